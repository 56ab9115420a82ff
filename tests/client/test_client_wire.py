"""sessionloop.client against a real ``sessionloop serve``: typed results and errors, retries across
lost connections, pacing, timeouts and bounded buffers (through a real TCP relay a test can cut)."""

from __future__ import annotations

import asyncio
import json

import pytest
from websockets.asyncio.client import connect

from sessionloop.actors.api.host import Host
from sessionloop.client import (
    AsyncClient,
    CallTimeout,
    Client,
    Conflict,
    ConnectFailed,
    ConnectionLost,
    CursorExpired,
    InvalidArguments,
    NotFound,
    TokenRefused,
)
from sessionloop.client.wire import OWNER_METHODS, python_name
from sessionloop.protocol.registry import METHODS
from sessionloop.protocol.schemas import (
    AgentMessageItem,
    SessionsListResult,
    SubscribeResult,
    TurnItem,
)
from sessionloop.protocol.schemas_loop import LoopCreateResult, LoopSendResult, LoopWaitForTurnResult
from tests.client.conftest import BOT_TOKEN, OTHER_TOKEN, Relay, free_port
from tests.e2e.conftest import APPS, ServerProcess

pytestmark = pytest.mark.e2e

FAST = {"reconnect_initial": 0.05, "reconnect_min": 0.05, "reconnect_max": 0.2}


def run(coro):
    return asyncio.run(coro)


def test_results_are_the_protocols_structs_and_errors_carry_their_codes(bot_server):
    async def go():
        async with AsyncClient(bot_server.url, BOT_TOKEN) as bot:
            s = await bot.create(container_id="inbox", title="Alice")
            receipt = await bot.send(s.session_id, "hello", "m1")
            again = await bot.send(s.session_id, "hello", "m1")
            with pytest.raises(Conflict) as conflict:
                await bot.send(s.session_id, "another text", "m1")
            with pytest.raises(NotFound) as missing:
                await bot.send("no-such-session", "x", "m2")
            done = await bot.wait_for_turn(s.session_id, receipt.turn_id)
            return s, receipt, again, conflict.value, missing.value, done
    s, receipt, again, conflict, missing, done = run(go())
    assert isinstance(s, LoopCreateResult) and isinstance(receipt, LoopSendResult)
    assert receipt.state == "accepted" and again.state == "duplicate" and again.turn_id == receipt.turn_id
    assert (conflict.code, conflict.rpc_code, conflict.data["code"], conflict.method) == (
        "conflict", -32000, "conflict", "loop/send")
    assert missing.code == "not-found" and "no-such-session" in missing.message
    assert done == LoopWaitForTurnResult(state="completed", output_text="echo: hello")


def test_arguments_beyond_a_bound_are_refused_before_anything_is_sent(bot_server):
    async def go():
        async with AsyncClient(bot_server.url, BOT_TOKEN) as bot:
            s = await bot.create(container_id="inbox")
            with pytest.raises(InvalidArguments) as long_text:
                await bot.send(s.session_id, "x" * 100_001, "k")
            with pytest.raises(InvalidArguments) as bad_mode:
                await bot.create(container_id="inbox", permission_mode="everything")
            with pytest.raises(InvalidArguments) as unknown:
                await bot.call("session/nothing")
            page = await bot.list_events(s.session_id)
            return str(long_text.value), str(bad_mode.value), str(unknown.value), page
    long_text, bad_mode, unknown, page = run(go())
    assert "params.text" in long_text and "100000" in long_text
    assert "params.permissionMode" in bad_mode
    assert "session/nothing" in unknown
    assert page.events == []  # the refused send wrote nothing


def test_a_send_whose_receipt_was_lost_is_sent_again_and_answers_the_original_turn(bot_server, relay):
    async def go():
        async with AsyncClient(relay.url, BOT_TOKEN, **FAST) as bot:
            s = await bot.create(container_id="inbox")
            relay.drop_reply_when(lambda data: b'"state":"accepted"' in data)
            receipt = await bot.send(s.session_id, "only once", "k-lost")
            done = await bot.wait_for_turn(s.session_id, receipt.turn_id)
            events = await bot.list_events(s.session_id)
            return receipt, done, events, bot.connections
    receipt, done, events, connections = run(go())
    assert relay.dropped_replies == 1 and connections == 2
    assert receipt.state == "duplicate"  # the first send was committed: the repeat names its turn
    assert done.output_text == "echo: only once"
    assert [e.turn_id for e in events.events if e.type == "turn.started"] == [receipt.turn_id]


