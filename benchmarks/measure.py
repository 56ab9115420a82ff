"""What every benchmark measures the same way: a machine-wide clock, percentiles, and a process's
CPU time and memory read from /proc (so a server in another process can be measured too); and
what every benchmark does the same way with its options and its results file."""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from typing import Any

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def now() -> float:
    """CLOCK_MONOTONIC in seconds: one clock for every process of the machine."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of already sorted values; NaN when there are none."""
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (from /proc); NaN once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def proc_rss_mib(pid: int) -> float:
    """Resident memory of a process in MiB (from /proc); NaN once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def rss_peak_mib() -> float:
    """Peak resident memory of this process in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def fill_defaults(args: argparse.Namespace, table: list[tuple[str, Any, Any]]) -> None:
    """Each ``(option, full-run default, --quick default)`` the command line left unset."""
    for name, full, quick in table:
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)


def write_results(name: str, results: dict[str, Any]) -> str:
    """``results`` to ``benchmarks/results/<name>.json`` (printed, returned)."""
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{name}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nwrote {path}")
    return path
