"""The examples that use sessionloop.client run against a real server: the bot of docs/bots.md and
the Planner -> Worker -> Writer pipeline (examples/pipeline.py), run twice for one job."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys

import pytest

from tests.client.conftest import BOT_TOKEN
from tests.conftest import REPO

pytestmark = pytest.mark.e2e


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "examples", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pipeline_runs_remote_and_a_second_run_of_the_job_answers_the_same_sessions(bot_server):
    pipeline = load("pipeline")
    first = asyncio.run(pipeline.run_pipeline(bot_server.url, BOT_TOKEN, "job-7"))
    again = asyncio.run(pipeline.run_pipeline(bot_server.url, BOT_TOKEN, "job-7"))
    assert first["plan"] == pipeline.JOB_STEPS
    assert first["workers"] == [f"echo: {step}" for step in pipeline.JOB_STEPS]
    assert first["summary"] == "echo: Summarise:\n" + "\n".join(f"- echo: {s}" for s in pipeline.JOB_STEPS)
    assert again == first  # the same keys: the same sessions and answers, nothing new


def test_the_pipeline_script_prints_its_result(bot_server):
    done = subprocess.run([sys.executable, os.path.join(REPO, "examples", "pipeline.py"), bot_server.url, "job-9"],
                          env={**os.environ, "SESSIONLOOP_TOKEN": BOT_TOKEN}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert '"summary": "echo: Summarise:' in done.stdout


def test_the_bot_example_gets_its_answer_and_the_conflict(bot_server, capsys):
    assert load("bot").main(bot_server.url, BOT_TOKEN) == "echo: What is the weather?"
    printed = capsys.readouterr().out
    assert "refused: conflict" in printed and "turn.completed" in printed
