"""Human text in the server's language (seed 004 文字与语言; SPEC §6: ``en`` default, ``zh``
supported): the catalogue is complete in both languages, text objects render when a frame is
sent, events keep keys and values (old events show their stored text), and raw data is never
translated. Gateway tests run on a real host with in-memory clients (``gateway_harness``)."""

from __future__ import annotations

import os
import re
from typing import Any

import msgspec
import pytest

from sessionloop.actors import events as E
from sessionloop.actors.events import decode_event, encode_event
from sessionloop.actors.gateway.service import SessionProtocolService
from sessionloop.actors.model import ModelError, ScriptedProvider
from sessionloop.actors.replay.live import serve_live_view
from sessionloop.actors.replay.verify import verify
from sessionloop.actors.session.decide import compact_failed
from sessionloop.actors.settings.texts import (
    CATALOGUE,
    LANGUAGES,
    STRICT_ENV,
    MissingText,
    Text,
    enc_hook,
    placeholders,
    stored_parts,
    text,
)
from sessionloop.actors.tasks.model import task_ended
from sessionloop.actors.views.items import ItemsProjection
from tests.actors.gateway_harness import MemoryClient, wait_until

CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")
#: templates that are the same words in every language (a field path around a placeholder)
SAME_IN_EVERY_LANGUAGE = {"error.params"}


def zh(value: Any) -> Any:
    """``value`` as a frame of a ``zh`` server carries it."""
    return msgspec.json.decode(msgspec.json.Encoder(enc_hook=enc_hook(lambda: "zh")).encode(value))


# --- the catalogue ----------------------------------------------------------------------------------


def test_every_catalogue_key_renders_in_every_language_with_the_same_placeholders() -> None:
    for key, entry in CATALOGUE.items():
        assert set(entry) == set(LANGUAGES), f"{key}: languages {sorted(entry)}"
        names = placeholders(entry["en"])
        values = {name: f"<{name}>" for name in names}
        for language in LANGUAGES:
            assert placeholders(entry[language]) == names, f"{key} [{language}]: {entry[language]!r}"
            rendered = text(language, key, **values)
            assert rendered.strip() and "{" not in rendered.replace("{}", ""), f"{key} [{language}]: {rendered!r}"
            assert all(f"<{name}>" in rendered for name in names), f"{key} [{language}]: {rendered!r}"


def test_every_chinese_text_is_written_in_chinese() -> None:
    for key, entry in CATALOGUE.items():
        if key in SAME_IN_EVERY_LANGUAGE:
            continue
        assert CJK.search(entry["zh"]), f"{key}: {entry['zh']!r} has no Chinese"
        assert entry["zh"] != entry["en"], key


def test_the_default_workspace_is_named_as_the_seed_names_it() -> None:
    assert text("zh", "place.default-workspace") == "默认工作区"
    assert text("zh", "place.workspace", name="proj") == "工作区「proj」"


def test_a_missing_key_raises_in_strict_mode_and_falls_back_to_the_key_at_run_time(monkeypatch) -> None:
    assert os.environ.get(STRICT_ENV)  # the suite runs strict (tests/conftest.py)
    with pytest.raises(MissingText, match="no-such-key"):
        Text("notice.no-such-key")
    with pytest.raises(MissingText, match="limit"):
        Text("notice.tool-limit")  # its placeholder has no value
    monkeypatch.delenv(STRICT_ENV)
    assert Text("notice.no-such-key") == "notice.no-such-key"
    assert text("zh", "notice.tool-limit") == CATALOGUE["notice.tool-limit"]["zh"]  # the placeholder shows


def test_a_key_missing_in_one_language_raises_in_strict_mode_and_falls_back_to_english(monkeypatch) -> None:
    monkeypatch.setitem(CATALOGUE, "test.only-english", {"en": "only {n} in English"})
    with pytest.raises(MissingText, match="zh"):
        text("zh", "test.only-english", n=1)
    monkeypatch.delenv(STRICT_ENV)
    assert text("zh", "test.only-english", n=1) == "only 1 in English"
    assert Text("test.only-english", n=2).render("zh") == "only 2 in English"


def test_an_unknown_language_renders_in_english() -> None:
    assert Text("usage.context").render("fr") == "Context"


# --- text objects -------------------------------------------------------------------------------------


def test_a_text_object_is_its_english_rendering_and_renders_in_chinese_with_the_values_raw() -> None:
    notice = Text("notice.tool-limit", limit=7)
    assert notice == "Stopped after 7 model calls; continue to let the agent go on."
    assert str(notice) == notice and type(str(notice)) is str  # logs and str() stay English
    assert notice.render("zh") == "模型已调用 7 次，这一轮先停在这里；选择继续即可让 agent 接着做。"
    nested = Text("notice.compress-failed", error=Text("compress.model-failed", error="HTTP 503"))
    assert nested.render("zh") == "压缩失败：摘要模型出错：HTTP 503"  # the provider's words stay raw


