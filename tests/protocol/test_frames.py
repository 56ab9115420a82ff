"""Framing: how every kind of malformed input is answered (seed 004 帧, RELIABILITY msgspec)."""

from __future__ import annotations

import json

import msgspec
import pytest
from protocol_helpers import Peer, error_of, make_connection, request

from sessionloop.protocol.connection import Limits
from sessionloop.protocol.errors import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, RpcError
from sessionloop.protocol.frames import (
    BadFrame,
    Request,
    decode_params,
    decode_request,
    error_frame,
    is_too_large,
    notification_frame,
    peek_id,
    render_validation_error,
    request_frame,
    result_frame,
)
from sessionloop.protocol.limits import MAX_NESTING
from sessionloop.protocol.registry import METHODS
from sessionloop.protocol.schemas import Empty, SessionIdParams

# --- parse errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "frame",
    ["{", "", "   ", "nope", '{"jsonrpc":"2.0","id":1,', '{"a":1} trailing', "[1,2", '"unterminated'],
)
def test_invalid_json_is_parse_error_with_null_id(peer: Peer, frame: str) -> None:
    (reply,) = peer.feed(frame)
    assert error_of(reply)[:2] == (None, PARSE_ERROR)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json(peer: Peer, literal: str) -> None:
    (reply,) = peer.feed(
        f'{{"jsonrpc":"2.0","id":1,"method":"sessions/list","params":{{"limit":{literal}}}}}'
    )
    assert error_of(reply)[:2] == (None, PARSE_ERROR)


def test_invalid_utf8_bytes_are_parse_error(peer: Peer) -> None:
    (reply,) = peer.feed(b'{"jsonrpc":"2.0","id":1,"method":"\xff\xfe"}')
    assert error_of(reply)[:2] == (None, PARSE_ERROR)


def test_lone_surrogate_in_a_text_frame_is_parse_error(peer: Peer) -> None:
    (reply,) = peer.feed('{"jsonrpc":"2.0","id":1,"method":"\ud800"}')
    assert error_of(reply)[:2] == (None, PARSE_ERROR)


def test_escaped_lone_surrogate_is_parse_error(peer: Peer) -> None:
    (reply,) = peer.feed('{"jsonrpc":"2.0","id":"\\ud800","method":"x"}')
    assert error_of(reply)[:2] == (None, PARSE_ERROR)


def test_utf8_bom_is_parse_error(peer: Peer) -> None:
    (reply,) = peer.feed(b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"method":"sessions/watch"}')
    assert error_of(reply)[:2] == (None, PARSE_ERROR)


# --- invalid requests -----------------------------------------------------------------------------


@pytest.mark.parametrize("frame", ["[]", '[{"jsonrpc":"2.0","id":1,"method":"sessions/watch"}]', "[1, 2, 3]"])
def test_a_batch_gets_one_invalid_request_with_null_id(peer: Peer, frame: str) -> None:
    (reply,) = peer.feed(frame)
    _, code, message = error_of(reply)
    assert (reply["id"], code) == (None, INVALID_REQUEST) and "batch" in message


@pytest.mark.parametrize("frame", ["1", '"text"', "null", "true", "3.5"])
def test_a_json_value_that_is_not_an_object_is_invalid_request(peer: Peer, frame: str) -> None:
    (reply,) = peer.feed(frame)
    assert error_of(reply)[:2] == (None, INVALID_REQUEST)


def test_a_request_without_id_is_invalid_request_with_null_id(peer: Peer) -> None:
    (reply,) = peer.feed('{"jsonrpc":"2.0","method":"sessions/watch","params":{}}')
    _, code, message = error_of(reply)
    assert (reply["id"], code) == (None, INVALID_REQUEST) and "id" in message


@pytest.mark.parametrize("bad_id", ["null", "1.5", "true", "false", "[1]", '{"a":1}', "1e400"])
def test_an_id_that_is_not_string_or_integer_is_invalid_request_with_null_id(peer: Peer, bad_id: str) -> None:
    (reply,) = peer.feed(f'{{"jsonrpc":"2.0","id":{bad_id},"method":"sessions/watch"}}')
    assert error_of(reply)[:2] == (None, INVALID_REQUEST)


