"""Issue 8 for the Session Loop API's Python inputs: whatever a bot passes, a refused call raises a
SessionloopError that names what was wrong and writes nothing, never a TypeError from deep inside
or a half-checked value that reaches the store."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionloop.actors import events as E
from sessionloop.actors.api.loop import MAX_TITLE
from sessionloop.eventstore import SessionloopError

REF = E.AttachmentRef(name="a", kind="file", mime="text/plain", size=1, sha256="0" * 64)

not_strings = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.binary(max_size=8),
                        st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                              max_size=2))
not_strings_or_none = not_strings.filter(lambda v: v is not None)
huge = st.integers(1, 3).map(lambda n: "x" * (100_001 * n))
unknown_ids = st.one_of(st.text(max_size=40), huge, st.just("0" * 21), st.just("../../etc"), st.just("a\x00b"))
not_ints = st.one_of(st.none(), st.booleans(), st.floats(), st.text(max_size=5), st.lists(st.integers(), max_size=2))


def bad_send(sid: str, theirs: str) -> st.SearchStrategy:
    """(field the error must name, kwargs of send) with exactly that field wrong."""
    ok = {"session_id": sid, "text": "hi", "idempotency_key": "k"}

    def with_(field, values, label=None):
        return values.map(lambda v: (label or field, {**ok, field: v}))

    return st.one_of(
        with_("session_id", st.one_of(not_strings, unknown_ids, st.just(theirs)).filter(lambda v: v != sid),
              "session"),
        with_("text", st.one_of(not_strings, huge)),
        with_("idempotency_key", st.one_of(not_strings, st.just(""), st.text(min_size=513, max_size=600))),
        with_("attachments", st.one_of(st.text(max_size=5), st.integers(), st.dictionaries(st.text(max_size=3),
                                                                                            st.integers(), max_size=2),
                                       st.lists(not_strings, min_size=1, max_size=3),
                                       st.integers(11, 30).map(lambda n: [REF] * n))),
    )


def bad_create() -> st.SearchStrategy:
    ok = {"container_id": "inbox"}
    message = {"text": "hi", "idempotency_key": "m"}

    def with_(field, values, base=ok, label=None):
        return values.map(lambda v: (label or field, {**base, field: v}))

    return st.one_of(
        with_("container_id", st.one_of(not_strings_or_none, st.text(max_size=20).filter(lambda c: c != "inbox")),
              label="container"),
        with_("space", st.one_of(not_strings_or_none.filter(lambda v: not isinstance(v, dict)),
                                 st.dictionaries(st.text(max_size=8).filter(lambda k: k not in ("spaceId", "space_id")),
                                                 st.text(max_size=5), min_size=1, max_size=3),
                                 st.fixed_dictionaries({"spaceId": st.one_of(not_strings, st.just(""), huge)})),
              base={}),
        with_("title", st.one_of(not_strings, st.text(min_size=MAX_TITLE + 1, max_size=MAX_TITLE + 50))),
        with_("activity", st.one_of(not_strings, st.text(max_size=12).filter(
            lambda a: a not in ("interactive", "background")))),
        with_("permission_mode", st.one_of(not_strings_or_none, st.text(max_size=12).filter(
            lambda m: m not in ("ask", "acceptCalls", "deny")))),
        with_("initial_message", st.one_of(
            not_strings_or_none.filter(lambda v: not isinstance(v, dict)),
            st.dictionaries(st.text(max_size=8).filter(lambda k: k not in ("text", "idempotency_key",
                                                                           "idempotencyKey")),
                            st.text(max_size=5), min_size=1, max_size=2).map(lambda extra: {**message, **extra}),
            not_strings.map(lambda t: {**message, "text": t}),
            st.one_of(not_strings, st.just(""), st.text(min_size=513, max_size=520)).map(
                lambda k: {**message, "idempotency_key": k}),
            huge.map(lambda t: {**message, "text": t}))),
        with_("context", st.one_of(not_strings_or_none, st.text(max_size=10))),
    )


def bad_wait(sid: str, theirs: str) -> st.SearchStrategy:
    ok = {"session_id": sid, "turn_id": "t", "timeout_ms": 1000}

    def with_(field, values, label=None):
        return values.map(lambda v: (label or field, {**ok, field: v}))

    return st.one_of(
        with_("session_id", st.one_of(not_strings, unknown_ids, st.just(theirs)).filter(lambda v: v != sid),
              "session"),
        with_("turn_id", st.one_of(not_strings, unknown_ids), "turn"),
        with_("timeout_ms", st.one_of(st.booleans(), st.text(max_size=5), st.just(float("nan")),
                                      st.lists(st.integers(), max_size=2))),
    )


def bad_list(sid: str, theirs: str) -> st.SearchStrategy:
    ok = {"session_id": sid, "after": None, "limit": 100}

    def with_(field, values, label=None):
        return values.map(lambda v: (label or field, {**ok, field: v}))

    return st.one_of(
        with_("session_id", st.one_of(not_strings_or_none, unknown_ids, st.just(theirs)).filter(
            lambda v: v != sid), "session"),
        with_("after", st.one_of(not_ints.filter(lambda v: v is not None), st.integers(max_value=-1),
                                 st.integers(min_value=2**63))),
        with_("limit", st.one_of(not_ints, st.integers(max_value=0), st.integers(min_value=1001))),
    )


@pytest.fixture
def loop_host(open_host):
    host = open_host()
    host.register_app("mybot", platform="telegram", containers=["inbox"])
    host.register_app("other", containers=["inbox"])
    return host


@pytest.fixture
def known(loop_host):
    """A session of the app with one ended turn, and another app's session: ids that exist, so
    a refusal cannot come from the store being empty."""
    bot = loop_host.sessions(app="mybot")
    s = bot.create(container_id="inbox", initial_message={"text": "hello", "idempotency_key": "first"})
    assert bot.wait_for_turn(s.session_id, s.turn_id).state == "completed"
    theirs = loop_host.sessions(app="other").create(container_id="inbox").session_id
    return s.session_id, theirs


def refused(loop_host, call) -> SessionloopError:
    counts = loop_host.rt.app_counts

    def unfinished() -> dict[str, int]:
        return {app: counts.count(app) for app in ("mybot", "other")}

    head, before = loop_host.store.head_position, unfinished()
    with pytest.raises(SessionloopError) as caught:
        call()
    assert loop_host.store.head_position == head, "a refused call wrote to the store"
    assert unfinished() == before, "a refused send kept a quota slot"
    return caught.value


def names(error: Exception, field: str) -> bool:
    return field in str(error)


CALLS = {
    "send": lambda loop, kw: loop.send(**kw),
    "create": lambda loop, kw: loop.create(**kw),
    "wait_for_turn": lambda loop, kw: loop.wait_for_turn(**kw),
    "list_events": lambda loop, kw: loop.list_events(**kw),
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_refused_python_call_raises_a_sessionloop_error_naming_the_field_and_writes_nothing(
        loop_host, known, data):
    sid, theirs = known
    op = data.draw(st.sampled_from(sorted(CALLS)))
    strategy = {"send": bad_send(sid, theirs), "create": bad_create(), "wait_for_turn": bad_wait(sid, theirs),
                "list_events": bad_list(sid, theirs)}[op]
    field, kwargs = data.draw(strategy)
    bot = loop_host.sessions(app="mybot")
    error = refused(loop_host, lambda: CALLS[op](bot, kwargs))
    assert names(error, field), (op, field, error)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_async_variants_refuse_the_same_inputs_the_same_way(loop_host, known, data):
    """Bots on asyncio take the other code path (acreate, asend, await_turn): it must check as
    much as the sync one."""
    sid, theirs = known
    op = data.draw(st.sampled_from(["send", "create", "wait_for_turn"]))
    field, kwargs = data.draw({"send": bad_send(sid, theirs), "create": bad_create(),
                               "wait_for_turn": bad_wait(sid, theirs)}[op])
    aloop = loop_host.async_sessions(app="mybot")
    error = refused(loop_host, lambda: asyncio.run(CALLS[op](aloop, kwargs)))
    assert names(error, field), (op, field, error)


def test_another_apps_session_id_is_not_found_in_every_call_and_writes_nothing(loop_host, known):
    """Ids must not leak between apps (seed 000 隔离边界): the same not-found as for an id that
    never existed."""
    _, theirs = known
    bot = loop_host.sessions(app="mybot")
    for call in (lambda: bot.send(theirs, "hi", idempotency_key="k"),
                 lambda: bot.wait_for_turn(theirs, "t"),
                 lambda: bot.list_events(session_id=theirs)):
        error = refused(loop_host, call)
        assert error.code == "not-found" and theirs in str(error)


def test_a_callback_that_cannot_be_called_is_refused_when_subscribing(loop_host):
    """Found at subscription, not later on the session's thread when the first event arrives."""
    bot = loop_host.sessions(app="mybot")
    error = refused(loop_host, lambda: bot.on_did_receive_event("print"))
    assert names(error, "callback")


def test_an_initial_message_may_use_the_seeds_camel_case_key_but_not_two_different_keys(loop_host):
    bot = loop_host.sessions(app="mybot")
    made = bot.create(container_id="inbox", initial_message={"text": "hi", "idempotencyKey": "camel"})
    assert made.turn_id is not None
    error = refused(loop_host, lambda: bot.create(container_id="inbox", initial_message={
        "text": "hi", "idempotencyKey": "a", "idempotency_key": "b"}))
    assert names(error, "idempotency_key") and names(error, "idempotencyKey")


def test_a_wait_for_an_unknown_turn_leaves_no_waiter_behind(loop_host, known):
    """A bot retrying waits on a wrong turn id must not grow the host's waiter table."""
    sid, _ = known
    bot = loop_host.sessions(app="mybot")
    for i in range(20):
        error = refused(loop_host, lambda i=i: bot.wait_for_turn(sid, f"no-such-turn-{i}"))
        assert error.code == "not-found"
    assert not any(t.startswith("no-such-turn") for t in loop_host.rt.results._waiters)
