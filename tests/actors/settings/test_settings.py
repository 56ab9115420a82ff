"""Seed 004, 会话设置 (session settings), places and rooms: one named test per rule, through the
protocol with in-memory clients on a real host (``Host.open(tmp, durability="nosync")``)."""

from __future__ import annotations

import os
import stat
import tomllib
from typing import Any

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.gateway.service import SessionProtocolService
from sessionloop.actors.model import MockProvider
from sessionloop.actors.session.commands import NewSession
from sessionloop.actors.session.messages import Create
from sessionloop.actors.settings.decide import check_value
from sessionloop.actors.settings.document import dump_toml
from sessionloop.actors.settings.fields import SettingField
from tests.actors.gateway_harness import MemoryClient

INVALID_PARAMS = -32602
WINDOW = E.PlaceRef(key="onebot:42:group:7", kind="window", name="Friends")
GROUP = E.ChatInfo(type="group", multi_party=True)


@pytest.fixture
def env(open_host):
    """``make(**options) -> (host, service)``; services are closed before their hosts."""
    made: list[SessionProtocolService] = []

    def make(**options: Any) -> tuple[Any, SessionProtocolService]:
        host = open_host(**options)
        svc = host.protocol()
        made.append(svc)
        return host, svc

    yield make
    for svc in made:
        svc.close()  # again after a restart test closed it: closing twice is harmless


@pytest.fixture
def world(env):
    host, svc = env()
    return host, svc, MemoryClient(svc)


def new_session(c: MemoryClient, **params: Any) -> str:
    return c.result("session/create", params)["session"]["id"]


def room(host: Any, **created: Any) -> str:
    """An IM room as an adapter files it: platform, instance, account, chat window and place."""
    fields: dict[str, Any] = {"kind": "room", "platform": "onebot", "instance": "onebot-1", "account": "42",
                              "chat": GROUP, "place": WINDOW}
    fields.update(created)
    return host.create(**fields).id


def rows(result: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["plugin"], r["key"]): r for r in result["items"]}


def get_row(c: MemoryClient, sid: str, plugin: str, key: str) -> dict[str, Any]:
    return rows(c.result("session/config/get", {"sessionId": sid}))[(plugin, key)]


def set_session(c: MemoryClient, sid: str, plugin: str, key: str, value: Any) -> dict[str, Any]:
    return c.call("session/config/update", {"sessionId": sid, "plugin": plugin, "key": key, "value": value})


def set_layer(c: MemoryClient, layer: dict[str, Any], plugin: str, key: str, value: Any) -> dict[str, Any]:
    return c.call("session/config/layer/update", {"layer": layer, "plugin": plugin, "key": key, "value": value})


def layer_row(c: MemoryClient, layer: dict[str, Any], plugin: str, key: str) -> dict[str, Any]:
    return rows(c.result("session/config/layer/get", {"layer": layer}))[(plugin, key)]


def turn_done(c: MemoryClient, sid: str) -> dict[str, Any]:
    return c.wait(lambda f: f.get("method") == "item/completed" and f["params"]["sessionId"] == sid
                  and f["params"]["item"]["kind"] == "turn", 30)["params"]["item"]


def send_and_wait(c: MemoryClient, sid: str, text: str) -> None:
    c.result("session/subscribe", {"sessionId": sid})
    clear(c)  # an earlier turn's item must not answer for this one
    c.result("turn/send", {"sessionId": sid, "content": text})
    turn_done(c, sid)


def events_of(host: Any, sid: str, kind: type) -> list[Any]:
    return [r.event for r in host.session(sid).events() if isinstance(r.event, kind)]


def config_doc(host: Any) -> dict[str, Any]:
    with open(os.path.join(host.rt.data_dir, "config.toml"), "rb") as f:
        return tomllib.load(f)


def clear(c: MemoryClient) -> None:
    with c.cond:
        c.frames.clear()


GLOBAL = {"scope": "global"}
DEFAULT_WORKSPACE = {"scope": "place", "key": "workspace:default"}


# --- features and the host configuration document --------------------------------------------------


class HandshakeClient(MemoryClient):
    """Keeps the ``initialize`` result, which MemoryClient's constructor drops."""

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 10) -> dict[str, Any]:
        reply = super().call(method, params, timeout)
        if method == "initialize":
            self.initialized = reply["result"]
        return reply


def test_features_report_settings_once_the_service_is_installed(world):
    host, svc, _ = world
    assert host.settings is not None
    assert HandshakeClient(svc).initialized["features"]["settings"] is True


def test_the_app_name_comes_from_config_toml_and_is_read_again_on_every_handshake(world):
    host, svc, c = world
    path = os.path.join(host.rt.data_dir, "config.toml")
    with open(path, "w") as f:
        f.write('name = "Aalis"\n')
    assert HandshakeClient(svc).initialized["appName"] == "Aalis"
    set_layer(c, GLOBAL, "agent", "maxSteps", 9)
    with open(path, "a") as f:
        f.write("\n[other]\nkept = true\n")
    assert config_doc(host)["name"] == "Aalis"
    with open(path) as f:
        text = f.read().replace('"Aalis"', '"Bea"')
    with open(path, "w") as f:
        f.write(text)
    assert HandshakeClient(svc).initialized["appName"] == "Bea"