def test_an_overlong_string_id_is_invalid_request_with_null_id(peer: Peer) -> None:
    (reply,) = peer.feed(request("sessions/watch", {}, "x" * 5000))
    assert error_of(reply)[:2] == (None, INVALID_REQUEST)


@pytest.mark.parametrize("request_id", ["abc", "", 0, -7, 2**63, 10**30, "名字"])
def test_string_and_integer_ids_are_echoed_exactly(peer: Peer, request_id: int | str) -> None:
    reply = peer.call("no/such/method", {}, request_id)
    assert reply["id"] == request_id and type(reply["id"]) is type(request_id)


@pytest.mark.parametrize("jsonrpc", [None, '"1.0"', "2.0", '"2.0 "', "2"])
def test_missing_or_wrong_jsonrpc_is_invalid_request_with_the_id(peer: Peer, jsonrpc: str | None) -> None:
    member = "" if jsonrpc is None else f'"jsonrpc":{jsonrpc},'
    (reply,) = peer.feed(f'{{{member}"id":42,"method":"sessions/watch"}}')
    assert error_of(reply)[:2] == (42, INVALID_REQUEST)


@pytest.mark.parametrize("method", ["missing", "5", "null", '["sessions/list"]'])
def test_a_method_that_is_not_a_string_is_invalid_request_with_the_id(peer: Peer, method: str) -> None:
    member = "" if method == "missing" else f',"method":{method}'
    (reply,) = peer.feed(f'{{"jsonrpc":"2.0","id":"m"{member}}}')
    assert error_of(reply)[:2] == ("m", INVALID_REQUEST)


@pytest.mark.parametrize("params", ["[]", '["s1"]', "null", '"s1"', "7", "true"])
def test_params_that_are_not_an_object_are_invalid_request_with_the_id(peer: Peer, params: str) -> None:
    (reply,) = peer.feed(f'{{"jsonrpc":"2.0","id":3,"method":"session/archive","params":{params}}}')
    _, code, message = error_of(reply)
    assert (reply["id"], code) == (3, INVALID_REQUEST) and "params" in message


def test_missing_params_are_an_empty_object() -> None:
    assert isinstance(decode_params(METHODS["sessions/watch"].decoder, msgspec.Raw()), Empty)


def test_duplicate_keys_take_the_last_value(peer: Peer) -> None:
    reply = peer.feed('{"jsonrpc":"2.0","id":1,"id":2,"method":"x","method":"no/such"}')[0]
    assert reply["id"] == 2 and "no/such" in reply["error"]["message"]


# --- invalid params: the message names the field --------------------------------------------------


def test_a_wrong_type_names_the_field_path(peer: Peer) -> None:
    reply = peer.call("session/archive", {"sessionId": 5}, 9)
    assert error_of(reply) == (9, INVALID_PARAMS, "params.sessionId: Expected `str`, got `int`")


def test_a_missing_field_is_named(peer: Peer) -> None:
    reply = peer.call("session/archive", {}, 9)
    assert error_of(reply) == (9, INVALID_PARAMS, "params.sessionId: missing required field")


def test_a_nested_field_path_is_named(peer: Peer) -> None:
    attachments = [{"data": "data:image/png;base64,AAAA", "name": "a"}, {"data": 1, "name": "b"}]
    reply = peer.call("turn/send", {"sessionId": "s", "content": "hi", "attachments": attachments}, 9)
    assert error_of(reply)[2] == "params.attachments[1].data: Expected `str`, got `int`"


def test_validation_errors_are_invalid_params_not_parse_errors() -> None:
    # ValidationError is a DecodeError subclass: caught in the wrong order it would be a parse error.
    assert issubclass(msgspec.ValidationError, msgspec.DecodeError)
    result = decode_params(METHODS["session/archive"].decoder, msgspec.Raw(b'{"sessionId": []}'))
    assert isinstance(result, RpcError) and result.rpc_code == INVALID_PARAMS