def test_a_create_without_a_key_is_not_repeated_when_its_answer_is_lost(bot_server, relay):
    async def go():
        async with AsyncClient(relay.url, BOT_TOKEN, **FAST) as bot:
            relay.drop_reply_when(lambda data: b'"sessionId"' in data)
            with pytest.raises(ConnectionLost) as lost:
                await bot.create(container_id="inbox", title="maybe")
            relay.drop_reply_when(lambda data: b'"sessionId"' in data)
            keyed = await bot.create(container_id="inbox", title="keyed",
                                     initial_message={"text": "hi", "idempotency_key": "c-1"})
            again = await bot.create(container_id="inbox", title="keyed",
                                     initial_message={"text": "hi", "idempotency_key": "c-1"})
            return lost.value, keyed, again
    lost, keyed, again = run(go())
    assert lost.code == "connection-lost" and "loop/create" in str(lost)
    assert relay.dropped_replies == 2
    assert keyed.session_id == again.session_id and keyed.turn_id == again.turn_id


def _stored(events):
    return [e for e in events if e.cursor != "0"]


async def _everything(bot):
    out, after = [], "0"
    while True:
        page = await bot.list_events(after=after, limit=1000)
        out += page.events
        if page.next_cursor is None:
            return out
        after = page.next_cursor


def test_watch_resumes_across_cut_connections_with_no_gap_and_no_duplicate(bot_server, relay):
    async def go():
        async with AsyncClient(relay.url, BOT_TOKEN, **FAST) as bot:
            s = await bot.create(container_id="inbox")
            stream = bot.watch(after="0")
            seen = []

            async def consume():
                async for event in stream:
                    if event.cursor != "0":
                        seen.append(event)
                    if sum(e.type == "turn.completed" for e in seen) == 12:
                        return

            consumer = asyncio.ensure_future(consume())
            for i in range(12):
                receipt = await bot.send(s.session_id, f"message {i}", f"w-{i}")
                if i % 3 == 1:
                    relay.cut()
                await bot.wait_for_turn(s.session_id, receipt.turn_id)
            await asyncio.wait_for(consumer, 30)
            return seen, await _everything(bot), bot.connections, stream.catch_ups
    seen, stored, connections, catch_ups = run(go())
    assert connections >= 5 and catch_ups >= 4
    assert [e.cursor for e in seen] == [e.cursor for e in stored]  # each once, none missing, in order
    assert len({e.cursor for e in seen}) == len(seen)


def test_watch_resumes_across_a_killed_and_restarted_server(bot_server, relay):
    async def go():
        async with AsyncClient(relay.url, BOT_TOKEN, **FAST) as bot:
            s = await bot.create(container_id="inbox")
            stream = bot.watch(after="0")
            first = await bot.send(s.session_id, "before", "r-1")
            await bot.wait_for_turn(s.session_id, first.turn_id)
            seen = [await anext(stream)]
            bot_server.stop(9)
            bot_server.start()  # the same data directory, a new port behind the same address
            relay.upstream_port = bot_server.port
            second = await bot.send(s.session_id, "after", "r-2")
            await bot.wait_for_turn(s.session_id, second.turn_id)
            while sum(e.type == "turn.completed" for e in seen) < 2:
                event = await asyncio.wait_for(anext(stream), 30)
                if event.cursor != "0":
                    seen.append(event)
            return seen, await _everything(bot)
    seen, stored = run(go())
    assert [e.cursor for e in seen] == [e.cursor for e in stored]


def test_a_live_buffer_that_overflows_catches_up_from_the_store(bot_server):
    async def go():
        async with AsyncClient(bot_server.url, BOT_TOKEN) as bot:
            s = await bot.create(container_id="inbox")
            stream = await bot.watch(max_buffer=3).start()  # live from here on
            first = await bot.send(s.session_id, "one", "o-1")
            seen = [await anext(stream)]
            await bot.wait_for_turn(s.session_id, first.turn_id)
            for i in range(4):
                r = await bot.send(s.session_id, f"more {i}", f"o-{i + 2}")
                await bot.wait_for_turn(s.session_id, r.turn_id)
            while sum(e.type == "turn.completed" for e in seen) < 5:
                event = await asyncio.wait_for(anext(stream), 10)
                if event.cursor != "0":
                    seen.append(event)
            return _stored(seen), await _everything(bot), stream.overflows
    seen, stored, overflows = run(go())
    assert overflows >= 1
    assert [e.cursor for e in seen] == [e.cursor for e in stored]


