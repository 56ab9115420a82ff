"""The tool registry, the workspace confinement and the built-in tools (SPEC §4 "Tools", §7)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from sessionloop.actors.events import PlanEntry, ToolDisplay
from sessionloop.actors.tools import (
    ToolContext,
    ToolError,
    ToolRegistry,
    ToolResult,
    ToolSpec,
    Workspace,
    builtin,
    builtin_tools,
    default_registry,
    plan_from_output,
)
from tests.conftest import wait_no_process_with_arg


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "src").mkdir()
    (ws / "src" / "main.py").write_text("print('hi')\n")
    (ws / "README").write_text("readme")
    (tmp_path / "secret.txt").write_text("top secret")
    return ws


@pytest.fixture()
def ws(root: Path) -> Workspace:
    return Workspace(root)


def call(name: str, args: Any, ctx: ToolContext) -> ToolResult:
    return run(default_registry().execute(name, args, ctx))


def process_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")  # a zombie is dead, only not reaped
    except FileNotFoundError:
        return True


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process_gone(pid):
            return True
        time.sleep(0.02)
    return False


# --- workspace confinement ----------------------------------------------------------------------


def test_a_relative_path_resolves_inside_the_workspace(ws: Workspace, root: Path) -> None:
    assert ws.resolve("src/main.py") == root / "src" / "main.py"
    assert ws.relative("src/../README") == "README"
    assert ws.relative(".") == "."


def test_a_path_escaping_with_dotdot_is_refused(ws: Workspace) -> None:
    with pytest.raises(ToolError, match=r"path '\.\./secret\.txt' is outside the workspace"):
        ws.resolve("../secret.txt")
    with pytest.raises(ToolError, match="outside the workspace"):
        ws.resolve("src/../../secret.txt")


def test_an_absolute_path_outside_the_workspace_is_refused(ws: Workspace) -> None:
    with pytest.raises(ToolError, match=r"path '/etc/passwd' is outside the workspace"):
        ws.resolve("/etc/passwd")


def test_an_absolute_path_inside_the_workspace_is_accepted(ws: Workspace, root: Path) -> None:
    assert ws.relative(str(root / "src" / "main.py")) == "src/main.py"


def test_a_symlink_pointing_outside_is_refused(ws: Workspace, root: Path) -> None:
    (root / "link").symlink_to(root.parent / "secret.txt")
    (root / "outdir").symlink_to(root.parent)
    with pytest.raises(ToolError, match="outside the workspace"):
        ws.resolve("link")
    with pytest.raises(ToolError, match="outside the workspace"):
        ws.resolve("outdir/new-file.txt")


def test_a_symlink_inside_the_workspace_is_followed(ws: Workspace, root: Path) -> None:
    (root / "alias").symlink_to(root / "src")
    assert ws.relative("alias/main.py") == "src/main.py"


def test_a_symlink_loop_is_refused_with_a_clear_error(ws: Workspace, root: Path) -> None:
    (root / "loop").symlink_to(root / "loop")
    try:
        resolved = ws.resolve("loop")
    except ToolError as e:
        assert "loop" in str(e)
    else:
        assert resolved.is_relative_to(root)  # newer Pythons resolve a loop without raising


def test_a_path_with_a_nul_character_is_refused(ws: Workspace) -> None:
    with pytest.raises(ToolError, match="NUL"):
        ws.resolve("a\x00b")


def test_the_refusal_names_the_given_path_not_the_servers_directories(ws: Workspace, root: Path) -> None:
    with pytest.raises(ToolError) as e:
        ws.resolve("../x")
    assert str(root) not in str(e.value)


def test_a_workspace_root_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Workspace(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        Workspace(tmp_path / "file", create=True)


def test_a_session_workspace_is_created_only_when_a_tool_writes(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "later", create=True)
    ctx = ToolContext(workspace=ws)
    listed = call("list_files", {}, ctx)
    assert not listed.is_error and listed.output == {"path": ".", "entries": [], "truncated": False}
    missing = call("read_file", {"path": "a.txt"}, ctx)
    assert missing.is_error and "does not exist" in missing.output["error"]
    assert not ws.exists()
    assert not call("write_file", {"path": "a.txt", "content": "hi"}, ctx).is_error
    assert ws.exists() and (tmp_path / "later" / "a.txt").read_text() == "hi"


def test_exec_creates_a_missing_session_workspace(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "later", create=True)
    result = call("exec", {"command": "pwd"}, ToolContext(workspace=ws))
    assert not result.is_error and ws.exists()
    assert result.output["output"].strip() == str(ws.root)


def test_file_tools_refuse_paths_outside_the_workspace(ws: Workspace) -> None:
    ctx = ToolContext(workspace=ws)
    for name, args in [
        ("read_file", {"path": "../secret.txt"}),
        ("list_files", {"path": "/"}),
        ("write_file", {"path": "../evil.txt", "content": "x"}),
        ("exec", {"command": "pwd", "cwd": ".."}),
    ]:
        outcome = call(name, args, ctx)
        assert outcome.is_error and "outside the workspace" in outcome.output["error"], name
    assert not (ws.root.parent / "evil.txt").exists()


# --- the registry -------------------------------------------------------------------------------


async def echo_handler(args: dict[str, Any], ctx: ToolContext) -> Any:
    return {"got": args}


ECHO = ToolSpec(
    name="echo",
    description="echo",
    handler=echo_handler,
    parameters={
        "type": "object",
        "properties": {"n": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["n"],
        "additionalProperties": False,
    },
)


def test_schemas_for_the_model_list_every_tool_in_order() -> None:
    schemas = default_registry().schemas()
    assert [s["name"] for s in schemas] == ["list_files", "read_file", "write_file", "exec", "update_plan"]
    assert set(schemas[0]) == {"name", "description", "parameters"}


def test_registering_two_tools_with_one_name_is_refused() -> None:
    registry = ToolRegistry([ECHO])
    with pytest.raises(ValueError, match="already registered"):
        registry.register(ECHO)
    registry.register(ECHO, replace=True)
    assert registry.names() == ["echo"] and "echo" in registry and len(registry) == 1


def test_an_unknown_tool_becomes_an_error_result_naming_the_available_ones(ws: Workspace) -> None:
    outcome = run(ToolRegistry([ECHO]).execute("nope", {}, ToolContext(workspace=ws)))
    assert outcome == ToolResult.error("unknown tool 'nope'; available: echo")


def test_validation_names_a_missing_required_field() -> None:
    with pytest.raises(ToolError, match="missing required field 'n'"):
        ToolRegistry([ECHO]).validate("echo", {})


def test_validation_names_a_field_of_the_wrong_type() -> None:
    with pytest.raises(ToolError, match="field 'n' must be integer, got string"):
        ToolRegistry([ECHO]).validate("echo", {"n": "1"})
    with pytest.raises(ToolError, match="field 'n' must be integer, got boolean"):
        ToolRegistry([ECHO]).validate("echo", {"n": True})
    with pytest.raises(ToolError, match=r"field 'tags\[1\]' must be string, got integer"):
        ToolRegistry([ECHO]).validate("echo", {"n": 1, "tags": ["a", 2]})


def test_validation_refuses_unknown_fields_only_when_the_schema_says_so() -> None:
    with pytest.raises(ToolError, match="unknown field 'x'"):
        ToolRegistry([ECHO]).validate("echo", {"n": 1, "x": 2})
    assert default_registry().validate("read_file", {"path": "a", "extra": 1}) == {"path": "a", "extra": 1}


def test_arguments_given_as_a_json_string_are_parsed() -> None:
    assert ToolRegistry([ECHO]).validate("echo", '{"n": 3}') == {"n": 3}
    with pytest.raises(ToolError, match="not valid JSON"):
        ToolRegistry([ECHO]).validate("echo", "{n: 3")
    with pytest.raises(ToolError, match="must be a JSON object, got array"):
        ToolRegistry([ECHO]).validate("echo", [1])


def test_invalid_arguments_become_an_error_result_not_an_exception(ws: Workspace) -> None:
    outcome = run(ToolRegistry([ECHO]).execute("echo", {"n": "x"}, ToolContext(workspace=ws)))
    assert outcome.is_error and outcome.output == {"error": "field 'n' must be integer, got string"}


def test_a_plain_return_value_is_wrapped_in_a_result(ws: Workspace) -> None:
    outcome = run(ToolRegistry([ECHO]).execute("echo", {"n": 1}, ToolContext(workspace=ws)))
    assert outcome == ToolResult(output={"got": {"n": 1}})


def test_a_bug_in_a_tool_becomes_an_error_result(ws: Workspace) -> None:
    async def broken(args: dict[str, Any], ctx: ToolContext) -> Any:
        raise KeyError("boom")

    spec = ToolSpec(name="broken", description="", parameters={"type": "object"}, handler=broken)
    outcome = run(ToolRegistry([spec]).execute("broken", {}, ToolContext(workspace=ws)))
    assert outcome.is_error and outcome.output == {"error": "broken failed: KeyError: 'boom'"}


def test_cancellation_propagates_out_of_execute(ws: Workspace) -> None:
    async def slow(args: dict[str, Any], ctx: ToolContext) -> Any:
        await asyncio.sleep(30)

    registry = ToolRegistry(
        [ToolSpec(name="slow", description="", parameters={"type": "object"}, handler=slow)]
    )

    async def scenario() -> None:
        task = asyncio.ensure_future(registry.execute("slow", {}, ToolContext(workspace=ws)))
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(scenario())


def test_the_tool_flags_match_the_spec() -> None:
    flags = {s.name: (s.needs_approval, s.can_background, s.display_kind) for s in builtin_tools()}
    assert flags == {
        "list_files": (False, False, None),
        "read_file": (False, False, None),
        "write_file": (True, False, "file-change"),
        "exec": (True, True, "command"),
        "update_plan": (False, False, None),
    }


def test_extra_tools_such_as_spawn_session_join_the_default_registry() -> None:
    spawn = ToolSpec(
        name="spawn_session", description="", parameters={"type": "object"}, handler=echo_handler
    )
    assert default_registry(extra=[spawn]).names()[-1] == "spawn_session"


# --- list_files / read_file ---------------------------------------------------------------------


def test_list_files_lists_sorted_entries_with_directories_marked(ws: Workspace) -> None:
    outcome = call("list_files", {"path": "."}, ToolContext(workspace=ws))
    assert outcome.output == {"path": ".", "entries": ["README", "src/"], "truncated": False}
    assert call("list_files", {}, ToolContext(workspace=ws)).output["entries"] == ["README", "src/"]


def test_list_files_of_a_missing_directory_or_a_file_is_an_error(ws: Workspace) -> None:
    assert call("list_files", {"path": "nope"}, ToolContext(workspace=ws)).output == {
        "error": "'nope' does not exist"
    }
    assert call("list_files", {"path": "README"}, ToolContext(workspace=ws)).output == {
        "error": "'README' is not a directory"
    }


def test_read_file_returns_the_content(ws: Workspace) -> None:
    outcome = call("read_file", {"path": "src/main.py"}, ToolContext(workspace=ws))
    assert outcome.output == {
        "path": "src/main.py",
        "size": 12,
        "truncated": False,
        "content": "print('hi')\n",
    }


def test_read_file_is_capped_in_size(ws: Workspace, root: Path) -> None:
    (root / "big.txt").write_text("z" * (builtin.READ_LIMIT + 10))
    outcome = call("read_file", {"path": "big.txt"}, ToolContext(workspace=ws))
    assert len(outcome.output["content"]) == builtin.READ_LIMIT and outcome.output["truncated"] is True


def test_read_file_reports_a_binary_file_without_its_bytes(ws: Workspace, root: Path) -> None:
    (root / "blob").write_bytes(b"\x00\x01\x02")
    assert call("read_file", {"path": "blob"}, ToolContext(workspace=ws)).output["binary"] is True


def test_read_file_of_a_missing_file_is_an_error(ws: Workspace) -> None:
    outcome = call("read_file", {"path": "nope.txt"}, ToolContext(workspace=ws))
    assert outcome.is_error and outcome.output == {"error": "'nope.txt' does not exist"}


# --- write_file ---------------------------------------------------------------------------------


def test_write_file_records_the_before_image_before_it_writes(ws: Workspace, root: Path) -> None:
    seen: list[tuple[str, str]] = []
    ctx = ToolContext(workspace=ws, record_before_image=lambda p: seen.append((p, (root / p).read_text())))
    outcome = call("write_file", {"path": "README", "content": "new"}, ctx)
    assert seen == [("README", "readme")]
    assert (root / "README").read_text() == "new"
    assert outcome.output == {"path": "README", "bytes": 3, "created": False}


def test_write_file_waits_for_an_asynchronous_before_image_callback(ws: Workspace, root: Path) -> None:
    seen: list[str] = []

    async def persist(path: str) -> None:
        await asyncio.sleep(0.02)
        seen.append((root / path).read_text())

    call(
        "write_file",
        {"path": "README", "content": "after"},
        ToolContext(workspace=ws, record_before_image=persist),
    )
    assert seen == ["readme"]


def test_write_file_creates_a_new_file_and_its_directories(ws: Workspace, root: Path) -> None:
    paths: list[str] = []
    outcome = call(
        "write_file",
        {"path": "a/b/c.txt", "content": "héllo"},
        ToolContext(workspace=ws, record_before_image=paths.append),
    )
    assert (root / "a" / "b" / "c.txt").read_text() == "héllo"
    assert outcome.output == {"path": "a/b/c.txt", "bytes": 6, "created": True}
    assert paths == ["a/b/c.txt"], "a new file is recorded too (it did not exist before)"


def test_write_file_outside_the_workspace_never_calls_the_before_image_callback(ws: Workspace) -> None:
    paths: list[str] = []
    call(
        "write_file",
        {"path": "../x", "content": ""},
        ToolContext(workspace=ws, record_before_image=paths.append),
    )
    assert paths == []


def test_write_file_to_a_directory_is_an_error(ws: Workspace) -> None:
    assert call("write_file", {"path": "src", "content": "x"}, ToolContext(workspace=ws)).output == {
        "error": "'src' is a directory"
    }


def test_write_file_displays_a_file_change_with_removed_and_added_text(ws: Workspace) -> None:
    spec = default_registry().get("write_file")
    assert spec.display({"path": "README", "content": "new"}, ws) == ToolDisplay(
        kind="file-change", path="README", removed="readme", added="new"
    )
    assert spec.display({"path": "fresh.txt", "content": "x"}, ws) == ToolDisplay(
        kind="file-change", path="fresh.txt", added="x"
    )


def test_a_display_that_cannot_be_built_is_none(ws: Workspace) -> None:
    assert default_registry().get("write_file").display({"path": "../x", "content": ""}, ws) is None


# --- exec ---------------------------------------------------------------------------------------


def test_exec_returns_the_exit_code_and_the_output(ws: Workspace) -> None:
    outcome = call("exec", {"command": "echo out; echo err >&2; exit 3"}, ToolContext(workspace=ws))
    assert outcome.output == {"exitCode": 3, "output": "out\nerr\n"}
    assert outcome.exit_code == 3 and not outcome.is_error


def test_exec_runs_in_the_workspace_or_in_cwd_inside_it(ws: Workspace, root: Path) -> None:
    assert call("exec", {"command": "pwd"}, ToolContext(workspace=ws)).output["output"] == f"{root}\n"
    assert (
        call("exec", {"command": "pwd", "cwd": "src"}, ToolContext(workspace=ws)).output["output"]
        == f"{root}/src\n"
    )
    assert call("exec", {"command": "pwd", "cwd": "README"}, ToolContext(workspace=ws)).output == {
        "error": "cwd 'README' is not a directory"
    }


def test_exec_streams_output_before_the_command_ends(ws: Workspace) -> None:
    async def scenario() -> None:
        first = asyncio.Event()
        chunks: list[str] = []

        def on_output(text: str) -> None:
            chunks.append(text)
            first.set()

        ctx = ToolContext(workspace=ws, on_output=on_output)
        task = asyncio.ensure_future(
            default_registry().execute("exec", {"command": "echo first; sleep 0.5; echo second"}, ctx)
        )
        await asyncio.wait_for(first.wait(), 5)
        assert not task.done() and "".join(chunks) == "first\n"
        outcome = await task
        assert "".join(chunks) == "first\nsecond\n" == outcome.output["output"]

    run(scenario())


def test_exec_returns_only_the_tail_of_a_long_output_but_streams_all_of_it(ws: Workspace) -> None:
    streamed: list[str] = []
    outcome = call(
        "exec",
        {"command": "yes 0123456789 | head -n 5000; echo END"},
        ToolContext(workspace=ws, on_output=streamed.append),
    )
    assert len(outcome.output["output"]) == builtin.OUTPUT_TAIL and outcome.output["output"].endswith("END\n")
    assert len("".join(streamed)) == 5000 * 11 + 4


def test_exec_killed_by_a_signal_reports_128_plus_the_signal(ws: Workspace) -> None:
    assert call("exec", {"command": "kill -9 $$"}, ToolContext(workspace=ws)).output["exitCode"] == 137


def test_exec_does_not_wait_for_children_left_in_the_background_and_the_sandbox_ends_them(ws: Workspace) -> None:
    marker = unique_seconds()
    start = time.monotonic()
    outcome = call("exec", {"command": f"sleep {marker} & echo started"}, ToolContext(workspace=ws))
    assert time.monotonic() - start < 5 and outcome.output["exitCode"] == 0
    # the shell was the sandbox's first process: its PID namespace ended with it
    assert wait_no_process_with_arg(marker)


def unique_seconds() -> str:
    """A ``sleep`` argument no other process has: 30 seconds and a unique fraction."""
    return f"30.{os.getpid()}{time.monotonic_ns() % 10**6:06d}"


def cancel_exec(ws: Workspace, command: str) -> None:
    """Start ``command`` (which prints a line once its children run), then cancel the call."""

    async def scenario() -> None:
        first_line = asyncio.Event()
        out: list[str] = []

        def on_output(text: str) -> None:
            out.append(text)
            if "\n" in "".join(out):
                first_line.set()

        task = asyncio.ensure_future(
            default_registry().execute(
                "exec", {"command": command}, ToolContext(workspace=ws, on_output=on_output)
            )
        )
        await asyncio.wait_for(first_line.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(scenario())


def test_cancelling_exec_kills_the_child_processes(ws: Workspace) -> None:
    marker = unique_seconds()
    cancel_exec(ws, f"sleep {marker} & echo started; wait")
    assert wait_no_process_with_arg(marker), "the child of the shell was killed with the sandbox"


def test_cancelling_exec_kills_a_child_that_ignores_sigterm(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(builtin, "KILL_GRACE_S", 0.2)
    marker = unique_seconds()
    cancel_exec(ws, f"trap '' TERM; sleep {marker} & echo started; wait")
    assert wait_no_process_with_arg(marker)


def test_exec_displays_the_command_and_takes_the_exit_code_from_the_result(ws: Workspace) -> None:
    spec = default_registry().get("exec")
    display = spec.display({"command": "make", "cwd": "src"}, ws)
    assert display == ToolDisplay(kind="command", command="make", cwd="src")
    # verbatim from the arguments (seed 004): no cwd when none was given, none when not a string
    assert spec.display({"command": "make"}, ws) == ToolDisplay(kind="command", command="make")
    assert spec.display({"command": "make", "cwd": "./src/../src"}, ws) == ToolDisplay(
        kind="command", command="make", cwd="./src/../src")
    assert spec.display({"command": ["make"]}, ws) is None
    done = spec.display_after(display, ToolResult(output={"exitCode": 2, "output": ""}))
    assert done == ToolDisplay(kind="command", command="make", cwd="src", exit_code=2)
    assert spec.display_result_key == "exitCode"


def test_exec_accepts_the_background_flag(ws: Workspace) -> None:
    assert (
        call("exec", {"command": "true", "background": True}, ToolContext(workspace=ws)).output["exitCode"]
        == 0
    )


# --- update_plan --------------------------------------------------------------------------------


def test_update_plan_returns_the_plan_for_the_plan_event(ws: Workspace) -> None:
    args = {
        "entries": [{"text": "read", "status": "completed"}, {"text": "fix", "status": "in_progress"}],
        "explanation": "half way",
    }
    outcome = call("update_plan", args, ToolContext(workspace=ws))
    assert outcome.output == args
    assert plan_from_output(outcome.output) == (
        [PlanEntry(text="read", status="completed"), PlanEntry(text="fix", status="in_progress")],
        "half way",
    )


def test_update_plan_refuses_an_unknown_status_naming_the_field(ws: Workspace) -> None:
    outcome = call("update_plan", {"entries": [{"text": "x", "status": "done"}]}, ToolContext(workspace=ws))
    assert outcome.is_error and "field 'entries[0].status' must be one of" in outcome.output["error"]


def test_a_session_workspace_under_a_real_parent_confines_like_a_resolved_one(tmp_path: Path) -> None:
    """``Workspace.child`` (the fast path for sessions' own directories) refuses what the full
    constructor refuses, and a session directory that is a symlink is resolved the full way."""
    parent = tmp_path / "workspaces"
    parent.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    ws = Workspace.child(str(parent), "s1")
    assert not ws.exists() and ws.root == parent / "s1"
    ws.ensure()
    (parent / "s1" / "link").symlink_to(outside)
    for bad in ("../s2", "/etc/passwd", "link/secret"):
        with pytest.raises(ToolError, match="outside the workspace"):
            ws.resolve(bad)
    assert ws.resolve("a/../b") == parent / "s1" / "b"
    (parent / "s2").symlink_to(outside)  # the session directory itself points elsewhere
    linked = Workspace.child(str(parent), "s2")
    assert linked.root == outside.resolve()
    assert linked.resolve("secret") == outside.resolve() / "secret"
    (parent / "s3").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        Workspace.child(str(parent), "s3")
