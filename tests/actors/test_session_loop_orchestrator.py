"""The Planner -> Worker -> Writer pattern of seed 000 works, as shown in examples/orchestrator.py."""

from __future__ import annotations

import importlib.util
import os

from actors.host import Host
from tests.conftest import REPO


def load_example():
    spec = importlib.util.spec_from_file_location("orchestrator", os.path.join(REPO, "examples", "orchestrator.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_orchestrator_example_fans_out_to_background_children_and_summarises(tmp_path):
    example = load_example()
    out = example.main(str(tmp_path / "data"))
    assert out["planner"] == "done: 1 tool calls"
    assert out["workers"] == [f"echo: {t}" for t in example.JOB_TASKS]
    assert out["summary"].startswith("echo: Summarise:") and "estimate the cost" in out["summary"]
    assert out["children"] == len(example.JOB_TASKS) + 1  # the workers and the writer


def test_children_made_with_context_caller_inherit_the_callers_policy_and_are_tasks(tmp_path):
    example = load_example()
    data = str(tmp_path / "data")
    example.main(data)
    with Host.open(data, durability="nosync") as host:
        sessions = host.list()
        planner = next(s for s in sessions if s.title == "Planner")
        children = [s for s in sessions if s.parent_id == planner.id]
        assert {c.kind for c in children} == {"task"}
        for child in children:
            created = host.session(child.id).events()[0].event
            assert (created.activity, created.permission_mode, created.app_id) == ("background", "acceptCalls",
                                                                                    "orchestrator")


def test_spawn_session_runs_a_task_in_a_child_of_an_owner_session(open_host):
    host = open_host(permission_mode="acceptCalls")
    s = host.create()
    assert s.run('!tool spawn_session {"task": "sub job"}').output_text == "done: 1 tool calls"
    [child] = [c for c in host.list() if c.parent_id == s.id]
    assert child.kind == "task"
    tool_result = [m.content for m in s.snapshot().messages if m.role == "tool"][0]
    assert '"outputText":"echo: sub job"' in tool_result
