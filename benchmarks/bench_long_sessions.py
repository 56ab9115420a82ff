"""A session kept for months: what a turn costs as its history grows (issue "Every core", long-lived
sessions).

    python benchmarks/bench_long_sessions.py                 # one session driven to 5,000 turns
    python benchmarks/bench_long_sessions.py --turns 1000    # a shorter run

A bot keeps one session per contact and sends it turn after turn. One session on a fresh data
directory (nosync, mock model) is driven turn by turn in process (``Session.run``, each turn waited
for, as a contact's next message is), every other turn with a ``list_files`` tool call. Reported
per window of ``--window`` turns: process CPU per turn (``time.process_time``), wall time per turn,
and the process's RSS after the window; then the stream's event count, the size of the latest
snapshot, and the session's activation after a reopen (the host closed and opened again, then one
read that activates the actor: snapshot + the events after it), median of ``--repeats``.

The ratios that matter are in one run: CPU per turn of the last window over the first (target 1.1x
or less at 5,000 turns), activation (target under 20 ms at 50,000 events), and RSS per turn of
history (a live session's memory should be bounded by its model view, not its history).
Writes ``benchmarks/results/long_sessions.json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_turns import PLAIN_TEXT, TOOL_TEXT
from benchmarks.measure import machine_reference_ms, rss_peak_mib, write_results
from sessionloop.actors.api.host import Host


def rss_now_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def drive(host: Host, session: Any, turns: int, window: int) -> list[dict[str, float]]:
    rows: list[dict[str, float]] = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for turn in range(1, turns + 1):
        result = session.run(TOOL_TEXT if turn % 2 else PLAIN_TEXT)
        if result.state != "completed":
            raise SystemExit(f"turn {turn} ended {result.state}: {result.code} {result.reason}")
        if turn % window == 0:
            cpu1, wall1 = time.process_time(), time.perf_counter()
            rows.append({"turns": turn, "cpu_ms_per_turn": (cpu1 - cpu0) * 1000 / window,
                         "wall_ms_per_turn": (wall1 - wall0) * 1000 / window, "rss_mib": rss_now_mib()})
            cpu0, wall0 = cpu1, wall1
    return rows


def activation_ms(data_dir: str, session_id: str, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        with Host.open(data_dir, durability="nosync", permission_mode="acceptCalls") as host:
            started = time.perf_counter()
            state = host.session(session_id).state  # the first message activates the actor
            times.append((time.perf_counter() - started) * 1000)
            assert state in ("idle", "completed"), state
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=5000)
    ap.add_argument("--window", type=int, default=100, help="turns per reported window")
    ap.add_argument("--repeats", type=int, default=5, help="activations measured after the run")
    args = ap.parse_args()
    if args.turns < 2 * args.window:
        raise SystemExit("--turns must be at least two windows")
    reference = machine_reference_ms()
    data_dir = tempfile.mkdtemp(prefix="sessionloop-long-")
    try:
        with Host.open(data_dir, durability="nosync", permission_mode="acceptCalls") as host:
            session = host.create(title="one contact")
            rss_start = rss_now_mib()
            rows = drive(host, session, args.turns, args.window)
            events = len(host.store.read_stream(f"session-{session.id}"))
            snapshot = host.store.load_snapshot(f"session-{session.id}")
            snapshot_bytes = len(snapshot.state) if snapshot is not None else 0
        activations = activation_ms(data_dir, session.id, args.repeats)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    first, last = rows[0], rows[-1]
    print(f"{'turns':>8} {'CPU ms/turn':>12} {'wall ms/turn':>13} {'RSS MiB':>9}")
    for row in rows if len(rows) <= 12 else rows[:3] + rows[len(rows) // 2:len(rows) // 2 + 1] + rows[-3:]:
        print(f"{row['turns']:>8,} {row['cpu_ms_per_turn']:>12.3f} {row['wall_ms_per_turn']:>13.3f} "
              f"{row['rss_mib']:>9.1f}")
    cpu_ratio = last["cpu_ms_per_turn"] / first["cpu_ms_per_turn"]
    rss_per_turn_kib = (last["rss_mib"] - rss_start) * 1024 / args.turns
    print(f"\nCPU per turn, last window / first: {cpu_ratio:.2f}x   (target <= 1.1x)")
    print(f"events in the stream: {events:,}; latest snapshot: {snapshot_bytes / 1024:,.0f} KiB")
    print(f"activation after a reopen: median {statistics.median(activations):.1f} ms, "
          f"max {max(activations):.1f} ms")
    print(f"RSS growth: {rss_per_turn_kib:.2f} KiB per turn of history (peak {rss_peak_mib():.0f} MiB)")
    print(f"machine reference: {reference:.1f} ms")
    write_results("long_sessions", {
        "turns": args.turns, "window": args.window, "windows": rows, "cpu_ratio_last_first": cpu_ratio,
        "events": events, "snapshot_bytes": snapshot_bytes, "activation_ms": activations,
        "rss_kib_per_turn": rss_per_turn_kib, "machine_reference_ms": reference})


if __name__ == "__main__":
    main()
