"""Seeds 000/001, the Session Loop API: one named test per rule, on a real host."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.errors import Forbidden, InvalidCommand, NotFound
from sessionloop.actors.tools import ToolSpec
from sessionloop.eventstore import IdempotencyConflict
from tests.actors.gateway_harness import MemoryClient, wait_until


@pytest.fixture
def loop_host(open_host):
    host = open_host()
    host.register_app("mybot", platform="telegram", containers=["inbox", "workers"])
    host.register_app("other", platform="slack", containers=["inbox"])
    return host


@pytest.fixture
def bot(loop_host):
    return loop_host.sessions(app="mybot")


def test_create_in_a_declared_container_makes_a_room_of_the_app(loop_host, bot):
    s = bot.create(container_id="inbox", title="Chat with Alice")
    record = loop_host.list()[0]
    assert record.id == s.session_id and record.kind == "room"
    created = loop_host.session(s.session_id).events()[0].event
    assert (created.app_id, created.platform, created.instance, created.container_id) == (
        "mybot", "telegram", "mybot", "inbox")


def test_create_in_a_space_looks_like_an_owner_session_but_belongs_to_the_app(loop_host, bot):
    s = bot.create(space={"spaceId": "home"})
    created = loop_host.session(s.session_id).events()[0].event
    assert (created.kind, created.space_id, created.app_id) == ("owner", "home", "mybot")


@pytest.mark.parametrize("kwargs, message", [
    ({}, "exactly one placement"),
    ({"container_id": "inbox", "space": {"spaceId": "x"}}, "exactly one placement"),
    ({"container_id": "secret"}, "container 'secret' is not declared"),
    ({"space": {"id": "x"}}, "spaceId"),
    ({"container_id": "inbox", "activity": "sometimes"}, "activity"),
])
def test_placement_rules_are_enforced_with_an_error_naming_the_problem(bot, kwargs, message):
    with pytest.raises(InvalidCommand, match=message):
        bot.create(**kwargs)


def test_an_app_without_permissions_sessions_is_refused(loop_host):
    loop_host.register_app("muted", sessions=False)
    with pytest.raises(Forbidden, match="permissions.sessions"):
        loop_host.sessions(app="muted")


def test_interactive_defaults_to_ask_and_background_to_accept_calls(loop_host, bot):
    a = bot.create(container_id="inbox")
    b = bot.create(container_id="inbox", activity="background")
    modes = [loop_host.session(s.session_id).events()[0].event.permission_mode for s in (a, b)]
    assert modes == ["ask", "acceptCalls"]


def test_context_caller_outside_a_tool_execution_is_an_error(bot):
    with pytest.raises(InvalidCommand, match="inside a tool's execution"):
        bot.create(container_id="workers", context="caller")


def test_create_with_an_initial_message_returns_its_turn_and_runs_it(bot):
    s = bot.create(container_id="inbox", initial_message={"text": "Hello from the bot.", "idempotencyKey": "w-1"})
    assert s.turn_id is not None
    assert bot.wait_for_turn(s.session_id, s.turn_id).output_text == "echo: Hello from the bot."


def test_create_with_an_initial_message_that_fails_leaves_no_session(loop_host, bot):
    loop_host.rt.faults.arm("before-commit", RuntimeError("between the writes"))
    with pytest.raises(Exception, match="between the writes"):
        bot.create(container_id="inbox", initial_message={"text": "hi", "idempotencyKey": "ghost"})
    assert loop_host.list() == []


def test_a_retried_create_with_the_same_initial_key_returns_the_same_session(loop_host, bot):
    first = bot.create(container_id="inbox", initial_message={"text": "hi", "idempotencyKey": "dup-create"})
    again = bot.create(container_id="inbox", initial_message={"text": "hi", "idempotencyKey": "dup-create"})
    assert (again.session_id, again.turn_id) == (first.session_id, first.turn_id)
    assert len(loop_host.list()) == 1


def test_send_requires_an_idempotency_key_of_at_most_512_characters(bot):
    s = bot.create(container_id="inbox")
    with pytest.raises(InvalidCommand, match="idempotency_key is required"):
        bot.send(s.session_id, "hi", idempotency_key="")
    with pytest.raises(InvalidCommand, match="at most 512"):
        bot.send(s.session_id, "hi", idempotency_key="k" * 513)
    assert bot.send(s.session_id, "hi", idempotency_key="k" * 512).state == "accepted"


def test_text_is_limited_to_100000_characters(bot):
    s = bot.create(container_id="inbox")
    with pytest.raises(InvalidCommand, match="at most 100000"):
        bot.send(s.session_id, "x" * 100_001, idempotency_key="big")


def test_attachment_limits_are_ten_and_20_mb(bot):
    s = bot.create(container_id="inbox")
    ref = E.AttachmentRef(name="a", kind="file", mime="application/octet-stream", size=10, sha256="0" * 64)
    with pytest.raises(InvalidCommand, match="at most 10"):
        bot.send(s.session_id, "x", idempotency_key="a", attachments=[ref] * 11)
    big = E.AttachmentRef(name="b", kind="file", mime="application/octet-stream", size=21 * 1024 * 1024,
                          sha256="0" * 64)
    with pytest.raises(InvalidCommand, match="20 MB each"):
        bot.send(s.session_id, "x", idempotency_key="b", attachments=[big])
    half = E.AttachmentRef(name="c", kind="file", mime="application/octet-stream", size=11 * 1024 * 1024,
                           sha256="0" * 64)
    with pytest.raises(InvalidCommand, match="together"):
        bot.send(s.session_id, "x", idempotency_key="c", attachments=[half, half])


def test_a_repeated_key_returns_the_original_receipt_and_starts_nothing(loop_host, bot):
    s = bot.create(container_id="inbox")
    first = bot.send(s.session_id, "What is the weather?", idempotency_key="msg-123")
    again = bot.send(s.session_id, "What is the weather?", idempotency_key="msg-123")
    assert first.state == "accepted" and again.state == "duplicate" and again.turn_id == first.turn_id
    bot.wait_for_turn(s.session_id, first.turn_id)
    turns = [e for e in loop_host.session(s.session_id).events() if isinstance(e.event, E.TurnStarted)]
    assert len(turns) == 1


def test_a_repeated_key_with_a_different_body_is_a_conflict(bot):
    s = bot.create(container_id="inbox")
    bot.send(s.session_id, "one thing", idempotency_key="k")
    with pytest.raises(IdempotencyConflict):
        bot.send(s.session_id, "another thing", idempotency_key="k")


def test_the_same_key_sent_by_many_threads_at_once_makes_exactly_one_turn(loop_host, bot):
    s = bot.create(container_id="inbox")
    barrier = threading.Barrier(10)
    receipts = []

    def send() -> None:
        barrier.wait()
        receipts.append(bot.send(s.session_id, "once", idempotency_key="race"))

    threads = [threading.Thread(target=send) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.turn_id for r in receipts}) == 1
    assert sum(r.state != "duplicate" for r in receipts) == 1
    bot.wait_for_turn(s.session_id, receipts[0].turn_id)
    assert sum(isinstance(e.event, E.TurnStarted) for e in loop_host.session(s.session_id).events()) == 1


def test_a_repeated_key_after_a_restart_returns_the_original_receipt(open_host, data_dir):
    host = open_host()
    host.register_app("mybot", containers=["inbox"])
    bot = host.sessions(app="mybot")
    s = bot.create(container_id="inbox")
    first = bot.send(s.session_id, "hello", idempotency_key="persisted")
    bot.wait_for_turn(s.session_id, first.turn_id)
    host.close()
    again_host = open_host()
    again_host.register_app("mybot", containers=["inbox"])
    again = again_host.sessions(app="mybot").send(s.session_id, "hello", idempotency_key="persisted")
    assert again.state == "duplicate" and again.turn_id == first.turn_id


def test_send_is_strict_fifo_under_50_concurrent_senders(loop_host, bot):
    s = bot.create(container_id="inbox")
    accepted: list = []
    lock = threading.Lock()
    barrier = threading.Barrier(50)

    def send(i: int) -> None:
        barrier.wait()
        while True:  # the quota (20 unfinished turns) rejects some: retry as the receipt says
            r = bot.send(s.session_id, f"!sleep 5\nm{i}", idempotency_key=f"fifo-{i}")
            if r.state != "rejected":
                break
            time.sleep(r.retry_after_ms / 20_000)
        with lock:
            accepted.append(r)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    by_acceptance = [r.turn_id for r in sorted(accepted, key=lambda r: r.position)]
    for turn_id in by_acceptance:
        assert bot.wait_for_turn(s.session_id, turn_id, timeout_ms=30_000).state == "completed"
    started = [e.event.turn_id for e in loop_host.session(s.session_id).events() if isinstance(e.event, E.TurnStarted)]
    assert started == by_acceptance and len(started) == 50


class Gate:
    """A tool whose calls wait until the test opens the gate: a turn stays unfinished exactly as
    long as the test needs, so the quota tests depend on no sleep being long enough."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.entered = threading.Semaphore(0)

    async def run(self, args, ctx):
        self.entered.release()
        while not self.opened.is_set():
            await asyncio.sleep(0.005)
        return {"passed": True}

    def wait_entered(self, count: int) -> None:
        for _ in range(count):
            assert self.entered.acquire(timeout=10), "a gated turn did not start"