def test_a_rejected_receipt_is_sent_again_after_its_retry_after(bot_server):
    async def go():
        async with (AsyncClient(bot_server.url, BOT_TOKEN, honour_rejected=False) as plain,
                    AsyncClient(bot_server.url, BOT_TOKEN) as patient):
            s = await plain.create(container_id="inbox")
            for i in range(20):  # the session's quota: 20 unfinished turns (the first holds the others)
                await plain.send(s.session_id, "!sleep 2000\nbusy" if i == 0 else f"queued {i}", f"q-{i}")
            refused = await plain.send(s.session_id, "one more", "q-extra")
            taken = await patient.send(s.session_id, "one more", "q-extra")
            done = await patient.wait_for_turn(s.session_id, taken.turn_id, timeout_ms=60_000)
            return refused, taken, done
    refused, taken, done = run(go())
    assert refused.state == "rejected" and refused.retry_after_ms == 1000 and refused.turn_id is None
    assert taken.state in ("accepted", "queued") and done.output_text == "echo: one more"


def test_the_server_refuses_a_burst_with_retry_after_and_the_client_paces_below_it(bot_server):
    async def raw_burst():
        async with connect(bot_server.url, additional_headers={"Authorization": f"Bearer {BOT_TOKEN}"}) as ws:
            await ws.send(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "0.2.1", "client": {"name": "raw", "version": "1"}}}))
            await ws.recv()
            for i in range(1, 301):
                await ws.send(json.dumps({"jsonrpc": "2.0", "id": i, "method": "loop/listEvents", "params": {}}))
            replies = [json.loads(await ws.recv()) for _ in range(300)]
            return [r["error"]["data"] for r in replies if "error" in r]

    async def paced():
        async with AsyncClient(bot_server.url, BOT_TOKEN) as bot:
            pages = await asyncio.gather(*(bot.list_events() for _ in range(300)))
            return len(pages)

    refusals = run(raw_burst())
    assert refusals and all(d["code"] == "rejected" and d["retryAfterMs"] >= 1 for d in refusals)
    assert run(paced()) == 300  # none refused: every call answered


def test_a_call_times_out_when_no_answer_comes_and_the_next_one_works(bot_server, relay):
    async def go():
        async with AsyncClient(relay.url, BOT_TOKEN, **FAST) as bot:
            s = await bot.create(container_id="inbox")
            r = await bot.send(s.session_id, "hello", "t-1")
            relay.stall = True
            with pytest.raises(CallTimeout) as timed_out:
                await bot.list_events(timeout=0.3)
            waited = await bot.wait_for_turn(s.session_id, r.turn_id, timeout=0.3)
            relay.stall = False
            return timed_out.value, waited, await bot.wait_for_turn(s.session_id, r.turn_id)
    timed_out, waited, done = run(go())
    assert isinstance(timed_out, TimeoutError) and "loop/listEvents" in str(timed_out)
    assert waited.state == "timeout" and done.output_text == "echo: hello"


def test_a_refused_token_and_an_empty_port_fail_at_connect(bot_server):
    async def go():
        with pytest.raises(TokenRefused) as refused:
            await AsyncClient(bot_server.url, "not-a-token-of-this-server-at-all-000").connect()
        with pytest.raises(ConnectFailed) as nothing:
            await AsyncClient(f"ws://127.0.0.1:{free_port()}/session", BOT_TOKEN, connect_timeout=0.5,
                              **FAST).connect()
        return refused.value, nothing.value
    refused, nothing = run(go())
    assert "401" in str(refused) and "not-a-token" not in str(refused)  # no secret in the error
    assert "connection refused" in str(nothing)


def test_apps_see_only_their_own_sessions_through_the_client(bot_server):
    with Client(bot_server.url, BOT_TOKEN) as mine, Client(bot_server.url, OTHER_TOKEN) as theirs:
        s = mine.create(container_id="inbox")
        with pytest.raises(NotFound):
            theirs.send(s.session_id, "hi", "x")
        with pytest.raises(NotFound):
            theirs.wait_for_turn(s.session_id, "some-turn")
        assert theirs.list_events().events == []


