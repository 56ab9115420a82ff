"""The connection state machine: dispatch, answers, pushes, closing, back-pressure."""

from __future__ import annotations

import json

import msgspec
import pytest
from protocol_helpers import Peer, error_of, hello, make_connection, request

from sessionloop.eventstore.errors import StorageFull, WrongExpectedVersion
from sessionloop.protocol.connection import (
    CLOSE_GOING_AWAY,
    TRANSITIONS,
    Close,
    Dispatch,
    Event,
    Limits,
    Push,
    Send,
    State,
    TokenBucket,
    encode_push,
    truncate_close_reason,
)
from sessionloop.protocol.errors import (
    APPLICATION_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    ProtocolMisuse,
    RpcError,
)
from sessionloop.protocol.frames import notification_frame
from sessionloop.protocol.schemas import (
    Empty,
    FeaturesChanged,
    ItemDelta,
    SessionIdParams,
    SessionResync,
    SessionsListParams,
    SessionsListResult,
)
from sessionloop.protocol.schemas_types import Features

# --- before the handshake -------------------------------------------------------------------------


def test_only_initialize_is_allowed_before_the_handshake(fresh: Peer) -> None:
    reply = fresh.call("sessions/list", {}, 1)
    assert error_of(reply)[:2] == (1, INVALID_REQUEST)
    assert fresh.dispatched == []


def test_an_unknown_method_before_the_handshake_is_invalid_request(fresh: Peer) -> None:
    assert error_of(fresh.call("no/such", {}, 2))[:2] == (2, INVALID_REQUEST)


def test_notifications_wait_for_the_handshake(fresh: Peer) -> None:
    assert fresh.conn.notify("session/config/changed", Empty()) is None
    assert not fresh.conn.is_open


# --- dispatch and answers -------------------------------------------------------------------------


def test_an_unknown_method_is_method_not_found(peer: Peer) -> None:
    reply = peer.call("sessions/teleport", {}, 3)
    assert error_of(reply) == (3, METHOD_NOT_FOUND, "method not found: sessions/teleport")


def test_a_valid_request_is_dispatched_with_typed_params(peer: Peer) -> None:
    outputs = peer.conn.receive(request("session/archive", {"sessionId": "s1"}, "r1"))
    assert outputs == [Dispatch("r1", "session/archive", SessionIdParams(session_id="s1"))]
    assert peer.conn.in_flight == 1


def test_the_gateway_result_answers_the_dispatched_id(peer: Peer) -> None:
    peer.handlers["sessions/list"] = lambda params: SessionsListResult(sessions=[], groups=[])
    reply = peer.call("sessions/list", {"limit": 5}, 8)
    assert reply == {"jsonrpc": "2.0", "id": 8, "result": {"sessions": [], "groups": []}}
    assert peer.conn.in_flight == 0


def test_an_rpc_error_from_the_gateway_carries_data_code(peer: Peer) -> None:
    def refuse(params: msgspec.Struct) -> msgspec.Struct:
        raise RpcError.expected_turn_mismatch("turn t1 is not running", turnId="t1")

    peer.handlers["turn/abort"] = refuse
    reply = peer.call("turn/abort", {"sessionId": "s", "turnId": "t1"}, 4)
    assert reply["error"] == {
        "code": APPLICATION_ERROR,
        "message": "turn t1 is not running",
        "data": {"code": "expected-turn-mismatch", "turnId": "t1"},
    }


def test_domain_errors_are_translated_to_business_codes_or_internal_error(peer: Peer) -> None:
    peer.conn.receive(request("session/rename", {"sessionId": "s", "title": "t"}, 1))
    peer.conn.receive(request("session/rename", {"sessionId": "s", "title": "t"}, 2))
    conflict = json.loads(peer.conn.error(1, WrongExpectedVersion("session-s", 3, 4)) or "")
    assert conflict["error"]["code"] == APPLICATION_ERROR and conflict["error"]["data"]["code"] == "conflict"
    full = json.loads(peer.conn.error(2, StorageFull("disk full", path="/srv/data/store")) or "")
    data = {"code": "storage-unavailable", "retryAfterMs": 1000, "outcome": "not-written", "reason": "full"}
    assert full["error"] == {"code": APPLICATION_ERROR, "message": "disk full", "data": data}  # no server path


def test_answering_an_id_that_is_not_in_flight_is_misuse(peer: Peer) -> None:
    with pytest.raises(ProtocolMisuse):
        peer.conn.result("never-sent", Empty())
    with pytest.raises(ProtocolMisuse):
        peer.conn.error("never-sent", RpcError.internal_error())


def test_a_result_of_the_wrong_type_is_misuse_and_keeps_the_request_in_flight(peer: Peer) -> None:
    peer.conn.receive(request("sessions/list", {}, 1))
    with pytest.raises(ProtocolMisuse):
        peer.conn.result(1, Empty())
    assert peer.conn.in_flight == 1
    assert peer.conn.result(1, SessionsListResult(sessions=[], groups=[])) is not None


