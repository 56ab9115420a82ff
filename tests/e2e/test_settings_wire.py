"""Seed 004, 会话设置 (session settings) over the wire: ``session/config/*`` and
``session/config/changed`` against a real ``sessionloop serve`` subprocess with real WebSocket
clients, one named test per rule (the wire counterparts of tests/actors/settings/test_settings.py).

One server is shared by the module; every test leaves the global, platform, platform-type and
place layers as it found them (the ``clean_layers`` fixture deletes whatever a test wrote there,
even when it failed). The restart and the unwritable-document tests start servers of their own.
Over the wire there is no adapter, so no room has a chat window: window places and platform-type
resolution of a session are left to tests/actors/settings/test_settings.py.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tomllib
from typing import Any

import pytest

from sessionloop.actors.settings.document import dump_toml
from tests.e2e.conftest import Client, ServerProcess, initialized, open_client

pytestmark = pytest.mark.e2e

INVALID_PARAMS = -32602
BUSINESS = -32000  # seed: business errors carry data.code
APPS = """
[apps.mybot]
token = "bot-token-for-the-end-to-end-tests"
platform = "telegram"
containers = ["inbox"]

[apps.other]
token = "other-token-for-the-end-to-end-tests"
platform = "slack"
containers = ["inbox"]

[apps.late]
token = "late-token-for-the-end-to-end-tests"
platform = "matrix"
containers = ["inbox"]
"""
BOT = "bot-token-for-the-end-to-end-tests"
OTHER = "other-token-for-the-end-to-end-tests"
LATE = "late-token-for-the-end-to-end-tests"
GLOBAL = {"scope": "global"}
CONSOLE = {"scope": "platform", "platform": "console"}
TELEGRAM = {"scope": "platform", "platform": "telegram"}
TELEGRAM_GROUP = {"scope": "platformType", "platform": "telegram", "type": "group"}
WORKSPACE = {"scope": "place", "key": "workspace:default"}
SHARED_LAYERS = (GLOBAL, CONSOLE, TELEGRAM, TELEGRAM_GROUP, WORKSPACE)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def start_server(data_dir: str) -> ServerProcess:
    os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(data_dir, "apps.toml"), "w") as f:
        f.write(APPS)
    return ServerProcess(data_dir).start()


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    server = start_server(str(tmp_path_factory.mktemp("settings-wire") / "data"))
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def clean_layers(request):
    """After each test on the shared server, delete every value written on the shared layers."""
    yield
    if "shared" not in request.fixturenames:
        return
    server = request.getfixturevalue("shared")

    async def go():
        async with open_client(server) as ws:
            c = await initialized(ws)
            for layer in SHARED_LAYERS:
                for row in (await c.result("session/config/layer/get", {"layer": layer}))["items"]:
                    if "value" in row:
                        await c.result("session/config/layer/update", {"layer": layer, "plugin": row["plugin"],
                                                                       "key": row["key"], "value": None})
    run(go())


# --- helpers -----------------------------------------------------------------------------------


def rows(result: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["plugin"], r["key"]): r for r in result["items"]}


async def new_session(c: Any, **params: Any) -> str:
    return (await c.result("session/create", params))["session"]["id"]


async def get_row(c: Any, sid: str, plugin: str, key: str) -> dict[str, Any]:
    return rows(await c.result("session/config/get", {"sessionId": sid}))[(plugin, key)]


async def set_session(c: Any, sid: str, plugin: str, key: str, value: Any) -> dict[str, Any]:
    return await c.call("session/config/update", {"sessionId": sid, "plugin": plugin, "key": key, "value": value})


async def set_layer(c: Any, layer: dict[str, Any], plugin: str, key: str, value: Any) -> dict[str, Any]:
    return await c.call("session/config/layer/update", {"layer": layer, "plugin": plugin, "key": key, "value": value})


async def layer_row(c: Any, layer: dict[str, Any], plugin: str, key: str) -> dict[str, Any]:
    return rows(await c.result("session/config/layer/get", {"layer": layer}))[(plugin, key)]


async def eff(c: Any, sid: str, plugin: str = "agent", key: str = "maxSteps") -> tuple[Any, Any]:
    row = await get_row(c, sid, plugin, key)
    return row.get("effective"), row.get("source")


async def room_of(server: ServerProcess, token: str = BOT, **params: Any) -> str:
    async with open_client(server, token) as ws:
        app = await initialized(ws)
        return (await app.result("loop/create", {"containerId": "inbox", **params}))["sessionId"]


def config_path(server: ServerProcess) -> str:
    return os.path.join(server.data_dir, "config.toml")


def config_doc(server: ServerProcess) -> dict[str, Any]:
    try:
        with open(config_path(server), "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}


def edit_config(server: ServerProcess, change: Any) -> None:
    """Edit the host configuration document as someone else would, keeping its other keys."""
    doc = config_doc(server)
    change(doc)
    with open(config_path(server), "w") as f:
        f.write(dump_toml(doc))


async def turn(c: Any, sid: str, text: str) -> list[dict[str, Any]]:
    """Send ``text`` to a subscribed session and wait for its turn; the items of that turn."""
    c.pushes.clear()
    await c.result("turn/send", {"sessionId": sid, "content": text})
    done = (await c.turn_done(sid, 30))["params"]["item"]
    if any(p["params"].get("item", {}).get("kind") == "tool-call" for p in c.pushes):
        await asyncio.sleep(0.1)  # a notice comes right after the turn item
        await c.call("session/config/layers", {})  # drain what arrived meanwhile into c.pushes
    return [p["params"]["item"] for p in c.pushes if p["method"] == "item/completed"
            and p["params"].get("sessionId") == sid and p["params"]["item"].get("turnId") == done["turnId"]]


async def settle(*clients: Any) -> None:
    """Let a pending (coalesced) ``session/config/changed`` arrive, then forget every push."""
    await asyncio.sleep(0.2)
    for c in clients:
        await c.call("session/config/layers", {})
        c.pushes.clear()


async def no_push(c: Any, method: str, wait: float = 0.4) -> bool:
    await asyncio.sleep(wait)
    await c.call("session/config/layers", {})  # receive what arrived meanwhile
    return not any(p["method"] == method for p in c.pushes)


# --- handshake --------------------------------------------------------------------------------------


def test_features_report_settings_and_the_app_name_is_read_from_config_toml_on_every_handshake(shared):
    async def handshake() -> dict[str, Any]:
        async with open_client(shared) as ws:
            return await Client(ws).result(
                "initialize", {"protocolVersion": "0.2.0", "client": {"name": "e2e", "version": "1"}})

    async def go():
        edit_config(shared, lambda d: d.update(name="Aalis"))
        first = await handshake()
        edit_config(shared, lambda d: d.update(name="Bea"))
        second = await handshake()
        edit_config(shared, lambda d: d.pop("name"))
        return first, second

    first, second = run(go())
    assert first["features"]["settings"] is True
    assert (first["appName"], second["appName"]) == ("Aalis", "Bea")


# --- session/config/get ----------------------------------------------------------------------------


def test_get_lists_rows_composer_then_common_then_advanced_and_no_place_only_field(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            return await c.result("session/config/get", {"sessionId": await new_session(c)})
    got = run(go())
    assert [(r["plugin"], r["key"], r["prominence"]) for r in got["items"]] == [
        ("llm", "model", "composer"), ("tools", "permissionMode", "composer"), ("agent", "maxSteps", "common"),
        ("agent", "systemPrompt", "common"), ("tools", "sandbox", "common"),
        ("agent", "contextChars", "advanced")]  # no tools/execYieldSeconds
    assert got["platform"] == "console"  # the owner's entry platform


def test_a_row_carries_the_field_declaration_with_its_session_spec(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            return await get_row(c, await new_session(c), "agent", "maxSteps")
    row = run(go())
    assert row["field"] == {
        "type": "integer", "title": "Model calls per turn", "default": 20, "minimum": 0,
        "description": "After this many model calls a turn stops with a notice; continue resumes it. "
                       "0: unlimited (turn/abort still stops a turn).",
        "session": {"prominence": "common", "order": 3}}


def test_with_no_layer_value_the_default_is_effective_with_source_default(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            return await get_row(c, await new_session(c), "agent", "maxSteps")
    row = run(go())
    assert (row["effective"], row["source"]) == (20, "default") and "value" not in row and "actual" not in row


def test_a_row_without_an_effective_value_carries_the_actual_value_in_use(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            sid = await new_session(c)
            model = await get_row(c, sid, "llm", "model")
            mode = await get_row(c, sid, "tools", "permissionMode")
            denying_room = await room_of(shared, permissionMode="deny")
            return model, mode, await get_row(c, denying_room, "tools", "permissionMode")
    model, mode, room_mode = run(go())
    assert "effective" not in model and "source" not in model
    assert model["actual"] == {"value": "mock/mock", "label": "Follow the service preference (now: mock)"}
    assert mode["actual"] == {"value": "ask"}  # an interactive owner session asks
    assert room_mode["actual"] == {"value": "deny"}  # the room's own mode, given at loop/create


def test_get_names_the_birth_platform_of_an_app_room(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            return await c.result("session/config/get", {"sessionId": await room_of(shared)})
    assert run(go())["platform"] == "telegram"


def test_get_and_update_of_an_unknown_session_are_not_found(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            return (await c.call("session/config/get", {"sessionId": "nope"}),
                    await set_session(c, "nope", "agent", "maxSteps", 2))
    for reply in run(go()):
        assert reply["error"]["code"] == BUSINESS and reply["error"]["data"]["code"] == "not-found"
        assert "nope" in reply["error"]["message"]


# --- session/config/update (the session's own layer) --------------------------------------------------


def test_update_answers_the_rows_with_value_effective_and_source_session(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            sid = await new_session(c)
            reply = await set_session(c, sid, "agent", "maxSteps", 2)
            return reply, await get_row(c, sid, "agent", "maxSteps")
    reply, again = run(go())
    row = rows(reply["result"])[("agent", "maxSteps")]
    assert (row["value"], row["effective"], row["source"]) == (2, 2, "session")
    assert len(reply["result"]["items"]) == 6 and reply["result"]["platform"] == "console"  # as get gives them
    assert (again["value"], again["source"]) == (2, "session")


def test_null_deletes_the_session_value_and_the_row_inherits_again(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            sid = await new_session(c)
            await set_layer(c, GLOBAL, "agent", "maxSteps", 6)
            await set_session(c, sid, "agent", "maxSteps", 2)
            return rows((await set_session(c, sid, "agent", "maxSteps", None))["result"])[("agent", "maxSteps")]
    row = run(go())
    assert "value" not in row and (row["effective"], row["source"]) == (6, "global")


@pytest.mark.parametrize("plugin, key, value, named", [
    ("agent", "maxSteps", "many", "params.value"), ("agent", "maxSteps", -1, "params.value"),
    ("agent", "maxSteps", True, "params.value"), ("agent", "maxSteps", 2.5, "params.value"),
    ("tools", "permissionMode", "sometimes", "params.value"), ("agent", "systemPrompt", 3, "params.value"),
    ("llm", "model", " ", "params.value"), ("agent", "nope", 1, "params.key"), ("nobody", "maxSteps", 1, "params.key"),
])
def test_an_invalid_session_value_or_key_is_invalid_params_naming_the_field_and_nothing_changes(
        shared, plugin, key, value, named):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            sid = await new_session(c)
            reply = await set_session(c, sid, plugin, key, value)
            return reply, await c.result("session/config/get", {"sessionId": sid})
    reply, after = run(go())
    assert reply["error"]["code"] == INVALID_PARAMS and reply["error"]["message"].startswith(named)
    assert all("value" not in r and r.get("source") != "session" for r in after["items"])


def test_a_malformed_update_is_invalid_params_naming_the_parameter(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            sid = await new_session(c)
            missing = await c.call("session/config/update", {"sessionId": sid, "plugin": "agent", "key": "maxSteps"})
            wrong = await c.call("session/config/update",
                                 {"sessionId": sid, "plugin": 3, "key": "maxSteps", "value": 2})
            return missing, wrong, await get_row(c, sid, "agent", "maxSteps")
    missing, wrong, row = run(go())
    assert missing["error"]["code"] == INVALID_PARAMS and missing["error"]["message"].startswith("params.value")
    assert wrong["error"]["code"] == INVALID_PARAMS and wrong["error"]["message"].startswith("params.plugin")
    assert "value" not in row


def test_a_field_that_stops_at_the_place_cannot_be_written_on_one_session(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            sid = await new_session(c)
            return await set_session(c, sid, "tools", "execYieldSeconds", 1)
    error = run(go())["error"]
    assert error["code"] == INVALID_PARAMS and error["message"].startswith("params.key") and "place" in error["message"]


# --- layers ------------------------------------------------------------------------------------------------


def test_layers_answer_the_order_table_and_every_layer_that_can_be_set(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            await new_session(c)
            await room_of(shared)
            await set_layer(c, TELEGRAM_GROUP, "agent", "maxSteps", 3)  # a written chat type is listed
            return await c.result("session/config/layers", {})
    result = run(go())
    assert [(o["name"], o["label"]) for o in result["order"]] == [
        ("global", "Global (plugin configuration)"), ("platform", "Platform"),
        ("platformType", "Platform chat type"), ("place", "Place"), ("session", "This session")]
    layers = result["layers"]
    assert layers[0] == {"layer": GLOBAL}
    scopes = [entry["layer"]["scope"] for entry in layers]
    assert scopes == sorted(scopes, key=["global", "platform", "platformType", "place"].index)
    platforms = [entry["layer"]["platform"] for entry in layers if entry["layer"]["scope"] == "platform"]
    assert {"console", "telegram"} <= set(platforms) and platforms == sorted(platforms)
    assert {"layer": TELEGRAM_GROUP} in layers
    places = [entry for entry in layers if entry["layer"]["scope"] == "place"]
    assert places[0] == {"layer": WORKSPACE, "label": "Default workspace"}


def test_layer_rows_are_effective_up_to_that_layer(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            await new_session(c)  # the default workspace is a recorded place
            await set_layer(c, GLOBAL, "agent", "maxSteps", 6)
            platform_before = await layer_row(c, TELEGRAM, "agent", "maxSteps")
            await set_layer(c, TELEGRAM, "agent", "maxSteps", 4)
            await set_layer(c, CONSOLE, "agent", "maxSteps", 3)
            kind = await layer_row(c, TELEGRAM_GROUP, "agent", "maxSteps")
            workspace = await layer_row(c, WORKSPACE, "agent", "maxSteps")
            return platform_before, kind, workspace, await layer_row(c, GLOBAL, "agent", "maxSteps")
    platform_before, kind, workspace, global_row = run(go())
    assert "value" not in platform_before and (platform_before["effective"], platform_before["source"]) == (6, "global")
    assert (kind["effective"], kind["source"]) == (4, "platform")  # platformType resolves over its platform
    assert (workspace["effective"], workspace["source"]) == (6, "global")  # a workspace only over global
    assert (global_row["value"], global_row["effective"], global_row["source"]) == (6, 6, "global")


def test_an_owner_session_resolves_global_then_workspace_then_platform_then_session(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            sid = await new_session(c)
            seen = []
            for layer, steps in ((GLOBAL, 9), (WORKSPACE, 5), (CONSOLE, 4)):
                await set_layer(c, layer, "agent", "maxSteps", steps)
                seen.append(await eff(c, sid))
            await set_session(c, sid, "agent", "maxSteps", 3)
            seen.append(await eff(c, sid))
            return seen
    assert run(go()) == [(9, "global"), (5, "place"), (4, "platform"), (3, "session")]


def test_null_on_each_layer_falls_back_to_the_next_one_and_on_global_restores_the_default(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            sid = await new_session(c)
            for layer, steps in ((GLOBAL, 9), (WORKSPACE, 5), (CONSOLE, 4)):
                await set_layer(c, layer, "agent", "maxSteps", steps)
            await set_session(c, sid, "agent", "maxSteps", 3)
            seen = []
            await set_session(c, sid, "agent", "maxSteps", None)
            seen.append(await eff(c, sid))
            for layer in (CONSOLE, WORKSPACE):
                await set_layer(c, layer, "agent", "maxSteps", None)
                seen.append(await eff(c, sid))
            global_row = rows((await set_layer(c, GLOBAL, "agent", "maxSteps", None))["result"])[("agent", "maxSteps")]
            seen.append(await eff(c, sid))
            return seen, global_row
    seen, global_row = run(go())
    assert seen == [(4, "platform"), (5, "place"), (9, "global"), (20, "default")]
    assert "value" not in global_row and (global_row["effective"], global_row["source"]) == (20, "default")
    assert "maxSteps" not in config_doc(shared).get("plugins", {}).get("agent", {})


def test_an_app_room_resolves_global_then_its_platform_and_has_no_workspace_layer(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            sid = await room_of(shared)
            seen = []
            for layer, steps in ((GLOBAL, 9), (WORKSPACE, 5), (TELEGRAM, 8), (CONSOLE, 4), (TELEGRAM_GROUP, 7)):
                await set_layer(c, layer, "agent", "maxSteps", steps)
                seen.append(await eff(c, sid))
            await set_session(c, sid, "agent", "maxSteps", 2)
            seen.append(await eff(c, sid))
            return seen
    assert run(go()) == [(9, "global"), (9, "global"), (8, "platform"), (8, "platform"),
                         (8, "platform"),  # no chat window: no platform-type layer
                         (2, "session")]


def test_a_child_session_resolves_through_its_root_but_keeps_its_own_session_layer(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            parent = await room_of(shared)
            child = await new_session(c, parentId=parent)
            got = await c.result("session/config/get", {"sessionId": child})
            await set_layer(c, TELEGRAM, "agent", "maxSteps", 7)
            seen = [await eff(c, child)]
            await set_session(c, parent, "agent", "maxSteps", 3)  # the root's own layer is the root's only
            seen.append(await eff(c, child))
            await set_session(c, child, "agent", "maxSteps", 2)
            seen.append(await eff(c, child))
            return got["platform"], seen, await eff(c, parent)
    platform, seen, parent = run(go())
    assert platform == "telegram"
    assert seen == [(7, "platform"), (7, "platform"), (2, "session")] and parent == (3, "session")


def test_global_platform_and_platform_type_values_are_written_to_config_toml(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            replies = [await set_layer(c, GLOBAL, "agent", "maxSteps", 9),
                       await set_layer(c, TELEGRAM, "agent", "maxSteps", 8),
                       await set_layer(c, TELEGRAM_GROUP, "tools", "permissionMode", "deny")]
            return replies, config_doc(shared)
    replies, doc = run(go())
    assert all("result" in r and "unsaved" not in r["result"] for r in replies)
    assert doc["plugins"]["agent"]["maxSteps"] == 9
    assert doc["sessionSettings"]["platform"]["telegram"]["agent"] == {"maxSteps": 8}
    assert doc["sessionSettings"]["platformType"]["telegram"]["group"]["tools"] == {"permissionMode": "deny"}
    assert not [n for n in os.listdir(shared.data_dir) if n.startswith(".config.toml.")]  # no temporary left


def test_an_edit_of_config_toml_by_someone_else_is_picked_up(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            sid = await new_session(c)
            edit_config(shared, lambda d: d.setdefault("plugins", {}).setdefault("agent", {}).update(maxSteps=11))
            return await eff(c, sid)
    assert run(go()) == (11, "global")


def test_an_edit_of_config_toml_with_an_invalid_value_is_refused_and_the_value_before_stays(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            assert "result" in await set_layer(c, GLOBAL, "agent", "maxSteps", 6)
            edit_config(shared, lambda d: d.setdefault("plugins", {}).setdefault("agent", {}).update(maxSteps="lots"))
            return await layer_row(c, GLOBAL, "agent", "maxSteps")
    row = run(go())
    assert (row["value"], row["effective"], row["source"]) == (6, 6, "global")
    shared.log.flush()
    with open(shared.log.name) as f:
        said = [line for line in f if "config.toml refused: plugins.agent.maxSteps: expected an integer" in line]
    assert len(said) == 1, said


@pytest.mark.parametrize("layer, named", [
    ({"scope": "place", "key": "onebot:1:group:404"}, "params.layer.key"),
    ({"scope": "session"}, "params.layer.scope"), ({"scope": "planet"}, "params.layer.scope"),
    ({"scope": "platform", "platform": ""}, "params.layer.platform"),
    ({"scope": "platformType", "platform": "telegram"}, "params.layer.type"),
])
def test_an_invalid_layer_or_an_unrecorded_place_is_invalid_params_and_nothing_changes(shared, layer, named):
    before = config_doc(shared)

    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            return [await c.call("session/config/layer/get", {"layer": layer}),
                    await set_layer(c, layer, "agent", "maxSteps", 2)]
    for reply in run(go()):
        assert reply["error"]["code"] == INVALID_PARAMS and reply["error"]["message"].startswith(named)
    assert config_doc(shared) == before


def test_a_layer_write_of_a_bad_value_or_an_unknown_key_is_invalid_params_and_nothing_changes(shared):
    before = config_doc(shared)

    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            bad = await set_layer(c, GLOBAL, "agent", "maxSteps", -1)
            unknown = await set_layer(c, GLOBAL, "agent", "color", "red")
            return bad, unknown, await layer_row(c, GLOBAL, "agent", "maxSteps")
    bad, unknown, row = run(go())
    assert bad["error"]["code"] == INVALID_PARAMS and bad["error"]["message"].startswith("params.value")
    assert unknown["error"]["code"] == INVALID_PARAMS and unknown["error"]["message"].startswith("params.key")
    assert "value" not in row and config_doc(shared) == before


# --- overrides -------------------------------------------------------------------------------------


def test_overrides_list_every_place_beyond_global_grouped_by_key(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            parent = await new_session(c, name="Plans")
            child = await new_session(c, parentId=parent)
            await c.result("session/rename", {"sessionId": child, "title": "Research"})
            await set_layer(c, GLOBAL, "agent", "contextChars", 9000)  # global: not an override
            await set_layer(c, TELEGRAM, "agent", "contextChars", 8000)
            await set_layer(c, WORKSPACE, "agent", "contextChars", 7000)
            await set_session(c, parent, "agent", "contextChars", 3000)
            await set_session(c, child, "agent", "contextChars", 2000)
            return parent, child, await c.result("session/config/overrides", {"plugin": "agent"})
    parent, child, got = run(go())
    groups = {g["key"]: g["entries"] for g in got["items"]}
    sessions = sorted([
        {"target": {"scope": "session", "sessionId": parent, "title": "Plans"}, "value": 3000},
        {"target": {"scope": "session", "sessionId": child, "title": "Research",
                    "parent": {"id": parent, "title": "Plans"}}, "value": 2000}],
        key=lambda e: e["target"]["sessionId"])
    assert groups["contextChars"] == [{"target": TELEGRAM, "value": 8000}, {"target": WORKSPACE, "value": 7000},
                                      *sessions]


def test_overrides_of_a_plugin_that_declares_nothing_is_invalid_params(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            return await c.call("session/config/overrides", {"plugin": "ghost"})
    error = run(go())["error"]
    assert error["code"] == INVALID_PARAMS and error["message"].startswith("params.plugin")


# --- apps ------------------------------------------------------------------------------------------


def test_an_app_may_read_and_set_its_own_session(shared):
    async def go():
        async with open_client(shared, BOT) as ws:
            bot = await initialized(ws)
            sid = (await bot.result("loop/create", {"containerId": "inbox"}))["sessionId"]
            reply = await set_session(bot, sid, "agent", "maxSteps", 3)
            return reply, await bot.result("session/config/get", {"sessionId": sid})
    reply, got = run(go())
    assert rows(reply["result"])[("agent", "maxSteps")]["source"] == "session"
    assert rows(got)[("agent", "maxSteps")]["value"] == 3 and got["platform"] == "telegram"


def test_an_app_may_not_read_or_write_layers_or_overrides(shared):
    async def go():
        async with open_client(shared, BOT) as ws:
            bot = await initialized(ws)
            replies = [await bot.call(method, params) for method, params in (
                ("session/config/layers", {}), ("session/config/layer/get", {"layer": GLOBAL}),
                ("session/config/layer/update", {"layer": GLOBAL, "plugin": "agent", "key": "maxSteps", "value": 4}),
                ("session/config/overrides", {"plugin": "agent"}))]
        async with open_client(shared) as ws:
            owner = await initialized(ws)
            return replies, await layer_row(owner, GLOBAL, "agent", "maxSteps")
    replies, global_row = run(go())
    assert [r["error"]["data"]["code"] for r in replies] == ["forbidden"] * 4
    assert "value" not in global_row  # the refused write changed nothing


def test_an_app_cannot_read_or_write_the_owners_or_another_apps_session_settings(shared):
    async def go():
        async with open_client(shared) as ws, open_client(shared, BOT) as bws, open_client(shared, OTHER) as ows:
            owner, bot, other = await initialized(ws), await initialized(bws), await initialized(ows)
            mine = await new_session(owner)
            bots = (await bot.result("loop/create", {"containerId": "inbox"}))["sessionId"]
            replies = [await bot.call("session/config/get", {"sessionId": mine}),
                       await set_session(bot, mine, "agent", "maxSteps", 2),
                       await other.call("session/config/get", {"sessionId": bots}),
                       await set_session(other, bots, "agent", "maxSteps", 2)]
            return replies, await get_row(owner, mine, "agent", "maxSteps"), await get_row(owner, bots, "agent",
                                                                                           "maxSteps")
    replies, owners, bots = run(go())
    assert [r["error"]["data"]["code"] for r in replies] == ["not-found"] * 4
    assert "value" not in owners and "value" not in bots


# --- session/config/changed ------------------------------------------------------------------------------


def test_a_change_pushes_session_config_changed_to_every_connection_and_a_re_read_sees_it(shared):
    async def go():
        async with open_client(shared) as wa, open_client(shared) as wb, open_client(shared, BOT) as wbot:
            a, b, bot = await initialized(wa), await initialized(wb), await initialized(wbot)
            sid = (await bot.result("loop/create", {"containerId": "inbox"}))["sessionId"]
            seen = []
            for action in (lambda: set_session(a, sid, "agent", "maxSteps", 2),
                           lambda: set_layer(a, TELEGRAM, "agent", "systemPrompt", "Be brief.")):
                await settle(a, b, bot)
                assert "result" in await action()
                pushes = [await c.push(lambda m: m["method"] == "session/config/changed", 5) for c in (b, bot)]
                seen.append(([p["params"] for p in pushes], await get_row(bot, sid, "agent", "maxSteps"),
                             await get_row(b, sid, "agent", "systemPrompt")))
            return seen
    (first_pushes, steps, _), (second_pushes, _, prompt) = run(go())
    assert first_pushes == second_pushes == [{}, {}]  # no parameters: clients re-read
    assert (steps["value"], steps["source"]) == (2, "session")
    assert (prompt["effective"], prompt["source"]) == ("Be brief.", "platform")


def test_the_first_room_of_a_new_platform_pushes_session_config_changed(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            await settle(c)
            await room_of(shared, LATE)  # platform matrix: the list of layers grew
            push = await c.push(lambda m: m["method"] == "session/config/changed", 5)
            layers = await c.result("session/config/layers", {})
            return push, layers
    push, layers = run(go())
    assert push["params"] == {} and {"layer": {"scope": "platform", "platform": "matrix"}} in layers["layers"]


def test_a_session_that_changes_no_setting_shown_pushes_nothing(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            await new_session(c)  # the default workspace and console are known now
            await settle(c)
            await c.result("session/delete", {"sessionId": await new_session(c)})
            quiet = await no_push(c, "session/config/changed")
            await set_session(c, await new_session(c), "agent", "maxSteps", 2)
            loud = not await no_push(c, "session/config/changed")
            return quiet, loud
    assert run(go()) == (True, True)


# --- the agent uses the effective values ---------------------------------------------------------------


async def subscribed(c: Any, **settings: Any) -> str:
    sid = await new_session(c)
    for ident, value in settings.items():
        plugin, key = ident.split("__")
        assert "result" in await set_session(c, sid, plugin, key, value)
    await c.result("session/subscribe", {"sessionId": sid})
    return sid


def test_max_steps_two_on_one_session_gives_it_the_tool_limit_notice_and_not_its_neighbour(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            limited = await subscribed(c, tools__permissionMode="acceptCalls", agent__maxSteps=2)
            neighbour = await subscribed(c, tools__permissionMode="acceptCalls", agent__maxSteps=5)
            return await turn(c, limited, "!loop"), await turn(c, neighbour, "!loop")
    limited, neighbour = run(go())
    assert [i["text"] for i in limited if i["kind"] == "notice"] == [
        "Stopped after 2 model calls; continue to let the agent go on."]
    assert sum(i["kind"] == "tool-call" for i in limited) == 2
    assert [i["text"] for i in neighbour if i["kind"] == "notice"] == [
        "Stopped after 5 model calls; continue to let the agent go on."]
    assert sum(i["kind"] == "tool-call" for i in neighbour) == 5


def test_a_global_change_reaches_a_live_session_on_its_next_turn(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            sid = await subscribed(c, tools__permissionMode="acceptCalls")
            await turn(c, sid, "hello")  # the session is live, its configuration cached
            await set_layer(c, GLOBAL, "agent", "maxSteps", 3)
            return await turn(c, sid, "!loop")
    items = run(go())
    assert [i["text"] for i in items if i["kind"] == "notice"] == [
        "Stopped after 3 model calls; continue to let the agent go on."]


def test_the_model_setting_is_the_model_of_the_next_request(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            large = await subscribed(c, llm__model="mock/mock-large")
            plain = await subscribed(c)
            return await turn(c, large, "hi"), await turn(c, plain, "hi"), await get_row(c, large, "llm", "model")
    large, plain, row = run(go())
    assert [i["model"]["model"] for i in large if i["kind"] == "agent-message"] == ["mock-large"]
    assert [i["model"]["model"] for i in plain if i["kind"] == "agent-message"] == ["mock"]
    assert (row["effective"], row["source"]) == ("mock/mock-large", "session") and "actual" not in row


def test_a_system_prompt_set_on_a_session_is_sent_to_the_model(shared):
    prompt = "You are terse. " * 200  # 3000 characters: about 750 prompt tokens (mock: characters // 4)

    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            prompted = await subscribed(c, agent__systemPrompt=prompt)
            plain = await subscribed(c)
            return await turn(c, prompted, "hi"), await turn(c, plain, "hi")
    prompted, plain = run(go())
    tokens = [next(i["model"]["promptTokens"] for i in items if i["kind"] == "agent-message")
              for items in (prompted, plain)]
    # the prompt replaces the built-in one: the model got it and "hi", nothing else (mock: characters // 4)
    assert tokens[0] == (len(prompt) + len("hi")) // 4 and tokens[1] != tokens[0]


def test_permission_mode_deny_set_on_a_session_refuses_its_tool_calls(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            denying = await subscribed(c, tools__permissionMode="deny")
            asking = await subscribed(c)  # asks; with no owner present its call is denied as absent
            return [await turn(c, sid, '!tool exec {"command": "echo hi"}') for sid in (denying, asking)]
    denying, asking = ([(i["status"], i["result"], i["settlement"]["source"])
                        for i in items if i["kind"] == "tool-call"]
                       for items in run(go()))
    assert denying == [("denied", {"error": "denied: the permission mode is deny"}, "ineligible")]
    assert asking == [("denied", {"error": "denied: nobody was present to approve it"}, "absent")]


def test_exec_yield_seconds_set_on_the_workspace_sends_exec_to_the_background_sooner(shared):
    async def go():
        async with open_client(shared) as ws:
            c = await initialized(ws)
            await new_session(c)
            await set_layer(c, WORKSPACE, "tools", "execYieldSeconds", 0)
            sid = await subscribed(c, tools__permissionMode="acceptCalls")
            items = await turn(c, sid, '!tool exec {"command": "sleep 2; echo late"}')
            await c.result("background/stopAll", {"sessionId": sid})
            return items
    calls = [i for i in run(go()) if i["kind"] == "tool-call"]
    assert len(calls) == 1 and calls[0].get("taskId") and calls[0]["result"]["status"] == "running"


# --- their own servers: a restart, an unwritable document ---------------------------------------------


def test_settings_survive_a_server_restart(tmp_path):
    data = str(tmp_path / "data")
    first = start_server(data)
    try:
        async def write():
            async with open_client(first) as ws:
                c = await initialized(ws)
                kept, gone = await new_session(c), await new_session(c)
                room = await room_of(first)
                assert "result" in await set_session(c, kept, "tools", "permissionMode", "deny")
                assert "result" in await set_session(c, gone, "tools", "permissionMode", "ask")
                assert "result" in await set_session(c, room, "agent", "maxSteps", 4)
                for layer, key, value in ((GLOBAL, "maxSteps", 9), (TELEGRAM, "maxSteps", 8),
                                          (TELEGRAM_GROUP, "contextChars", 5000), (WORKSPACE, "systemPrompt", "Hi")):
                    assert "result" in await set_layer(c, layer, "agent", key, value)
                await c.result("session/delete", {"sessionId": gone})
                return kept, room
        kept, room = run(write())
    finally:
        first.stop()
    second = start_server(data)
    try:
        async def read():
            async with open_client(second) as ws:
                c = await initialized(ws)
                layers = {(layer["scope"], key): await layer_row(c, layer, "agent", key) for layer, key in (
                    (GLOBAL, "maxSteps"), (TELEGRAM, "maxSteps"), (TELEGRAM_GROUP, "contextChars"),
                    (WORKSPACE, "systemPrompt"))}
                return (layers, await get_row(c, kept, "tools", "permissionMode"), await eff(c, kept),
                        await eff(c, kept, "agent", "systemPrompt"), await eff(c, room),
                        await c.result("session/config/overrides", {"plugin": "tools"}))
        layers, mode, kept_steps, kept_prompt, room_steps, overrides = run(read())
    finally:
        second.stop()
    assert second.epoch > first.epoch
    assert {k: r["value"] for k, r in layers.items()} == {
        ("global", "maxSteps"): 9, ("platform", "maxSteps"): 8, ("platformType", "contextChars"): 5000,
        ("place", "systemPrompt"): "Hi"}
    assert (mode["value"], mode["source"]) == ("deny", "session")
    assert kept_steps == (9, "global") and kept_prompt == ("Hi", "place") and room_steps == (4, "session")
    # the overrides index is rebuilt from the log; the deleted session's value drops out
    assert [(g["key"], [e["target"]["sessionId"] for e in g["entries"]]) for g in overrides["items"]] == [
        ("permissionMode", [kept])]


def test_an_unwritable_config_toml_reports_unsaved_after_the_change_took_effect(tmp_path):
    server = start_server(str(tmp_path / "data"))
    os.mkdir(config_path(server))  # a directory cannot be replaced by the new file
    try:
        async def go():
            async with open_client(server) as ws:
                c = await initialized(ws)
                sid = await room_of(server)
                reply = await set_layer(c, TELEGRAM, "agent", "maxSteps", 3)
                return reply, await eff(c, sid)
        reply, room_steps = run(go())
    finally:
        server.stop()
        shutil.rmtree(config_path(server), ignore_errors=True)
    assert reply["result"]["unsaved"].startswith("Applied, but not saved: writing the configuration file")
    assert rows(reply["result"])[("agent", "maxSteps")]["value"] == 3
    assert room_steps == (3, "platform")  # in effect although not saved
