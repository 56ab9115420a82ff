"""Lossless resume of an app's event feed against real servers (issue 21, "Lossless resume"):
``loop/watch`` and ``loop/listEvents`` from a cursor, across a restart; ``cursor-expired`` with the
oldest cursor; ``GET /api/loop/events`` (server-sent events, ``Last-Event-ID``); and a thousand
disconnections at random points, of both, with no gap and no duplicate."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import time
from typing import Any

import pytest

from sessionloop.actors.api.host import Host
from tests.e2e.conftest import APPS, initialized, open_client

pytestmark = pytest.mark.e2e

BOT = "bot-token-for-the-end-to-end-tests"


def _stored(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["cursor"] != "0"]


async def _bot(server: Any) -> Any:
    ws = await open_client(server, BOT).__aenter__()
    return ws, await initialized(ws)


async def _history(c: Any, after: str | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        page = await c.result("loop/listEvents", {"after": after, "limit": 500} if after else {"limit": 500})
        out += page["events"]
        if page.get("nextCursor") is None:
            return out
        after = page["nextCursor"]


async def _turns(c: Any, session_id: str, n: int, tag: str) -> None:
    for i in range(n):
        receipt = await c.result("loop/send", {"sessionId": session_id, "text": f"{tag} {i}",
                                               "idempotencyKey": f"{tag}-{i}"})
        done = await c.result("loop/waitForTurn", {"sessionId": session_id, "turnId": receipt["turnId"]})
        assert done["state"] == "completed"


async def _watched(c: Any, n: int, timeout: float = 10) -> list[dict[str, Any]]:
    """The next ``n`` stored events of the connection's watch (deltas left out)."""
    got: list[dict[str, Any]] = []
    while len(got) < n:
        push = await c.push(lambda m: m["method"] == "loop/event", timeout)
        if push["params"]["event"]["cursor"] != "0":
            got.append(push["params"]["event"])
    return got


async def _sse_open(port: int, token: str, cursor: str | None = None, *, query: str = "") -> Any:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    lines = [f"GET /api/loop/events{query} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {token}"]
    if cursor is not None:
        lines.append(f"Last-Event-ID: {cursor}")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    return int(head.split()[1]), head.decode(), reader, writer


def _logged(server: Any, fragment: str) -> bool:
    server.log.flush()
    with open(server.log.name) as f:
        return fragment in f.read()


async def _sse_events(reader: Any, n: int, timeout: float = 10) -> tuple[list[tuple[str | None, dict[str, Any]]], int]:
    """The next ``n`` events of a stream as ``(id, data)``, and the comments seen."""
    events: list[tuple[str | None, dict[str, Any]]] = []
    comments = 0
    event_id: str | None = None
    data: list[str] = []
    while len(events) < n:
        line = (await asyncio.wait_for(reader.readline(), timeout)).decode().rstrip("\n")
        if not line:
            if data:
                events.append((event_id, json.loads("\n".join(data))))
            event_id, data = None, []
        elif line.startswith(":"):
            comments += 1
        elif line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            data.append(line[6:])
    return events, comments


def test_loop_watch_from_a_cursor_resumes_exactly_after_it_across_a_server_restart(server_factory, tmp_path):
    data = tmp_path / "data"
    os.makedirs(data)
    (data / "apps.toml").write_text(APPS)
    first = server_factory(data_dir=str(data))

    async def before() -> tuple[str, list[dict[str, Any]]]:
        ws, c = await _bot(first)
        made = await c.result("loop/create", {"containerId": "inbox", "title": "a"})
        await _turns(c, made["sessionId"], 4, "before")
        history = _stored(await _history(c))
        await ws.close()
        return made["sessionId"], history

    session_id, history = asyncio.run(before())
    assert len(history) >= 8
    first.stop()
    second = server_factory(data_dir=str(data))
    assert second.epoch != first.epoch
    k = len(history) // 3

    async def after() -> None:
        ws, c = await _bot(second)
        started = await c.result("loop/watch", {"cursor": history[k]["cursor"]})
        assert started == {"cursor": history[k]["cursor"]}
        assert await _watched(c, len(history) - k - 1) == history[k + 1:]
        await _turns(c, session_id, 1, "after")  # then the live events, in order, right after
        live = await _watched(c, 3)
        assert [e["type"] for e in live] == ["turn.started", "assistant.message", "turn.completed"]
        assert int(live[0]["cursor"]) > int(history[-1]["cursor"])
        # loop/listEvents from the same cursor after the restart: the same events
        assert _stored(await _history(c, history[k]["cursor"]))[: len(history) - k - 1] == history[k + 1:]
        await ws.close()

    asyncio.run(after())