def test_a_request_is_answered_only_once(peer: Peer) -> None:
    peer.conn.receive(request("sessions/watch", {}, 1))
    assert peer.conn.result(1, Empty()) is not None
    with pytest.raises(ProtocolMisuse):
        peer.conn.result(1, Empty())


def test_a_second_request_with_an_id_in_flight_is_invalid_request(peer: Peer) -> None:
    peer.conn.receive(request("sessions/watch", {}, "same"))
    reply = peer.call("sessions/watch", {}, "same")
    assert error_of(reply)[:2] == ("same", INVALID_REQUEST)
    assert peer.conn.in_flight == 1


def test_an_id_can_be_reused_once_its_request_was_answered(peer: Peer) -> None:
    peer.conn.receive(request("sessions/watch", {}, 1))
    peer.conn.result(1, Empty())
    assert isinstance(peer.conn.receive(request("sessions/watch", {}, 1))[0], Dispatch)


def test_string_and_integer_ids_with_the_same_digits_are_different_requests(peer: Peer) -> None:
    peer.conn.receive(request("sessions/watch", {}, 1))
    assert isinstance(peer.conn.receive(request("sessions/watch", {}, "1"))[0], Dispatch)


# --- notifications --------------------------------------------------------------------------------


def test_notify_builds_a_notification_frame_on_an_open_connection(peer: Peer) -> None:
    frame = peer.conn.notify("session/resync", SessionResync(session_id="s", epoch=3, seq=10))
    assert json.loads(frame or "") == {
        "jsonrpc": "2.0",
        "method": "session/resync",
        "params": {"sessionId": "s", "epoch": 3, "seq": 10},
    }


def test_an_unknown_notification_is_misuse(peer: Peer) -> None:
    with pytest.raises(ProtocolMisuse):
        peer.conn.notify("session/exploded", Empty())


def test_a_notification_with_the_wrong_params_type_is_misuse(peer: Peer) -> None:
    with pytest.raises(ProtocolMisuse):
        peer.conn.notify("features/changed", Empty())
    features = Features(send=False, rewind=False, compress=False, settings=False)
    assert peer.conn.notify("features/changed", FeaturesChanged(features=features)) is not None


