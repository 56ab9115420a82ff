"""What every benchmark measures the same way: a machine-wide clock, percentiles, and a process's
CPU time and memory read from /proc (so a server in another process can be measured too); and
what every benchmark does the same way with its options and its results file."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
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


class _Item:
    __slots__ = ("key", "n")

    def __init__(self, key: str, n: int) -> None:
        self.key, self.n = key, n


def reference_work(rounds: int = 100_000) -> int:
    """A fixed single-threaded pure-Python workload of the kinds a turn is made of (small objects,
    attribute and dict access, calls, string formatting); returns a checksum so the work stays."""
    table: dict[str, _Item] = {}
    total = 0
    for i in range(rounds):
        key = f"s{i % 512}"
        item = table.get(key)
        if item is None:
            item = table[key] = _Item(key, 0)
        item.n += i & 7
        total += len(item.key) + item.n % 3
    return total + len(table)


def machine_reference_ms(repeats: int = 7) -> float:
    """Milliseconds :func:`reference_work` takes in this process now, best of ``repeats``.

    The machine is shared and its speed drifts (the same code has measured 4,000 and 6,500
    turns/s on one day): printed beside a run's figures, this tells a slow machine from a slow
    change. Only runs whose references are close compare directly."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        reference_work()
        best = min(best, time.perf_counter() - started)
    return best * 1000


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (from /proc); NaN once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def proc_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (``/proc/<pid>/task/<tid>/children``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return out


def proc_tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and the processes below it now (``serve --workers``:
    the supervisor, its workers and nats-server)."""
    return sum(c for c in (proc_cpu_s(p) for p in proc_tree(pid)) if c == c)


def proc_tree_switches(pid: int) -> int:
    """Voluntary context switches so far of every live thread of ``pid`` and the processes below
    it (``/proc/<p>/task/<tid>/status``): a thread blocks once each time it waits for another's
    hand-off, so this counts a turn's hand-offs between threads. A thread that ended is not counted."""
    total = 0
    for p in proc_tree(pid):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/status") as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches:"):
                            total += int(line.split()[1])
                            break
            except OSError:
                continue
    return total


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


def run_job(script: str, spec: dict[str, Any], *, pinned: bool = False, cwd: str | None = None,
            label: str | None = None, taskset: bool | None = None) -> dict[str, Any]:
    """One job of a benchmark in a fresh process, ``python SCRIPT --child SPEC`` (under ``taskset
    -c 0`` when ``pinned``, or as ``taskset`` says for a job that pins what it spawns instead);
    its result is the JSON of its last stdout line. A failed job fails the benchmark loudly, with
    the tail of the child's stderr and ``label`` (default: the command)."""
    cmd = [sys.executable, os.path.abspath(script), "--child", json.dumps(spec)]
    if pinned if taskset is None else taskset:
        cmd = ["taskset", "-c", "0", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False, cwd=cwd)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-6000:])
        raise SystemExit(f"FAILED: {label or ' '.join(cmd)}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


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