def test_a_cursor_older_than_the_retention_gets_cursor_expired_with_the_oldest_cursor(server_factory, tmp_path):
    data = tmp_path / "data"
    host = Host.open(str(data), durability="nosync", feed_max_events=5, permission_mode="acceptCalls")
    host.register_app("mybot", platform="telegram", containers=["inbox"])
    loop = host.sessions(app="mybot")
    made = loop.create(container_id="inbox", title="old")
    for i in range(4):
        receipt = loop.send(made.session_id, f"m {i}", idempotency_key=f"k{i}")
        assert loop.wait_for_turn(made.session_id, receipt.turn_id).state == "completed"
    kept = loop.list_events(limit=100).events
    assert len(kept) == 5
    host.close()
    (data / "apps.toml").write_text(APPS)
    server = server_factory(data_dir=str(data))

    async def check() -> None:
        ws, c = await _bot(server)
        for method, params in (("loop/listEvents", {"after": "1"}), ("loop/watch", {"cursor": "1"})):
            reply = await c.call(method, params)
            error = reply["error"]
            assert error["code"] == -32000 and error["data"]["code"] == "cursor-expired", reply
            oldest = error["data"]["oldestCursor"]
            assert 1 < int(oldest) < kept[0].cursor
            assert "retention" in error["message"]
        # the oldest cursor itself resumes with every retained event
        page = await c.result("loop/listEvents", {"after": oldest})
        assert [e["cursor"] for e in page["events"]] == [str(e.cursor) for e in kept]
        assert await c.result("loop/watch", {"cursor": oldest}) == {"cursor": oldest}
        assert [e["cursor"] for e in await _watched(c, 5)] == [str(e.cursor) for e in kept]
        # "0": everything retained, never expired
        assert len((await c.result("loop/listEvents", {"after": "0"}))["events"]) == 5
        await ws.close()
        status, head, reader, writer = await _sse_open(server.port, BOT, "1")
        body = json.loads(await reader.read())
        writer.close()
        assert status == 410 and "application/json" in head
        assert body["error"]["code"] == "cursor-expired" and body["error"]["oldestCursor"] == oldest

    asyncio.run(check())


