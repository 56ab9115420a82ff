"""Every mock answer streams (SPEC §4: "streamed as deltas of a few characters"), over a real server.

An answer the mock can give at once is taken in place, inside the commit of its step; its live
frames go out after that commit (SPEC §2.6: persist, then publish). What a client sees must be what
it sees for an answer streamed over time (``!sleep``): the same frames in the same order with the
same text, for a subscriber (``item/*``) and for a loop watcher (``loop/event``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.e2e.conftest import initialized, open_client

pytestmark = pytest.mark.e2e

BOT_TOKEN = "bot-token-for-the-end-to-end-tests"  # mybot, in tests/e2e/conftest.py APPS
TOOL = '!tool list_files {"path": "."}'


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def pushes_until_turn_ends(c: Any, sid: str) -> list[dict[str, Any]]:
    """Every push of session ``sid`` up to and including the ``item/completed`` of its turn item."""
    out: list[dict[str, Any]] = []
    while True:
        push = await c.push(lambda m: m.get("params", {}).get("sessionId") == sid
                            and m["method"].startswith("item/"))
        out.append(push)
        if push["method"] == "item/completed" and push["params"]["item"]["kind"] == "turn":
            return out


async def subscribed_turn(server: Any, text: str) -> list[dict[str, Any]]:
    """The pushes a subscriber of a fresh session gets for one turn of ``text``."""
    async with open_client(server) as ws:
        c = await initialized(ws)
        sid = (await c.result("session/create", {}))["session"]["id"]
        await c.result("session/subscribe", {"sessionId": sid})
        await c.result("turn/send", {"sessionId": sid, "content": text})
        return await pushes_until_turn_ends(c, sid)


def shape(pushes: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(method, item kind) of each push; a delta takes the kind of the item it streams."""
    kinds: dict[str, str] = {}
    out = []
    for p in pushes:
        params = p["params"]
        if p["method"] == "item/delta":
            out.append(("item/delta", kinds.get(params["itemId"], "?")))
        else:
            kinds[params["item"]["itemId"]] = params["item"]["kind"]
            out.append((p["method"], params["item"]["kind"]))
    return out


def streamed(pushes: list[dict[str, Any]], kind: str) -> list[tuple[str, str]]:
    """For each item of ``kind`` that got deltas: (its deltas joined, its completed text)."""
    items: dict[str, list[str]] = {}
    done: dict[str, str] = {}
    for p in pushes:
        params = p["params"]
        if p["method"] == "item/started" and params["item"]["kind"] == kind:
            items.setdefault(params["item"]["itemId"], [])
        elif p["method"] == "item/delta" and params["itemId"] in items:
            items[params["itemId"]].append(params["text"])
        elif p["method"] == "item/completed" and params["item"]["itemId"] in items:
            done[params["item"]["itemId"]] = params["item"]["text"]
    return [("".join(parts), done.get(iid, "<never completed>")) for iid, parts in items.items() if parts]


def assert_streamed_before_completed(pushes: list[dict[str, Any]], kind: str, text: str) -> None:
    methods = [(m, k) for m, k in shape(pushes) if k == kind]
    assert ("item/started", kind) in methods and ("item/completed", kind) in methods, methods
    started, completed = methods.index(("item/started", kind)), methods.index(("item/completed", kind))
    deltas = [i for i, mk in enumerate(methods) if mk == ("item/delta", kind)]
    assert deltas and started < min(deltas) and max(deltas) < completed, methods
    assert streamed(pushes, kind) == [(text, text)]


def test_a_subscriber_of_a_plain_turn_gets_item_started_then_deltas_making_the_answer_then_item_completed(server):
    pushes = run(subscribed_turn(server, "hello"))
    assert_streamed_before_completed(pushes, "agent-message", "echo: hello")
    started = next(p for p in pushes
                   if p["method"] == "item/started" and p["params"]["item"]["kind"] == "agent-message")
    assert started["params"]["item"]["text"] == ""  # the whole text comes with the deltas, then item/completed
    seqs = [p["params"]["seq"] for p in pushes]
    assert seqs == sorted(set(seqs)), seqs  # increasing, none twice


def test_a_subscriber_of_a_reasoning_turn_gets_the_reasoning_streamed_before_the_answer(server):
    pushes = run(subscribed_turn(server, "!reason first the why\nhello"))
    assert_streamed_before_completed(pushes, "reasoning", "first the why")
    assert_streamed_before_completed(pushes, "agent-message", "echo: hello")
    order = shape(pushes)
    assert order.index(("item/delta", "reasoning")) < order.index(("item/started", "agent-message"))
    seqs = [p["params"]["seq"] for p in pushes]
    assert seqs == sorted(set(seqs)), seqs


@pytest.mark.parametrize("text", ["hello", "!reason first the why\nhello", TOOL], ids=["plain", "reasoning", "tool"])
def test_an_answer_taken_at_once_pushes_the_same_frames_as_one_streamed_over_a_millisecond(server, text):
    at_once = run(subscribed_turn(server, text))
    over_time = run(subscribed_turn(server, f"!sleep 1\n{text}"))
    assert shape(at_once) == shape(over_time)
    for kind in ("reasoning", "agent-message"):
        assert streamed(at_once, kind) == streamed(over_time, kind)
    assert streamed(at_once, "agent-message")  # the comparison is not between two silent turns


async def watched_turn(server: Any, text: str, key: str) -> list[dict[str, Any]]:
    """The ``loop/event`` events a watching bot gets for one turn of ``text`` in a new room."""
    async with open_client(server, BOT_TOKEN) as ws:
        c = await initialized(ws)
        await c.result("loop/watch", {})
        sid = (await c.result("loop/create", {"containerId": "inbox"}))["sessionId"]
        await c.result("loop/send", {"sessionId": sid, "text": text, "idempotencyKey": key})
        events = []
        while True:
            push = await c.push(lambda m: m["method"] == "loop/event" and m["params"]["event"]["sessionId"] == sid)
            events.append(push["params"]["event"])
            if events[-1]["type"] in ("turn.completed", "turn.failed"):
                return events


def test_a_loop_watcher_gets_assistant_deltas_making_the_answer_before_the_message_and_turn_completed(app_server):
    events = run(watched_turn(app_server, "hello", "k1"))
    types = [e["type"] for e in events]
    deltas = [i for i, t in enumerate(types) if t == "assistant.delta"]
    assert deltas, types
    assert types.index("turn.started") < min(deltas)
    assert max(deltas) < types.index("assistant.message") < types.index("turn.completed")
    assert "".join(events[i]["data"]["text"] for i in deltas) == "echo: hello"


def test_a_loop_watcher_gets_the_same_events_for_an_answer_taken_at_once_as_for_one_streamed(app_server):
    at_once = run(watched_turn(app_server, "hello", "k1"))
    over_time = run(watched_turn(app_server, "!sleep 1\nhello", "k2"))
    assert [e["type"] for e in at_once] == [e["type"] for e in over_time]

    def texts(events: list[dict[str, Any]]) -> list[str]:
        return [e["data"]["text"] for e in events if e["type"] in ("assistant.delta", "assistant.message")]

    assert "".join(texts(at_once)) == "".join(texts(over_time)) == "echo: hello" * 2
