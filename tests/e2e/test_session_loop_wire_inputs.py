"""The Session Loop API's wire inputs (issue 8 for loop/*) and the cursors a receipt carries, on a
real ``sessionloop serve`` with bots connected by their app tokens from apps.toml."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect as connect_sync

from tests.conftest import store_head
from tests.e2e.conftest import initialized, open_client

pytestmark = pytest.mark.e2e


class SyncClient:
    """A blocking JSON-RPC client, so hypothesis can drive one connection example by example."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0

    def call(self, method: str, params: Any) -> tuple[int, dict[str, Any]]:
        self.next_id += 1
        self.ws.send(json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=10))
            if msg.get("id") == self.next_id:
                return self.next_id, msg

    def result(self, method: str, params: Any) -> Any:
        _, reply = self.call(method, params)
        assert "result" in reply, reply
        return reply["result"]


def app_client(server, token: str) -> Any:
    return connect_sync(server.url, additional_headers={"Authorization": f"Bearer {token}"})


def initialize(client: SyncClient) -> None:
    client.result("initialize", {"protocolVersion": "0.2.0", "client": {"name": "fuzz", "version": "1"}})


# --- what a bot may get wrong ------------------------------------------------------------------

# not JSON: Infinity would be a parse error (id null), a different rule (tests/reliability/test_bad_input.py)
json_not_strings = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40),
                             st.floats(allow_nan=False, allow_infinity=False),
                             st.lists(st.integers(), max_size=3),
                             st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
json_not_ints = st.one_of(st.booleans(),
                          st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer()),
                          st.text(max_size=5), st.lists(st.integers(), max_size=2))
huge = st.integers(0, 2).map(lambda n: "x" * (100_001 + n * 10_000))
unknown_ids = st.one_of(st.text(max_size=40), huge, st.just("0" * 21), st.just("../x"))
MISSING = object()


def params_with(base: dict[str, Any], field: str, values: st.SearchStrategy, label: str) -> st.SearchStrategy:
    def build(value: Any) -> tuple[dict[str, Any], str]:
        params = {k: v for k, v in base.items() if k != field}
        if value is not MISSING:
            params[field] = value
        return params, label

    return values.map(build)


def bad_calls(sid: str, theirs: str) -> st.SearchStrategy:
    """(method, params, what the error must name): exactly one thing wrong per call."""
    send = {"sessionId": sid, "text": "hi", "idempotencyKey": "k"}
    create = {"containerId": "inbox"}
    wait = {"sessionId": sid, "turnId": "t", "timeoutMs": 1000}
    events = {"sessionId": sid}
    session_ids = st.one_of(json_not_strings, unknown_ids, st.just(theirs), st.just(MISSING)).filter(
        lambda v: v != sid)
    attachment = {"data": "data:text/plain;base64,aGk=", "name": "a.txt"}
    message = {"text": "hi", "idempotencyKey": "m"}

    def on(method: str, strategy: st.SearchStrategy) -> st.SearchStrategy:
        return strategy.map(lambda pl: (method, pl[0], pl[1]))

    return st.one_of(
        on("loop/send", params_with(send, "sessionId", session_ids, "session")),
        on("loop/send", params_with(send, "text", st.one_of(json_not_strings, huge, st.just(MISSING)), "text")),
        on("loop/send", params_with(send, "idempotencyKey", st.one_of(
            json_not_strings, st.just(""), st.text(min_size=513, max_size=600), st.just(MISSING)), "idempotencyKey")),
        on("loop/send", params_with(send, "attachments", st.one_of(
            json_not_strings.filter(lambda v: not isinstance(v, list) and v is not None),
            st.integers(11, 15).map(lambda n: [attachment] * n),
            st.lists(st.one_of(json_not_strings, st.just({"name": "a"}), st.just({"data": "nope", "name": "a"})),
                     min_size=1, max_size=3)), "attachments")),
        on("loop/create", params_with(create, "containerId", st.one_of(
            json_not_strings.filter(lambda v: v is not None), st.text(max_size=12).filter(lambda c: c != "inbox")),
            "container")),
        on("loop/create", params_with({}, "space", st.one_of(
            json_not_strings.filter(lambda v: not isinstance(v, dict) and v is not None),
            st.just({}), st.fixed_dictionaries({"spaceId": st.one_of(json_not_strings, st.just(""),
                                                                      st.text(min_size=513, max_size=520))})),
            "space")),
        on("loop/create", params_with(create, "space", st.just({"spaceId": "s"}), "space")),  # both placements
        on("loop/create", params_with(create, "title", st.one_of(
            json_not_strings.filter(lambda v: v is not None), st.text(min_size=1001, max_size=1100)), "title")),
        on("loop/create", params_with(create, "activity", st.one_of(
            json_not_strings.filter(lambda v: v is not None),
            st.text(max_size=12).filter(lambda a: a not in ("interactive", "background"))), "activity")),
        on("loop/create", params_with(create, "permissionMode", st.one_of(
            json_not_strings.filter(lambda v: v is not None),
            st.text(max_size=12).filter(lambda m: m not in ("ask", "acceptCalls", "deny"))), "permissionMode")),
        on("loop/create", params_with(create, "initialMessage", st.one_of(
            json_not_strings.filter(lambda v: not isinstance(v, dict) and v is not None),
            st.sampled_from(["text", "idempotencyKey"]).map(lambda k: {x: v for x, v in message.items() if x != k}),
            json_not_strings.map(lambda t: {**message, "text": t}),
            huge.map(lambda t: {**message, "text": t}),
            st.one_of(json_not_strings, st.just(""), st.text(min_size=513, max_size=520)).map(
                lambda k: {**message, "idempotencyKey": k})), "initialMessage")),
        on("loop/create", params_with(create, "context", st.one_of(
            json_not_strings.filter(lambda v: v is not None), st.text(max_size=10)), "context")),
        on("loop/waitForTurn", params_with(wait, "sessionId", session_ids, "session")),
        on("loop/waitForTurn", params_with(wait, "turnId", st.one_of(json_not_strings, unknown_ids, st.just(MISSING)),
                                           "turn")),
        on("loop/waitForTurn", params_with(wait, "timeoutMs", json_not_ints, "timeoutMs")),
        on("loop/listEvents", params_with(events, "sessionId", session_ids.filter(
            lambda v: v is not None and v is not MISSING), "session")),
        on("loop/listEvents", params_with(events, "after", st.one_of(
            json_not_strings.filter(lambda v: not isinstance(v, str) and v is not None),
            st.one_of(st.integers(max_value=-1), st.integers(min_value=2**63)).map(str),
            st.sampled_from(["abc", "", "1.5", "0x10", "cursor"])), "after")),
        on("loop/listEvents", params_with(events, "limit", st.one_of(
            json_not_ints, st.integers(max_value=0), st.integers(min_value=1001)), "limit")),
        st.tuples(st.sampled_from(["loop/send", "loop/create", "loop/waitForTurn", "loop/listEvents", "loop/watch"]),
                  st.one_of(st.lists(st.integers(), max_size=3), st.text(max_size=5), st.integers()),
                  st.just("params")),
    )