def test_the_sse_endpoint_resumes_after_last_event_id_and_the_cursor_parameter(app_server):
    async def check() -> None:
        ws, c = await _bot(app_server)
        made = await c.result("loop/create", {"containerId": "inbox", "title": "sse"})
        await _turns(c, made["sessionId"], 3, "sse")
        history = _stored(await _history(c))
        status, head, reader, writer = await _sse_open(app_server.port, BOT, history[1]["cursor"])
        assert status == 200 and "text/event-stream" in head
        events, _ = await _sse_events(reader, len(history) - 2)
        assert [i for i, _ in events] == [e["cursor"] for e in history[2:]]
        assert [d for _, d in events] == history[2:]
        await _turns(c, made["sessionId"], 1, "live")  # live ones follow; deltas carry no id
        more, _ = await _sse_events(reader, 1)
        while more[-1][1]["type"] != "turn.completed":
            more += (await _sse_events(reader, 1))[0]
        assert all((i is None) == (d["type"] == "assistant.delta") for i, d in more)
        types = [d["type"] for _, d in more]
        assert "assistant.delta" in types and types.index("assistant.delta") < types.index("assistant.message")
        assert types[0] == "turn.started"
        assert [d["type"] for i, d in more if i is not None] == ["turn.started", "assistant.message",
                                                                  "turn.completed"]
        writer.close()
        status, _, reader, writer = await _sse_open(app_server.port, BOT, query=f"?cursor={history[-2]['cursor']}")
        assert status == 200
        assert [i for i, _ in (await _sse_events(reader, 1))[0]] == [history[-1]["cursor"]]
        writer.close()
        for token, cursor, query, expected in ((BOT, "x1", "", 400), (BOT, "5", "?cursor=6", 400),
                                               ("e2e-owner-token", None, "", 403), ("wrong", None, "", 401)):
            status, _, reader, writer = await _sse_open(app_server.port, token, cursor, query=query)
            writer.close()
            assert status == expected, (token, cursor, query)
        await ws.close()

    asyncio.run(check())


def test_the_sse_stream_sends_heartbeats_as_comments(apps_server):
    server = apps_server(APPS)
    server.stop()
    quick = type(server)(server.data_dir, "--ping-interval", "0.2", "--ping-timeout", "5").start()
    try:
        async def check() -> None:
            status, _, reader, writer = await _sse_open(quick.port, BOT)
            assert status == 200
            comments = 0
            deadline = time.monotonic() + 5
            while comments < 3 and time.monotonic() < deadline:
                line = await asyncio.wait_for(reader.readline(), 5)
                comments += line.startswith(b": ping")
            writer.close()
            assert comments >= 3

        asyncio.run(check())
    finally:
        quick.stop()


def test_a_thousand_disconnections_at_random_points_lose_and_repeat_nothing(app_server):
    """Bots resume from the last cursor they received, by ``loop/watch`` or by ``Last-Event-ID``,
    mixed at random, while turns run in four sessions; each connection ends, abruptly, after a
    random number of events (or bytes, for SSE: mid-event too). What they received, end to end,
    is the stored feed after where they started: 0 gaps, 0 duplicates, in order."""
    rng = random.Random(21)

    async def produce(c: Any, sessions: list[str], stop: asyncio.Event) -> int:
        sent = 0
        while not stop.is_set():
            sid = sessions[sent % len(sessions)]
            receipt = await c.result("loop/send", {"sessionId": sid, "text": f"p {sent}", "idempotencyKey": f"p{sent}"})
            assert receipt["state"] == "accepted", receipt
            sent += 1
            await asyncio.sleep(0.03)
        return sent

    async def by_ws(cursor: str, take: int, got: list[dict[str, Any]]) -> str:
        async with open_client(app_server, BOT) as ws:
            c = await initialized(ws)
            await c.result("loop/watch", {"cursor": cursor})
            while take > 0:
                push = await c.push(lambda m: m["method"] == "loop/event", 10)
                event = push["params"]["event"]
                if event["cursor"] != "0":
                    got.append(event)
                    cursor = event["cursor"]
                    take -= 1
            ws.transport.abort()  # no close handshake: as a crash or a cut cable
        return cursor

    async def by_sse(cursor: str, take: int, got: list[dict[str, Any]]) -> str:
        status, _, reader, writer = await _sse_open(app_server.port, BOT, cursor)
        assert status == 200
        cut = rng.randrange(1, 4000)  # bytes after which the connection is cut: mid-event too
        read, event_id, data = 0, None, None
        while take > 0 and read < cut:
            line = await asyncio.wait_for(reader.readline(), 10)
            read += len(line)
            if read >= cut and rng.random() < 0.5:
                break  # this line was not taken: whatever event it belongs to is not complete
            text = line.decode().rstrip("\n")
            if text.startswith("id: "):
                event_id = text[4:]
            elif text.startswith("data: "):
                data = json.loads(text[6:])
            elif not text and data is not None:
                if event_id is not None:
                    assert data["cursor"] == event_id
                    got.append(data)
                    cursor = event_id
                    take -= 1
                event_id, data = None, None
        writer.transport.abort()
        return cursor

    async def run() -> None:
        ws, c = await _bot(app_server)
        sessions = [(await c.result("loop/create", {"containerId": "inbox", "title": f"s{i}"}))["sessionId"]
                    for i in range(4)]
        start = (await c.result("loop/watch", {}))["cursor"]  # the present: what follows must all arrive
        stop = asyncio.Event()
        producer = asyncio.ensure_future(produce(c, sessions, stop))
        got: list[dict[str, Any]] = []
        cursor, kinds = start, {"ws": 0, "sse": 0}
        began = time.monotonic()
        for _ in range(1000):
            kind = rng.choice(("ws", "sse"))
            kinds[kind] += 1
            take = rng.choice((0, 1, 2, 3, 5, 8, 13))
            cursor = await (by_ws if kind == "ws" else by_sse)(cursor, take, got)
        stop.set()
        sent = await producer
        async with open_client(app_server, BOT) as ws2:  # wait until every turn ended
            c2 = await initialized(ws2)
            deadline = time.monotonic() + 30
            while True:
                everything = _stored(await _history(c2, start))
                if sum(e["type"] == "turn.completed" for e in everything) >= sent or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
        await by_ws(cursor, len(everything) - len(got), got)  # the rest, once more by resuming
        await ws.close()
        cursors = [int(e["cursor"]) for e in got]
        assert len(cursors) == len(set(cursors)), "duplicates"
        assert cursors == sorted(cursors), "out of order"
        assert got == everything, "gaps"
        assert sent > 100 and len(got) > 300 and min(kinds.values()) > 400
        print(f"1000 disconnections ({kinds}) over {len(got)} events of {sent} turns in "
              f"{time.monotonic() - began:.1f} s")

    asyncio.run(run())