@pytest.fixture
def gate(loop_host):
    g = Gate()
    loop_host.rt.tools.register(ToolSpec(name="gate", description="waits for the test", parameters={"type": "object"},
                                         handler=g.run))
    yield g
    g.opened.set()


def fill_session(bot, session_id: str, prefix: str) -> list:
    """20 unfinished turns: one held at the gate, 19 queued behind it."""
    receipts = [bot.send(session_id, "!tool gate {}", idempotency_key=f"{prefix}-0")]
    receipts += [bot.send(session_id, f"{prefix} {i}", idempotency_key=f"{prefix}-{i}") for i in range(1, 20)]
    assert [r.state for r in receipts] == ["accepted"] + ["queued"] * 19
    return receipts


def test_quota_rejection_and_recovery_for_20_unfinished_turns_in_a_session(loop_host, bot, gate):
    s = bot.create(container_id="inbox").session_id
    filled = fill_session(bot, s, "m")
    gate.wait_entered(1)
    head = loop_host.store.head_position
    refused = bot.send(s, "one too many", idempotency_key="m-20")
    assert (refused.state, refused.retry_after_ms, refused.turn_id, refused.cursor) == ("rejected", 1000, None, None)
    assert loop_host.store.head_position == head  # a rejected input is not stored, its key not spent
    gate.opened.set()
    assert bot.wait_for_turn(s, filled[-1].turn_id, timeout_ms=30_000).state == "completed"
    again = bot.send(s, "one too many", idempotency_key="m-20")
    assert again.state == "accepted" and again.turn_id is not None
    assert bot.wait_for_turn(s, again.turn_id).output_text == "echo: one too many"


