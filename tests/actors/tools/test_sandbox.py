"""The sandbox's command line and policies (actors/tools/sandbox.py); the escape suite in
tests/reliability/test_sandbox_escape.py attacks the real thing through a server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.replay.timeline import build_timeline
from sessionloop.actors.tools import ToolContext, ToolError, Workspace, default_registry
from sessionloop.actors.tools.sandbox import POLICIES, Sandbox, SandboxUnavailable, policy_at_most, policy_rank


def argv(sandbox: Sandbox, policy: str, ws: Path) -> list[str]:
    sandbox.bwrap = "/usr/bin/bwrap"
    return sandbox._bwrap_argv(policy, str(ws), str(ws), ["/bin/true"])


def pairs(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_the_data_directory_is_masked_before_the_workspace_inside_it_is_bound_back(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ws = data / "workspaces" / "s1"
    ws.mkdir(parents=True)
    args = argv(Sandbox(hidden=[str(data), str(data / "workspaces")]), "workspace-write", ws)
    assert args.index(str(data)) < args.index(str(data / "workspaces")) < args.index("--bind")
    assert pairs(args, "--bind") == [str(ws)]
    assert pairs(args, "--tmpfs") == ["/tmp", str(data), str(data / "workspaces")]


def test_a_hidden_path_inside_the_workspace_is_masked_after_the_bind(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "key").write_text("k")
    args = argv(Sandbox(hidden=[str(tmp_path / "secrets"), str(tmp_path / "key")]), "workspace-write", tmp_path)
    bind = args.index("--bind")
    assert args.index(str(tmp_path / "secrets")) > bind  # a tmpfs over the directory
    dev_null = [i for i, a in enumerate(args) if a == "/dev/null"]
    assert dev_null and dev_null[0] > bind and args[dev_null[0] + 1] == str(tmp_path / "key")  # a file: /dev/null


def test_read_only_binds_the_workspace_read_only_and_only_the_network_policy_shares_the_network(tmp_path: Path) -> None:
    sandbox = Sandbox()
    read_only = argv(sandbox, "read-only", tmp_path)
    assert pairs(read_only, "--ro-bind")[-1] == str(tmp_path) and "--bind" not in read_only
    for policy in ("read-only", "workspace-write"):
        assert "--share-net" not in argv(sandbox, policy, tmp_path)
    assert "--share-net" in argv(sandbox, "workspace-write+network", tmp_path)
    every = argv(sandbox, "workspace-write", tmp_path)
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
                 "--clearenv"):
        assert flag in every
    assert every[every.index("--cap-drop") + 1] == "ALL"


def test_the_environment_of_a_command_holds_nothing_of_the_servers_but_path(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SESSIONLOOP_TOKEN", "secret-token")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    args = argv(Sandbox(), "workspace-write", tmp_path)
    names = pairs(args, "--setenv")
    assert set(names) == {"PATH", "HOME", "TMPDIR", "LANG", "TERM", "NO_COLOR", "PAGER", "GIT_PAGER"}
    assert "secret-token" not in args and "sk-secret" not in args


def test_policies_are_ordered_from_read_only_to_full_access() -> None:
    assert [policy_rank(p) for p in POLICIES] == [0, 1, 2, 3]
    assert policy_at_most("read-only", "workspace-write")
    assert not policy_at_most("danger-full-access", "workspace-write")
    with pytest.raises(ValueError, match="unknown sandbox policy 'root'"):
        policy_rank("root")


def test_a_call_decided_under_one_sandbox_mode_is_not_run_under_the_other(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="does not run: the command was not run"):
        Sandbox("bwrap").prepare("none", "true", str(tmp_path), str(tmp_path))
    with pytest.raises(ToolError, match="does not run"):
        Sandbox("none").prepare("workspace-write", "true", str(tmp_path), str(tmp_path))


def test_exec_refuses_with_the_cause_when_bubblewrap_cannot_be_started(tmp_path: Path) -> None:
    sandbox = Sandbox("bwrap", bwrap=str(tmp_path / "missing-bwrap"))
    with pytest.raises(SandboxUnavailable, match="bubblewrap cannot be started"):
        sandbox.prepare("workspace-write", "true", str(tmp_path), str(tmp_path))
    outcome = asyncio.run(default_registry().execute(
        "exec", {"command": "touch ran"}, ToolContext(workspace=Workspace(tmp_path), sandbox=sandbox)))
    assert outcome.is_error and "exec is unavailable" in outcome.output["error"]
    assert not (tmp_path / "ran").exists()


def test_the_policy_a_command_ran_under_is_in_its_event_and_in_replay(open_host) -> None:
    host = open_host(permission_mode="acceptCalls", sandbox_policy="read-only")
    session = host.create(title="policy")
    session.run('!tool exec {"command": "true"}')
    started = [r.event for r in session.events() if isinstance(r.event, E.ToolStarted)]
    assert [e.display.sandbox for e in started] == ["read-only"]
    (tool,) = [e for e in build_timeline(session.id, list(session.events())).entries if e.kind == "tool"]
    assert tool.facts["sandbox"] == "read-only"