def test_writing_the_document_keeps_its_other_keys_and_leaves_no_temporary_file(world):
    host, _, c = world
    path = os.path.join(host.rt.data_dir, "config.toml")
    with open(path, "w") as f:
        f.write('name = "Aalis"\nlanguage = "en"\n\n[plugins.agent]\napiKey = "k"\n')
    assert "unsaved" not in set_layer(c, GLOBAL, "agent", "maxSteps", 9)["result"]
    doc = config_doc(host)
    assert doc["name"] == "Aalis" and doc["language"] == "en"
    assert doc["plugins"]["agent"] == {"apiKey": "k", "maxSteps": 9}
    assert sorted(os.listdir(host.rt.data_dir)) == sorted(n for n in os.listdir(host.rt.data_dir)
                                                          if not n.startswith(".config.toml."))


def test_the_toml_writer_round_trips_what_tomllib_reads():
    doc = {"name": 'A "quoted"\\ name\n\x7f', "n": 3, "x": 1.5, "flag": False, "list": [1, "two", {"k": 1}],
           "plugins": {"agent": {"maxSteps": 4}, "odd key": {"ü": "ß"}}, "empty": {}}
    assert tomllib.loads(dump_toml(doc)) == doc


# --- rows of one session ----------------------------------------------------------------------------


def test_rows_are_sorted_composer_then_common_then_advanced_by_declared_order(world):
    _, _, c = world
    sid = new_session(c)
    items = c.result("session/config/get", {"sessionId": sid})["items"]
    assert [(r["plugin"], r["key"], r["prominence"]) for r in items] == [
        ("llm", "model", "composer"), ("tools", "permissionMode", "composer"), ("agent", "maxSteps", "common"),
        ("agent", "systemPrompt", "common"), ("tools", "sandbox", "common"),
        ("agent", "contextChars", "advanced")]


def test_a_row_carries_the_field_declaration_with_its_session_spec_and_no_functions(world):
    _, _, c = world
    row = get_row(c, new_session(c), "agent", "maxSteps")
    assert row["field"] == {
        "type": "integer", "title": "Model calls per turn", "default": 20, "minimum": 0,
        "description": "After this many model calls a turn stops with a notice; continue resumes it. "
                       "0: unlimited (turn/abort still stops a turn).",
        "session": {"prominence": "common", "order": 3}}
    assert "actual" not in row["field"]


def test_with_no_layer_value_the_default_is_effective_with_source_default(world):
    _, _, c = world
    row = get_row(c, new_session(c), "agent", "maxSteps")
    assert (row["effective"], row["source"]) == (20, "default") and "value" not in row and "actual" not in row


def test_a_row_without_an_effective_value_carries_the_actual_value_in_use(world):
    host, _, c = world
    row = get_row(c, new_session(c), "llm", "model")
    assert "effective" not in row and "source" not in row
    assert row["actual"] == {"value": "mock/mock", "label": "Follow the service preference (now: mock)"}
    bot_room = host.create(kind="room", platform="onebot", permission_mode="deny").id
    assert get_row(c, bot_room, "tools", "permissionMode")["actual"] == {"value": "deny"}  # its own mode


def test_a_session_lists_no_field_that_can_only_be_set_down_to_a_place(world):
    _, _, c = world
    assert ("tools", "execYieldSeconds") not in rows(c.result("session/config/get", {"sessionId": new_session(c)}))


def test_a_session_lists_only_fields_that_apply_to_its_kind(world):
    host, _, c = world
    host.settings.declare([SettingField("im", "replyInGroups", "boolean", "Reply in groups",
                                                   prominence="common", applies_to=("room",))])
    assert ("im", "replyInGroups") not in rows(c.result("session/config/get", {"sessionId": new_session(c)}))
    assert ("im", "replyInGroups") in rows(c.result("session/config/get", {"sessionId": room(host)}))


def test_get_names_the_platform_its_platform_layer_used(world):
    host, _, c = world
    assert c.result("session/config/get", {"sessionId": new_session(c)})["platform"] == "console"
    assert c.result("session/config/get", {"sessionId": room(host)})["platform"] == "onebot"


def test_get_on_a_session_the_connection_cannot_see_is_not_found(world):
    host, svc, c = world
    host.register_app("bot", platform="telegram", containers=["inbox"])
    other = MemoryClient(svc, app_id="bot")
    mine = new_session(c)
    for client, sid in ((c, "nope"), (other, mine)):
        error = client.call("session/config/get", {"sessionId": sid})["error"]
        assert error["data"]["code"] == "not-found"


def test_more_than_two_composer_fields_of_one_plugin_fall_back_to_common(world):
    host, _, c = world
    host.settings.declare([
        SettingField("ui", f"k{i}", "boolean", f"K{i}", prominence="composer", order=i) for i in range(3)])
    got = rows(c.result("session/config/get", {"sessionId": new_session(c)}))
    assert [got[("ui", f"k{i}")]["prominence"] for i in range(3)] == ["composer", "composer", "common"]
    assert got[("ui", "k2")]["field"]["session"]["prominence"] == "composer"


# --- writing one session's layer -----------------------------------------------------------------------


def test_updating_a_session_value_answers_with_value_effective_and_source_session(world):
    host, _, c = world
    sid = new_session(c)
    row = rows(set_session(c, sid, "agent", "maxSteps", 2)["result"])[("agent", "maxSteps")]
    assert (row["value"], row["effective"], row["source"]) == (2, 2, "session")
    assert [(e.plugin, e.key, e.value) for e in events_of(host, sid, E.SessionSettingChanged)] == [
        ("agent", "maxSteps", 2)]