def test_quota_rejection_and_recovery_for_200_unfinished_turns_of_an_app(loop_host, bot, gate):
    """The app's limit holds across sessions: a session with nothing queued is still refused
    while the app has 200 unfinished turns elsewhere, and accepted once they end."""
    full = [bot.create(container_id="inbox").session_id for _ in range(10)]
    filled = [fill_session(bot, sid, f"s{i}") for i, sid in enumerate(full)]
    gate.wait_entered(10)
    assert loop_host.rt.app_counts.count("mybot") == 200
    idle = bot.create(container_id="inbox").session_id
    head = loop_host.store.head_position
    refused = bot.send(idle, "hello", idempotency_key="idle-1")
    assert (refused.state, refused.retry_after_ms, refused.turn_id) == ("rejected", 1000, None)
    assert loop_host.store.head_position == head and loop_host.rt.app_counts.count("mybot") == 200
    gate.opened.set()
    for sid, receipts in zip(full, filled, strict=True):
        assert bot.wait_for_turn(sid, receipts[-1].turn_id, timeout_ms=30_000).state == "completed"
    again = bot.send(idle, "hello", idempotency_key="idle-1")
    assert again.state == "accepted"
    assert bot.wait_for_turn(idle, again.turn_id).output_text == "echo: hello"