def test_unknown_keys_in_params_are_accepted(peer: Peer) -> None:
    peer.feed(request("session/archive", {"sessionId": "s", "fromTheFuture": {"x": [1, 2]}}, 1))
    assert isinstance(peer.dispatched[-1].params, SessionIdParams)


def test_unknown_keys_in_the_envelope_are_accepted(peer: Peer) -> None:
    peer.feed('{"jsonrpc":"2.0","id":1,"method":"sessions/watch","extra":{"deep":[1]}}')
    assert peer.dispatched[-1].method == "sessions/watch"


def test_render_validation_error_puts_the_root_path_first() -> None:
    try:
        msgspec.json.decode(b'{"sessionId": 1}', type=SessionIdParams)
    except msgspec.ValidationError as e:
        assert render_validation_error(e) == "params.sessionId: Expected `str`, got `int`"
        assert render_validation_error(e, "request").startswith("request.sessionId:")


# --- nesting and size -----------------------------------------------------------------------------


def test_deep_nesting_is_answered_with_the_id_when_it_is_visible(peer: Peer) -> None:
    frame = '{"jsonrpc":"2.0","id":77,"method":"sessions/watch","params":{"x":%s}}' % (
        "[" * 5000 + "]" * 5000
    )
    (reply,) = peer.feed(frame)
    assert error_of(reply)[:2] == (77, INVALID_REQUEST)


def test_deep_nesting_without_a_visible_id_gets_null(peer: Peer) -> None:
    (reply,) = peer.feed("[" * 100_000 + "]" * 100_000)
    assert error_of(reply)[:2] == (None, INVALID_REQUEST)


def test_nesting_just_below_the_limit_is_a_normal_request(peer: Peer) -> None:
    frame = '{"jsonrpc":"2.0","id":1,"method":"sessions/watch","params":{"x":%s}}' % ("[" * 500 + "]" * 500)
    peer.feed(frame)
    assert peer.dispatched[-1].id == 1


def _nested(levels: int, request_id: int = 1) -> str:
    """A sessions/watch request whose envelope and params are 2 of its ``levels``."""
    inner = "[" * (levels - 2) + "]" * (levels - 2)
    return f'{{"jsonrpc":"2.0","id":{request_id},"method":"sessions/watch","params":{{"x":{inner}}}}}'


def test_a_request_nested_exactly_max_nesting_levels_is_a_normal_request(peer: Peer) -> None:
    peer.feed(_nested(MAX_NESTING, 5))
    assert peer.dispatched[-1].id == 5


@pytest.mark.parametrize("levels", [MAX_NESTING + 1, 1_200, 2_000, 9_000])
def test_a_request_nested_past_max_nesting_is_refused_naming_the_limit_on_every_python(
    peer: Peer, levels: int
) -> None:
    # msgspec's own limit is the interpreter's: ~1,000 levels on 3.11, 1,500 on 3.12, 10,000 on
    # 3.13; the bound is ours, the same on all of them.
    (reply,) = peer.feed(_nested(levels, 6))
    assert error_of(reply) == (6, INVALID_REQUEST, f"request is nested too deeply: more than {MAX_NESTING} levels")
    assert peer.dispatched == []


def test_brackets_inside_strings_are_not_nesting(peer: Peer) -> None:
    text = json.dumps('["\\' * 2 * MAX_NESTING)
    peer.feed(f'{{"jsonrpc":"2.0","id":7,"method":"sessions/watch","params":{{"x":{text}}}}}')
    assert peer.dispatched[-1].id == 7


def test_a_frame_over_the_limit_is_request_too_large_with_its_id() -> None:
    p = Peer(make_connection(limits=Limits(max_frame_bytes=1000)))
    frame = '{"jsonrpc":"2.0","id":"big-1","method":"turn/send","params":{"content":"%s"}}' % ("x" * 2000)
    (reply,) = p.feed(frame)
    assert error_of(reply) == ("big-1", INVALID_REQUEST, "request too large")