def test_a_frame_renders_text_objects_anywhere_and_leaves_plain_strings_alone() -> None:
    frame = {"items": [{"text": Text("usage.reply")}, {"text": "Reply"}], "label": Text("layer.session")}
    assert zh(frame) == {"items": [{"text": "回复"}, {"text": "Reply"}], "label": "本会话"}


def test_an_event_keeps_a_texts_key_and_values_through_the_store_and_shows_it_in_chinese() -> None:
    why = Text("compress.cancelled", reason="stopped by the owner")
    event = compact_failed(Text("notice.compress-failed", error=why), at=1)
    back = decode_event(encode_event(event))
    assert back.error == "Compression failed: cancelled: stopped by the owner"  # the English, as before
    shown = Text.stored(back.error, back.error_key, back.error_values)
    assert shown.render("zh") == "压缩失败：已取消：stopped by the owner"


def test_an_event_without_a_key_or_with_an_unknown_one_shows_its_stored_text() -> None:
    assert Text.stored("written before keys", "") == "written before keys"
    assert zh({"t": Text.stored("from a newer build", "notice.not-known-here", {"x": 1})}) == {
        "t": "from a newer build"}
    old = E.NoticePosted(at=1, notice_id="n1", topic="tool-limit", text="Stopped after 3 model calls")
    items = ItemsProjection("s1")
    items.apply(old)
    assert zh(items.item("n1"))["text"] == "Stopped after 3 model calls"


def test_a_plain_string_keeps_no_key() -> None:
    assert stored_parts("a tool's own error") == ("a tool's own error", "", {})
    ended = task_ended(at=1, task_id="t1", status="failed", reason="exit status 3")
    assert (ended.reason, ended.reason_key) == ("exit status 3", "")


# --- items, rendered when sent ------------------------------------------------------------------------


def test_a_rooms_undelivered_reasons_and_the_usage_labels_render_in_chinese() -> None:
    items = ItemsProjection("s1")
    items.apply_all([
        E.SessionCreated(at=1, session_id="s1", kind="room"),
        E.InputAccepted(at=1, input_id="i1", turn_id="t1", text="hi"),
        E.TurnStarted(at=1, turn_id="t1", input_ids=["i1"]),
        E.LlmCompleted(at=2, turn_id="t1", step_id="t1.1", text="let me look",
                       tool_calls=[E.ToolCallSpec(call_id="c1", name="list_files", args={"path": "."})],
                       usage=E.Usage(prompt_tokens=10, completion_tokens=4)),
        E.LlmCompleted(at=3, turn_id="t1", step_id="t1.2", text="thinking aloud", usage=E.Usage()),
        E.TurnCompleted(at=4, turn_id="t1", outcome="silent"),
    ])
    assert zh(items.item("t1.1"))["undelivered"]["reason"] == "这是工具调用之前说的话；一轮只把最后的回复发进房间"
    assert zh(items.item("t1.2"))["undelivered"]["reason"] == "这一轮没有回复就结束了"
    assert zh(items.item("t1.1"))["text"] == "let me look"  # what she said is raw
    assert [p["label"] for p in zh(items.usage_item())["parts"]] == ["上下文", "回复"]


def test_a_denied_calls_card_says_why_in_chinese_and_its_result_is_what_the_model_was_told() -> None:
    settlement = E.Settlement(state="denied", source="answer", at=3, note="不要动这个文件")
    items = ItemsProjection("s1")
    items.apply_all([
        E.InputAccepted(at=1, input_id="i1", turn_id="t1", text="write it"),
        E.TurnStarted(at=1, turn_id="t1", input_ids=["i1"]),
        E.LlmCompleted(at=2, turn_id="t1", step_id="t1.1",
                       tool_calls=[E.ToolCallSpec(call_id="c1", name="write_file",
                                                  args={"path": "a", "content": "x"})]),
        E.ToolApprovalRequested(at=2, turn_id="t1", call_id="c1", approval_id="a1"),
        E.ToolApprovalSettled(at=3, turn_id="t1", call_id="c1", approval_id="a1", settlement=settlement),
        E.ToolFinished(at=3, turn_id="t1", call_id="c1", status="denied", approval_id="a1", settlement=settlement,
                       output={"error": "denied: the user denied it: 不要动这个文件"}),
    ])
    card = zh(items.item("c1"))
    assert card["reason"] == "用户拒绝了：不要动这个文件"
    assert card["result"] == {"error": "denied: the user denied it: 不要动这个文件"}
    assert card["args"] == {"path": "a", "content": "x"}


