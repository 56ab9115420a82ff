"""Opening a big store and activating a long session (SPEC §10, activation).

    python benchmarks/bench_activation.py            # 100,000 stored sessions, >= 1,000,000 events
    python benchmarks/bench_activation.py --quick    # 2,000 stored sessions, 3 long ones (under a minute)

Targets (SPEC §10): open a store of 1,000,000 events / 100,000 sessions and answer
``sessions/list`` in under 1 s; activate one session with 10,000 events in under 50 ms (snapshots).

The store (built once, cached under ``benchmarks/results/.cache/``): ``bench_turns.py``'s stored
sessions (one finished turn each, made with ``host.create(initial_input=...)``; built here when
that cache is missing) plus ``--long`` long sessions, each driven by real turns (mock model, half
with a ``list_files`` tool call) until its stream holds ``--long-events`` events; more long
sessions are added until the store holds ``--events`` events in all. Every run works on a fresh
copy, so no run sees what an earlier one wrote.

* **open and list** (over the wire): ``sessionloop serve`` is started as a subprocess on port 0 on
  the copy; a WebSocket client connects, ``initialize``s and sends ``sessions/list`` (the default
  page of 50), then ``sessions/list`` with a ``query`` naming one session (a search over all of
  them). Reported: spawn -> listening (the process's start, imports included, and the listing
  index loaded from the store), connect -> first list reply, spawn -> first list reply (the
  figure the target speaks of), the query's reply time, and the same for an empty store (what
  the process costs with nothing stored); then the plain list once more (rows already built).
* **activation** (in process, as the directory does it): a host opened on the copy, then each
  long session's first message (its state), which activates the actor: its latest snapshot, then
  the events after it folded in. Reported: activation p50 / max, the events folded after the
  snapshot, and for reference the fold of the whole stream from its first event (what activation
  would cost without snapshots).

Unpinned and pinned to one CPU (``taskset -c 0``), medians of ``--repeats``, each run in a fresh
process. Prints tables and writes ``benchmarks/results/activation.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_turns import (
    CACHE,
    PLAIN_TEXT,
    TOOL_TEXT,
    create_sessions,
    open_host,
)
from benchmarks.measure import fill_defaults, now, percentile, run_job, write_results
from benchmarks.server_proc import ServerProc
from sessionloop.actors.api.host import Host
from sessionloop.actors.session.state import evolve, new_state
from sessionloop.actors.system import gc_policy
from sessionloop.cli.bench_cmd import inprocess_turn
from sessionloop.cli.bench_config import is_tool_turn
from sessionloop.cli.client import Endpoint, connect
from sessionloop.protocol.schemas_items import TurnItem

TOKEN = "bench-activation-token"
TARGET_LIST_MS, TARGET_ACTIVATE_MS = 1000.0, 50.0


# --- the cached store ---------------------------------------------------------------------------


def job_build(spec: dict[str, Any]) -> dict[str, Any]:
    """Stored sessions (bench_turns' cache, built if missing) plus long sessions, into ``path``."""
    t0 = time.perf_counter()
    stored = os.path.join(CACHE, f"stored-{spec['stored']}")
    if not os.path.exists(os.path.join(stored, "ids.json")):
        building = stored + ".building"
        shutil.rmtree(building, ignore_errors=True)
        host = open_host(os.path.join(building, "data"), {**spec, "durability": "nosync", "llm_latency_ms": 0.0}, 2000)
        ids = create_sessions(host, spec["stored"], initial_input=PLAIN_TEXT)
        host.close()
        with open(os.path.join(building, "ids.json"), "w") as f:
            json.dump(ids, f)
        os.replace(building, stored)
    tmp = spec["path"] + ".building"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(os.path.join(stored, "data"), os.path.join(tmp, "data"))
    with open(os.path.join(stored, "ids.json")) as f:
        ids = json.load(f)
    host = open_host(os.path.join(tmp, "data"), {"durability": "nosync", "llm_latency_ms": 0.0}, 4000)
    long_ids: list[str] = []
    while len(long_ids) < spec["long"] or host.store.head_position < spec["events"]:
        batch = [host.create(title=f"long {len(long_ids) + i}").id for i in range(spec["long"])]
        asyncio.run(drive_long(host, batch, spec["long_events"]))
        long_ids += batch
    events, sessions = host.store.head_position, len(host.list())
    host.close()
    with open(os.path.join(tmp, "ids.json"), "w") as f:
        json.dump({"stored": ids, "long": long_ids}, f)
    os.replace(tmp, spec["path"])
    return {"events": events, "sessions": sessions, "long_sessions": len(long_ids), "build_s": time.perf_counter() - t0}


async def drive_long(host: Host, ids: list[str], events_each: int) -> None:
    """Turns one after the other in each session (all sessions at once) until each stream holds
    ``events_each`` events."""
    turn = inprocess_turn(host)

    async def one(k: int, session_id: str) -> None:
        j = 0
        while host.store.stream_version(f"session-{session_id}") < events_each:
            outcome = await turn(session_id, TOOL_TEXT if is_tool_turn(0.5, k, j) else PLAIN_TEXT)
            if outcome.state != "completed":
                raise RuntimeError(f"a turn of {session_id} ended {outcome.state}")
            j += 1

    await asyncio.gather(*(one(k, s) for k, s in enumerate(ids)))


def job_build_recovery(spec: dict[str, Any]) -> dict[str, Any]:
    """RELIABILITY recovery_time's store: ``sessions`` sessions of ``each`` events (real turns,
    snapshots as the host takes them), plus one session of ``big`` events."""
    t0 = time.perf_counter()
    tmp = spec["path"] + ".building"
    shutil.rmtree(tmp, ignore_errors=True)
    host = open_host(os.path.join(tmp, "data"), {"durability": "nosync", "llm_latency_ms": 0.0}, 4000)
    ids = create_sessions(host, spec["sessions"])
    for start in range(0, len(ids), 2000):  # a few thousand sessions at a time: live actors stay capped
        asyncio.run(drive_long(host, ids[start:start + 2000], spec["each"]))
    big = host.create(title="big").id
    asyncio.run(drive_long(host, [big], spec["big"]))
    events = host.store.head_position
    host.close()
    with open(os.path.join(tmp, "ids.json"), "w") as f:
        json.dump({"stored": ids, "long": [big]}, f)
    os.replace(tmp, spec["path"])
    return {"events": events, "sessions": len(ids) + 1, "build_s": time.perf_counter() - t0}


def job_recovery(spec: dict[str, Any]) -> dict[str, Any]:
    """A cold start of ``serve`` on a fresh copy: spawn -> listening -> the history of a stored
    session (it activates from its snapshot) and a turn on another answered."""
    work, ids = fresh_copy(spec["path"])
    try:
        with spawned(work, spec["pinned"]) as (server, t0, ready):
            served = asyncio.run(serve_one(server.port, random.Random(spec.get("seed", 1)).sample(ids["stored"], 2)))
        return {"spawn_to_listening_ms": (ready - t0) * 1000, "spawn_to_history_ms": (served["history"] - t0) * 1000,
                "spawn_to_turn_ms": (served["turn"] - t0) * 1000}
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def serve_one(port: int, sids: list[str]) -> dict[str, float]:
    async with connect(Endpoint(url=f"ws://127.0.0.1:{port}/session", token=TOKEN)) as client:
        page = await client.call("session/history", {"sessionId": sids[0], "limit": 50})
        if not page.items:
            raise RuntimeError(f"session {sids[0]} answered an empty history")
        history = now()
        await client.call("session/subscribe", {"sessionId": sids[1]})
        await client.call("turn/send", {"sessionId": sids[1], "content": "hello after a cold start"})
        while True:  # the turn's end: its ``turn`` item completed
            push = await client.next(timeout=30)
            item = getattr(push.params, "item", None)
            if push.method == "item/completed" and isinstance(item, TurnItem) and item.ended_at is not None:
                return {"history": history, "turn": now()}


def fresh_copy(path: str) -> tuple[str, dict[str, list[str]]]:
    """A temporary copy of the cached store's data directory, and its session ids."""
    work = tempfile.mkdtemp(prefix="bench-activation-")
    shutil.copytree(os.path.join(path, "data"), os.path.join(work, "data"))
    with open(os.path.join(path, "ids.json")) as f:
        return work, json.load(f)


# --- open and list, over the wire ---------------------------------------------------------------


@contextlib.contextmanager
def spawned(work: str, pinned: bool) -> Iterator[tuple[ServerProc, float, float]]:
    """``sessionloop serve`` on ``work/data`` (its server on CPU 0 when ``pinned``): the server,
    the moment it was spawned and the moment it listened; stopped on exit."""
    t0 = now()
    server = ServerProc(os.path.join(work, "data"), TOKEN, ["--durability", "nosync"], "0" if pinned else None)
    try:
        yield server, t0, now()
    finally:
        server.stop()


def job_list(spec: dict[str, Any]) -> dict[str, Any]:
    """Spawn ``serve`` on a fresh copy (or an empty directory), connect, list, search."""
    work, ids = (tempfile.mkdtemp(prefix="bench-activation-"), None) if spec.get("empty") else fresh_copy(spec["path"])
    try:
        with spawned(work, spec["pinned"]) as (server, t0, ready):
            out = asyncio.run(list_and_search(server.port, ids))
        return {"spawn_to_listening_ms": (ready - t0) * 1000, "connect_to_list_ms": (out["listed"] - ready) * 1000,
                "spawn_to_list_ms": (out["listed"] - t0) * 1000, "again_ms": out["again_ms"],
                "query_ms": out["query_ms"],
                "listed": out["listed_n"], "found": out["found"]}
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def list_and_search(port: int, ids: dict[str, list[str]] | None) -> dict[str, Any]:
    async with connect(Endpoint(url=f"ws://127.0.0.1:{port}/session", token=TOKEN)) as client:
        page = await client.call("sessions/list", {})
        listed = now()
        t = now()
        await client.call("sessions/list", {})
        again_ms = (now() - t) * 1000
        if ids is None:
            return {"listed": listed, "listed_n": len(page.sessions), "again_ms": again_ms, "query_ms": float("nan"),
                    "found": 0}
        title = f"bench {len(ids['stored']) - 1}"
        t = now()
        found = await client.call("sessions/list", {"query": title})
        query_ms = (now() - t) * 1000
        if not any(s.title == title for s in found.sessions):
            raise RuntimeError(f"sessions/list with query {title!r} did not find it")
        if len(page.sessions) == 0:
            raise RuntimeError("sessions/list answered an empty page over a full store")
        return {"listed": listed, "listed_n": len(page.sessions), "again_ms": again_ms, "query_ms": query_ms,
                "found": len(found.sessions)}


# --- activation, in process ---------------------------------------------------------------------


def job_activate(spec: dict[str, Any]) -> dict[str, Any]:
    work, ids = fresh_copy(spec["path"])
    try:
        host = Host.open(os.path.join(work, "data"), durability="nosync", max_live=4000)
        gc_policy.freeze_startup()
        activate, tail, full, events = [], [], [], []
        for sid in ids["long"]:
            stream = f"session-{sid}"
            snap = host.store.load_snapshot(stream)
            version = host.store.stream_version(stream)
            t = time.perf_counter()
            state = host.session(sid).state  # the first message: the directory activates the actor
            activate.append((time.perf_counter() - t) * 1000)
            if state != "completed":  # its last turn ended; nothing to resume
                raise RuntimeError(f"long session {sid} activated as {state!r}, not completed")
            events.append(version)
            tail.append(version - (snap.version if snap is not None else 0))
            t = time.perf_counter()
            folded = new_state(sid)
            for recorded in host.store.read_stream(stream):
                evolve(folded, recorded.event)
            full.append((time.perf_counter() - t) * 1000)
            if folded.version != version:
                raise RuntimeError(f"folding {stream} reached version {folded.version}, not {version}")
        host.close()
        activate.sort(), full.sort()
        return {"long_sessions": len(activate), "events_per_session_min": min(events),
                "activate_p50_ms": percentile(activate, 0.5), "activate_max_ms": activate[-1],
                "events_after_snapshot_max": max(tail),
                "fold_all_p50_ms": percentile(full, 0.5), "fold_all_max_ms": full[-1]}
    finally:
        shutil.rmtree(work, ignore_errors=True)


JOBS = {"build": job_build, "list": job_list, "activate": job_activate, "build_recovery": job_build_recovery,
        "recovery": job_recovery}


# --- the parent ---------------------------------------------------------------------------------


def run_child(spec: dict[str, Any], pinned: bool) -> dict[str, Any]:
    """One job in a fresh process; the activation job under ``taskset -c 0`` when pinned (the list
    job pins the server it spawns instead)."""
    return run_job(__file__, {**spec, "pinned": pinned}, taskset=pinned and spec["job"] == "activate")

def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    out["samples"] = runs
    return out


def print_table(title: str, cols: dict[str, dict[str, Any]], rows: list[tuple[str, str, str]]) -> None:
    print(f"\n{title}")
    print(f"{'measure':<44}" + "".join(f"{c:>24}" for c in cols))
    print("-" * (44 + 24 * len(cols)))
    for key, name, fmt in rows:
        print(f"{name:<44}" + "".join(f"{format(cols[c][key], fmt):>24}" for c in cols))


LIST_ROWS = [("spawn_to_listening_ms", "spawn -> listening (ms)", ",.0f"),
             ("connect_to_list_ms", "connect -> first sessions/list (ms)", ",.0f"),
             ("spawn_to_list_ms", "spawn -> first sessions/list (ms)", ",.0f"),
             ("again_ms", "sessions/list again (ms)", ",.1f"),
             ("query_ms", "sessions/list with a query (ms)", ",.1f"), ("listed", "sessions on the page", ".0f")]
ACTIVATE_ROWS = [("activate_p50_ms", "activation p50 (ms)", ".1f"), ("activate_max_ms", "activation max (ms)", ".1f"),
                 ("events_per_session_min", "events per long session (least)", ",.0f"),
                 ("events_after_snapshot_max", "events folded after the snapshot (most)", ",.0f"),
                 ("fold_all_p50_ms", "fold of the whole stream p50 (ms)", ".1f"),
                 ("fold_all_max_ms", "fold of the whole stream max (ms)", ".1f")]


RECOVERY_ROWS = [("spawn_to_listening_ms", "spawn -> listening (ms)", ",.0f"),
                 ("spawn_to_history_ms", "spawn -> a stored session's history (ms)", ",.0f"),
                 ("spawn_to_turn_ms", "spawn -> a turn answered on another (ms)", ",.0f")]


def RECOVERY_SHAPE(args: argparse.Namespace) -> str:  # noqa: N802 - reads as a constant in the tables
    n, each, big = recovery_shape(args)
    return f"{n:,} sessions x {each} events + one of {big:,}"


def recovery_shape(args: argparse.Namespace) -> tuple[int, int, int]:
    return (1000, 200, 5000) if args.quick else (10_000, 200, 50_000)


def recovery_runs(args: argparse.Namespace, modes: list[tuple[str, bool]],
                  runs: dict[tuple[str, str], list[dict[str, Any]]]) -> None:
    """RELIABILITY recovery_time: serving after a cold start, and the full replay of a big session."""
    n, each, big = recovery_shape(args)
    spec = {"path": os.path.join(CACHE, f"recovery-{n}x{each}-{big}"), "sessions": n, "each": each, "big": big}
    if not os.path.exists(os.path.join(spec["path"], "ids.json")):
        print(f"building the recovery store (cached in {spec['path']}) ...", flush=True)
        print(f"built: {run_child({**spec, 'job': 'build_recovery'}, pinned=False)}", flush=True)
    for r in range(args.repeats):
        for label, pinned in modes:
            runs.setdefault(("recovery", label), []).append(run_child({**spec, "job": "recovery", "seed": r}, pinned))
            runs.setdefault(("replay_big", label), []).append(run_child({**spec, "job": "activate"}, pinned))


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 2,000 stored sessions, 3 long ones")
    ap.add_argument("--stored", type=int, help="stored sessions (default 100000; 2000 with --quick)")
    ap.add_argument("--events", type=int, help="events in the store at least (default 1000000; 0 with --quick)")
    ap.add_argument("--long", type=int, help="long sessions at least (default 10; 3 with --quick)")
    ap.add_argument("--long-events", type=int, default=10_000, help="events per long session")
    ap.add_argument("--repeats", type=int, default=3, help="runs per figure; the median is reported")
    ap.add_argument("--no-pinned", action="store_true", help="skip the runs pinned to CPU 0")
    ap.add_argument("--recovery", action="store_true",
                    help="also RELIABILITY recovery_time: 10,000 sessions x 200 events and one of 50,000 "
                         "(1,000 x 200 and one of 5,000 with --quick), a cold start and a full replay")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    fill_defaults(args, [("stored", 100_000, 2000), ("events", 1_000_000, 0), ("long", 10, 3)])
    return args


def main() -> None:
    args = parse_args()
    if args.child:
        spec = json.loads(args.child)
        gc_policy.apply()  # the server's GC settings (actors/system/gc_policy.py)
        print(json.dumps(JOBS[spec["job"]](spec)))
        return
    path = os.path.join(CACHE, f"activation-{args.stored}-{args.events}-{args.long}x{args.long_events}")
    spec = {"path": path, "stored": args.stored, "events": args.events, "long": args.long,
            "long_events": args.long_events}
    results: dict[str, Any] = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": args.quick, "params": spec}
    if not os.path.exists(os.path.join(path, "ids.json")):
        print(f"building the store (cached in {path}) ...", flush=True)
        os.makedirs(CACHE, exist_ok=True)
        results["built"] = run_child({**spec, "job": "build"}, pinned=False)
        print(f"built: {results['built']}")
    modes = [("unpinned", False)] + ([("pinned_cpu0", True)] if not args.no_pinned and shutil.which("taskset") else [])
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(args.repeats):
        for label, pinned in modes:
            runs.setdefault(("list", label), []).append(run_child({**spec, "job": "list"}, pinned))
            runs.setdefault(("list_empty", label), []).append(run_child({**spec, "job": "list", "empty": True}, pinned))
            runs.setdefault(("activate", label), []).append(run_child({**spec, "job": "activate"}, pinned))
    if args.recovery:
        recovery_runs(args, modes, runs)
    got = {f"{job} {label}": medians(r) for (job, label), r in runs.items()}
    results.update(got)
    list_cols = {k: v for k, v in got.items() if k.startswith("list")}
    print_table(f"open and list over the wire (serve subprocess; medians of {args.repeats})", list_cols, LIST_ROWS)
    print_table(f"activating a long session (in process; medians of {args.repeats})",
                {k: v for k, v in got.items() if k.startswith("activate")}, ACTIVATE_ROWS)
    if args.recovery:
        print_table(f"recovery_time: a cold start of serve on {RECOVERY_SHAPE(args)} (medians of {args.repeats})",
                    {k: v for k, v in got.items() if k.startswith("recovery")}, RECOVERY_ROWS)
        print_table("recovery_time: the big session, activated and replayed from its first event",
                    {k: v for k, v in got.items() if k.startswith("replay_big")}, ACTIVATE_ROWS)
        worst_serve = max(s["spawn_to_turn_ms"]
                          for k, v in got.items() if k.startswith("recovery") for s in v["samples"])
        worst_replay = max(s["fold_all_max_ms"]
                           for k, v in got.items() if k.startswith("replay_big") for s in v["samples"])
        results["recovery_targets"] = {"serving_under_10s": worst_serve < 10_000,
                                       "replay_under_2s": worst_replay < 2000}
        print(f"recovery_time targets: cold start -> a turn answered, worst run {worst_serve:,.0f} ms (< 10,000); "
              f"the big session replayed from its first event, worst {worst_replay:,.0f} ms (< 2,000)")
    worst_list = max(s["spawn_to_list_ms"] for k, v in got.items() if k.startswith("list ") for s in v["samples"])
    worst_act = max(s["activate_max_ms"] for k, v in got.items() if k.startswith("activate") for s in v["samples"])
    results["targets"] = {"list_under_1s": worst_list < TARGET_LIST_MS,
                          "activate_under_50ms": worst_act < TARGET_ACTIVATE_MS}
    print(f"\ntargets: spawn -> first list, worst run {worst_list:,.0f} ms (< {TARGET_LIST_MS:,.0f}); "
          f"activation, worst session of any run {worst_act:.1f} ms (< {TARGET_ACTIVATE_MS:.0f})")
    write_results("activation", results)


if __name__ == "__main__":
    main()