def test_wait_for_turn_reports_completed_failed_and_timeout_without_cancelling(bot):
    s = bot.create(container_id="inbox")
    ok = bot.send(s.session_id, "fine", idempotency_key="a")
    bad = bot.send(s.session_id, "!error broken", idempotency_key="b")
    slow = bot.send(s.session_id, "!sleep 1500\nslow", idempotency_key="c")
    assert bot.wait_for_turn(s.session_id, ok.turn_id).output_text == "echo: fine"
    failed = bot.wait_for_turn(s.session_id, bad.turn_id)
    assert (failed.state, failed.code) == ("failed", "model-error")
    started = time.monotonic()
    timed_out = bot.wait_for_turn(s.session_id, slow.turn_id, timeout_ms=10)  # clamped up to 1 s
    assert timed_out.state == "timeout" and time.monotonic() - started >= 0.9
    assert bot.wait_for_turn(s.session_id, slow.turn_id).output_text == "echo: slow"  # the turn went on


def test_the_wait_timeout_is_clamped_to_1_to_600_seconds(bot):
    assert bot.clamp_timeout_ms(None) == 60 and bot.clamp_timeout_ms(5) == 1 and bot.clamp_timeout_ms(10**9) == 600


@pytest.mark.parametrize("timeout_ms, seconds", [(10**310, 600), (-(10**310), 1), (2**1100, 600),
                                                  (float("inf"), 600), (float("-inf"), 1)])
def test_a_timeout_beyond_float_range_is_clamped_instead_of_overflowing(bot, timeout_ms, seconds):
    assert bot.clamp_timeout_ms(timeout_ms) == seconds


def test_waiting_with_a_310_digit_timeout_returns_the_turns_result(bot):
    s = bot.create(container_id="inbox", initial_message={"text": "hi", "idempotency_key": "k"})
    result = bot.wait_for_turn(s.session_id, s.turn_id, timeout_ms=int("9" * 310))
    assert (result.state, result.output_text) == ("completed", "echo: hi")


def test_an_app_cannot_see_send_to_or_wait_on_another_apps_sessions(loop_host, bot):
    theirs = loop_host.sessions(app="other").create(container_id="inbox")
    with pytest.raises(NotFound):
        bot.send(theirs.session_id, "hi", idempotency_key="x")
    with pytest.raises(NotFound):
        bot.wait_for_turn(theirs.session_id, "t")
    with pytest.raises(NotFound):
        bot.list_events(session_id=theirs.session_id)


def test_events_are_listed_by_cursor_and_deltas_are_never_stored(bot):
    s = bot.create(container_id="inbox")
    r = bot.send(s.session_id, "hi", idempotency_key="e1")
    bot.wait_for_turn(s.session_id, r.turn_id)
    page = bot.list_events(session_id=s.session_id)
    assert [e.type for e in page.events] == ["turn.started", "assistant.message", "turn.completed"]
    assert page.events[1].data["text"] == "echo: hi"
    assert all(e.type != "assistant.delta" for e in page.events)
    r2 = bot.send(s.session_id, "again", idempotency_key="e2")
    bot.wait_for_turn(s.session_id, r2.turn_id)
    later = bot.list_events(after=page.events[-1].cursor)
    assert [e.type for e in later.events] == ["turn.started", "assistant.message", "turn.completed"]
    assert all(e.cursor > page.events[-1].cursor for e in later.events)


def three_inputs(bot, sid: str):
    """An input that ended before, one sent while a slow turn runs (queued) and one after all
    ended: a cursor must separate an input from what came before it in every case."""
    before = bot.send(sid, "before", idempotency_key="c0")
    bot.wait_for_turn(sid, before.turn_id)
    slow = bot.send(sid, "!sleep 200\nslow", idempotency_key="c1")
    queued = bot.send(sid, "queued", idempotency_key="c2")
    assert (slow.state, queued.state) == ("accepted", "queued")
    bot.wait_for_turn(sid, queued.turn_id)
    last = bot.send(sid, "last", idempotency_key="c3")
    bot.wait_for_turn(sid, last.turn_id)
    return before, slow, queued, last


