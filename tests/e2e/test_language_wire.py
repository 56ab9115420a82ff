"""Human text in the server's language over the wire (seed 004 文字与语言; SPEC §6): a real
``sessionloop serve`` subprocess, real WebSocket clients, a real SIGHUP. ``language`` in
config.toml (re-read on SIGHUP) or ``serve --language`` chooses it, and a change applies to the
frames sent after it, also of items built before it; raw data (tool args and results, user text,
setting values) is never translated.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest
from click.testing import CliRunner

from sessionloop.cli.main import main
from tests.e2e.conftest import TOKEN, Client, ServerProcess, initialized, open_client
from tests.e2e.test_reload_on_sighup import reload, write_config

pytestmark = pytest.mark.e2e

WRITE = '!tool write_file {"path": "notes.txt", "content": "héllo wörld"}'
ARGS = {"path": "notes.txt", "content": "héllo wörld"}
MODEL_WAS_TOLD = {"error": "denied: nobody was present to approve it"}
NOTICE = {"en": "Stopped after 1 model calls; continue to let the agent go on.",
          "zh": "模型已调用 1 次，这一轮先停在这里；选择继续即可让 agent 接着做。"}
DENIED = {"en": "nobody was present to approve it", "zh": "当时没有人在场审批"}
MISSING = {"en": "session no-such-session not found", "zh": "会话 no-such-session 不存在"}
WORKSPACE = {"en": "Default workspace", "zh": "默认工作区"}
TITLE = {"en": "Model calls per turn", "zh": "每轮模型调用次数"}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def by_kind(items: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(i for i in items if i["kind"] == kind)


async def denied_turn(c: Client, sid: str) -> dict[str, dict[str, Any]]:
    """A turn whose ``write_file`` call is denied at once (no owner is present: no presence/update)
    and which then stops at its one model call: the pushed card and notice."""
    c.pushes.clear()
    await c.result("turn/send", {"sessionId": sid, "content": WRITE})
    card = await c.push(lambda m: m["method"] == "item/completed" and m["params"]["item"]["kind"] == "tool-call"
                        and m["params"]["item"]["status"] == "denied" and "result" in m["params"]["item"])
    notice = await c.push(lambda m: m["method"] == "item/completed"
                          and m["params"]["item"].get("topic") == "tool-limit")
    await c.turn_done(sid)
    return {"card": card["params"]["item"], "notice": notice["params"]["item"]}


async def texts_of(c: Client, sid: str) -> dict[str, Any]:
    """Everything this test reads, from frames sent now: the snapshot of ``sid`` (items built
    before), an error, a new session's summary and the settings rows of ``sid``."""
    snapshot = await c.result("session/subscribe", {"sessionId": sid})
    items = snapshot["items"]
    card, notice, asked = by_kind(items, "tool-call"), by_kind(items, "notice"), by_kind(items, "user-message")
    missing = (await c.call("session/subscribe", {"sessionId": "no-such-session"}))["error"]["message"]
    created = (await c.result("session/create", {}))["session"]
    rows = {(r["plugin"], r["key"]): r for r in (await c.result("session/config/get", {"sessionId": sid}))["items"]}
    steps = rows[("agent", "maxSteps")]
    return {"notice": notice["text"], "reason": card["reason"], "result": card["result"], "args": card["args"],
            "asked": asked["text"], "missing": missing, "place": created["place"]["name"],
            "title": steps["field"]["title"], "value": steps["value"], "summary place": snapshot["session"]["place"]}


def expected(language: str) -> dict[str, Any]:
    return {"notice": NOTICE[language], "reason": DENIED[language], "result": MODEL_WAS_TOLD, "args": ARGS,
            "asked": WRITE, "missing": MISSING[language], "place": WORKSPACE[language], "title": TITLE[language],
            "value": 1, "summary place": {"key": "workspace:default", "kind": "workspace", "name": WORKSPACE[language]}}