def test_the_owner_protocol_through_the_sync_client_resubscribes_after_a_cut(bot_server, relay):
    with Client(relay.url, bot_server.token, **FAST) as owner:
        created = owner.session_create(name="by the owner")
        listed = owner.sessions_list(limit=10)
        snapshot = owner.session_subscribe(session_id=created.session.id)
        owner.turn_send(session_id=created.session.id, content="hello")
        pushes = []
        while not any(n.method == "item/completed" and isinstance(n.params.item, TurnItem) and n.params.item.outcome
                      for n in pushes):
            pushes.append(owner.next_notification(timeout=10))
        relay.cut()
        renewed = owner.next_notification(timeout=10)
    assert isinstance(listed, SessionsListResult) and created.session.id in [s.id for s in listed.sessions]
    assert isinstance(snapshot, SubscribeResult) and snapshot.session.id == created.session.id
    assert renewed.method == "session/subscribe" and isinstance(renewed.params, SubscribeResult)
    assert any(isinstance(item, AgentMessageItem) and item.text == "echo: hello"
               for item in renewed.params.items)


def test_every_method_of_the_protocol_has_a_method_on_both_clients():
    names = {python_name(m) for m in OWNER_METHODS}
    assert set(OWNER_METHODS) | {"initialize"} | {m for m in METHODS if m.startswith("loop/")} == set(METHODS)
    assert all(callable(getattr(AsyncClient, n)) and callable(getattr(Client, n)) for n in names)
    assert {"sessions_list", "session_config_layer_get", "session_mark_seen", "background_stop_all"} <= names
    assert all(hasattr(AsyncClient, n) and hasattr(Client, n)
               for n in ("create", "send", "wait_for_turn", "list_events", "watch", "call"))


def test_the_relay_is_a_real_connection():
    """The relay itself: a connection to nowhere is accepted and then ends (nothing listens upstream)."""
    r = Relay(free_port())
    try:
        async def go():
            reader, writer = await asyncio.open_connection("127.0.0.1", r.port)
            data = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            return data
        assert run(go()) == b"" and r.connections == 1
    finally:
        r.close()


def test_watch_has_no_gap_and_no_duplicate_while_many_sessions_commit_at_once_and_connections_drop(
        bot_server, relay):
    """Sessions commit on threads of their own, so live events of different sessions may come a
    little out of cursor order; catching up after each cut must still give each stored event once."""
    async def go():
        async with AsyncClient(relay.url, BOT_TOKEN, **FAST) as bot:
            sessions = [(await bot.create(container_id="inbox")).session_id for _ in range(6)]
            stream = await bot.watch(after="0").start()
            seen = []

            async def talk(sid):
                for i in range(5):
                    r = await bot.send(sid, f"!sleep 40\n{sid[-4:]} {i}", f"{sid}-{i}")
                    await bot.wait_for_turn(sid, r.turn_id)

            async def cutter():
                while True:
                    await asyncio.sleep(0.08)
                    relay.cut()

            async def consume():
                async for event in stream:
                    if event.cursor != "0":
                        seen.append(event)
                    if sum(e.type == "turn.completed" for e in seen) == 30:
                        return

            consuming = asyncio.ensure_future(consume())
            cutting = asyncio.ensure_future(cutter())
            await asyncio.gather(*(talk(s) for s in sessions))
            cutting.cancel()
            await asyncio.wait_for(consuming, 30)
            return seen, await _everything(bot), bot.connections
    seen, stored, connections = run(go())
    assert connections >= 3
    cursors = [e.cursor for e in seen]
    assert len(cursors) == len(set(cursors))  # no duplicate
    assert sorted(cursors, key=int) == [e.cursor for e in stored]  # no gap


def test_the_sync_iterator_keeps_its_place_across_a_timeout(bot_server):
    with Client(bot_server.url, BOT_TOKEN) as bot:
        events = bot.watch(after="0")
        with pytest.raises(TimeoutError):
            events.next(timeout=0.2)  # nothing stored yet
        s = bot.create(container_id="inbox", initial_message={"text": "hi", "idempotency_key": "it-1"})
        bot.wait_for_turn(s.session_id, s.turn_id)
        heard = [events.next(timeout=10)]
        while heard[-1].type != "turn.completed":
            heard.append(events.next(timeout=10))
        events.close()
    stored = [e.type for e in heard if e.cursor != "0"]
    assert stored == ["turn.started", "assistant.message", "turn.completed"]
    assert events.last_cursor == heard[-1].cursor