def test_an_sse_client_that_does_not_read_is_cut_off_and_others_are_unaffected(apps_server):
    server = apps_server(APPS)
    server.stop()
    small = type(server)(server.data_dir, "--max-outbox-mb", "0.05").start()
    try:
        async def check() -> None:
            ws, c = await _bot(small)
            made = await c.result("loop/create", {"containerId": "inbox", "title": "big"})
            for i in range(100):  # ~800 KB of events: more than the socket buffers and the outbox hold
                await c.result("loop/send", {"sessionId": made["sessionId"], "text": f"{i} " + "x" * 4000,
                                             "idempotencyKey": f"big-{i}"})
            history = _stored(await _history(c))
            while sum(e["type"] == "turn.completed" for e in history) < 100:
                await asyncio.sleep(0.1)
                history = _stored(await _history(c))
            # a reader that takes nothing: a tiny receive window (set before connecting), a raw socket
            # nobody reads (an asyncio stream would read into its own buffer)
            loop = asyncio.get_running_loop()
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.0.1", small.port))
            await loop.sock_sendall(sock, f"GET /api/loop/events?cursor=0 HTTP/1.1\r\nHost: x\r\n"
                                          f"Authorization: Bearer {BOT}\r\n\r\n".encode())
            # the server cuts it off while it reads nothing, and says so (the peer may not even see
            # the reset: its zero receive window leaves the reset's sequence number out of it)
            deadline = time.monotonic() + 60
            while not _logged(small, "event stream closed: slow consumer: outgoing buffer full") \
                    and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            cut_off = time.monotonic() < deadline
            status, _, r2, w2 = await _sse_open(small.port, BOT, history[-2]["cursor"])  # a healthy one
            assert status == 200
            assert [i for i, _ in (await _sse_events(r2, 1))[0]] == [history[-1]["cursor"]]
            w2.close()
            assert cut_off
            sock.close()
            await ws.close()

        asyncio.run(check())
    finally:
        small.stop()