def test_null_deletes_the_session_value_and_the_row_inherits_again(world):
    _, _, c = world
    sid = new_session(c)
    set_layer(c, GLOBAL, "agent", "maxSteps", 6)
    set_session(c, sid, "agent", "maxSteps", 2)
    row = rows(set_session(c, sid, "agent", "maxSteps", None)["result"])[("agent", "maxSteps")]
    assert "value" not in row and (row["effective"], row["source"]) == (6, "global")


@pytest.mark.parametrize("plugin, key, value", [
    ("agent", "maxSteps", "many"), ("agent", "maxSteps", -1), ("agent", "maxSteps", True), ("agent", "maxSteps", 2.5),
    ("tools", "permissionMode", "sometimes"), ("agent", "systemPrompt", 3), ("llm", "model", " "),
    ("agent", "nope", 1), ("nobody", "maxSteps", 1),
])
def test_an_invalid_value_or_key_is_invalid_params_and_nothing_changes(world, plugin, key, value):
    host, _, c = world
    sid = new_session(c)
    error = set_session(c, sid, plugin, key, value)["error"]
    assert error["code"] == INVALID_PARAMS and error["message"].startswith(("params.value", "params.key"))
    assert events_of(host, sid, E.SessionSettingChanged) == []


def test_a_field_that_stops_at_the_place_cannot_be_written_on_one_session(world):
    host, _, c = world
    sid = new_session(c)
    error = set_session(c, sid, "tools", "execYieldSeconds", 1)["error"]
    assert error["code"] == INVALID_PARAMS and "place" in error["message"]
    assert events_of(host, sid, E.SessionSettingChanged) == []


def test_a_field_that_does_not_apply_to_the_session_is_refused_but_null_is_not_checked(world):
    host, _, c = world
    host.settings.declare([SettingField("im", "replyInGroups", "boolean", "Reply in groups",
                                                   applies_to=("room",))])
    sid = new_session(c)
    assert set_session(c, sid, "im", "replyInGroups", True)["error"]["code"] == INVALID_PARAMS
    assert "result" in set_session(c, sid, "im", "replyInGroups", None)
    assert events_of(host, sid, E.SessionSettingChanged) == []


def test_an_app_may_set_its_own_session_but_not_read_or_write_layers(world):
    host, svc, _ = world
    host.register_app("bot", platform="telegram", containers=["inbox"])
    bot = MemoryClient(svc, app_id="bot")
    sid = bot.result("loop/create", {"containerId": "inbox"})["sessionId"]
    assert rows(set_session(bot, sid, "agent", "maxSteps", 3)["result"])[("agent", "maxSteps")]["source"] == "session"
    for method, params in (("session/config/layers", {}), ("session/config/layer/get", {"layer": GLOBAL}),
                           ("session/config/overrides", {"plugin": "agent"})):
        assert bot.call(method, params)["error"]["data"]["code"] == "forbidden"


# --- layers ----------------------------------------------------------------------------------------


def test_layers_answer_the_order_table_and_every_layer_that_can_be_set(world):
    host, _, c = world
    room(host)
    host.settings.declare_platform("onebot", {"group": "QQ group", "private": None})
    set_layer(c, {"scope": "platformType", "platform": "slack", "type": "channel"}, "agent", "maxSteps", 3)
    result = c.result("session/config/layers", {})
    assert [(o["name"], o["label"]) for o in result["order"]] == [
        ("global", "Global (plugin configuration)"), ("platform", "Platform"),
        ("platformType", "Platform chat type"), ("place", "Place"), ("session", "This session")]
    assert result["layers"] == [
        {"layer": {"scope": "global"}},
        {"layer": {"scope": "platform", "platform": "console"}},
        {"layer": {"scope": "platform", "platform": "onebot"}},
        {"layer": {"scope": "platform", "platform": "slack"}},
        {"layer": {"scope": "platformType", "platform": "onebot", "type": "group"}, "label": "QQ group"},
        {"layer": {"scope": "platformType", "platform": "onebot", "type": "private"}},
        {"layer": {"scope": "platformType", "platform": "slack", "type": "channel"}},
        {"layer": {"scope": "place", "key": "workspace:default"}, "label": "Default workspace"},
        {"layer": {"scope": "place", "key": "onebot:42:group:7"}, "label": "QQ group Friends",
         "platform": "onebot", "type": "group"},
    ]


def test_places_list_workspaces_first_the_default_one_first_then_windows(world, tmp_path):
    host, _, c = world
    room(host)
    folder = tmp_path / "proj"
    folder.mkdir()
    host.create(cwd=str(folder))
    new_session(c)
    places = [(i["layer"]["key"], i.get("label")) for i in c.result("session/config/layers", {})["layers"]
              if i["layer"]["scope"] == "place"]
    assert places == [("workspace:default", "Default workspace"), (f"workspace:{folder}", 'Workspace "proj"'),
                      ("onebot:42:group:7", "group Friends")]


def test_layer_rows_are_effective_up_to_that_layer(world):
    _, _, c = world
    set_layer(c, GLOBAL, "agent", "maxSteps", 6)
    assert layer_row(c, GLOBAL, "agent", "maxSteps")["source"] == "global"
    platform = layer_row(c, {"scope": "platform", "platform": "onebot"}, "agent", "maxSteps")
    assert "value" not in platform and (platform["effective"], platform["source"]) == (6, "global")
    set_layer(c, {"scope": "platform", "platform": "onebot"}, "agent", "maxSteps", 4)
    kind = layer_row(c, {"scope": "platformType", "platform": "onebot", "type": "group"}, "agent", "maxSteps")
    assert (kind["effective"], kind["source"]) == (4, "platform")
    assert layer_row(c, GLOBAL, "agent", "maxSteps")["effective"] == 6


