"""What the sandbox costs per ``exec`` (SPEC §7), against a plain subprocess, in one run.

    python benchmarks/bench_sandbox.py            # 300 commands per variant, interleaved
    python benchmarks/bench_sandbox.py --quick    # 40 per variant

Each command is ``exec``'s real path (:func:`actors.tools.builtin.exec_command` through the tool
registry on an asyncio loop: workspace checks, the launch, the output reader, the exit) running
``true``, so what is timed is the start and end of a command, not the command. Variants, run in
interleaved rounds (one command of each per round, the order rotated) so the shared machine's
drift falls on all of them alike:

* ``plain``: ``/bin/sh -c`` as exec ran it before the sandbox (the server's environment, no limits);
* ``limits only``: ``--sandbox none``: ``prlimit`` and a scrubbed environment, no namespaces;
* ``bwrap``: the default ``workspace-write`` sandbox (namespaces, mounts, limits; as root, a pids
  cgroup per command);
* ``bwrap+network``: ``workspace-write+network`` (no network namespace to make).

Reported: p50 / p99 / mean milliseconds per command and the ratio of each p50 to ``plain``'s.
Unpinned and pinned to one CPU (``taskset -c 0``), each in a fresh process. Prints a table and
writes ``benchmarks/results/sandbox.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.measure import fill_defaults, machine_reference_ms, now, percentile, run_job, write_results  # noqa: E402
from sessionloop.actors.tools import ToolContext, Workspace, default_registry  # noqa: E402
from sessionloop.actors.tools.sandbox import ExecLimits, Launch, Sandbox  # noqa: E402

VARIANTS = ["plain", "limits only", "bwrap", "bwrap+network"]


class PlainSandbox(Sandbox):
    """exec as it ran before the sandbox: ``/bin/sh -c`` with the server's environment."""

    def prepare(self, policy: str, command: str, workspace: str, cwd: str) -> Launch:
        return Launch(argv=["/bin/sh", "-c", command], env=dict(os.environ), policy="plain")


def contexts(root: str) -> dict[str, ToolContext]:
    ws = Workspace(root)
    limits = ExecLimits()
    bwrap = Sandbox("bwrap", hidden=[os.path.dirname(root)], limits=limits)
    problem = bwrap.probe()
    if problem is not None:
        raise SystemExit(f"no sandbox here: {problem}")
    return {
        "plain": ToolContext(workspace=ws, sandbox=PlainSandbox("none")),
        "limits only": ToolContext(workspace=ws, sandbox=Sandbox("none", limits=limits), sandbox_policy="none"),
        "bwrap": ToolContext(workspace=ws, sandbox=bwrap, sandbox_policy="workspace-write"),
        "bwrap+network": ToolContext(workspace=ws, sandbox=bwrap, sandbox_policy="workspace-write+network"),
    }


async def measure(count: int) -> dict[str, list[float]]:
    registry = default_registry()
    with tempfile.TemporaryDirectory() as base:
        root = os.path.join(base, "ws")
        os.mkdir(root)
        ctxs = contexts(root)
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for v in VARIANTS:  # warm up: the first probe, imports, page cache
            await registry.execute("exec", {"command": "true"}, ctxs[v])
        for i in range(count):
            for v in VARIANTS[i % len(VARIANTS):] + VARIANTS[: i % len(VARIANTS)]:
                start = now()
                result = await registry.execute("exec", {"command": "true"}, ctxs[v])
                times[v].append((now() - start) * 1000)
                if result.is_error or result.output.get("exitCode") != 0:
                    raise SystemExit(f"{v}: exec failed: {result.output}")
        for ctx in ctxs.values():
            ctx.sandbox.close()
        return times


def child(spec: dict[str, Any]) -> None:
    times = asyncio.run(measure(spec["count"]))
    out = {}
    for v, values in times.items():
        values.sort()
        out[v] = {"p50": percentile(values, 0.5), "p99": percentile(values, 0.99), "mean": statistics.fmean(values)}
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--count", type=int, default=None, help="commands per variant")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(json.loads(args.child))
        return
    fill_defaults(args, [("count", 300, 40)])
    reference = machine_reference_ms()
    results: dict[str, Any] = {"count": args.count, "machine_reference_ms": reference, "runs": {}}
    print(f"exec of `true`, {args.count} per variant, interleaved (machine reference {reference:.1f} ms)\n")
    print(f"{'':14} {'variant':14} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'p50 / plain':>12}")
    for pinned in (False, True):
        label = "pinned" if pinned else "unpinned"
        run = run_job(__file__, {"count": args.count}, pinned=pinned, label=f"bench_sandbox {label}")
        results["runs"][label] = run
        for v in VARIANTS:
            r = run[v]
            print(f"{label:14} {v:14} {r['p50']:8.2f} {r['p99']:8.2f} {r['mean']:8.2f} "
                  f"{r['p50'] / run['plain']['p50']:11.2f}x")
    write_results("sandbox", results)


if __name__ == "__main__":
    main()
