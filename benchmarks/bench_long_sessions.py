"""A session kept for months: what a turn costs as its history grows (issue "Every core", long-lived
sessions).

    python benchmarks/bench_long_sessions.py                 # 5,000 measured turns, then on to 50,000 events
    python benchmarks/bench_long_sessions.py --turns 1000 --events 0    # a shorter run

A bot keeps one session per contact and sends it turn after turn. One session on a fresh data
directory (nosync, mock model, the server's GC settings) is driven turn by turn in process
(``Session.run``, each turn waited for, as a contact's next message is), every other turn with a
``list_files`` tool call. Reported per window of ``--window`` turns: process CPU per turn
(``time.process_time``), wall time per turn, and the process's RSS after the window. After
``--turns`` the session is driven on, unmeasured, until its stream holds ``--events`` events; then
the stream's event count, the size of the latest snapshot, and the session's activation after a
reopen (the host closed and opened again, then one read that activates the actor: snapshot + the
events after it), wall and process CPU, median of ``--repeats``; and the live session's memory:
what the activation allocated and still holds (tracemalloc, after a collection), beside what its
model view (the messages the next model call is sent) takes alone.

The ratios that matter are in one run: CPU per turn of turns 4,901-5,000 over turns 1-100 (target
1.1x or less; and, since a shared machine's speed drifts over a run, the same comparison made at
one time: ``--rounds`` times a new session's turns 1-100 beside the long session's next 100),
activation (target under 20 ms at 50,000 events), and the live memory beyond the model view (a
live session's memory should be bounded by its model view and settings, not its
history). Writes ``benchmarks/results/long_sessions.json``.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import msgspec

from benchmarks.bench_turns import PLAIN_TEXT, TOOL_TEXT
from benchmarks.measure import machine_reference_ms, rss_peak_mib, write_results
from sessionloop.actors import events as E
from sessionloop.actors.api.host import Host
from sessionloop.actors.system import gc_policy


def rss_now_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def run_turn(session: Any, turn: int) -> None:
    result = session.run(TOOL_TEXT if turn % 2 else PLAIN_TEXT)
    if result.state != "completed":
        raise SystemExit(f"turn {turn} ended {result.state}: {result.code} {result.reason}")


def drive(session: Any, turns: int, window: int) -> list[dict[str, float]]:
    rows: list[dict[str, float]] = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for turn in range(1, turns + 1):
        run_turn(session, turn)
        if turn % window == 0:
            cpu1, wall1 = time.process_time(), time.perf_counter()
            rows.append({"turns": turn, "cpu_ms_per_turn": (cpu1 - cpu0) * 1000 / window,
                         "wall_ms_per_turn": (wall1 - wall0) * 1000 / window, "rss_mib": rss_now_mib()})
            cpu0, wall0 = cpu1, wall1
    return rows


def interleaved(host: Host, session: Any, turn: int, window: int, rounds: int) -> tuple[list[float], list[float], int]:
    """CPU ms per turn of ``window`` turns of a new session (its turns 1 to ``window``), then of
    ``window`` more turns of the long ``session``, ``rounds`` times: the two at the same time of the
    run, so a machine whose speed drifts (a shared one) moves both alike."""
    fresh, long = [], []
    for _ in range(rounds):
        other = host.create(title="a new contact")
        cpu0 = time.process_time()
        for t in range(1, window + 1):
            run_turn(other, t)
        cpu1 = time.process_time()
        for _ in range(window):
            turn += 1
            run_turn(session, turn)
        cpu2 = time.process_time()
        fresh.append((cpu1 - cpu0) * 1000 / window)
        long.append((cpu2 - cpu1) * 1000 / window)
    return fresh, long, turn


def drive_to(host: Host, session: Any, turn: int, events: int) -> int:
    """Run more turns (unmeasured) until the session's stream holds ``events`` events."""
    stream = f"session-{session.id}"
    while host.store.stream_version(stream) < events:
        turn += 1
        run_turn(session, turn)
    return turn


def open_host(data_dir: str) -> Host:
    return Host.open(data_dir, durability="nosync", permission_mode="acceptCalls")


def activation(data_dir: str, session_id: str, repeats: int) -> tuple[list[float], list[float]]:
    """Wall and process-CPU milliseconds of the first read after a reopen (the actor's activation)."""
    walls, cpus = [], []
    for _ in range(repeats):
        with open_host(data_dir) as host:
            time.sleep(0.3)  # what the host starts on opening settles first
            cpu, started = time.process_time(), time.perf_counter()
            state = host.session(session_id).state  # the first message activates the actor
            walls.append((time.perf_counter() - started) * 1000)
            cpus.append((time.process_time() - cpu) * 1000)
            assert state in ("idle", "completed"), state
    return walls, cpus


def live_memory(data_dir: str, session_id: str) -> dict[str, float]:
    """KiB the activation of the session allocated and still holds (the live actor, its state), and
    KiB its model view (the messages the next model call is sent) takes decoded on its own."""
    with open_host(data_dir) as host:
        time.sleep(0.3)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        assert host.session(session_id).state in ("idle", "completed")
        gc.collect()
        live = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        messages = msgspec.msgpack.encode(host.session(session_id).snapshot().messages)  # the live state's
    gc.collect()
    tracemalloc.start()
    view = msgspec.msgpack.decode(messages, type=list[E.Message])
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return {"live_kib": live / 1024, "model_view_kib": held / 1024, "beyond_model_view_kib": (live - held) / 1024,
            "model_view_messages": len(view)}