def test_a_window_place_is_above_global_platform_and_platform_type(world):
    host, _, c = world
    sid = room(host)
    window = {"scope": "place", "key": WINDOW.key}
    for layer, steps in ((GLOBAL, 9), ({"scope": "platform", "platform": "onebot"}, 8),
                         ({"scope": "platformType", "platform": "onebot", "type": "group"}, 7), (window, 6)):
        set_layer(c, layer, "agent", "maxSteps", steps)
    assert (get_row(c, sid, "agent", "maxSteps")["source"]) == "place"
    assert layer_row(c, window, "agent", "maxSteps")["effective"] == 6
    set_layer(c, window, "agent", "maxSteps", None)
    assert get_row(c, sid, "agent", "maxSteps")["source"] == "platformType"
    set_layer(c, {"scope": "platformType", "platform": "onebot", "type": "group"}, "agent", "maxSteps", None)
    assert get_row(c, sid, "agent", "maxSteps")["source"] == "platform"  # platformType above platform
    set_layer(c, {"scope": "platform", "platform": "onebot"}, "agent", "maxSteps", None)
    assert get_row(c, sid, "agent", "maxSteps")["source"] == "global"  # platform above global only


def test_a_workspace_place_is_above_global_only(world):
    _, _, c = world
    sid = new_session(c)
    set_layer(c, GLOBAL, "agent", "maxSteps", 9)
    set_layer(c, DEFAULT_WORKSPACE, "agent", "maxSteps", 5)
    assert (get_row(c, sid, "agent", "maxSteps")["effective"]) == 5
    set_layer(c, {"scope": "platform", "platform": "console"}, "agent", "maxSteps", 4)
    row = get_row(c, sid, "agent", "maxSteps")
    assert (row["effective"], row["source"]) == (4, "platform")


def test_a_child_session_resolves_through_its_root(world):
    host, _, c = world
    parent = room(host)
    child = new_session(c, parentId=parent)
    set_layer(c, {"scope": "platformType", "platform": "onebot", "type": "group"}, "agent", "maxSteps", 7)
    set_layer(c, {"scope": "place", "key": WINDOW.key}, "agent", "systemPrompt", "Be brief.")
    got = c.result("session/config/get", {"sessionId": child})
    assert got["platform"] == "onebot"
    assert (rows(got)[("agent", "maxSteps")]["source"], rows(got)[("agent", "systemPrompt")]["source"]) == (
        "platformType", "place")
    set_session(c, parent, "agent", "maxSteps", 3)  # the root's own layer is the root's only
    assert get_row(c, child, "agent", "maxSteps")["effective"] == 7


def test_global_platform_and_platform_type_values_persist_in_config_toml(env):
    host, svc = env()
    c = MemoryClient(svc)
    set_layer(c, GLOBAL, "agent", "maxSteps", 9)
    set_layer(c, {"scope": "platform", "platform": "onebot"}, "agent", "maxSteps", 8)
    set_layer(c, {"scope": "platformType", "platform": "onebot", "type": "group"}, "tools", "permissionMode", "deny")
    assert config_doc(host) == {
        "plugins": {"agent": {"maxSteps": 9}},
        "sessionSettings": {"platform": {"onebot": {"agent": {"maxSteps": 8}}},
                            "platformType": {"onebot": {"group": {"tools": {"permissionMode": "deny"}}}}}}
    svc.close()
    host.close()
    _, svc2 = env()
    again = MemoryClient(svc2)
    assert layer_row(again, {"scope": "platform", "platform": "onebot"}, "agent", "maxSteps")["value"] == 8


def test_null_on_the_global_layer_restores_the_default(world):
    host, _, c = world
    set_layer(c, GLOBAL, "agent", "maxSteps", 9)
    row = rows(set_layer(c, GLOBAL, "agent", "maxSteps", None)["result"])[("agent", "maxSteps")]
    assert "value" not in row and (row["effective"], row["source"]) == (20, "default")
    assert "plugins" not in config_doc(host)


def test_an_unwritable_config_toml_reports_unsaved_after_the_change_took_effect(world):
    host, _, c = world
    path = os.path.join(host.rt.data_dir, "config.toml")
    with open(path, "w") as f:
        f.write('name = "Aalis"\n')
    os.chmod(path, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    sid = new_session(c)
    result = set_layer(c, GLOBAL, "agent", "maxSteps", 3)["result"]
    assert "may not be written" in result["unsaved"] and path in result["unsaved"]
    assert rows(result)[("agent", "maxSteps")]["value"] == 3
    assert get_row(c, sid, "agent", "maxSteps")["effective"] == 3  # in effect although not saved
    with open(path) as f:
        assert f.read() == 'name = "Aalis"\n'


def test_any_other_write_failure_is_reported_unsaved_with_its_own_sentence(world):
    host, _, c = world
    os.mkdir(os.path.join(host.rt.data_dir, "config.toml"))  # cannot be replaced by a file
    result = set_layer(c, {"scope": "platform", "platform": "onebot"}, "agent", "maxSteps", 3)["result"]
    assert result["unsaved"].startswith("Applied, but not saved: writing the configuration file")
    assert rows(result)[("agent", "maxSteps")]["effective"] == 3


def test_an_invalid_value_in_the_document_read_at_start_is_shown_but_not_effective(env, data_dir):
    os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(data_dir, "config.toml"), "w") as f:
        f.write('[plugins.agent]\nmaxSteps = "lots"\n')
    _, svc = env()
    row = layer_row(MemoryClient(svc), GLOBAL, "agent", "maxSteps")
    assert (row["value"], row["effective"], row["source"]) == ("lots", 20, "default")


