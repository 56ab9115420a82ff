"""Before and after: ``bench_turns.py``'s throughput job from two checkouts, side by side.

    python benchmarks/ab_turns.py --before /work/main              # this checkout is "after"
    python benchmarks/ab_turns.py --before ../old --after . --observe none,subscriber --repeats 4

The machine is shared and its speed drifts, so two checkouts compare only when measured in one
run: every repeat runs each (checkout, observers, durability, pinning) once, in that interleaved
order, each job a fresh child process of that checkout's ``benchmarks/bench_turns.py --child``
(its own code: the child puts its checkout first on ``sys.path``), closed loop, 1,000 sessions x
10 turns by default. A checkout whose ``bench_turns.py`` has no observers ignores ``observe``
(nobody watches: what it measured before) and runs once per repeat. Medians are printed per
column, with the machine reference (``benchmarks.measure.machine_reference_ms``) before and after.
Writes ``benchmarks/results/ab_turns.json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.measure import machine_reference_ms, run_job, write_results

KEYS = [("turns_per_s", "turns/s", ",.0f"), ("p50_ms", "p50 (ms)", ",.1f"), ("p99_ms", "p99 (ms)", ",.1f"),
        ("cpu_ms_per_turn", "CPU ms/turn", ".3f"), ("observed_deltas_per_turn", "deltas seen/turn", ".2f")]


def knows_observers(checkout: str) -> bool:
    with open(os.path.join(checkout, "benchmarks", "bench_turns.py")) as f:
        return '"observe"' in f.read()


def columns(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(label, checkout, observe) of every column."""
    out = []
    for name, checkout in (("before", args.before), ("after", args.after)):
        modes = args.observe if knows_observers(checkout) else ["none"]
        out += [(f"{name}/{mode}", checkout, mode) for mode in modes]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the checkout measured as before")
    ap.add_argument("--after", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the checkout measured as after (default: this one)")
    ap.add_argument("--observe", default="none,subscriber", help="observer modes of a checkout that has them")
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--durability", default="nosync,sync")
    ap.add_argument("--no-pinned", action="store_true", help="skip the runs pinned to CPU 0")
    args = ap.parse_args()
    args.observe = [m for m in args.observe.split(",") if m]
    cols = columns(args)
    pins = [("unpinned", False)] + ([("pinned", True)] if not args.no_pinned and shutil.which("taskset") else [])
    durabilities = [d for d in args.durability.split(",") if d]
    base = {"job": "throughput", "sessions": args.sessions, "turns": args.turns, "llm_latency_ms": 0.0,
            "threads": None, "rate": None}
    samples: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    reference_before = machine_reference_ms()
    for r in range(args.repeats):
        for durability in durabilities:
            for pin, pinned in pins:
                for label, checkout, observe in cols:
                    spec = {**base, "durability": durability, "observe": observe}
                    out = run_job(os.path.join(checkout, "benchmarks", "bench_turns.py"), spec, pinned=pinned,
                                  cwd=checkout, label=f"{label} {durability} {pin}")
                    samples.setdefault((durability, pin, label), []).append(out)
                    print(f"repeat {r + 1}: {label:<18} {durability:<6} {pin:<8} {out['turns_per_s']:>8,.0f} turns/s "
                          f"p99 {out['p99_ms']:6.1f} ms  cpu {out['cpu_ms_per_turn']:.3f} ms/turn", flush=True)
    reference = {"before": reference_before, "after": machine_reference_ms()}
    table: dict[str, Any] = {}
    for (durability, pin, label), runs in samples.items():
        table.setdefault(f"{durability} {pin}", {})[label] = {
            key: statistics.median(run.get(key, 0.0) for run in runs) for key, _, _ in KEYS}
        table[f"{durability} {pin}"][label]["samples"] = [run["turns_per_s"] for run in runs]
    for group, by_label in table.items():
        print(f"\n{group} (medians of {args.repeats})")
        print(f"{'':<20}" + "".join(f"{name:>18}" for _, name, _ in KEYS))
        for label, row in by_label.items():
            print(f"{label:<20}" + "".join(f"{format(row[key], fmt):>18}" for key, _, fmt in KEYS))
    print(f"\nmachine reference: {reference['before']:.2f} ms before, {reference['after']:.2f} ms after")
    write_results("ab_turns", {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "before": os.path.abspath(args.before),
                               "after": os.path.abspath(args.after), "params": vars(args) | {"observe": args.observe},
                               "machine_reference_ms": reference, "medians": table})


if __name__ == "__main__":
    main()
