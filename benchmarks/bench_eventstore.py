"""Event store throughput against raw py-lmdb, side by side in one run (SPEC §10).

    python benchmarks/bench_eventstore.py            # unpinned, then pinned to CPU 0
    python benchmarks/bench_eventstore.py --quick    # smaller sizes

Measures, on the same encoded payloads (a typical ``llm.completed`` event):

* raw py-lmdb ``put`` of every payload in one transaction, and ``putmulti`` (the ceiling);
* ``EventStore.append`` from one writer in batches (nosync): target >= 50% of the raw put rate;
* 100 concurrent writers appending 8-event batches, group-committed, ``sync`` and ``nosync``:
  target >= 50,000 events/s in ``sync``;
* reading a stream back (events/s, decoded).

Prints a table and writes ``benchmarks/results/eventstore.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import lmdb  # noqa: E402  (benchmark baseline: the raw driver, for comparison only)

from benchmarks.measure import write_results  # noqa: E402
from sessionloop.actors.events import (  # noqa: E402
    LlmCompleted,
    ToolCallSpec,
    Usage,
    open_store,  # noqa: E402
)
from sessionloop.eventstore.codec import encode_event  # noqa: E402


def typical_event(i: int) -> LlmCompleted:
    return LlmCompleted(
        at=1_700_000_000_000 + i,
        turn_id=f"turn-{i // 8:08d}",
        step_id=f"step-{i:08d}",
        text="echo: the quick brown fox jumps over the lazy dog",
        tool_calls=[ToolCallSpec(call_id=f"call_{i}", name="list_files", args={"path": "."})] if i % 2 else [],
        usage=Usage(prompt_tokens=120, completion_tokens=12),
        model="mock",
        provider="mock",
        duration_ms=1,
    )


def bench_raw(payloads: list[bytes]) -> dict[str, float]:
    out = {}
    for mode in ("put", "putmulti"):
        d = tempfile.mkdtemp()
        env = lmdb.open(d, map_size=1 << 32, sync=False, metasync=False, max_dbs=2)
        db = env.open_db(b"log")
        t0 = time.perf_counter()
        with env.begin(write=True, db=db) as txn:
            if mode == "put":
                pack = struct.Struct(">Q").pack
                for i, p in enumerate(payloads):
                    txn.put(pack(i + 1), p, append=True)
            else:
                cur = txn.cursor()
                pack = struct.Struct(">Q").pack
                cur.putmulti([(pack(i + 1), p) for i, p in enumerate(payloads)], append=True)
        dt = time.perf_counter() - t0
        env.close()
        shutil.rmtree(d)
        out[f"raw_{mode}_events_per_s"] = len(payloads) / dt
    return out


def bench_single_writer(events: list, batch: int) -> float:
    d = tempfile.mkdtemp()
    store = open_store(d, durability="nosync", map_size=1 << 32)
    t0 = time.perf_counter()
    version = 0
    for i in range(0, len(events), batch):
        chunk = events[i:i + batch]
        store.append("session-single", chunk, version)
        version += len(chunk)
    dt = time.perf_counter() - t0
    store.close()
    shutil.rmtree(d)
    return len(events) / dt


def bench_concurrent(durability: str, writers: int, appends_each: int, batch: int) -> dict[str, float]:
    d = tempfile.mkdtemp()
    store = open_store(d, durability=durability, map_size=1 << 32)
    events = [typical_event(i) for i in range(batch)]
    barrier = threading.Barrier(writers + 1)
    latencies: list[float] = []
    lock = threading.Lock()

    def writer(w: int) -> None:
        mine = []
        barrier.wait()
        for j in range(appends_each):
            t = time.perf_counter()
            store.append(f"session-w{w}", events, j * batch)
            mine.append(time.perf_counter() - t)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    info = store.info()
    store.close()
    shutil.rmtree(d)
    latencies.sort()
    return {
        "events_per_s": writers * appends_each * batch / dt,
        "appends_per_s": writers * appends_each / dt,
        "mean_group_size": info["requests"] / max(1, info["batches"]),
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000,
    }


def bench_read(n: int) -> float:
    d = tempfile.mkdtemp()
    store = open_store(d, durability="nosync", map_size=1 << 32)
    events = [typical_event(i) for i in range(n)]
    for i in range(0, n, 8):
        store.append("session-read", events[i:i + 8], i)
    t0 = time.perf_counter()
    got = store.read_stream("session-read")
    dt = time.perf_counter() - t0
    assert len(got) == n
    store.close()
    shutil.rmtree(d)
    return n / dt


def run(quick: bool, repeats: int) -> dict[str, float]:
    n = 50_000 if quick else 200_000
    events = [typical_event(i) for i in range(n)]
    payloads = [encode_event(e) for e in events]
    samples: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        samples.setdefault(key, []).append(value)

    for _ in range(repeats):
        for k, v in bench_raw(payloads).items():
            add(k, v)
        for batch in (8, 64):
            add(f"append_single_writer_batch{batch}_nosync_events_per_s", bench_single_writer(events, batch))
        for durability in ("nosync", "sync"):
            r = bench_concurrent(durability, 100, 20 if quick else 60, 8)
            for k, v in r.items():
                add(f"append_100_writers_batch8_{durability}_{k}", v)
        add("read_stream_events_per_s", bench_read(n // 4))
    result = {k: statistics.median(v) for k, v in samples.items()}
    for batch in (8, 64):
        result[f"ratio_single_writer_batch{batch}_vs_raw_put"] = (
            result[f"append_single_writer_batch{batch}_nosync_events_per_s"] / result["raw_put_events_per_s"]
        )
    return result


def print_table(title: str, result: dict[str, float]) -> None:
    print(f"\n{title}")
    print(f"{'measure':<62} {'value':>14}")
    print("-" * 77)
    for k, v in result.items():
        print(f"{k:<62} {v:>14,.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a few seconds)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per figure; the median is reported")
    ap.add_argument("--pinned-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-pinned", action="store_true", help="skip the run pinned to CPU 0")
    args = ap.parse_args()
    if args.pinned_child:
        print(json.dumps(run(args.quick, args.repeats)))
        return
    results = {"unpinned": run(args.quick, args.repeats)}
    print_table("unpinned", results["unpinned"])
    if not args.no_pinned and shutil.which("taskset"):
        cmd = ["taskset", "-c", "0", sys.executable, __file__, "--pinned-child", "--repeats", str(args.repeats)]
        if args.quick:
            cmd.append("--quick")
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        results["pinned_cpu0"] = json.loads(out.stdout.strip().splitlines()[-1])
        print_table("pinned to CPU 0 (taskset -c 0)", results["pinned_cpu0"])
    write_results("eventstore", {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": args.quick, **results})


if __name__ == "__main__":
    main()
