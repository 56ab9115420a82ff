"""An app's manifest bounds what its sessions may do (actors/settings/apps.py; SPEC §7 who may change what)."""

from __future__ import annotations

import pytest

from sessionloop.actors.errors import Forbidden, InvalidCommand
from sessionloop.actors.session.commands import AgentConfigOf
from sessionloop.actors.session.messages import Ask
from sessionloop.actors.settings.apps import AppManifest, clamp_mode, clamp_policy
from tests.actors.gateway_harness import MemoryClient

ASK_ONLY = AppManifest(id="a", permission_modes=["ask"], sandbox="read-only")


def test_a_mode_above_the_manifest_comes_down_to_the_nearest_allowed_one() -> None:
    assert clamp_mode("acceptCalls", ASK_ONLY) == "ask"
    assert clamp_mode("acceptCalls", AppManifest(id="a", permission_modes=["deny"])) == "deny"
    assert clamp_mode("deny", ASK_ONLY) == "ask"  # nothing listed below deny: the most restrictive listed
    assert clamp_mode("ask", AppManifest(id="a")) == "ask"


def test_a_sandbox_policy_wider_than_the_manifest_comes_down_to_its_ceiling() -> None:
    assert clamp_policy("danger-full-access", ASK_ONLY) == "read-only"
    assert clamp_policy("workspace-write+network", AppManifest(id="a")) == "workspace-write"
    assert clamp_policy("read-only", AppManifest(id="a")) == "read-only"


def test_a_manifest_with_an_unknown_mode_or_policy_is_refused_naming_the_app(open_host) -> None:
    host = open_host()
    with pytest.raises(InvalidCommand, match="app 'bad': permission_modes"):
        host.register_app("bad", permission_modes=["root"])
    with pytest.raises(InvalidCommand, match="app 'bad': sandbox must be one of"):
        host.register_app("bad", sandbox="everything")


def effective(host, session_id: str) -> tuple[str, str]:
    """The (permission mode, sandbox policy) the session's agent runs with now."""
    cfg = host.rt.ask(session_id, lambda r: Ask(AgentConfigOf(), r))
    return cfg.permission_mode, cfg.sandbox


@pytest.fixture
def limited(open_host):
    host = open_host()
    host.register_app("bot", platform="im", containers=["inbox"], permission_modes=["ask", "deny"],
                      sandbox="read-only")
    return host


def test_creating_a_session_in_a_mode_the_manifest_does_not_list_is_forbidden(limited) -> None:
    with pytest.raises(Forbidden, match="may not create sessions in permission mode 'acceptCalls'"):
        limited.sessions(app="bot").create(container_id="inbox", permission_mode="acceptCalls")
    assert limited.list() == []  # nothing was created


def test_a_background_session_of_a_limited_app_asks_instead_of_accepting_calls(limited) -> None:
    created = limited.sessions(app="bot").create(container_id="inbox", activity="background")
    assert effective(limited, created.session_id) == ("ask", "read-only")
    session = limited.session(created.session_id)
    session.run('!tool exec {"command": "touch x"}')
    (call,) = session.snapshot().tool_calls.values()
    assert call.settlement.source == "absent" and call.status == "denied"  # asked (nobody there), not run


def test_the_owners_layers_cannot_lift_an_apps_session_above_its_manifest(limited) -> None:
    created = limited.sessions(app="bot").create(container_id="inbox")
    svc = limited.protocol()
    owner = MemoryClient(svc)
    for key, value in (("permissionMode", "acceptCalls"), ("sandbox", "danger-full-access")):
        owner.result("session/config/update", {"sessionId": created.session_id, "plugin": "tools", "key": key,
                                               "value": value})
    assert effective(limited, created.session_id) == ("ask", "read-only")


@pytest.mark.parametrize(("key", "value"), [("permissionMode", "acceptCalls"), ("sandbox", "workspace-write"),
                                            ("sandbox", "danger-full-access")])
def test_an_app_raising_its_own_session_beyond_its_manifest_is_forbidden_and_nothing_changes(limited, key, value):
    created = limited.sessions(app="bot").create(container_id="inbox")
    svc = limited.protocol()
    app = MemoryClient(svc, app_id="bot")
    before = limited.store.stream_version(f"session-{created.session_id}")
    reply = app.call("session/config/update", {"sessionId": created.session_id, "plugin": "tools", "key": key,
                                               "value": value})
    assert reply["error"]["data"]["code"] == "forbidden" and "its manifest allows" in reply["error"]["message"]
    assert limited.store.stream_version(f"session-{created.session_id}") == before
    ok = app.call("session/config/update", {"sessionId": created.session_id, "plugin": "tools",
                                            "key": "permissionMode", "value": "deny"})
    assert "result" in ok  # within the manifest: allowed


def test_the_sessions_of_an_app_no_longer_registered_may_run_no_tool_that_needs_approval(open_host) -> None:
    host = open_host()
    host.register_app("gone", containers=["inbox"])
    created = host.sessions(app="gone").create(container_id="inbox", activity="background")
    assert effective(host, created.session_id) == ("acceptCalls", "workspace-write")
    host.close()
    reopened = open_host()  # the app is not registered again (removed from apps.toml)
    assert effective(reopened, created.session_id) == ("deny", "read-only")