def test_list_events_from_the_receipts_cursor_shows_exactly_the_events_of_that_input(bot):
    s = bot.create(container_id="inbox").session_id
    before, slow, queued, last = three_inputs(bot, s)
    everything = bot.list_events(session_id=s).events
    of_queued = [e for e in everything if e.turn_id == queued.turn_id]
    assert [e.type for e in of_queued] == ["turn.started", "assistant.message", "turn.completed"]
    since = bot.list_events(session_id=s, after=queued.cursor).events
    assert [e for e in since if e.turn_id == queued.turn_id] == of_queued  # all of them, none before it
    assert {e.turn_id for e in since} == {slow.turn_id, queued.turn_id, last.turn_id}  # the slow turn's tail
    assert before.turn_id not in {e.turn_id for e in since}
    assert {e.turn_id for e in bot.list_events(after=last.cursor).events} == {last.turn_id}
    between = [e for e in everything if queued.cursor < e.cursor <= last.cursor]
    assert {e.turn_id for e in between} == {slow.turn_id, queued.turn_id}
    again = bot.send(s, "queued", idempotency_key="c2")  # a duplicate points at the original input
    assert again.state == "duplicate" and again.cursor == queued.cursor


def test_the_receipts_epoch_and_seq_mark_where_that_inputs_pushes_begin_on_the_protocol_stream(loop_host, bot):
    """seq counts a session's pushes, so it cannot start list_events; it is the protocol
    stream's cursor: a subscriber finds an input's pushes after the receipt's (epoch, seq)."""
    svc = loop_host.protocol()
    try:
        s = bot.create(container_id="inbox").session_id
        client = MemoryClient(svc, app_id="mybot")
        snapshot = client.result("session/subscribe", {"sessionId": s})
        before, slow, queued, last = three_inputs(bot, s)
        client.wait(lambda f: f.get("method") == "item/completed" and f["params"]["item"]["kind"] == "turn"
                    and f["params"]["item"]["turnId"] == last.turn_id)
        with client.cond:
            pushes = [f["params"] for f in client.frames if "seq" in f.get("params", {})]
        assert queued.epoch == snapshot["epoch"] == loop_host.epoch
        assert {p["epoch"] for p in pushes} == {loop_host.epoch}

        def turns(items):
            return {p["item"]["turnId"] for p in items if "turnId" in p.get("item", {})}

        of_queued = [p for p in pushes if p.get("item", {}).get("turnId") == queued.turn_id]
        assert {p["item"]["kind"] for p in of_queued} >= {"user-message", "turn", "agent-message"}
        assert all(p["seq"] > queued.seq for p in of_queued)
        assert turns(p for p in pushes if p["seq"] > queued.seq) == {slow.turn_id, queued.turn_id, last.turn_id}
        assert turns(p for p in pushes if p["seq"] > last.seq) == {last.turn_id}
        assert snapshot["seq"] <= before.seq < slow.seq <= queued.seq < last.seq
    finally:
        svc.close()


def test_on_did_receive_event_sees_every_session_of_the_app_and_unsubscribes(loop_host, bot):
    seen = []
    unsubscribe = bot.on_did_receive_event(seen.append)
    a = bot.create(container_id="inbox")
    b = bot.create(container_id="inbox")
    for s, key in ((a, "x"), (b, "y")):
        bot.wait_for_turn(s.session_id, bot.send(s.session_id, "!sleep 50\nhi", idempotency_key=key).turn_id)
    loop_host.sessions(app="other").create(container_id="inbox")
    types = {(e.session_id, e.type) for e in seen}
    assert {(a.session_id, "turn.completed"), (b.session_id, "turn.completed")} <= types
    assert any(e.type == "assistant.delta" for e in seen)  # live streaming reaches bots
    unsubscribe()
    count = len(seen)
    bot.wait_for_turn(a.session_id, bot.send(a.session_id, "more", idempotency_key="z").turn_id)
    assert len(seen) == count