def test_any_exception_answers_a_dispatched_request_and_a_bug_is_an_internal_error(peer: Peer) -> None:
    peer.conn.receive(request("session/rename", {"sessionId": "s", "title": "t"}, 1))
    bug = json.loads(peer.conn.error(1, KeyError("row-3")) or "")
    assert bug == {"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "KeyError: 'row-3'"}}
    assert peer.conn.in_flight == 0


# --- pushes encoded once for many connections -----------------------------------------------------


def delta(seq: int) -> ItemDelta:
    return ItemDelta(session_id="s", epoch=1, seq=seq, item_id="i1", text="hel")


def test_a_push_encoded_once_is_the_same_text_on_every_open_connection(peer: Peer) -> None:
    other = Peer(make_connection())
    other.feed(hello())
    push = encode_push("item/delta", delta(4))
    assert push == Push("item/delta", notification_frame("item/delta", delta(4)))
    assert peer.conn.push(push) is push.text and other.conn.push(push) is push.text


def test_a_push_reaches_no_connection_before_its_handshake_or_after_its_close(fresh: Peer, peer: Peer) -> None:
    push = encode_push("item/delta", delta(5))
    assert fresh.conn.push(push) is None
    peer.conn.close()
    assert peer.conn.push(push) is None
    ended = Peer(make_connection())
    ended.feed(hello())
    ended.conn.shutdown("server stopping")
    assert ended.conn.push(push) is None


def test_encoding_an_unknown_push_or_one_with_the_wrong_params_is_misuse() -> None:
    with pytest.raises(ProtocolMisuse):
        encode_push("item/exploded", delta(1))
    with pytest.raises(ProtocolMisuse):
        encode_push("item/delta", SessionResync(session_id="s", epoch=1, seq=1))


# --- closing --------------------------------------------------------------------------------------


def test_a_closed_connection_produces_nothing(peer: Peer) -> None:
    peer.conn.close()
    assert peer.conn.receive(request("sessions/watch", {}, 1)) == []
    assert peer.conn.receive("not json") == []
    assert peer.conn.notify("session/config/changed", Empty()) is None


def test_answers_after_the_transport_closed_are_dropped_quietly(peer: Peer) -> None:
    peer.conn.receive(request("sessions/watch", {}, 1))
    peer.conn.close()
    assert peer.conn.result(1, Empty()) is None
    assert peer.conn.error(1, RpcError.internal_error()) is None
    assert peer.conn.in_flight == 0


def test_closing_twice_is_harmless(peer: Peer) -> None:
    peer.conn.close()
    peer.conn.close()
    assert peer.conn.state is State.CLOSED


def test_shutdown_asks_the_transport_to_close_with_going_away(peer: Peer) -> None:
    assert peer.conn.shutdown("server reloading") == [Close(CLOSE_GOING_AWAY, "server reloading")]
    assert peer.conn.shutdown("again") == []
    assert peer.conn.receive(request("sessions/watch", {}, 1)) == []


def test_the_transition_table_has_no_way_back_from_closed() -> None:
    assert {target for (source, _), target in TRANSITIONS.items() if source is State.CLOSED} == {State.CLOSED}
    assert (State.OPEN, Event.INIT_ACCEPTED) not in TRANSITIONS


def test_an_illegal_transition_is_misuse(peer: Peer) -> None:
    with pytest.raises(ProtocolMisuse):
        peer.conn._transition(Event.INIT_ACCEPTED)


@pytest.mark.parametrize(
    ("reason", "limit"), [("a" * 200, 123), ("é" * 100, 123), ("名" * 50, 10), ("ok", 123)]
)
def test_close_reasons_are_cut_to_whole_utf8_characters(reason: str, limit: int) -> None:
    cut = truncate_close_reason(reason, limit)
    assert len(cut.encode()) <= limit and reason.startswith(cut)


# --- back-pressure --------------------------------------------------------------------------------


def _limited(rate: float, burst: int, max_in_flight: int = 256) -> Peer:
    p = Peer(
        make_connection(limits=Limits(requests_per_second=rate, burst=burst, max_in_flight=max_in_flight))
    )
    p.feed(hello(), now=0.0)
    return p


def test_over_the_rate_limit_a_request_is_rejected_with_retry_after() -> None:
    p = _limited(rate=10, burst=2)  # the handshake took one token
    assert isinstance(p.conn.receive(request("sessions/watch", {}, 1), now=0.0)[0], Dispatch)
    (out,) = p.conn.receive(request("sessions/watch", {}, 2), now=0.0)
    assert isinstance(out, Send)
    reply = json.loads(out.text)
    assert reply["id"] == 2 and reply["error"]["data"] == {"code": "rejected", "retryAfterMs": 100}


def test_the_rate_limit_refills_with_time() -> None:
    p = _limited(rate=10, burst=1)
    assert isinstance(p.conn.receive(request("sessions/watch", {}, 1), now=0.0)[0], Send)
    assert isinstance(p.conn.receive(request("sessions/watch", {}, 1), now=0.1)[0], Dispatch)


def test_without_now_the_rate_limiter_is_not_consulted() -> None:
    p = _limited(rate=1, burst=1)
    for i in range(20):
        assert isinstance(p.conn.receive(request("sessions/watch", {}, i))[0], Dispatch)


def test_malformed_frames_do_not_spend_tokens() -> None:
    p = _limited(rate=1, burst=2)
    for _ in range(10):
        assert error_of(p.feed("junk", now=0.0)[0])[0] is None
    assert isinstance(p.conn.receive(request("sessions/watch", {}, 1), now=0.0)[0], Dispatch)


def test_too_many_requests_in_flight_are_rejected() -> None:
    p = _limited(rate=1000, burst=1000, max_in_flight=2)
    for i in range(2):
        p.conn.receive(request("sessions/watch", {}, i))
    (reply,) = p.feed(request("sessions/watch", {}, 9))
    assert reply["error"]["data"]["code"] == "rejected" and reply["error"]["data"]["retryAfterMs"] > 0
    p.conn.result(0, Empty())
    assert isinstance(p.conn.receive(request("sessions/watch", {}, 9))[0], Dispatch)


def test_the_token_bucket_does_not_refill_when_the_clock_goes_backwards() -> None:
    bucket = TokenBucket(rate=1, burst=1)
    assert bucket.take(100.0) is None
    assert bucket.take(50.0) == 1000
    assert bucket.take(100.5) == 500
    assert bucket.take(101.0) is None


def test_a_token_bucket_needs_a_positive_rate() -> None:
    with pytest.raises(ProtocolMisuse):
        TokenBucket(rate=0, burst=1)


# --- a whole conversation -------------------------------------------------------------------------


def test_a_conversation_through_the_in_memory_pair(fresh: Peer) -> None:
    fresh.handlers["sessions/list"] = lambda p: SessionsListResult(
        sessions=[],
        groups=[],
        next_cursor="c" if isinstance(p, SessionsListParams) and p.limit == 1 else None,
    )
    fresh.handlers["sessions/watch"] = lambda p: Empty()
    assert "error" in fresh.call("sessions/watch", {}, 0)
    assert "result" in fresh.feed(hello())[0]
    assert fresh.call("sessions/list", {"limit": 1}, 1)["result"]["nextCursor"] == "c"
    assert fresh.call("sessions/watch", None, 2)["result"] == {}
    assert fresh.conn.in_flight == 0


def test_initialize_announces_the_connections_rate_limits() -> None:
    p = Peer(make_connection(limits=Limits(requests_per_second=20, burst=10, max_in_flight=64)))
    (reply,) = p.feed(hello(), now=0.0)
    assert reply["result"]["rateLimits"] == {"requestsPerSecond": 20, "burst": 10, "maxInFlight": 64}
    unlimited = Peer(make_connection(limits=Limits(requests_per_second=None)))
    (reply,) = unlimited.feed(hello(), now=0.0)
    assert reply["result"]["rateLimits"] == {"requestsPerSecond": None, "burst": 200, "maxInFlight": 256}
