"""Planner -> Worker -> Writer over the wire: a bot drives a pipeline of sessions through
``sessionloop.client``, against a running server (the mock model, or a real one).

The bot (1) asks a planner session for the plan of a job, (2) hands each step to a worker session
of its own, all at once, (3) waits for every worker, then (4) gives the results to a writer session
and prints its summary. Every session is created with its first message and a key derived from the
job id, so running the script again for the same job creates nothing and answers the same results
(``loop/create`` with the same initial key is the same session): a bot that crashed half-way just
runs again. The client reconnects by itself if the server restarts meanwhile.

    # DATA/apps.toml of the server (then start it, or send it SIGHUP):
    [apps.pipeline]
    token = "pipeline-token-replace-with-32-or-more-characters"
    containers = ["inbox", "workers"]

    SESSIONLOOP_TOKEN=pipeline-token-replace-with-32-or-more-characters python examples/pipeline.py [URL] [JOB]

With the mock model the planner echoes the job back (``echo: Plan:`` then one step a line), each
worker answers ``echo: <step>`` and the writer echoes what it was given, so the output is
deterministic.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from sessionloop.client import AsyncClient

JOB_STEPS = ["list the risks", "estimate the cost", "draft the timeline"]
DEFAULT_URL = "ws://127.0.0.1:8765/session"


async def run_pipeline(url: str, token: str, job: str = "job-1", steps: list[str] = JOB_STEPS) -> dict[str, Any]:
    async with AsyncClient(url, token, client_name="pipeline-example") as bot:

        async def session_answer(title: str, container: str, text: str, key: str) -> tuple[str, str]:
            made = await bot.create(container_id=container, title=title, activity="background",
                                    initial_message={"text": text, "idempotency_key": f"{job}-{key}"})
            assert made.turn_id is not None  # a create with a first message names its turn
            result = await bot.wait_for_turn(made.session_id, made.turn_id, timeout_ms=300_000)
            if result.state != "completed":
                raise RuntimeError(f"{title} ({made.session_id}) did not complete: {result.state} {result.message}")
            return made.session_id, result.output_text or ""

        planner, plan = await session_answer("Planner", "inbox", "Plan:\n" + "\n".join(steps), "plan")
        tasks = [line.strip() for line in plan.removeprefix("echo: ").splitlines()[1:] if line.strip()]
        workers = await asyncio.gather(*(session_answer(f"Worker {i + 1}", "workers", task, f"work-{i}")
                                         for i, task in enumerate(tasks)))
        report = "\n".join(f"- {answer}" for _, answer in workers)
        writer, summary = await session_answer("Writer", "workers", f"Summarise:\n{report}", "write")
        return {"planner": planner, "plan": tasks, "workers": [answer for _, answer in workers],
                "writer": writer, "summary": summary}


def main() -> None:
    token = os.environ.get("SESSIONLOOP_TOKEN")
    if not token:
        sys.exit("set SESSIONLOOP_TOKEN to the app's token (see this file's docstring)")
    url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SESSIONLOOP_URL", DEFAULT_URL)
    job = sys.argv[2] if len(sys.argv) > 2 else "job-1"
    print(json.dumps(asyncio.run(run_pipeline(url, token, job)), indent=2))


if __name__ == "__main__":
    main()