def test_async_variants_send_and_wait(loop_host):
    aloop = loop_host.async_sessions(app="mybot")

    async def go():
        s = await aloop.create(container_id="inbox")
        receipt = await aloop.send(s.session_id, "async hi", idempotency_key="as-1")
        return await aloop.wait_for_turn(s.session_id, receipt.turn_id)

    assert asyncio.run(go()).output_text == "echo: async hi"


def test_a_duplicate_receipt_carries_the_cursor_of_the_original_input(bot):
    s = bot.create(container_id="inbox")
    first = bot.send(s.session_id, "hi", idempotency_key="cur")
    again = bot.send(s.session_id, "hi", idempotency_key="cur")
    assert again.state == "duplicate" and again.position == first.position > 0
    assert (again.epoch, again.seq, again.cursor) == (first.epoch, first.seq, first.cursor)


def test_the_app_quota_holds_when_many_sessions_send_at_once(loop_host):
    aloop = loop_host.async_sessions(app="mybot")

    async def go():
        sids = [(await aloop.create(container_id="inbox")).session_id for _ in range(50)]
        return await asyncio.gather(*(aloop.send(sid, f"!sleep 3000\nx{k}", idempotency_key=f"{i}-{k}")
                                      for k in range(10) for i, sid in enumerate(sids)))

    receipts = asyncio.run(go())
    assert sum(r.state != "rejected" for r in receipts) == 200
    assert loop_host.rt.app_counts.count("mybot") == 200


def test_a_room_created_through_the_python_api_records_its_chat_account_and_window_place(loop_host) -> None:
    loop = loop_host.sessions(app="mybot")
    made = loop.create(container_id="inbox", title="Team", chat={"type": "group", "multiParty": True},
                       account="bot-1", place={"key": "telegram:bot-1:group:77", "name": "Team chat"})
    created = loop_host.session(made.session_id).snapshot().created
    assert created.chat == E.ChatInfo(type="group", multi_party=True) and created.account == "bot-1"
    assert created.place == E.PlaceRef(key="telegram:bot-1:group:77", kind="window", name="Team chat")
    with pytest.raises(InvalidCommand, match="describe a room"):
        loop.create(space={"spaceId": "s"}, chat={"type": "group"})
    with pytest.raises(InvalidCommand, match="chat.multiParty must be true or false"):
        loop.create(container_id="inbox", chat={"type": "group", "multiParty": "yes"})


def test_wait_for_turn_over_the_protocol_leaves_no_timer_behind_and_still_times_out(loop_host, bot):
    """Each ``loop/waitForTurn`` sets its timeout on the worker loop; a wait its turn answered
    cancels it (before, every wait left its timer of up to two minutes, and the loop woke for it)."""
    svc = loop_host.protocol()
    try:
        client = MemoryClient(svc, app_id="mybot")
        s = client.result("loop/create", {"containerId": "inbox"})["sessionId"]
        for i in range(30):
            sent = client.result("loop/send", {"sessionId": s, "text": f"hello {i}", "idempotencyKey": f"k{i}"})
            done = client.result("loop/waitForTurn", {"sessionId": s, "turnId": sent["turnId"], "timeoutMs": 120_000})
            assert done == {"state": "completed", "outputText": f"echo: hello {i}"}
        # what is left is short (a listing push's 50 ms); thirty two-minute timeouts would stay
        wait_until(lambda: len(loop_host.rt.worker.deadlines) == 0, timeout=2, what="no deadline left")
        slow = client.result("loop/send", {"sessionId": s, "text": "!sleep 3000\nlate", "idempotencyKey": "slow"})
        started = time.monotonic()
        waited = client.result("loop/waitForTurn", {"sessionId": s, "turnId": slow["turnId"], "timeoutMs": 200})
        assert waited == {"state": "timeout"}
        assert 0.19 <= time.monotonic() - started < 2.5
        wait_until(lambda: len(loop_host.rt.worker.deadlines) == 0, timeout=2, what="no deadline left")
    finally:
        svc.close()