def test_every_refused_loop_call_gets_a_json_rpc_error_naming_the_field_and_writes_nothing(app_server):
    with (app_client(app_server, "bot-token-for-the-end-to-end-tests") as bot_ws,
          app_client(app_server, "other-token-for-the-end-to-end-tests") as other_ws):
        bot, other = SyncClient(bot_ws), SyncClient(other_ws)
        initialize(bot)
        initialize(other)
        made = bot.result("loop/create", {"containerId": "inbox", "initialMessage": {"text": "hi",
                                                                                      "idempotencyKey": "w"}})
        assert bot.result("loop/waitForTurn", {"sessionId": made["sessionId"], "turnId": made["turnId"]})[
            "state"] == "completed"
        theirs = other.result("loop/create", {"containerId": "inbox"})["sessionId"]

        @settings(max_examples=200, deadline=None, database=None)
        @given(bad_calls(made["sessionId"], theirs))
        def check(call: tuple[str, Any, str]) -> None:
            method, params, label = call
            before = store_head(os.path.join(app_server.data_dir, "store"))
            request_id, reply = bot.call(method, params)
            assert reply.get("jsonrpc") == "2.0" and reply.get("id") == request_id and "result" not in reply, reply
            error = reply["error"]
            assert error["code"] in (-32600, -32602, -32000), error  # never an internal error
            assert isinstance(error["message"], str) and 0 < len(error["message"]) <= 500
            assert label.lower() in error["message"].lower(), (label, error)
            if error["code"] == -32000:
                assert error["data"]["code"] == "not-found", error
            assert store_head(os.path.join(app_server.data_dir, "store")) == before, (
                f"{method} {params!r:.200} wrote to the store")

        check()
        # the connection is still served normally after all of that
        assert bot.result("loop/listEvents", {"sessionId": made["sessionId"]})["events"]


