"""One contract, two implementations: the same scenarios of the Session Loop API run against the
in-process API (``Host.async_sessions``) and against a real ``sessionloop serve`` through
``sessionloop.client``, so the two cannot drift (create, send, wait, quotas, duplicates,
conflicts, events, isolation between apps).

Each scenario talks to a :class:`Bot`: the API of docs/bots.md reduced to what both sides share,
with answers as plain values (cursors as strings) and every refusal as :class:`Refused` carrying
the error's code (``invalid`` for an argument refused before anything was written: in process an
``InvalidCommand``, over the wire ``invalidParams`` or the client's own check).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from sessionloop.actors.api.host import Host
from sessionloop.client import AsyncClient
from tests.e2e.conftest import ServerProcess

APPS_TOML = """
[apps.mybot]
token = "contract-bot-token-000000000000000000"
platform = "telegram"
containers = ["inbox", "workers"]

[apps.other]
token = "contract-other-token-0000000000000000"
platform = "slack"
containers = ["inbox"]
permission_modes = ["ask"]
"""
APPS = {"mybot": {"platform": "telegram", "containers": ["inbox", "workers"]},
        "other": {"platform": "slack", "containers": ["inbox"], "permission_modes": ["ask"]}}
TOKENS = {"mybot": "contract-bot-token-000000000000000000", "other": "contract-other-token-0000000000000000"}
INVALID = {"invalid", "invalidParams", "invalid-arguments"}


class Refused(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = "invalid" if code in INVALID else code


@dataclass(frozen=True)
class Receipt:
    state: str
    turn_id: str | None
    retry_after_ms: int | None
    cursor: str | None


@dataclass(frozen=True)
class Event:
    cursor: str
    session_id: str
    type: str
    turn_id: str | None
    data: Any


async def refusing(call: Awaitable[Any]) -> Any:
    try:
        return await call
    except Exception as e:
        code = getattr(e, "code", None)
        if isinstance(code, str):
            raise Refused(code) from e
        raise


class Bot:
    """What a scenario may do; both implementations below answer the same way."""

    async def create(self, **kw: Any) -> tuple[str, str | None]: ...
    async def send(self, session_id: str, text: str, key: str) -> Receipt: ...
    async def wait(self, session_id: str, turn_id: str, timeout_ms: int = 30_000) -> tuple[str, str | None]: ...
    async def events(self, session_id: str | None = None, after: str | None = None) -> list[Event]: ...
    async def watch(self) -> Callable[[], Awaitable[Event]]: ...


class InProcessBot(Bot):
    def __init__(self, host: Host, app: str) -> None:
        self.loop = host.async_sessions(app=app)

    async def create(self, **kw: Any) -> tuple[str, str | None]:
        made = await refusing(self.loop.create(**kw))
        return made.session_id, made.turn_id

    async def send(self, session_id: str, text: str, key: str) -> Receipt:
        r = await refusing(self.loop.send(session_id, text, key))
        return Receipt(r.state, r.turn_id, r.retry_after_ms, None if r.cursor is None else str(r.cursor))

    async def wait(self, session_id: str, turn_id: str, timeout_ms: int = 30_000) -> tuple[str, str | None]:
        r = await refusing(self.loop.wait_for_turn(session_id, turn_id, timeout_ms))
        return r.state, r.output_text

    async def events(self, session_id: str | None = None, after: str | None = None) -> list[Event]:
        page = await refusing(self.loop.list_events(session_id, None if after is None else int(after), 1000))
        return [Event(str(e.cursor), e.session_id, e.type, e.turn_id, e.data) for e in page.events]

    async def watch(self) -> Callable[[], Awaitable[Event]]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self.loop.on_did_receive_event(lambda e: loop.call_soon_threadsafe(queue.put_nowait, e))

        async def take() -> Event:
            e = await asyncio.wait_for(queue.get(), 30)
            return Event(str(e.cursor), e.session_id, e.type, e.turn_id, e.data)
        return take


class RemoteBot(Bot):
    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def create(self, **kw: Any) -> tuple[str, str | None]:
        made = await refusing(self.client.create(**kw))
        return made.session_id, made.turn_id

    async def send(self, session_id: str, text: str, key: str) -> Receipt:
        r = await refusing(self.client.send(session_id, text, key))
        return Receipt(r.state, r.turn_id, r.retry_after_ms, r.cursor)

    async def wait(self, session_id: str, turn_id: str, timeout_ms: int = 30_000) -> tuple[str, str | None]:
        r = await refusing(self.client.wait_for_turn(session_id, turn_id, timeout_ms))
        return r.state, r.output_text

    async def events(self, session_id: str | None = None, after: str | None = None) -> list[Event]:
        page = await refusing(self.client.list_events(session_id, after, 1000))
        return [Event(e.cursor, e.session_id, e.type, e.turn_id, e.data) for e in page.events]

    async def watch(self) -> Callable[[], Awaitable[Event]]:
        stream = await self.client.watch().start()

        async def take() -> Event:
            e = await asyncio.wait_for(anext(stream), 30)
            return Event(e.cursor, e.session_id, e.type, e.turn_id, e.data)
        return take


World = Callable[[], Any]  # () -> async context manager of (mybot, other)


@pytest.fixture(params=["in-process", pytest.param("remote", marks=pytest.mark.e2e)])
def world(request, tmp_path):
    """``async with world() as (bot, other)``: the apps ``mybot`` and ``other`` of one host."""
    if request.param == "in-process":
        host = Host.open(str(tmp_path / "data"), durability="nosync")
        for app, manifest in APPS.items():
            host.register_app(app, **manifest)

        @asynccontextmanager
        async def in_process() -> AsyncIterator[tuple[Bot, Bot]]:
            yield InProcessBot(host, "mybot"), InProcessBot(host, "other")

        yield in_process
        host.close()
        return
    data = tmp_path / "data"
    os.makedirs(data)
    (data / "apps.toml").write_text(APPS_TOML)
    server = ServerProcess(str(data)).start()

    @asynccontextmanager
    async def remote() -> AsyncIterator[tuple[Bot, Bot]]:
        # honour_rejected off: the contract is what the API answers, not the client's retries
        async with (AsyncClient(server.url, TOKENS["mybot"], honour_rejected=False) as a,
                    AsyncClient(server.url, TOKENS["other"], honour_rejected=False) as b):
            yield RemoteBot(a), RemoteBot(b)

    yield remote
    server.stop()


def scenario(world: World, body: Callable[[Bot, Bot], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        async with world() as (bot, other):
            return await body(bot, other)
    return asyncio.run(go())


def test_create_with_an_initial_message_runs_its_turn_and_the_same_key_answers_the_same_session(world):
    async def body(bot, other):
        first = await bot.create(container_id="inbox", title="Alice",
                                 initial_message={"text": "hello", "idempotency_key": "welcome"})
        again = await bot.create(container_id="inbox", title="Alice",
                                 initial_message={"text": "hello", "idempotency_key": "welcome"})
        return first, again, await bot.wait(*first)
    first, again, result = scenario(world, body)
    assert first == again and first[1] is not None
    assert result == ("completed", "echo: hello")


def test_a_placement_must_be_one_declared_container_or_a_space(world):
    async def body(bot, other):
        codes = []
        for kw in ({}, {"container_id": "nowhere"}, {"container_id": "inbox", "space": {"spaceId": "s"}}):
            try:
                await bot.create(**kw)
                codes.append("created")
            except Refused as e:
                codes.append(e.code)
        spaced = await bot.create(space={"spaceId": "room-1"}, title="in a space")
        return codes, spaced
    codes, spaced = scenario(world, body)
    assert codes == ["invalid", "invalid", "invalid"] and spaced[1] is None


def test_a_mode_the_manifest_does_not_allow_is_forbidden(world):
    async def body(bot, other):
        try:
            await other.create(container_id="inbox", permission_mode="deny")
        except Refused as e:
            return e.code, await other.events()
    assert scenario(world, body) == ("forbidden", [])


def test_send_then_wait_answers_in_order_and_a_repeat_is_the_same_turn(world):
    async def body(bot, other):
        sid, _ = await bot.create(container_id="inbox")
        receipts = [await bot.send(sid, f"message {i}", f"k-{i}") for i in range(3)]
        dup = await bot.send(sid, "message 1", "k-1")
        results = [await bot.wait(sid, r.turn_id) for r in receipts]
        return receipts, dup, results, await bot.events(sid)
    receipts, dup, results, events = scenario(world, body)
    assert receipts[0].state == "accepted" and {r.state for r in receipts[1:]} <= {"accepted", "queued"}
    assert dup.state == "duplicate" and dup.turn_id == receipts[1].turn_id
    assert results == [("completed", f"echo: message {i}") for i in range(3)]
    started = [e.turn_id for e in events if e.type == "turn.started"]
    assert started == [r.turn_id for r in receipts]  # FIFO, and the repeat started nothing


def test_the_same_key_with_another_text_is_a_conflict(world):
    async def body(bot, other):
        sid, _ = await bot.create(container_id="inbox")
        await bot.send(sid, "first", "same-key")
        try:
            await bot.send(sid, "second", "same-key")
        except Refused as e:
            return e.code
    assert scenario(world, body) == "conflict"


def test_a_wait_that_times_out_ends_only_the_wait(world):
    async def body(bot, other):
        sid, _ = await bot.create(container_id="inbox")
        r = await bot.send(sid, "!sleep 2500\nslow", "slow")  # a wait is at least 1 s
        early = await bot.wait(sid, r.turn_id, timeout_ms=1)
        return early, await bot.wait(sid, r.turn_id)
    early, late = scenario(world, body)
    assert early == ("timeout", None) and late == ("completed", "echo: slow")


def test_beyond_twenty_unfinished_turns_a_send_is_rejected_and_nothing_is_stored(world):
    async def body(bot, other):
        sid, _ = await bot.create(container_id="inbox")
        for i in range(20):  # the first holds the session: the others queue behind it
            await bot.send(sid, "!sleep 5000\nbusy" if i == 0 else f"queued {i}", f"busy-{i}")
        refused = await bot.send(sid, "one too many", "extra")
        again = await bot.send(sid, "one too many", "extra")  # not "duplicate": the key was not kept
        return refused, again
    refused, again = scenario(world, body)
    assert refused == again == Receipt("rejected", None, 1000, None)


def test_events_list_a_turn_and_start_right_before_an_input_with_its_cursor(world):
    async def body(bot, other):
        sid, _ = await bot.create(container_id="inbox")
        first = await bot.send(sid, "one", "e-1")
        await bot.wait(sid, first.turn_id)
        second = await bot.send(sid, "two", "e-2")
        await bot.wait(sid, second.turn_id)
        return first, second, await bot.events(sid), await bot.events(after=second.cursor)
    first, second, events, since = scenario(world, body)
    assert [e.type for e in events] == ["turn.started", "assistant.message", "turn.completed"] * 2
    assert [e.data["outputText"] for e in events if e.type == "turn.completed"] == ["echo: one", "echo: two"]
    assert {e.turn_id for e in since} == {second.turn_id} and len(since) == 3
    assert [int(e.cursor) for e in events] == sorted(int(e.cursor) for e in events)


def test_watch_hears_a_turn_as_it_happens(world):
    async def body(bot, other):
        take = await bot.watch()
        sid, _ = await bot.create(container_id="inbox")
        r = await bot.send(sid, "live", "w-1")
        heard = []
        while not heard or heard[-1].type != "turn.completed":
            heard.append(await take())
        return r, heard
    r, heard = scenario(world, body)
    assert heard[0].type == "turn.started" and heard[-1].data["outputText"] == "echo: live"
    assert {e.turn_id for e in heard} == {r.turn_id}
    assert "assistant.delta" in {e.type for e in heard}  # live pieces, never listed


def test_another_apps_session_is_not_found_in_every_call(world):
    async def body(bot, other):
        sid, turn = await bot.create(container_id="inbox", initial_message={"text": "mine", "idempotency_key": "m"})
        codes = []
        for call in (other.send(sid, "x", "x"), other.wait(sid, turn), other.events(sid)):
            try:
                await call
                codes.append("answered")
            except Refused as e:
                codes.append(e.code)
        return codes, await other.events(), len(await bot.events())
    codes, theirs, mine = scenario(world, body)
    assert codes == ["not-found"] * 3 and theirs == [] and mine > 0
