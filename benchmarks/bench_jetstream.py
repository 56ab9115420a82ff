"""Commits/s through the JetStream log (R=1 on one nats-server, R=3 on a three-server cluster on this
machine) against the LMDB store's append (issue 23).

    python benchmarks/bench_jetstream.py              # 3 interleaved rounds of 4 s per figure
    python benchmarks/bench_jetstream.py --quick      # 1 round of 2 s

Same commits on both sides: ``--writers`` concurrent writers, each on its own session, each
commit ``--batch`` typical ``llm.completed`` events (the encoded bytes of bench_eventstore's
event), every commit with its expected version (and a commit id on JetStream):

* ``lmdb_sync`` / ``lmdb_nosync``: ``EventStore.append`` from writer threads (group-committed);
* ``js_default``: ``JetStreamLog.append`` from asyncio tasks on one connection, nats-server with
  its default ``sync_interval`` (the OS flushes; fsync every 2 min), file storage;
* ``js_fenced``: the same server, every append through ``ShardOwner.append`` of one node holding
  all 16 shards: the server checks the shard's last sequence (the fence against a stale owner),
  so a node's appends to one shard go one at a time (16 writers' sessions share 16 shards);
* ``js_sync_always``: the same as ``js_default`` with ``sync_interval: always`` (fsync on every write);
* ``js_r3``: ``JetStreamLog.append`` at R=3 on a three-server cluster on loopback (``cli/natsproc.py``),
  default ``sync_interval``: an acknowledgement waits for a majority (two of the three) to store the
  commit. All three servers share this machine's cores with the writers, so it measures the
  protocol's cost, not what three machines would do.

The variants run interleaved (round 1 of each, then round 2 of each, ...) so a noisy neighbour on
the shared machine hits all of them alike; figures are medians over rounds. Ratios are JetStream
over the LMDB store at the same durability (default vs nosync, always vs sync), and R=3 over R=1.
Prints a table and writes ``benchmarks/results/jetstream.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_eventstore import typical_event  # noqa: E402
from benchmarks.measure import write_results  # noqa: E402
from sessionloop.actors.events import open_store  # noqa: E402
from sessionloop.cli.natsproc import NatsCluster, NatsServer, nats_server_version  # noqa: E402
from sessionloop.eventstore.codec import encode_event  # noqa: E402
from sessionloop.eventstore.jetstream_log import JetStreamLog  # noqa: E402
from sessionloop.eventstore.leases import ShardLeases, ShardOwner  # noqa: E402

VARIANTS = ("lmdb_nosync", "js_default", "js_fenced", "js_r3", "lmdb_sync", "js_sync_always")


def _summary(commits: int, seconds: float, batch: int, latencies: list[float]) -> dict[str, float]:
    latencies.sort()
    return {"commits_per_s": commits / seconds, "events_per_s": commits * batch / seconds,
            "p50_ms": latencies[len(latencies) // 2] * 1000 if latencies else 0.0,
            "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000 if latencies else 0.0}


def run_lmdb(durability: str, writers: int, batch: int, seconds: float) -> dict[str, float]:
    d = tempfile.mkdtemp(prefix="bench-lmdb-")
    store = open_store(d, durability=durability, map_size=1 << 32)
    events = [typical_event(i) for i in range(batch)]
    barrier = threading.Barrier(writers + 1)
    latencies: list[float] = []
    counts = [0] * writers
    lock = threading.Lock()
    stop_at = [0.0]

    def writer(w: int) -> None:
        mine: list[float] = []
        version = 0
        barrier.wait()
        while time.perf_counter() < stop_at[0]:
            t = time.perf_counter()
            store.append(f"session-w{w}", events, version)
            mine.append(time.perf_counter() - t)
            version += batch
        counts[w] = len(mine)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    stop_at[0] = t0 + seconds
    barrier.wait()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    store.close()
    shutil.rmtree(d, ignore_errors=True)
    return _summary(sum(counts), dt, batch, latencies)


async def _run_js(url: str, replicas: int, writers: int, batch: int, seconds: float, tag: str,
                  fenced: bool = False) -> dict[str, float]:
    log = await JetStreamLog.connect(url, replicas=replicas)
    append = log.append
    owner: ShardOwner | None = None
    if fenced:  # one node owning every shard: each append through the shard's fence
        owner = ShardOwner(log, await ShardLeases.open(log, ttl_s=60, replicas=replicas), f"bench-{tag}")
        for shard in range(log.shards):
            await owner.acquire(shard)
        append = owner.append
    payloads = [encode_event(typical_event(i)) for i in range(batch)]
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def writer(w: int) -> int:
        version, n = 0, 0
        while time.perf_counter() < stop_at:
            t = time.perf_counter()
            await append(f"session-{tag}-w{w}", payloads, version, uuid.uuid4().hex)
            latencies.append(time.perf_counter() - t)
            version += batch
            n += 1
        return n

    t0 = time.perf_counter()
    try:
        counts = await asyncio.gather(*(writer(w) for w in range(writers)))
    finally:
        dt = time.perf_counter() - t0
        if owner is not None:
            for shard in owner.held:
                await owner.release(shard)
        await log.close()
    return _summary(sum(counts), dt, batch, latencies)


def run_js(url: str, replicas: int, writers: int, batch: int, seconds: float, tag: str,
           fenced: bool = False) -> dict[str, float]:
    return asyncio.run(_run_js(url, replicas, writers, batch, seconds, tag, fenced))


def _server(work: str, name: str, sync_always: bool) -> NatsServer:
    """A JetStream nats-server with its store and log in ``work``, started."""
    server = NatsServer(log_path=os.path.join(work, f"{name}.log"), store_dir=os.path.join(work, name),
                        sync_always=sync_always)
    server.start()
    return server


def run(rounds: int, seconds: float, writers: int, batch: int) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="bench-js-")
    servers: dict[str, NatsServer] = {}
    cluster = NatsCluster(os.path.join(work, "r3"))
    samples: dict[str, dict[str, list[float]]] = {}
    try:
        servers["js_default"] = _server(work, "js_default", sync_always=False)
        servers["js_sync_always"] = _server(work, "js_sync_always", sync_always=True)
        cluster.start()
        for r in range(rounds):
            for name in VARIANTS:
                if name.startswith("lmdb_"):
                    got = run_lmdb(name.removeprefix("lmdb_"), writers, batch, seconds)
                elif name == "js_r3":
                    got = run_js(cluster.url, 3, writers, batch, seconds, f"r{r}")
                elif name == "js_fenced":
                    got = run_js(servers["js_default"].url, 1, writers, batch, seconds, f"f{r}", fenced=True)
                else:
                    got = run_js(servers[name].url, 1, writers, batch, seconds, f"r{r}")
                for k, v in got.items():
                    samples.setdefault(name, {}).setdefault(k, []).append(v)
                print(f"  round {r + 1} {name:<16} {got['commits_per_s']:>10,.0f} commits/s", flush=True)
    finally:
        for s in servers.values():
            s.stop()
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    result: dict[str, Any] = {name: {k: statistics.median(v) for k, v in m.items()} for name, m in samples.items()}
    result["ratio_js_default_vs_lmdb_nosync"] = (result["js_default"]["commits_per_s"]
                                                 / result["lmdb_nosync"]["commits_per_s"])
    result["ratio_js_sync_always_vs_lmdb_sync"] = (result["js_sync_always"]["commits_per_s"]
                                                   / result["lmdb_sync"]["commits_per_s"])
    result["ratio_js_fenced_vs_js_default"] = (result["js_fenced"]["commits_per_s"]
                                               / result["js_default"]["commits_per_s"])
    result["ratio_js_r3_vs_js_default"] = result["js_r3"]["commits_per_s"] / result["js_default"]["commits_per_s"]
    result["ratio_js_r3_vs_lmdb_nosync"] = result["js_r3"]["commits_per_s"] / result["lmdb_nosync"]["commits_per_s"]
    return result


def print_table(result: dict[str, Any], writers: int, batch: int) -> None:
    print(f"\n{writers} writers, {batch} events per commit (medians)")
    print(f"{'variant':<18} {'commits/s':>12} {'events/s':>12} {'p50 ms':>9} {'p99 ms':>9}")
    print("-" * 64)
    for name in VARIANTS:
        m = result[name]
        print(f"{name:<18} {m['commits_per_s']:>12,.0f} {m['events_per_s']:>12,.0f} {m['p50_ms']:>9.2f} "
              f"{m['p99_ms']:>9.2f}")
    print(f"\nJetStream (default sync) / LMDB nosync: {result['ratio_js_default_vs_lmdb_nosync']:.3f}")
    print(f"JetStream (sync always) / LMDB sync:    {result['ratio_js_sync_always_vs_lmdb_sync']:.3f}")
    print(f"JetStream fenced / unfenced (R=1):      {result['ratio_js_fenced_vs_js_default']:.3f}")
    print(f"JetStream R=3 / R=1 (default sync):     {result['ratio_js_r3_vs_js_default']:.3f}")
    print(f"JetStream R=3 / LMDB nosync:            {result['ratio_js_r3_vs_lmdb_nosync']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one round of 2 s per variant")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is reported")
    ap.add_argument("--seconds", type=float, default=4.0, help="length of one run (at most 20)")
    ap.add_argument("--writers", type=int, default=16, help="concurrent writers, one session each")
    ap.add_argument("--batch", type=int, default=4, help="events per commit")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 2.0
    if not 0 < args.seconds <= 20:
        ap.error("--seconds must be in (0, 20]")
    if not 1 <= args.rounds <= 10 or not 1 <= args.writers <= 1000 or not 1 <= args.batch <= 1000:
        ap.error("--rounds 1..10, --writers 1..1000, --batch 1..1000")
    result = run(args.rounds, args.seconds, args.writers, args.batch)
    print_table(result, args.writers, args.batch)
    write_results("jetstream", {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "rounds": args.rounds,
                                "seconds": args.seconds, "writers": args.writers, "batch": args.batch,
                                "nats_server": nats_server_version(), **result})


if __name__ == "__main__":
    main()