def test_a_background_task_notice_is_the_only_entry_of_the_turn_it_opens_and_its_queue_entry_is_the_notice() -> None:
    notice, key, values = stored_parts(Text("notice.background-task.exit", label="exec", task="k1",
                                            status=Text("task.status.failed"), exitCode=3))
    items = ItemsProjection("s1")
    items.apply_all([
        E.InputAccepted(at=1, input_id="i1", turn_id="t1", text="busy"),
        E.TurnStarted(at=1, turn_id="t1", input_ids=["i1"]),
        E.NoticePosted(at=2, notice_id="k1", topic="background-task", text=notice, text_key=key, text_values=values,
                       turn_id="t2", starts_turn=True),
        E.InputAccepted(at=2, input_id="i2", turn_id="t2", text=notice, source="background-task"),
    ])
    assert zh(items.queue_item())["entries"][0]["text"] == "后台任务 exec（k1）失败，退出码 3"
    items.apply_all([E.TurnCompleted(at=3, turn_id="t1", outcome="silent"),
                     E.TurnStarted(at=3, turn_id="t2", input_ids=["i2"], source="background-task")])
    in_turn = [i for i in items.items() if i.turn_id == "t2"]
    assert [zh(i)["kind"] for i in in_turn] == ["notice", "turn"]  # no user message with the agent's English input
    assert zh(in_turn[0])["text"] == "后台任务 exec（k1）失败，退出码 3"


# --- through the gateway ------------------------------------------------------------------------------


@pytest.fixture
def gateway(open_host):
    made: list[SessionProtocolService] = []

    def make(**options: Any) -> tuple[Any, SessionProtocolService, MemoryClient]:
        host = open_host(**options)
        svc = host.protocol()
        made.append(svc)
        return host, svc, MemoryClient(svc)

    yield make
    for svc in made:
        svc.close()


def set_language(host: Any, language: str | None) -> str:
    """Write config.toml's ``language`` (or remove it) and re-read it as SIGHUP does."""
    path = os.path.join(host.rt.data_dir, "config.toml")
    with open(path, "w") as f:
        f.write(f'language = "{language}"\n' if language is not None else "")
    stamp = os.stat(path).st_mtime_ns + 1_000_000
    os.utime(path, ns=(stamp, stamp))
    return host.settings.reload_host_config()


def new_session(c: MemoryClient) -> str:
    return c.result("session/create", {})["session"]["id"]


def turn_done(c: MemoryClient, sid: str) -> None:
    c.wait(lambda f: f.get("method") == "item/completed" and f["params"]["sessionId"] == sid
           and f["params"]["item"]["kind"] == "turn" and f["params"]["item"].get("outcome"), 10)


def test_items_built_in_english_are_sent_in_chinese_after_the_language_changes(gateway) -> None:
    host, _svc, c = gateway(max_steps=1)
    sid = new_session(c)
    c.result("session/subscribe", {"sessionId": sid})
    c.result("turn/send", {"sessionId": sid, "content": "!loop"})
    pushed = c.wait(lambda f: f.get("method") == "item/completed" and f["params"]["item"]["kind"] == "notice", 10)
    assert pushed["params"]["item"]["text"] == "Stopped after 1 model calls; continue to let the agent go on."
    turn_done(c, sid)
    assert "reloaded" in set_language(host, "zh")
    snapshot = c.result("session/subscribe", {"sessionId": sid})  # the same projection, sent now
    notice = next(i for i in snapshot["items"] if i["kind"] == "notice")
    assert notice["text"] == "模型已调用 1 次，这一轮先停在这里；选择继续即可让 agent 接着做。"
    assert next(i for i in snapshot["items"] if i["kind"] == "user-message")["text"] == "!loop"
    assert snapshot["session"]["place"]["name"] == "默认工作区"
    set_language(host, None)  # no key: the host's option (en) again
    assert next(i for i in c.result("session/subscribe", {"sessionId": sid})["items"]
                if i["kind"] == "notice")["text"].startswith("Stopped after 1 model calls")


def test_error_messages_reach_the_owner_in_chinese_with_ids_and_fields_raw(gateway) -> None:
    _host, _svc, c = gateway(language="zh")
    missing = c.call("session/subscribe", {"sessionId": "no-such-session"})["error"]
    assert missing["message"] == "会话 no-such-session 不存在" and missing["data"]["code"] == "not-found"
    answer = c.call("approval/respond", {"approvalId": "ap-x", "decision": "approve", "contentHash": "h"})["error"]
    assert answer["message"] == "审批 ap-x 不存在"
    sid = new_session(c)
    bad = c.call("session/config/update", {"sessionId": sid, "plugin": "agent", "key": "maxSteps", "value": "many"})
    assert bad["error"]["message"] == "params.value：agent/maxSteps：应为整数"
    blank = c.call("session/rename", {"sessionId": sid, "title": "   "})["error"]
    assert blank["message"] == "标题不能为空"
    task = c.call("background/output", {"taskId": "k-none"})["error"]
    assert task["message"] == "后台任务 k-none 不存在"