@pytest.mark.parametrize("edit, problem", [
    ('[plugins.agent]\nmaxSteps = "lots"\n', "plugins.agent.maxSteps: expected an integer"),
    ("[plugins.agent\nmaxSteps = 5\n", "not valid TOML"),
    ("[sessionSettings.platform]\nonebot = 3\n", "sessionSettings.platform.onebot: expected a table"),
])
def test_a_later_edit_that_is_not_a_valid_document_is_refused_and_the_values_before_stay(world, caplog, edit,
                                                                                         problem):
    host, _, c = world
    path = os.path.join(host.rt.data_dir, "config.toml")
    set_layer(c, GLOBAL, "agent", "maxSteps", 7)
    with open(path, "w") as f:
        f.write(edit)
    for _ in range(2):  # every settings request re-reads the file; the refusal is said once
        row = layer_row(c, GLOBAL, "agent", "maxSteps")
        assert (row["value"], row["effective"], row["source"]) == (7, 7, "global")
    said = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"{path} refused: {problem}"), said
    assert said[0].endswith("the settings read before stay in force (fix the file, then send the server SIGHUP)")


def test_an_edit_of_config_toml_by_someone_else_is_picked_up(world):
    host, _, c = world
    sid = new_session(c)
    with open(os.path.join(host.rt.data_dir, "config.toml"), "w") as f:
        f.write("[plugins.agent]\nmaxSteps = 11\n")
    assert get_row(c, sid, "agent", "maxSteps")["effective"] == 11


def test_place_values_are_events_in_the_place_stream_and_survive_a_restart(env):
    host, svc = env()
    c = MemoryClient(svc)
    sid = room(host)
    set_layer(c, {"scope": "place", "key": WINDOW.key}, "agent", "maxSteps", 4)
    stream = [r.event for r in host.store.read_stream(f"place-{WINDOW.key}")]
    assert isinstance(stream[0], E.PlaceRegistered) and (stream[0].kind, stream[0].name) == ("window", "Friends")
    assert [(e.plugin, e.key, e.value) for e in stream if isinstance(e, E.PlaceSettingChanged)] == [
        ("agent", "maxSteps", 4)]
    svc.close()
    host.close()
    _, svc2 = env()
    again = MemoryClient(svc2)
    row = get_row(again, sid, "agent", "maxSteps")
    assert (row["effective"], row["source"]) == (4, "place")


@pytest.mark.parametrize("layer", [
    {"scope": "place", "key": "onebot:1:group:404"}, {"scope": "session"}, {"scope": "planet"},
    {"scope": "platform", "platform": ""}, {"scope": "platformType", "platform": "onebot"},
])
def test_an_invalid_layer_or_an_unrecorded_place_is_invalid_params(world, layer):
    host, _, c = world
    for method, params in (("session/config/layer/get", {"layer": layer}),
                           ("session/config/layer/update", {"layer": layer, "plugin": "agent", "key": "maxSteps",
                                                            "value": 2})):
        assert c.call(method, params)["error"]["code"] == INVALID_PARAMS
    assert not os.path.exists(os.path.join(host.rt.data_dir, "config.toml"))


def test_a_layer_write_of_a_bad_value_or_unknown_key_changes_nothing(world):
    host, _, c = world
    for plugin, key, value in (("agent", "maxSteps", -1), ("agent", "color", "red")):
        assert set_layer(c, GLOBAL, plugin, key, value)["error"]["code"] == INVALID_PARAMS
    assert not os.path.exists(os.path.join(host.rt.data_dir, "config.toml"))


def test_each_layer_lists_the_fields_meant_for_it(world):
    host, _, c = world
    host.settings.declare([SettingField("im", "replyInGroups", "boolean", "Reply in groups",
                                                   applies_to=("room",))])
    room(host)
    new_session(c)

    def keys(layer: dict[str, Any]) -> set[str]:
        return {r["key"] for r in c.result("session/config/layer/get", {"layer": layer})["items"]}

    everything = {"model", "permissionMode", "maxSteps", "systemPrompt", "contextChars", "execYieldSeconds",
                  "sandbox", "replyInGroups"}
    assert keys(GLOBAL) == keys({"scope": "platform", "platform": "onebot"}) == everything
    assert keys({"scope": "platformType", "platform": "onebot", "type": "group"}) == everything  # rooms or tasks
    assert keys({"scope": "place", "key": WINDOW.key}) == everything - {"execYieldSeconds"}  # rooms
    assert keys(DEFAULT_WORKSPACE) == everything - {"replyInGroups"}  # owner sessions
    assert set_layer(c, DEFAULT_WORKSPACE, "im", "replyInGroups", True)["error"]["code"] == INVALID_PARAMS


# --- overrides ---------------------------------------------------------------------------------------


