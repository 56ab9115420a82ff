"""Bounds on what clients send, over a real ``sessionloop serve`` (the adversarial run behind the
issue): a 20 MB ``session/rename`` is refused for an app and for the owner and changes nothing; a
store an older version wrote with a 20 MB title lists it cut; a 310-digit ``timeoutMs`` is
``invalidParams``, not an ``OverflowError``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.events import open_store
from sessionloop.actors.views.summary import SummaryRecord, encode_summary_record
from sessionloop.protocol.limits import MAX_TITLE
from tests.conftest import REPO, store_head
from tests.e2e.conftest import TOKEN, initialized, open_client

pytestmark = pytest.mark.e2e

TWENTY_MB = "T" * (20 * 1000 * 1000)
#: a sessions/list reply of a few sessions with bounded titles; the issue's was 210 MB
SMALL_REPLY = 64 * 1024


async def listed(client: Any) -> tuple[dict[str, Any], int]:
    """The owner's sessions/list result and the size of its reply frame."""
    reply = await client.call("sessions/list", {})
    assert "result" in reply, reply
    return reply["result"], len(json.dumps(reply))


def test_a_20_mb_rename_is_invalid_params_for_an_app_and_the_owner_and_changes_nothing(app_server) -> None:
    async def go() -> tuple[list[dict[str, Any]], dict[str, Any], int, int]:
        async with (open_client(app_server, "bot-token-for-the-end-to-end-tests") as bot_ws,
                    open_client(app_server) as owner_ws):
            bot, owner = await initialized(bot_ws), await initialized(owner_ws)
            made = await bot.result("loop/create", {"containerId": "inbox", "title": "Chat with Alice"})
            theirs = made["sessionId"]
            mine = (await owner.result("session/create", {"name": "Mine"}))["session"]["id"]
            await owner.result("session/rename", {"sessionId": mine, "title": "My notes"})
            before = store_head(os.path.join(app_server.data_dir, "store"))
            refusals = [await bot.call("session/rename", {"sessionId": theirs, "title": TWENTY_MB}, timeout=60),
                        await owner.call("session/rename", {"sessionId": mine, "title": TWENTY_MB}, timeout=60)]
            after = store_head(os.path.join(app_server.data_dir, "store"))
            result, size = await listed(owner)
            assert after == before, "a refused rename wrote to the store"
            return refusals, result, size, len(json.dumps(await bot.result("sessions/list", {})))

    refusals, result, size, bot_size = asyncio.run(go())
    for reply in refusals:
        assert reply["error"]["code"] == -32602, reply["error"]
        assert reply["error"]["message"] == f"params.title: Expected `str` of length <= {MAX_TITLE}"
    assert sorted(s["title"] for s in result["sessions"]) == ["Chat with Alice", "My notes"]
    assert size < SMALL_REPLY and bot_size < SMALL_REPLY


def write_old_store(data_dir: str) -> str:
    """A session as the version before the bound stored it: a 20 MB title in its events and in
    its listing record, appended through the store API, before any server opened the store."""
    os.makedirs(data_dir, exist_ok=True)
    with open_store(os.path.join(data_dir, "store"), durability="nosync") as store:
        store.append("session-oldbig", [E.SessionCreated(at=1, session_id="oldbig", name="old"),
                                        E.SessionRenamed(at=2, title=TWENTY_MB)],
                     expected_version=0,
                     meta=encode_summary_record(SummaryRecord(id="oldbig", title=TWENTY_MB, name="old",
                                                              created_at=1, updated_at=2)))
    return "oldbig"


def test_a_stored_20_mb_title_from_an_older_version_lists_cut_and_sessions_ls_works(server_factory, tmp_path) -> None:
    data_dir = str(tmp_path / "data")
    session_id = write_old_store(data_dir)
    server = server_factory(data_dir=data_dir)

    async def go() -> tuple[dict[str, Any], int, dict[str, Any]]:
        async with open_client(server) as ws:
            owner = await initialized(ws)
            result, size = await listed(owner)
            snapshot = await owner.result("session/subscribe", {"sessionId": session_id})
            return result, size, snapshot

    result, size, snapshot = asyncio.run(go())
    (listed_session,) = result["sessions"]
    cut = "T" * (MAX_TITLE - 1) + "…"
    assert listed_session["id"] == session_id and listed_session["title"] == cut
    assert size < SMALL_REPLY
    assert snapshot["session"]["title"] == cut  # the activated session's own summary too
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONLOOP_")}
    env.update(SESSIONLOOP_URL=server.url, SESSIONLOOP_TOKEN=TOKEN, PYTHONPATH=REPO)
    ls = subprocess.run([sys.executable, "-m", "sessionloop", "sessions", "ls", "--json"], capture_output=True,
                        text=True, env=env, cwd=str(tmp_path), timeout=60, check=False)
    assert ls.returncode == 0, ls.stderr
    assert [(s["id"], s["title"]) for s in json.loads(ls.stdout)] == [(session_id, cut)]


def test_a_310_digit_timeout_is_invalid_params_and_int64_ends_are_clamped_over_the_wire(app_server) -> None:
    async def go() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with open_client(app_server, "bot-token-for-the-end-to-end-tests") as ws:
            bot = await initialized(ws)
            made = await bot.result("loop/create", {"containerId": "inbox",
                                                    "initialMessage": {"text": "hi", "idempotencyKey": "k"}})
            sid = made["sessionId"]
            huge = await bot.call("loop/waitForTurn", {"sessionId": sid, "turnId": made["turnId"],
                                                       "timeoutMs": int("9" * 310)})
            longest = await bot.result("loop/waitForTurn", {"sessionId": sid, "turnId": made["turnId"],
                                                            "timeoutMs": 2**63 - 1})
            slow = await bot.result("loop/send", {"sessionId": sid, "text": "!sleep 30000\nslow",
                                                  "idempotencyKey": "slow"})
            shortest = await bot.result("loop/waitForTurn", {"sessionId": sid, "turnId": slow["turnId"],
                                                             "timeoutMs": -(2**63)})
            events = await bot.result("loop/listEvents", {"sessionId": sid})
            return huge, longest, shortest, events

    huge, longest, shortest, events = asyncio.run(go())
    assert huge["error"]["code"] == -32602, huge
    assert huge["error"]["message"].startswith("params.timeoutMs: Expected `int` <= ")
    assert longest == {"state": "completed", "outputText": "echo: hi"}  # clamped to 600 s, answered at once
    assert shortest == {"state": "timeout"}  # clamped to 1 s; the turn goes on
    assert [e["type"] for e in events["events"]][:3] == ["turn.started", "assistant.message", "turn.completed"]