def test_a_frame_over_the_limit_without_a_visible_id_gets_null() -> None:
    p = Peer(make_connection(limits=Limits(max_frame_bytes=1000)))
    frame = '{"jsonrpc":"2.0","params":{"content":"%s"},"id":5,"method":"turn/send"}' % ("x" * 2000)
    (reply,) = p.feed(frame)
    assert error_of(reply) == (None, INVALID_REQUEST, "request too large")


def test_an_oversized_frame_that_is_not_even_json_is_still_answered_once() -> None:
    p = Peer(make_connection(limits=Limits(max_frame_bytes=100)))
    (reply,) = p.feed(b"\xff" * 1000)
    assert error_of(reply) == (None, INVALID_REQUEST, "request too large")


def test_the_default_limit_is_24_mib_and_counts_utf8_bytes() -> None:
    limit = 24 * 1024 * 1024
    assert Limits().max_frame_bytes == limit
    assert not is_too_large("é" * (limit // 2), limit)
    assert is_too_large("é" * (limit // 2 + 1), limit)
    assert is_too_large(b"x" * (limit + 1), limit)


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        ('{"jsonrpc":"2.0","id":12,"method":"x"', 12),
        ('{"id" : "a\\"b", "method":"x"', 'a"b'),
        ('{"method":"x", "id":-3}', -3),
        ('{"method":"say \\"id\\":9"}', None),
        ('{"params":{"x":1},"id":true}', None),
    ],
)
def test_peek_id_finds_an_id_in_the_head_of_a_frame(head: str, expected: object) -> None:
    assert peek_id(head) == expected
    assert peek_id(head.encode()) == expected


def test_peek_id_reads_only_the_first_200_bytes() -> None:
    assert peek_id('{"pad":"%s","id":1}' % ("x" * 300)) is None


# --- decode_request as a value --------------------------------------------------------------------


def test_decode_request_returns_values_never_raises() -> None:
    assert isinstance(decode_request('{"jsonrpc":"2.0","id":1,"method":"m"}'), Request)
    assert isinstance(decode_request(b"\x00"), BadFrame)


# --- building frames ------------------------------------------------------------------------------


def test_result_frames_are_jsonrpc_2_objects() -> None:
    assert json.loads(result_frame(1, Empty())) == {"jsonrpc": "2.0", "id": 1, "result": {}}


def test_error_frames_omit_empty_data_and_keep_business_codes() -> None:
    plain = json.loads(error_frame(None, RpcError.invalid_request("bad")))
    assert plain == {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "bad"}}
    app = json.loads(error_frame("a", RpcError.not_found("no session s1")))
    assert app["error"] == {"code": -32000, "message": "no session s1", "data": {"code": "not-found"}}


def test_notification_frames_have_no_id() -> None:
    frame = json.loads(notification_frame("session/config/changed", Empty()))
    assert frame == {"jsonrpc": "2.0", "method": "session/config/changed", "params": {}}


def test_request_frames_are_the_bytes_a_client_always_sent() -> None:
    """What cli/client.py sent before it asked protocol/ for its frames: the same bytes, for plain
    params, params Structs and no params at all."""
    old = msgspec.json.Encoder()
    params = {"sessionId": "s1", "limit": 5, "text": "héllo \u2028"}
    assert request_frame(4, "session/history", params) == old.encode(
        {"jsonrpc": "2.0", "id": 4, "method": "session/history", "params": params}).decode()
    assert request_frame("x", "session/subscribe", SessionIdParams(session_id="s1")) == (
        '{"jsonrpc":"2.0","id":"x","method":"session/subscribe","params":{"sessionId":"s1"}}')
    assert request_frame(5, "sessions/list") == '{"jsonrpc":"2.0","id":5,"method":"sessions/list","params":{}}'


def test_a_request_frame_the_server_decodes_is_the_request_it_was_built_from() -> None:
    decoded = decode_request(request_frame(9, "session/subscribe", {"sessionId": "s1"}))
    assert isinstance(decoded, Request) and (decoded.id, decoded.method) == (9, "session/subscribe")
    assert decode_params(METHODS["session/subscribe"].decoder, decoded.params) == SessionIdParams(session_id="s1")