def test_overrides_list_every_place_beyond_global_grouped_by_key(world):
    _, _, c = world
    parent = new_session(c, name="Plans")
    child = new_session(c, parentId=parent)
    c.result("session/rename", {"sessionId": child, "title": "Research"})
    set_layer(c, GLOBAL, "agent", "maxSteps", 9)
    set_layer(c, {"scope": "platform", "platform": "onebot"}, "agent", "maxSteps", 8)
    set_layer(c, DEFAULT_WORKSPACE, "agent", "systemPrompt", "Hi")
    set_session(c, parent, "agent", "maxSteps", 3)
    set_session(c, child, "agent", "maxSteps", 2)
    got = c.result("session/config/overrides", {"plugin": "agent"})["items"]
    # sessions come in id order; two ids made in the same millisecond need not be in creation order
    sessions = sorted([
        {"target": {"scope": "session", "sessionId": parent, "title": "Plans"}, "value": 3},
        {"target": {"scope": "session", "sessionId": child, "title": "Research",
                    "parent": {"id": parent, "title": "Plans"}}, "value": 2}], key=lambda e: e["target"]["sessionId"])
    assert got == [
        {"key": "maxSteps", "entries": [
            {"target": {"scope": "platform", "platform": "onebot"}, "value": 8}, *sessions]},
        {"key": "systemPrompt", "entries": [
            {"target": {"scope": "place", "key": "workspace:default"}, "value": "Hi"}]},
    ]


def test_overrides_are_found_from_the_log_after_a_restart_and_deleted_sessions_drop_out(env):
    host, svc = env()
    c = MemoryClient(svc)
    kept, gone = new_session(c), new_session(c)
    set_session(c, kept, "tools", "permissionMode", "deny")
    set_session(c, gone, "tools", "permissionMode", "ask")
    c.result("session/delete", {"sessionId": gone})
    svc.close()
    host.close()
    _, svc2 = env()
    got = MemoryClient(svc2).result("session/config/overrides", {"plugin": "tools"})["items"]
    assert [(g["key"], [e["target"]["sessionId"] for e in g["entries"]]) for g in got] == [("permissionMode", [kept])]


def test_overrides_of_a_plugin_that_declares_nothing_is_invalid_params(world):
    _, _, c = world
    assert c.call("session/config/overrides", {"plugin": "ghost"})["error"]["code"] == INVALID_PARAMS


# --- session/config/changed ------------------------------------------------------------------------------


def changed(c: MemoryClient) -> dict[str, Any]:
    return c.wait(lambda f: f.get("method") == "session/config/changed", 5)


def test_a_change_pushes_session_config_changed_without_params_to_every_connection(world):
    _, svc, a = world
    b = MemoryClient(svc)
    sid = new_session(a)
    for action in (lambda: set_session(a, sid, "agent", "maxSteps", 2),
                   lambda: set_layer(a, GLOBAL, "agent", "maxSteps", 4),
                   lambda: set_layer(a, DEFAULT_WORKSPACE, "agent", "maxSteps", 5)):
        clear(a)
        clear(b)
        action()
        for c in (a, b):
            assert changed(c)["params"] == {}


def test_a_session_in_a_new_place_or_deleted_with_own_values_pushes_session_config_changed(world):
    host, _, c = world
    clear(c)
    sid = room(host)  # a new window: the list of layers grew
    changed(c)
    set_session(c, sid, "agent", "maxSteps", 2)
    clear(c)
    c.result("session/delete", {"sessionId": sid})  # its own value leaves the overrides
    changed(c)


def test_closed_protocol_services_leave_no_settings_watch_and_a_live_one_still_hears_changes(env):
    host, live = env()
    c = MemoryClient(live)
    assert host.settings.watching == 1  # the live service's
    for _ in range(50):
        host.protocol().close()
    assert host.settings.watching == 1
    sid = new_session(c)
    clear(c)
    set_session(c, sid, "agent", "maxSteps", 2)
    changed(c)
    live.close()
    assert host.settings.watching == 0


def test_a_closed_settings_watch_is_not_called_again(world):
    host, _, c = world
    calls: list[int] = []
    watch = host.settings.watch(lambda: calls.append(1))
    sid = new_session(c)
    set_session(c, sid, "agent", "maxSteps", 2)
    assert calls == [1]
    watch.close()
    watch.close()  # twice is harmless
    set_session(c, sid, "agent", "maxSteps", 3)
    assert calls == [1]


def test_a_session_that_changes_no_setting_shown_pushes_nothing(world):
    host, _, c = world
    calls: list[int] = []
    host.settings.watch(lambda: calls.append(1))  # called before the reply
    first = new_session(c)
    c.result("session/delete", {"sessionId": new_session(c)})
    assert calls == []
    set_session(c, first, "agent", "maxSteps", 2)
    assert calls == [1]


def test_a_withdrawn_plugin_is_not_listed_and_its_values_come_back_when_it_returns(world):
    host, _, c = world
    settings = host.settings
    units = SettingField("weather", "units", "enum", "Units", options=("metric", "imperial"), prominence="common")
    settings.declare([units])
    sid = new_session(c)
    set_session(c, sid, "weather", "units", "imperial")
    clear(c)
    settings.withdraw("weather")
    changed(c)
    assert ("weather", "units") not in rows(c.result("session/config/get", {"sessionId": sid}))
    settings.declare([units])
    assert get_row(c, sid, "weather", "units")["value"] == "imperial"


# --- the agent uses the effective values -------------------------------------------------------------------


