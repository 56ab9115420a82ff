"""Configured models over a real ``sessionloop serve`` and a fake OpenAI-compatible endpoint on
127.0.0.1 (real HTTP, real SSE): refusals at start, the startup log, the option list of the model
field (``GET /api/models/llm``), and a session moved to another model by its settings."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import httpx
import pytest

from tests.conftest import REPO
from tests.e2e.conftest import APPS, TOKEN, ServerProcess, initialized, open_client
from tests.e2e.test_reload_on_sighup import reload
from tests.fake_models import FakeOpenAI

pytestmark = pytest.mark.e2e

SECRET = "sk-e2e-secret-key-0123456789"
BOT = "bot-token-for-the-end-to-end-tests"  # an app token of APPS


def config(fake: FakeOpenAI) -> str:
    return f"""
[models.default]
provider = "openai"
base_url = "{fake.base_url}"
model = "model-a"

[models.fast]
provider = "openai"
base_url = "{fake.base_url}"
model = "model-b"
api_key_env = "FAST_KEY"
"""


@pytest.fixture
def fake():
    with FakeOpenAI() as f:
        yield f


def data_with(tmp_path: Any, config_toml: str, apps: str | None = None) -> str:
    data = tmp_path / "data"
    os.makedirs(data, exist_ok=True)
    (data / "config.toml").write_text(config_toml)
    if apps is not None:
        (data / "apps.toml").write_text(apps)
    return str(data)


@pytest.fixture
def served(tmp_path, fake):
    servers: list[ServerProcess] = []

    def make(*extra: str, config_toml: str | None = None, env: dict[str, str] | None = None) -> ServerProcess:
        data = data_with(tmp_path, config(fake) if config_toml is None else config_toml, APPS)
        s = ServerProcess(data, *extra, env={"FAST_KEY": SECRET, **(env or {})}).start()
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


def log_of(server: ServerProcess) -> str:
    server.log.flush()
    with open(server.log.name) as f:
        return f.read()


def refused(data: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sessionloop", "serve", "--data", data, "--port", "0",
                           "--durability", "nosync", *extra],
                          capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
                          env=dict(os.environ, **(env or {})))


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def turn(c: Any, sid: str, text: str) -> list[dict[str, Any]]:
    c.pushes.clear()
    await c.result("turn/send", {"sessionId": sid, "content": text})
    done = (await c.turn_done(sid, 30))["params"]["item"]
    return [p["params"]["item"] for p in c.pushes if p["method"] == "item/completed"
            and p["params"]["item"].get("turnId") == done["turnId"]]


def reply_text(items: list[dict[str, Any]]) -> str:
    return "".join(i["text"] for i in items if i["kind"] == "agent-message")


# --- refusals ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("table, env, names", [
    ('provider = "openia"\nmodel = "m"', {}, ["[models.fast]", "unknown provider 'openia'"]),
    ('provider = "openai"\nmodel = "m"\napi_key_env = "UNSET_E2E_KEY"', {},
     ["[models.fast]", "api_key_env UNSET_E2E_KEY is not set"]),
    ('provider = "openai"\nmodel = "m"\nbase_url = "http//127.0.0.1:8000/v1"', {},
     ["[models.fast]", "base_url 'http//127.0.0.1:8000/v1'", "http:// or https://"]),
])
def test_serve_refuses_a_model_it_cannot_use_with_one_line_and_a_non_zero_exit(tmp_path, table, env, names):
    data = data_with(tmp_path, f'[models.default]\nprovider = "mock"\n\n[models.fast]\n{table}\n')
    done = refused(data, env=env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and done.stdout == ""
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "config.toml" in lines[0], done.stderr
    for name in names:
        assert name in lines[0]
    assert not os.path.exists(os.path.join(data, "store"))  # refused before anything was opened


def test_serve_refuses_a_flag_naming_an_unset_key_variable(tmp_path):
    done = refused(str(tmp_path / "data"), "--model-name", "m", "--api-key-env", "UNSET_FLAG_KEY")
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert "--model-* flags" in lines[0] and "api_key_env UNSET_FLAG_KEY is not set" in lines[0]


def test_serve_model_openai_without_a_key_for_the_openai_api_refuses_and_with_a_local_url_starts(tmp_path):
    # the older one-model path (OPENAI_* variables): the OpenAI API answers every keyless call 401
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    done = subprocess.run([sys.executable, "-m", "sessionloop", "serve", "--data", str(tmp_path / "a"), "--port", "0",
                           "--model", "openai"], capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
                          env=env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert "no API key for https://api.openai.com/v1" in lines[0] and "OPENAI_API_KEY" in lines[0]
    assert not os.path.exists(str(tmp_path / "a" / "store"))
    local = ServerProcess(str(tmp_path / "b"), "--model", "openai",
                          env={**env, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}).start()  # a local server: no key
    assert local.stop() == 0


# --- the startup log -------------------------------------------------------------------------------------


def test_the_startup_log_names_every_model_provider_and_url_at_info_and_never_the_key(served, fake):
    server = served()

    async def connect_once() -> None:
        async with open_client(server) as ws:
            await initialized(ws)
    run(connect_once())
    log = log_of(server)
    assert (f"INFO sessionloop.models: model default: provider openai, model id model-a, base URL "
            f"{fake.base_url}, no key") in log
    assert (f"INFO sessionloop.models: model fast: provider openai, model id model-b, base URL {fake.base_url}, "
            "key from $FAST_KEY") in log
    assert "INFO sessionloop.models: default model: default/model-a" in log
    assert SECRET not in log
    assert "connection open" not in log  # websockets' own INFO lines stay out


def test_without_models_the_log_says_sessions_use_the_built_in_mock(tmp_path):
    server = ServerProcess(str(tmp_path / "data")).start()
    try:
        assert "no models configured: sessions use the built-in mock model" in log_of(server)
    finally:
        server.stop()


def test_the_one_model_flags_configure_the_default_model(tmp_path, fake):
    server = ServerProcess(str(tmp_path / "data"), "--model-provider", "openai", "--base-url", fake.base_url,
                           "--model-name", "model-b", "--api-key-env", "FLAG_KEY", env={"FLAG_KEY": SECRET}).start()
    try:
        async def go() -> list[dict[str, Any]]:
            async with open_client(server) as ws:
                c = await initialized(ws)
                sid = (await c.result("session/create", {}))["session"]["id"]
                await c.result("session/subscribe", {"sessionId": sid})
                return await turn(c, sid, "hi")
        items = run(go())
        assert reply_text(items) == "reply from model-b"
        assert fake.requests[-1]["body"]["model"] == "model-b"
        assert fake.requests[-1]["headers"]["authorization"] == f"Bearer {SECRET}"
        log = log_of(server)
        assert "model default: provider openai, model id model-b" in log and "(--model-* flags)" in log
        assert SECRET not in log
    finally:
        server.stop()


# --- the option list and the model field ---------------------------------------------------------------------


def get(server: ServerProcess, path: str, token: str | None = TOKEN, **params: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"http://127.0.0.1:{server.port}{path}", headers=headers, params=params, timeout=10)


def test_the_option_list_of_the_model_field_is_the_configured_models_for_a_valid_token_only(served):
    server = served()
    owner = get(server, "/api/models/llm")
    assert owner.status_code == 200 and owner.headers["content-type"] == "application/json"
    body = owner.json()
    assert body["service"] == "llm"
    assert [(o["id"], o["provider"], o["model"], o["default"]) for o in body["options"]] == [
        ("default/model-a", "openai", "model-a", True), ("fast/model-b", "openai", "model-b", False)]
    assert SECRET not in owner.text and "FAST_KEY" not in owner.text
    assert get(server, "/api/models/llm", token=None).status_code == 401
    assert get(server, "/api/models/llm", token="wrong-token").status_code == 401
    assert get(server, "/api/models/llm", token=BOT).status_code == 200  # an app sets its sessions' rows
    assert get(server, "/api/models/nothing-answers-this").status_code == 404
    assert get(server, "/api/models/llm", dependency="x" * 2000).status_code == 400


def test_session_config_get_rows_carry_the_option_source_and_the_model_in_use(served):
    server = served()

    async def go() -> dict[str, Any]:
        async with open_client(server) as ws:
            c = await initialized(ws)
            sid = (await c.result("session/create", {}))["session"]["id"]
            rows = (await c.result("session/config/get", {"sessionId": sid}))["items"]
            return next(r for r in rows if (r["plugin"], r["key"]) == ("llm", "model"))
    row = run(go())
    assert row["field"]["type"] == "llm-ref" and row["field"]["dynamicOptions"] == "llm"
    assert "dependsOn" not in row["field"]  # the model depends on nothing
    assert row["actual"] == {"value": "default/model-a", "label": "Follow the service preference (now: model-a)"}


def test_a_session_switched_to_another_configured_model_calls_that_model(served, fake):
    server = served()

    async def go() -> tuple[Any, ...]:
        async with open_client(server) as ws:
            c = await initialized(ws)
            sid = (await c.result("session/create", {}))["session"]["id"]
            await c.result("session/subscribe", {"sessionId": sid})
            first = await turn(c, sid, "hi")
            refused = await c.call("session/config/update", {"sessionId": sid, "plugin": "llm", "key": "model",
                                                             "value": "fast/gpt-4o"})
            switched = await c.call("session/config/update", {"sessionId": sid, "plugin": "llm", "key": "model",
                                                              "value": "fast/model-b"})
            second = await turn(c, sid, "again")
            return first, refused, switched, second
    first, refused, switched, second = run(go())
    assert reply_text(first) == "reply from model-a" and reply_text(second) == "reply from model-b"
    assert [r["body"]["model"] for r in fake.requests] == ["model-a", "model-b"]
    assert "authorization" not in fake.requests[0]["headers"]  # default has no api_key_env
    assert fake.requests[1]["headers"]["authorization"] == f"Bearer {SECRET}"
    assert refused["error"]["message"].startswith("params.value: llm/model: model fast serves model-b, not 'gpt-4o'")
    assert "result" in switched
    model = next(i["model"] for i in second if i["kind"] == "agent-message")
    assert (model["model"], model["promptTokens"]) == ("model-b", 12)  # the fake's usage chunk
    metrics = get(server, "/metrics").text  # each configured model's requests, by its name
    assert 'sessionloop_model_requests_total{model="default"} 1.0' in metrics
    assert 'sessionloop_model_requests_total{model="fast"} 1.0' in metrics


def test_the_model_receives_the_built_in_system_prompt_with_its_tools_and_no_server_path(served, fake):
    server = served()

    async def go() -> None:
        async with open_client(server) as ws:
            c = await initialized(ws)
            sid = (await c.result("session/create", {}))["session"]["id"]
            await c.result("session/subscribe", {"sessionId": sid})
            await turn(c, sid, "hi")
    run(go())
    body = fake.requests[-1]["body"]
    system = body["messages"][0]
    assert system["role"] == "system" and body["messages"][1] == {"role": "user", "content": "hi"}
    for tool in body["tools"]:
        assert tool["function"]["name"] in system["content"]
    assert "Workspace: a directory of your own for this session" in system["content"]
    assert server.data_dir not in system["content"] and os.path.abspath(server.data_dir) not in system["content"]


def test_sighup_reloads_the_models_and_a_model_that_cannot_be_used_keeps_the_ones_in_force(served, fake):
    server = served()
    path = os.path.join(server.data_dir, "config.toml")
    with open(path, "a") as f:
        f.write('\n[models.extra]\nprovider = "mock"\nmodel = "echo-1"\n')
    line = reload(server)
    assert "models reloaded: default, fast, extra (default default/model-a)" in line, line
    assert [o["id"] for o in get(server, "/api/models/llm").json()["options"]] == [
        "default/model-a", "fast/model-b", "extra/echo-1"]
    assert "model extra: provider mock, model id echo-1" in log_of(server)
    with open(path, "a") as f:
        f.write('\n[models.broken]\nprovider = "openai"\nmodel = "m"\napi_key_env = "UNSET_RELOAD_KEY"\n')
    line = reload(server)
    assert "models refused: " in line and "[models.broken]: api_key_env UNSET_RELOAD_KEY is not set" in line
    assert "the models read before stay in force" in line
    assert [o["id"] for o in get(server, "/api/models/llm").json()["options"]] == [
        "default/model-a", "fast/model-b", "extra/echo-1"]
