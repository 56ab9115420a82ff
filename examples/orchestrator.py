"""Planner -> Worker -> Writer, the multi-agent pattern of seed 000, on the mock model.

A bot app owns a planner session. The planner's model calls one tool, ``fan_out``, whose
execution (1) splits the job into tasks, (2) creates one background worker session per task,
in parallel, with ``context='caller'`` (each inherits the planner's cwd, model and policy and
becomes its child), (3) waits for all of them with ``wait_for_turn``, then (4) hands the
collected results to a writer session and returns its summary.

    python examples/orchestrator.py [DATA_DIR]

With the mock model a worker answers ``echo: <task>`` and the writer echoes what it was given,
so the output is deterministic.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from typing import Any

from sessionloop.actors.api.host import Host
from sessionloop.actors.tools import ToolSpec

JOB_TASKS = ["list the risks", "estimate the cost", "draft the timeline"]


def fan_out_tool(host: Host) -> ToolSpec:
    loop = host.async_sessions(app="orchestrator")

    async def fan_out(args: dict[str, Any], ctx: Any) -> dict[str, Any]:
        job_id = args.get("jobId", ctx.call_id)

        async def work(i: int, task: str) -> str:
            s = await loop.create(container_id="workers", activity="background", context="caller",
                                  initial_message={"text": task, "idempotencyKey": f"job-{job_id}-{i}"})
            r = await loop.wait_for_turn(s.session_id, s.turn_id, timeout_ms=300_000)
            return r.output_text if r.state == "completed" else f"task {i} failed"

        results = await asyncio.gather(*(work(i, t) for i, t in enumerate(args["tasks"])))
        report = "\n".join(f"- {r}" for r in results)
        writer = await loop.create(container_id="workers", activity="background", context="caller",
                                   initial_message={"text": f"Summarise:\n{report}",
                                                    "idempotencyKey": f"job-{job_id}-writer"})
        summary = await loop.wait_for_turn(writer.session_id, writer.turn_id, timeout_ms=300_000)
        return {"results": results, "summary": summary.output_text}

    return ToolSpec(name="fan_out", description="Run tasks in parallel worker sessions and summarise.",
                    parameters={"type": "object", "required": ["tasks"],
                                "properties": {"tasks": {"type": "array"}, "jobId": {"type": "string"}}},
                    handler=fan_out)


def main(data_dir: str) -> dict[str, Any]:
    with Host.open(data_dir, durability="nosync") as host:
        host.register_app("orchestrator", platform="demo", containers=["inbox", "workers"])
        host.rt.tools.register(fan_out_tool(host))
        bot = host.sessions(app="orchestrator")
        planner = bot.create(container_id="inbox", title="Planner", activity="background")
        directive = "!tool fan_out " + json.dumps({"tasks": JOB_TASKS, "jobId": "job-1"})
        receipt = bot.send(planner.session_id, directive, idempotency_key="job-1")
        result = bot.wait_for_turn(planner.session_id, receipt.turn_id, timeout_ms=300_000)
        tool_output = json.loads(next(m.content for m in host.session(planner.session_id).snapshot().messages
                                      if m.role == "tool"))
        children = [s for s in host.list() if s.parent_id == planner.session_id]
        return {"planner": result.output_text, "workers": tool_output["results"], "summary": tool_output["summary"],
                "children": len(children)}


if __name__ == "__main__":
    out = main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="orchestrator-"))
    print(json.dumps(out, indent=2))
