"""The built-in system prompt (actors.model.prompts): what the model receives when no layer sets
``agent/systemPrompt`` — the tools, the workspace named relatively, the sandbox policy and the
permission mode — and that the setting replaces it."""

from __future__ import annotations

from typing import Any

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.gateway.service import SessionProtocolService
from sessionloop.actors.model import MockProvider
from tests.actors.gateway_harness import MemoryClient


class RecordingProvider(MockProvider):
    """The mock, keeping every request it was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[Any] = []

    def answer_now(self, request: Any, on_delta: Any) -> Any:
        self.requests.append(request)
        return super().answer_now(request, on_delta)

    async def generate(self, request: Any, on_delta: Any) -> Any:
        self.requests.append(request)
        return await super().generate(request, on_delta)


@pytest.fixture
def world(open_host):
    made: list[SessionProtocolService] = []

    def make(**options: Any) -> tuple[Any, MemoryClient, RecordingProvider]:
        provider = RecordingProvider()
        host = open_host(provider=provider, **options)
        svc = host.protocol()
        made.append(svc)
        return host, MemoryClient(svc), provider

    yield make
    for svc in made:
        svc.close()


def system_sent(provider: RecordingProvider) -> E.Message:
    first = provider.requests[-1].messages[0]
    assert first.role == "system", provider.requests[-1].messages
    return first


def test_a_session_without_a_prompt_tells_the_model_its_tools_workspace_and_sandbox(world):
    host, _, provider = world(permission_mode="ask")
    host.create().run("hi")
    prompt = system_sent(provider).content
    for name in host.rt.tools.names():
        assert name in prompt
    assert "write_file (needs approval)" in prompt and "exec (needs approval)" in prompt
    assert "list_files (needs approval)" not in prompt
    assert "Workspace: a directory of your own for this session. Tool paths are relative to it" in prompt
    assert "they may write only inside the workspace, and have no network" in prompt  # workspace-write
    assert "wait for the user to approve the call" in prompt  # ask
    # the server's own paths never reach the model: no path at all
    assert host.rt.data_dir not in prompt and "/" not in prompt


def test_a_project_session_is_told_its_folder_by_name_not_by_path(world, tmp_path):
    host, _, provider = world(permission_mode="acceptCalls")
    folder = tmp_path / "projects" / "billing-api"
    folder.mkdir(parents=True)
    host.create(cwd=str(folder)).run("hi")
    prompt = system_sent(provider).content
    assert 'Workspace: the project folder "billing-api".' in prompt
    assert str(tmp_path) not in prompt and "Tool calls run without asking the user." in prompt


def test_the_sandbox_policy_and_permission_mode_of_the_settings_are_what_the_prompt_says(world):
    host, c, provider = world(permission_mode="ask")
    sid = c.result("session/create", {})["session"]["id"]
    for key, value in (("sandbox", "read-only"), ("permissionMode", "deny")):
        reply = c.call("session/config/update", {"sessionId": sid, "plugin": "tools", "key": key, "value": value})
        assert "result" in reply, reply
    host.session(sid).run("hi")
    prompt = system_sent(provider).content
    assert "they can read files but write nothing, and have no network" in prompt
    assert "are refused in this session: use the other tools" in prompt


def test_a_system_prompt_setting_replaces_the_built_in_prompt(world):
    host, c, provider = world()
    sid = c.result("session/create", {})["session"]["id"]
    c.call("session/config/update", {"sessionId": sid, "plugin": "agent", "key": "systemPrompt",
                                     "value": "You answer in haiku."})
    host.session(sid).run("hi")
    assert [m.content for m in provider.requests[-1].messages if m.role == "system"] == ["You answer in haiku."]


def test_an_empty_system_prompt_setting_sends_no_system_message(world):
    host, c, provider = world()
    sid = c.result("session/create", {})["session"]["id"]
    c.call("session/config/update", {"sessionId": sid, "plugin": "agent", "key": "systemPrompt", "value": ""})
    host.session(sid).run("hi")
    assert [m.role for m in provider.requests[-1].messages] == ["user"]


def test_the_prompt_row_shows_the_built_in_prompt_as_what_is_in_use(world):
    host, c, provider = world(permission_mode="acceptCalls")
    sid = c.result("session/create", {})["session"]["id"]
    host.session(sid).run("hi")
    row = next(r for r in c.result("session/config/get", {"sessionId": sid})["items"]
               if (r["plugin"], r["key"]) == ("agent", "systemPrompt"))
    assert "effective" not in row and row["actual"]["value"] == system_sent(provider).content
    assert row["actual"]["label"] == "Built-in prompt (the tools, the workspace and the sandbox)"