def test_max_steps_two_on_one_session_gives_it_the_tool_limit_notice_and_not_its_neighbour(env):
    host, svc = env(permission_mode="acceptCalls", max_steps=4)
    c = MemoryClient(svc)
    limited, neighbour = new_session(c), new_session(c)
    set_session(c, limited, "agent", "maxSteps", 2)
    for sid in (limited, neighbour):
        send_and_wait(c, sid, "!loop")
    notices = {sid: [n for n in events_of(host, sid, E.NoticePosted) if n.topic == "tool-limit"]
               for sid in (limited, neighbour)}
    assert [n.text for n in notices[limited]] == ["Stopped after 2 model calls; continue to let the agent go on."]
    assert len(events_of(host, limited, E.LlmCompleted)) == 2
    assert all("after 2 " not in n.text for n in notices[neighbour])
    assert len(events_of(host, neighbour, E.LlmCompleted)) == 4


def test_a_limit_of_one_stops_a_tool_turn_that_its_neighbour_finishes(env):
    host, svc = env(permission_mode="acceptCalls")
    c = MemoryClient(svc)
    limited, neighbour = new_session(c), new_session(c)
    set_session(c, limited, "agent", "maxSteps", 1)
    for sid in (limited, neighbour):
        send_and_wait(c, sid, '!tool list_files {"path": "."}')
    assert [n.topic for n in events_of(host, limited, E.NoticePosted)] == ["tool-limit"]
    assert events_of(host, neighbour, E.NoticePosted) == []
    assert events_of(host, neighbour, E.TurnCompleted)[-1].output_text == "done: 1 tool calls"


def test_a_global_change_reaches_a_live_session_on_its_next_turn(env):
    host, svc = env(permission_mode="acceptCalls")
    c = MemoryClient(svc)
    sid = new_session(c)
    send_and_wait(c, sid, "hello")  # the session is live, its config cached
    set_layer(c, GLOBAL, "agent", "maxSteps", 3)
    send_and_wait(c, sid, "!loop")
    assert events_of(host, sid, E.TurnLimitReached)[-1].max_steps == 3


class RecordingProvider(MockProvider):
    def __init__(self) -> None:
        super().__init__()
        self.requests: list[Any] = []

    def answer_now(self, request: Any, on_delta: Any) -> Any:
        self.requests.append(request)
        return super().answer_now(request, on_delta)


def test_a_system_prompt_set_on_a_window_reaches_the_model_for_its_rooms(env):
    provider = RecordingProvider()
    host, svc = env(provider=provider)
    c = MemoryClient(svc)
    sid = room(host)
    set_layer(c, {"scope": "place", "key": WINDOW.key}, "agent", "systemPrompt", "You are in Friends.")
    send_and_wait(c, sid, "hi")
    assert provider.requests[-1].messages[0] == E.Message(role="system", content="You are in Friends.")


def test_the_model_setting_is_the_model_of_the_next_request(world):
    host, _, c = world
    sid = new_session(c)
    set_session(c, sid, "llm", "model", "mock/mock-large")
    send_and_wait(c, sid, "hi")
    assert events_of(host, sid, E.LlmCompleted)[-1].model == "mock-large"
    row = get_row(c, sid, "llm", "model")
    assert (row["effective"], row["source"]) == ("mock/mock-large", "session") and "actual" not in row


def test_permission_mode_deny_set_on_a_session_refuses_its_tool_calls(world):
    host, _, c = world
    sid = new_session(c)
    set_session(c, sid, "tools", "permissionMode", "deny")
    send_and_wait(c, sid, '!tool exec {"command": "echo hi"}')
    finished = events_of(host, sid, E.ToolFinished)[-1]
    assert finished.status == "denied" and finished.output == {"error": "denied: the permission mode is deny"}


def test_exec_yield_seconds_set_on_the_workspace_sends_exec_to_the_background_sooner(env):
    host, svc = env(permission_mode="acceptCalls")
    c = MemoryClient(svc)
    sid = new_session(c)
    set_layer(c, DEFAULT_WORKSPACE, "tools", "execYieldSeconds", 0)
    send_and_wait(c, sid, '!tool exec {"command": "sleep 2; echo late"}')
    finished = events_of(host, sid, E.ToolFinished)[0]
    assert finished.task_id is not None and finished.output["status"] == "running"
    c.result("background/stopAll", {"sessionId": sid})
    host.rt.tasks_service.stop_session([sid])


# --- places and summaries ------------------------------------------------------------------------------


def test_a_room_filed_with_a_chat_window_is_in_that_window_place(world):
    host, _, c = world
    sid = room(host)
    summary = c.result("sessions/list", {"section": "rooms"})["sessions"][0]
    assert summary["id"] == sid and summary["chat"] == {"type": "group", "multiParty": True}
    assert summary["place"] == {"key": WINDOW.key, "kind": "window", "name": "Friends"}
    set_layer(c, {"scope": "place", "key": WINDOW.key}, "agent", "maxSteps", 5)
    assert get_row(c, sid, "agent", "maxSteps")["source"] == "place"


def test_an_owner_session_with_a_folder_is_in_that_project_workspace(world, tmp_path):
    host, _, c = world
    folder = tmp_path / "site"
    folder.mkdir()
    sid = host.create(cwd=str(folder)).id
    set_layer(c, {"scope": "place", "key": f"workspace:{folder}"}, "agent", "maxSteps", 5)
    assert get_row(c, sid, "agent", "maxSteps")["source"] == "place"
    assert get_row(c, new_session(c), "agent", "maxSteps")["source"] == "default"  # the default workspace


def test_a_child_summary_takes_place_and_chat_from_its_root(world):
    host, _, c = world
    child = c.result("session/create", {"parentId": room(host)})["session"]
    assert child["place"] == {"key": WINDOW.key, "kind": "window", "name": "Friends"}
    assert child["chat"] == {"type": "group", "multiParty": True}