def test_a_subscription_whose_session_was_deleted_ends_with_the_error_after_a_reconnection(bot_server, relay):
    with Client(relay.url, bot_server.token, **FAST) as owner:
        gone = owner.session_create(name="to delete").session.id
        kept = owner.session_create(name="to keep").session.id
        owner.session_subscribe(session_id=gone)
        owner.session_subscribe(session_id=kept)
        owner.session_delete(session_id=gone)
        relay.cut()
        renewed = []
        while len(renewed) < 2:
            note = owner.next_notification(timeout=10)
            if note.method == "session/subscribe":
                renewed.append(note.params)
    assert isinstance(renewed[0], NotFound) and isinstance(renewed[1], SubscribeResult)
    assert renewed[1].session.id == kept


def test_client_options_out_of_bounds_are_refused_naming_the_option():
    for bad, name in (({"max_in_flight": 0}, "max_in_flight"), ({"call_timeout": -1}, "call_timeout"),
                      ({"burst": 1.5}, "burst"), ({"reconnect_min": 5.0, "reconnect_max": 1.0}, "reconnect")):
        with pytest.raises(InvalidArguments, match=name):
            AsyncClient("ws://127.0.0.1:1/session", BOT_TOKEN, **bad)
    with pytest.raises(InvalidArguments, match="no_such_option"):
        AsyncClient("ws://127.0.0.1:1/session", BOT_TOKEN, no_such_option=1)
    with pytest.raises(InvalidArguments, match="token"):
        AsyncClient("ws://127.0.0.1:1/session", "")


def test_a_cursor_older_than_the_retention_is_a_typed_cursor_expired_with_the_oldest_cursor(tmp_path):
    data = tmp_path / "data"
    host = Host.open(str(data), durability="nosync", feed_max_events=3, permission_mode="acceptCalls")
    host.register_app("mybot", platform="telegram", containers=["inbox"])
    loop = host.sessions(app="mybot")
    made = loop.create(container_id="inbox", title="old")
    for i in range(3):
        loop.wait_for_turn(made.session_id, loop.send(made.session_id, f"m {i}", idempotency_key=f"k{i}").turn_id)
    kept = [str(e.cursor) for e in loop.list_events(limit=100).events]
    host.close()
    (data / "apps.toml").write_text(APPS)
    server = ServerProcess(str(data)).start()

    async def go():
        async with AsyncClient(server.url, BOT_TOKEN, **FAST) as bot:
            with pytest.raises(CursorExpired) as listed:
                await bot.list_events(after="1")
            stream = bot.watch(after="1")
            with pytest.raises(CursorExpired) as watched:
                await anext(stream)
            oldest = listed.value.oldest_cursor
            page = await bot.list_events(after=oldest)
            return listed.value, watched.value, oldest, [e.cursor for e in page.events]

    try:
        listed, watched, oldest, resumed = run(go())
    finally:
        server.stop()
    assert listed.code == "cursor-expired" and watched.oldest_cursor == oldest
    assert oldest is not None and int(oldest) < int(kept[0]) and resumed == kept


def test_the_client_paces_itself_by_the_rate_limits_the_server_announces(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "apps.toml").write_text(APPS)
    server = ServerProcess(str(data), "--requests-per-second", "20", "--request-burst", "10").start()
    relay = Relay(server.port)
    refusals: list[bool] = []
    relay.drop_reply_when(lambda chunk: refusals.append(b'"code":"rejected"' in chunk) and False)

    async def burst(**options):
        async with AsyncClient(relay.url, BOT_TOKEN, **options) as bot:
            pages = await asyncio.gather(*(bot.list_events() for _ in range(40)))
            return bot.info.rate_limits, bot.pace, len(pages)

    try:
        announced, pace, answered = run(burst())
        paced_refusals = sum(refusals)
        refusals.clear()
        _, fast, fast_answered = run(burst(requests_per_second=200.0, burst=100))  # told to go faster
    finally:
        relay.close()
        server.stop()
    assert (announced.requests_per_second, announced.burst, announced.max_in_flight) == (20, 10, 256)
    assert (pace.requests_per_second, pace.burst, pace.max_in_flight) == (18, 5, 128)
    assert answered == 40 and paced_refusals == 0  # kept below the announced bucket: never refused
    assert (fast.requests_per_second, fast.burst) == (200.0, 100)
    assert fast_answered == 40 and sum(refusals) > 0  # the same burst above it is refused (and waited out)