def test_settings_titles_and_labels_are_in_the_servers_language_and_setting_values_are_raw(gateway) -> None:
    _host, _svc, c = gateway(language="zh")
    sid = new_session(c)
    c.result("session/config/update", {"sessionId": sid, "plugin": "agent", "key": "systemPrompt",
                                       "value": "Answer in English."})
    rows = {(r["plugin"], r["key"]): r for r in c.result("session/config/get", {"sessionId": sid})["items"]}
    assert rows[("agent", "maxSteps")]["field"]["title"] == "每轮模型调用次数"
    assert rows[("llm", "model")]["actual"]["label"].startswith("跟随服务偏好（此刻：")
    assert rows[("llm", "model")]["actual"]["value"].startswith("mock/")  # the value is raw
    assert rows[("agent", "systemPrompt")]["value"] == "Answer in English."
    layers = c.result("session/config/layers", {})
    assert [o["label"] for o in layers["order"]] == ["全局（插件配置）", "平台档", "平台类型档", "场所", "本会话"]
    assert {"layer": {"scope": "place", "key": "workspace:default"}, "label": "默认工作区"} in layers["layers"]


def test_a_failed_compression_says_why_in_chinese_in_its_notice_and_its_error(gateway) -> None:
    host, _svc, c = gateway(language="zh",
                            provider=ScriptedProvider(["hello", ModelError("overloaded")]))  # the summary call fails
    sid = new_session(c)
    c.result("session/subscribe", {"sessionId": sid})
    c.result("turn/send", {"sessionId": sid, "content": "hi"})
    turn_done(c, sid)
    failed = c.call("session/compress", {"sessionId": sid}, timeout=20)["error"]
    assert failed["message"] == "压缩失败：摘要模型出错：overloaded"
    notice = c.wait(lambda f: f.get("method") == "item/completed" and f["params"]["item"].get("topic") == "compress",
                    10)["params"]["item"]
    assert notice["text"] == "压缩失败：摘要模型出错：overloaded"
    assert notice["facts"]["error"] == "the summary model failed: overloaded"  # facts are raw data
    stored = [e.event for e in host.session(sid).events() if isinstance(e.event, E.ContextCompactFailed)]
    assert [(e.error, e.error_key, e.error_values) for e in stored] == [
        ("the summary model failed: overloaded", "compress.model-failed", {"error": "overloaded"})]


def test_a_stopped_background_tasks_reason_is_sent_in_the_language_of_the_moment(gateway) -> None:
    host, _svc, c = gateway(permission_mode="acceptCalls")
    c.result("background/watch", {})
    sid = new_session(c)
    c.result("turn/send", {"sessionId": sid, "content": '!tool exec {"command": "sleep 30", "background": true}'})
    running = c.wait(lambda f: f.get("method") == "background/changed"
                     and any(t["status"] == "running" for t in f["params"]["upserts"]), 10)
    task_id = running["params"]["upserts"][0]["id"]
    c.result("background/stop", {"taskId": task_id})
    listed = {t["id"]: t for t in c.result("background/list", {})["tasks"]}
    assert listed[task_id]["reason"] == "stopped"
    set_language(host, "zh")
    listed = wait_until(lambda: {t["id"]: t for t in c.result("background/list", {})["tasks"]}, what="the list")
    assert (listed[task_id]["status"], listed[task_id]["reason"]) == ("stopped", "已停止")
    ended = [e.event for e in host.store.read_stream(f"task-{task_id}") if isinstance(e.event, E.TaskEnded)]
    assert [(e.reason, e.reason_key) for e in ended] == [("stopped", "task.reason.stopped")]


def test_replay_verify_against_a_live_host_in_chinese_finds_no_difference(gateway) -> None:
    host, svc, c = gateway(language="zh", max_steps=1)
    sid = new_session(c)
    c.result("session/subscribe", {"sessionId": sid})
    c.result("turn/send", {"sessionId": sid, "content": "!loop"})
    turn_done(c, sid)
    stream = f"session-{sid}"
    report = verify(sid, host.store.read_stream(stream), host.store.load_snapshot(stream),
                    host.store.stream_meta(stream), live=serve_live_view(svc, sid))
    assert report.difference is None, report.difference
    assert any(i["text"].startswith("模型已调用 1 次") for i in report_items(svc, sid) if i["kind"] == "notice")


def report_items(svc: SessionProtocolService, sid: str) -> list[dict[str, Any]]:
    client = MemoryClient(svc)
    try:
        return client.result("session/subscribe", {"sessionId": sid})["items"]
    finally:
        client.close()