def test_an_owner_session_summary_names_its_workspace(world):
    _, _, c = world
    assert c.result("session/create", {})["session"]["place"]["kind"] == "workspace"


# --- rooms in sessions/list -----------------------------------------------------------------------------


def test_app_created_rooms_are_in_the_rooms_section_grouped_by_platform_and_instance(world):
    host, svc, c = world
    host.register_app("mybot", platform="telegram", containers=["inbox"])
    host.register_app("helper", platform="slack", containers=["inbox"])
    made = {app: [MemoryClient(svc, app_id=app).result("loop/create", {"containerId": "inbox"})["sessionId"]
                  for _ in range(n)] for app, n in (("mybot", 2), ("helper", 1))}
    new_session(c)
    listed = c.result("sessions/list", {"section": "rooms"})
    assert {s["id"] for s in listed["sessions"]} == {*made["mybot"], *made["helper"]}
    assert all(s["kind"] == "room" and s["section"] == "rooms" and not s["unread"] for s in listed["sessions"])
    assert listed["groups"] == [
        {"platform": "slack", "instance": "helper", "label": "helper", "rooms": 1, "accounts": 0, "attention": 0},
        {"platform": "telegram", "instance": "mybot", "label": "mybot", "rooms": 2, "accounts": 0, "attention": 0},
    ]
    assert [s["section"] for s in c.result("sessions/list", {})["sessions"]] == ["owner", "rooms", "rooms", "rooms"]


def test_room_groups_put_instances_first_by_id_and_the_instance_less_group_last(world):
    host, _, c = world
    room(host, instance="ob-2", account="1", place=None, chat=None)
    room(host, instance="ob-1", account="1", place=None, chat=None)
    room(host, instance="ob-1", account="2", place=None, chat=None)
    room(host, instance=None, account=None, place=None, chat=None)
    room(host, platform="discord", instance="d1", account=None, place=None, chat=None)
    groups = c.result("sessions/list", {})["groups"]
    assert [(g["platform"], g.get("instance"), g["label"], g["rooms"], g["accounts"]) for g in groups] == [
        ("discord", "d1", "d1", 1, 0), ("onebot", "ob-1", "ob-1", 2, 2), ("onebot", "ob-2", "ob-2", 1, 1),
        ("onebot", None, "onebot", 1, 0)]
    only = c.result("sessions/list", {"platform": "onebot"})["sessions"]
    assert len(only) == 1 and "instance" not in only[0]
    assert len(c.result("sessions/list", {"instance": "ob-1"})["sessions"]) == 2


def start_child_approval(host: Any, c: MemoryClient) -> str:
    """A room whose child session waits on an approval: the room needs attention."""
    parent = room(host)
    child = new_session(c, parentId=parent)
    c.result("presence/update", {"active": True})
    c.result("turn/send", {"sessionId": child, "content": '!tool exec {"command": "echo x"}'})
    c.wait(lambda f: f.get("method") == "approval/requested", 10)
    return parent


def test_a_room_group_counts_rooms_whose_children_wait_on_an_approval(world):
    host, _, c = world
    start_child_approval(host, c)
    groups = c.result("sessions/list", {})["groups"]
    assert [(g["instance"], g["attention"]) for g in groups] == [("onebot-1", 1)]


def test_sessions_changed_groups_count_rooms_whose_children_wait_on_an_approval(world):
    host, _, c = world
    c.result("sessions/watch", {})
    parent = start_child_approval(host, c)
    push = c.wait(lambda f: f.get("method") == "sessions/changed"
                  and any(s["id"] == parent and s["attention"] for s in f["params"]["upserts"]), 10)
    assert [g["attention"] for g in push["params"]["groups"]] == [1]


def test_query_platform_colon_group_matches_a_room_id_with_that_group(world):
    host, _, c = world
    sid = "onebot:42:group:20001"
    created = NewSession(kind="room", platform="onebot", instance="onebot-1")
    host.rt.ask(sid, lambda r: Create(created, None, r))
    room(host)
    assert [s["id"] for s in c.result("sessions/list", {"query": "onebot:20001"})["sessions"]] == [sid]
    assert c.result("sessions/list", {"query": "onebot:20002"})["sessions"] == []


def test_query_platform_colon_group_finds_a_room_by_its_window_key(world):
    host, _, c = world
    sid = room(host, place=E.PlaceRef(key="onebot:42:group:20001", kind="window", name="Team"))
    assert [s["id"] for s in c.result("sessions/list", {"query": "onebot:20001"})["sessions"]] == [sid]


# --- check_value: the in-process Python API passes any int -----------------------------------------


@pytest.mark.parametrize(("f", "value", "sentence"), [
    (SettingField("agent", "maxSteps", "integer", "Steps", minimum=1, maximum=1000), 10**400,
     "agent/maxSteps: at most 1000"),
    (SettingField("agent", "maxSteps", "integer", "Steps", minimum=1, maximum=1000), -10**400,
     "agent/maxSteps: at least 1"),
    (SettingField("ui", "count", "integer", "Count"), 10**400,
     "ui/count: expected an integer from -2**63 to 2**63-1"),
    (SettingField("ui", "ratio", "number", "Ratio"), 10**400,
     "ui/ratio: expected a number from -2**63 to 2**63-1"),
], ids=["over-the-maximum", "under-the-minimum", "unbounded-integer", "unbounded-number"])
def test_check_value_on_a_huge_integer_answers_the_fields_sentence(f, value, sentence):
    assert check_value(f, value) == sentence
