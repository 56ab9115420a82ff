"""The Planner -> Worker -> Writer pattern of seed 000 works, as shown in examples/orchestrator.py,
and children made with context='caller' share the caller's directory, model and policy."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.api.host import Host
from sessionloop.actors.tools import ToolSpec
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


# --- context='caller' (seed 000: 继承调用方的 cwd、模型、策略) ------------------------------------

def directive(tool: str, **args) -> str:
    return f"!tool {tool} {json.dumps(args)}"


def tool_outputs(host, session_id: str) -> list[dict]:
    """The outputs of the session's finished tool calls, in order, as the model saw them."""
    return [json.loads(m.content) for m in host.session(session_id).snapshot().messages if m.role == "tool"]


def finished_calls(host, session_id: str) -> list:
    return [e.event for e in host.session(session_id).events() if isinstance(e.event, E.ToolFinished)]


def children_of(host, session_id: str) -> list:
    return [s for s in host.list() if s.parent_id == session_id]


@pytest.fixture
def app_host(open_host):
    host = open_host()
    host.register_app("mybot", platform="telegram", containers=["inbox", "workers"])
    return host


def run_turn(bot, session_id: str, text: str, key: str):
    receipt = bot.send(session_id, text, idempotency_key=key)
    result = bot.wait_for_turn(session_id, receipt.turn_id, timeout_ms=30_000)
    assert result.state == "completed", result
    return result


def test_a_caller_context_child_works_in_the_parents_default_workspace(app_host):
    """The parent has no explicit cwd, so its directory is its own default workspace; a child
    made from it with context='caller' must see that directory, not get an empty one of its own
    (seed 000: the child inherits the caller's cwd, to fork a side line of the same work)."""
    bot = app_host.sessions(app="mybot")
    parent = bot.create(container_id="inbox", activity="background").session_id
    run_turn(bot, parent, directive("write_file", path="notes.txt", content="from the parent"), "w")
    task = directive("read_file", path="notes.txt") + "\n" + directive("write_file", path="child.txt", content="hi")
    run_turn(bot, parent, directive("spawn_session", task=task), "spawn")
    [child] = children_of(app_host, parent)
    read, wrote = tool_outputs(app_host, child.id)
    assert read["content"] == "from the parent"
    assert wrote["created"] is True
    parent_dir = app_host.rt.workspace(app_host.session(parent).snapshot()).root
    assert (parent_dir / "child.txt").read_text() == "hi"  # the parent sees what the child wrote
    assert app_host.session(child.id).events()[0].event.cwd == str(parent_dir)


def test_a_spawned_child_of_an_owner_session_inherits_its_explicit_cwd_model_and_policy(open_host, tmp_path):
    """Policy is inherited with its effect: a parent in 'deny' must not get a child that may
    write (a background child would otherwise default to acceptCalls); the model is inherited
    as the one the child's model calls actually use."""
    host = open_host()
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "README").write_text("the project")
    parent = host.create(cwd=str(folder), model="mock-large", permission_mode="deny")
    task = directive("read_file", path="README") + "\n" + directive("write_file", path="new.txt", content="x")
    assert parent.run(directive("spawn_session", task=task)).state == "completed"
    [child] = children_of(host, parent.id)
    created = host.session(child.id).events()[0].event
    assert (created.kind, created.cwd, created.model, created.permission_mode) == (
        "task", os.path.realpath(folder), "mock-large", "deny")
    read, write = finished_calls(host, child.id)
    assert read.status == "completed" and read.output["content"] == "the project"
    assert write.status == "denied" and not (folder / "new.txt").exists()
    models = {e.event.model for e in host.session(child.id).events() if isinstance(e.event, E.LlmCompleted)}
    assert models == {"mock-large"}


def test_an_explicit_permission_mode_overrides_the_inherited_policy(app_host):
    """Inheritance is the default, not a lock: the bot that creates the child may say otherwise."""
    bot = app_host.sessions(app="mybot")
    parent = bot.create(container_id="inbox", permission_mode="deny").session_id

    async def make_children(args, ctx):
        inherited = await app_host.async_sessions(app="mybot").create(container_id="workers", context="caller")
        chosen = await app_host.async_sessions(app="mybot").create(container_id="workers", context="caller",
                                                                   permission_mode="acceptCalls")
        return {"inherited": inherited.session_id, "chosen": chosen.session_id}

    app_host.rt.tools.register(ToolSpec(name="make_children", description="", parameters={"type": "object"},
                                        handler=make_children))
    run_turn(bot, parent, directive("make_children"), "k")
    [made] = tool_outputs(app_host, parent)
    modes = {name: app_host.session(sid).events()[0].event.permission_mode for name, sid in made.items()}
    assert modes == {"inherited": "deny", "chosen": "acceptCalls"}


def test_a_session_an_app_creates_in_a_tool_without_context_caller_is_isolated(app_host):
    """Without context='caller' nothing is inherited (seed 000): the new session is no child and
    works in its own directory, so it cannot read the calling session's files."""
    bot = app_host.sessions(app="mybot")
    parent = bot.create(container_id="inbox", activity="background").session_id
    run_turn(bot, parent, directive("write_file", path="secret.txt", content="parent only"), "w")
    loop = app_host.async_sessions(app="mybot")

    async def open_room(args, ctx):
        made = await loop.create(container_id="workers", activity="background",
                                 initial_message={"text": args["task"], "idempotencyKey": ctx.call_id})
        await loop.wait_for_turn(made.session_id, made.turn_id, timeout_ms=30_000)
        return {"sessionId": made.session_id}

    app_host.rt.tools.register(ToolSpec(name="open_room", description="", parameters={"type": "object"},
                                        handler=open_room))
    run_turn(bot, parent, directive("open_room", task=directive("read_file", path="secret.txt")), "room")
    room = tool_outputs(app_host, parent)[-1]["sessionId"]
    created = app_host.session(room).events()[0].event
    assert (created.parent_id, created.kind, created.cwd) == (None, "room", "")
    [read] = finished_calls(app_host, room)
    assert read.status == "failed" and "parent only" not in json.dumps(read.output)
    room_dir = app_host.rt.workspace(app_host.session(room).snapshot()).root
    parent_dir = app_host.rt.workspace(app_host.session(parent).snapshot()).root
    assert room_dir != parent_dir and not (room_dir / "secret.txt").exists()


def test_spawn_session_refuses_a_title_or_task_over_its_bound_and_makes_no_child(open_host):
    host = open_host(permission_mode="acceptCalls")
    parent = host.create()
    parent.run(directive("spawn_session", task="sub job", title="t" * 1001))
    parent.run(directive("spawn_session", task="x" * 100_001))
    title_refused, task_refused = finished_calls(host, parent.id)
    assert title_refused.status == "failed" and "field 'title' is 1001 characters; at most 1000" in str(
        title_refused.output)
    assert task_refused.status == "failed" and "field 'task' is 100001 characters; at most 100000" in str(
        task_refused.output)
    assert children_of(host, parent.id) == []