def test_a_receipts_cursor_and_epoch_seq_find_exactly_that_inputs_events_over_the_wire(app_server):
    """The bot learns where its input's events start from the receipt alone: ``cursor`` for
    loop/listEvents, ``(epoch, seq)`` for the session/subscribe stream, even when the input was
    queued behind a running turn."""
    async def go():
        async with open_client(app_server, "bot-token-for-the-end-to-end-tests") as ws:
            c = await initialized(ws)
            sid = (await c.result("loop/create", {"containerId": "inbox"}))["sessionId"]
            snapshot = await c.result("session/subscribe", {"sessionId": sid})

            async def send(text: str, key: str) -> dict[str, Any]:
                return await c.result("loop/send", {"sessionId": sid, "text": text, "idempotencyKey": key})

            async def wait(receipt: dict[str, Any]) -> None:
                assert (await c.result("loop/waitForTurn", {"sessionId": sid, "turnId": receipt["turnId"]}))[
                    "state"] == "completed"

            before = await send("before", "c0")
            await wait(before)
            slow, queued = await send("!sleep 300\nslow", "c1"), await send("queued", "c2")
            await wait(queued)
            last = await send("last", "c3")
            await wait(last)
            await c.push(lambda m: m["method"] == "item/completed" and m["params"]["item"]["kind"] == "turn"
                         and m["params"]["item"]["turnId"] == last["turnId"])
            everything = (await c.result("loop/listEvents", {"sessionId": sid}))["events"]
            since = (await c.result("loop/listEvents", {"sessionId": sid, "after": queued["cursor"]}))["events"]
            return snapshot, before, slow, queued, last, everything, since, list(c.pushes)

    snapshot, before, slow, queued, last, everything, since, pushes = asyncio.run(go())
    assert (slow["state"], queued["state"]) == ("accepted", "queued")
    of_queued = [e for e in everything if e.get("turnId") == queued["turnId"]]
    assert [e["type"] for e in of_queued] == ["turn.started", "assistant.message", "turn.completed"]
    assert [e for e in since if e.get("turnId") == queued["turnId"]] == of_queued
    assert {e.get("turnId") for e in since} == {slow["turnId"], queued["turnId"], last["turnId"]}
    stream = [p["params"] for p in pushes if "seq" in p.get("params", {})]
    assert {p["epoch"] for p in stream} == {queued["epoch"]} == {snapshot["epoch"]} == {app_server.epoch}
    queued_pushes = [p for p in stream if p.get("item", {}).get("turnId") == queued["turnId"]]
    assert queued_pushes and all(p["seq"] > queued["seq"] for p in queued_pushes)
    after_seq = {p["item"]["turnId"] for p in stream if p["seq"] > queued["seq"] and "turnId" in p.get("item", {})}
    assert before["turnId"] not in after_seq and queued["turnId"] in after_seq


def test_quota_rejection_and_recovery_over_the_wire(app_server):
    """The rejected receipt has the seed's shape (state, retryAfterMs 1000, no turn) and the bot
    that waits as told gets its input accepted with the same key."""
    async def go():
        async with open_client(app_server, "bot-token-for-the-end-to-end-tests") as ws:
            c = await initialized(ws)
            sid = (await c.result("loop/create", {"containerId": "inbox"}))["sessionId"]
            filled = [await c.result("loop/send", {"sessionId": sid, "text": "!sleep 1500\nhold",
                                                   "idempotencyKey": "q0"})]
            for i in range(1, 20):
                filled.append(await c.result("loop/send", {"sessionId": sid, "text": f"m{i}",
                                                           "idempotencyKey": f"q{i}"}))
            refused = await c.result("loop/send", {"sessionId": sid, "text": "extra", "idempotencyKey": "q20"})
            done = await c.result("loop/waitForTurn", {"sessionId": sid, "turnId": filled[-1]["turnId"],
                                                       "timeoutMs": 30_000})
            again = await c.result("loop/send", {"sessionId": sid, "text": "extra", "idempotencyKey": "q20"})
            result = await c.result("loop/waitForTurn", {"sessionId": sid, "turnId": again["turnId"]})
            return filled, refused, done, again, result

    filled, refused, done, again, result = asyncio.run(go())
    assert [r["state"] for r in filled] == ["accepted"] + ["queued"] * 19
    assert refused["state"] == "rejected" and refused["retryAfterMs"] == 1000
    assert "turnId" not in refused and "cursor" not in refused
    assert done["state"] == "completed"
    assert again["state"] == "accepted" and result == {"state": "completed", "outputText": "echo: extra"}


def test_a_send_with_attachments_to_a_session_not_found_saves_no_attachment(app_server):
    """Refused before anything is written: the attachment is not saved for a session the app
    does not have (the blob store would grow with every refused send)."""
    blobs = os.path.join(app_server.data_dir, "blobs")
    with app_client(app_server, "bot-token-for-the-end-to-end-tests") as ws:
        bot = SyncClient(ws)
        initialize(bot)
        _, reply = bot.call("loop/send", {"sessionId": "0" * 21, "text": "hi", "idempotencyKey": "k1",
                                          "attachments": [{"data": "data:text/plain;base64,aGVsbG8gYmxvYg==",
                                                           "name": "a.txt"}]})
        assert reply["error"]["code"] == -32000 and reply["error"]["data"]["code"] == "not-found", reply
    saved = [f for _, _, files in os.walk(blobs) for f in files] if os.path.isdir(blobs) else []
    assert saved == []