def window_ratio(rows: list[dict[str, float]], window: int, last_turn: int) -> float:
    by_turn = {int(r["turns"]): r["cpu_ms_per_turn"] for r in rows}
    return by_turn[last_turn] / by_turn[window]


def median_ratio(rows: list[dict[str, float]], count: int = 5) -> float:
    cpu = [r["cpu_ms_per_turn"] for r in rows]
    return statistics.median(cpu[-count:]) / statistics.median(cpu[:count])


def print_table(rows: list[dict[str, float]]) -> None:
    print(f"{'turns':>8} {'CPU ms/turn':>12} {'wall ms/turn':>13} {'RSS MiB':>9}")
    for row in rows if len(rows) <= 12 else rows[:3] + rows[len(rows) // 2:len(rows) // 2 + 1] + rows[-3:]:
        print(f"{row['turns']:>8,} {row['cpu_ms_per_turn']:>12.3f} {row['wall_ms_per_turn']:>13.3f} "
              f"{row['rss_mib']:>9.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=5000, help="measured turns")
    ap.add_argument("--window", type=int, default=100, help="turns per reported window")
    ap.add_argument("--events", type=int, default=50_000, help="then drive on to this many events (0: stop)")
    ap.add_argument("--repeats", type=int, default=7, help="activations measured after the run")
    ap.add_argument("--rounds", type=int, default=5,
                    help="after --turns: rounds of a new session's first window beside a window of the long one")
    args = ap.parse_args()
    if args.turns < 2 * args.window:
        raise SystemExit("--turns must be at least two windows")
    gc_policy.apply()  # the server's GC settings (actors/system/gc_policy.py)
    reference = machine_reference_ms()
    data_dir = tempfile.mkdtemp(prefix="sessionloop-long-")
    try:
        with open_host(data_dir) as host:
            gc_policy.freeze_startup()  # as ``sessionloop serve`` does once it is up
            session = host.create(title="one contact")
            rss_start = rss_now_mib()
            rows = drive(session, args.turns, args.window)
            rss_end = rows[-1]["rss_mib"]
            fresh, long, turns = interleaved(host, session, args.turns, args.window, args.rounds)
            turns = drive_to(host, session, turns, args.events)
            events = host.store.stream_version(f"session-{session.id}")
            snapshot = host.store.load_snapshot(f"session-{session.id}")
            # the record a snapshot writes each time, and with the parts (the history's full chunks, each written once)
            record_bytes = len(snapshot.state) if snapshot is not None else 0
            snapshot_bytes = record_bytes + (sum(len(p) for p in snapshot.parts) if snapshot is not None else 0)
        walls, cpus = activation(data_dir, session.id, args.repeats)
        memory = live_memory(data_dir, session.id)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    print_table(rows)
    cpu_ratio = rows[-1]["cpu_ms_per_turn"] / rows[0]["cpu_ms_per_turn"]
    cpu_ratio_5000 = window_ratio(rows, args.window, 5000) if args.turns >= 5000 else cpu_ratio
    medians = median_ratio(rows)
    rss_per_turn_kib = (rss_end - rss_start) * 1024 / args.turns
    print(f"\nCPU per turn, turns 4,901-5,000 (or the last window) over turns 1-{args.window}: {cpu_ratio_5000:.2f}x"
          f"   (target <= 1.1x); last window over the first {cpu_ratio:.2f}x; medians of the first and last "
          f"five windows {medians:.2f}x")
    side = statistics.median(long) / statistics.median(fresh)
    print(f"interleaved after turn {args.turns:,}: a new session's turns 1-{args.window} "
          f"{statistics.median(fresh):.3f} ms, the long session's next {args.window} "
          f"{statistics.median(long):.3f} ms CPU per turn (medians of {args.rounds}): {side:.2f}x")
    print(f"events in the stream: {events:,} after {turns:,} turns; latest snapshot: {snapshot_bytes / 1024:,.0f} KiB "
          f"(its record {record_bytes / 1024:,.0f} KiB, the rest in parts written once)")
    print(f"activation after a reopen: median {statistics.median(walls):.1f} ms wall (max {max(walls):.1f}), "
          f"{statistics.median(cpus):.1f} ms process CPU   (target < 20 ms at 50,000 events)")
    print(f"live session: {memory['live_kib']:,.0f} KiB held after its activation; its model view "
          f"({memory['model_view_messages']:,} messages) {memory['model_view_kib']:,.0f} KiB; beyond it "
          f"{memory['beyond_model_view_kib']:,.0f} KiB")
    print(f"RSS growth while driven: {rss_per_turn_kib:.2f} KiB per turn of history (peak {rss_peak_mib():.0f} MiB)")
    print(f"machine reference: {reference:.1f} ms")
    write_results("long_sessions", {
        "turns": args.turns, "window": args.window, "windows": rows, "cpu_ratio_5000_first": cpu_ratio_5000,
        "cpu_ratio_last_first": cpu_ratio, "cpu_ratio_median5": medians,
        "interleaved_new_ms": fresh, "interleaved_long_ms": long, "cpu_ratio_interleaved": side, "turns_driven": turns,
        "events": events, "snapshot_bytes": snapshot_bytes,
        "snapshot_record_bytes": record_bytes, "activation_ms": walls, "activation_cpu_ms": cpus,
        "live_memory": memory, "rss_kib_per_turn": rss_per_turn_kib, "machine_reference_ms": reference})


if __name__ == "__main__":
    main()