def test_after_sighup_with_language_zh_the_next_frames_are_in_chinese_and_raw_data_is_unchanged(server_factory):
    server = server_factory("--max-steps", "1")

    async def go() -> list[Any]:
        async with open_client(server) as ws:
            c = await initialized(ws)
            sid = (await c.result("session/create", {}))["session"]["id"]
            await c.result("session/config/update", {"sessionId": sid, "plugin": "agent", "key": "maxSteps",
                                                     "value": 1})
            await c.result("session/subscribe", {"sessionId": sid})
            pushed_en = await denied_turn(c, sid)
            before = await texts_of(c, sid)
            write_config(server, 'language = "zh"\n')
            line = reload(server)
            after = await texts_of(c, sid)
            await c.result("session/subscribe", {"sessionId": sid})
            pushed_zh = await denied_turn(c, sid)
            write_config(server, "")  # no language key: serve's --language (the default, en) again
            reload(server)
            back = await texts_of(c, sid)
            return [pushed_en, before, line, after, pushed_zh, back]

    pushed_en, before, line, after, pushed_zh, back = run(go())
    assert (pushed_en["notice"]["text"], pushed_en["card"]["reason"]) == (NOTICE["en"], DENIED["en"])
    assert before == expected("en")
    assert f"{server.data_dir}/config.toml reloaded" in line
    assert after == expected("zh")  # the items built before the change, sent after it
    assert (pushed_zh["notice"]["text"], pushed_zh["card"]["reason"]) == (NOTICE["zh"], DENIED["zh"])
    assert (pushed_zh["card"]["args"], pushed_zh["card"]["result"]) == (ARGS, MODEL_WAS_TOLD)
    assert back == expected("en")


def test_serve_language_zh_speaks_chinese_from_the_start_and_config_toml_then_wins(server_factory):
    server = server_factory("--language", "zh")

    async def missing() -> str:
        async with open_client(server) as ws:
            c = await initialized(ws)
            return (await c.call("session/subscribe", {"sessionId": "no-such-session"}))["error"]["message"]

    assert run(missing()) == MISSING["zh"]
    write_config(server, 'language = "en"\n')
    reload(server)
    assert run(missing()) == MISSING["en"]


def test_a_language_config_toml_does_not_know_is_refused_and_the_language_before_stays(server_factory, tmp_path):
    data = tmp_path / "data"
    os.makedirs(data)
    (data / "config.toml").write_text('language = "zh"\n')
    server = server_factory(data_dir=str(data))

    async def missing() -> str:
        async with open_client(server) as ws:
            c = await initialized(ws)
            return (await c.call("session/subscribe", {"sessionId": "no-such-session"}))["error"]["message"]

    assert run(missing()) == MISSING["zh"]
    write_config(server, 'language = "fr"\n')
    line = reload(server)
    assert "refused: language: expected one of en, zh, got 'fr'" in line, line
    assert run(missing()) == MISSING["zh"]


def test_serve_refuses_a_language_it_does_not_have(tmp_path):
    server = ServerProcess(str(tmp_path / "data"), "--language", "fr")
    with pytest.raises(RuntimeError, match="Invalid value for '--language'"):
        server.start()
    assert server.proc is not None and server.proc.wait(10) != 0


def test_replay_verify_over_the_wire_agrees_with_a_server_that_speaks_chinese(server_factory):
    server = server_factory("--language", "zh", "--max-steps", "1")

    async def go() -> tuple[str, dict[str, Any]]:
        async with open_client(server) as ws:
            c = await initialized(ws)
            sid = (await c.result("session/create", {}))["session"]["id"]
            await c.result("session/subscribe", {"sessionId": sid})
            pushed = await denied_turn(c, sid)
            return sid, pushed

    sid, pushed = run(go())
    assert pushed["notice"]["text"] == NOTICE["zh"]
    out = CliRunner().invoke(main, ["replay", sid, "--data", server.data_dir, "--verify", "--json",
                                    "--url", server.url, "--token", TOKEN])
    report = json.loads(out.stdout)
    assert out.exit_code == 0 and "difference" not in report, report
    assert report["compared"] == "live" and report["snapshotItems"] > 0
