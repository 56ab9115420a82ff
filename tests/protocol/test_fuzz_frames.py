"""Fuzzed frames (RELIABILITY frame_fuzz): ``Connection.receive`` never raises and every request
gets exactly one valid JSON-RPC 2.0 reply, with the request's own id whenever it could be read.

Inputs: random text and bytes (invalid UTF-8, lone surrogates), request-shaped objects with random
members (every registered method, random params with the schemas' own field names, ids of every
JSON type, huge numbers, NaN/Infinity), then mutated: truncated, spliced, duplicate keys, deep
nesting. Dispatched requests are answered by a stand-in gateway so they count as replied.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_helpers import hello, make_connection

from sessionloop.protocol.connection import Close, Connection, Dispatch, Send, State
from sessionloop.protocol.errors import RPC_ERROR_CODES, RpcError
from sessionloop.protocol.limits import MAX_NESTING
from sessionloop.protocol.registry import METHODS

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KNOWN_CODES = set(RPC_ERROR_CODES.values())
FIELD_NAMES = sorted({name for spec in METHODS.values() for name in spec.params.__struct_encode_fields__})

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63, max_value=10**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=15,
)
params = (
    st.dictionaries(st.sampled_from(FIELD_NAMES) | st.text(max_size=8), json_values, max_size=6) | json_values
)
ids = st.integers() | st.text(max_size=20) | scalars | st.lists(scalars, max_size=2)
methods = st.sampled_from(sorted(METHODS)) | st.text(max_size=20) | scalars


@st.composite
def request_objects(draw: st.DrawFn) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, strategy in (
        ("jsonrpc", st.sampled_from(["2.0", "2.0", "2.0", "1.0", 2.0, None])),
        ("id", ids),
        ("method", methods),
        ("params", params),
    ):
        if draw(st.integers(0, 9)) > 0:  # each member is sometimes missing
            obj[key] = draw(strategy)
    if obj.get("method") == "initialize" and draw(st.booleans()):
        obj["params"] = {
            "protocolVersion": draw(st.sampled_from(["0.2.0", "0.2", "1.0", "0.3.1", "x"])),
            "client": {"name": "f", "version": "1"},
        }
    return obj


@st.composite
def frames(draw: st.DrawFn) -> str | bytes:
    text = json.dumps(draw(request_objects()), ensure_ascii=draw(st.booleans()))
    mutation = draw(
        st.sampled_from(["none", "none", "truncate", "splice", "duplicate-key", "nest", "surrogate"])
    )
    if mutation == "truncate":
        text = text[: draw(st.integers(0, len(text)))]
    elif mutation == "splice":
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.text(max_size=5)) + text[at:]
    elif mutation == "duplicate-key" and text.startswith("{") and len(text) > 2:
        key = draw(st.sampled_from(["id", "method", "jsonrpc", "params"]))
        text = '{"' + key + '": ' + json.dumps(draw(json_values)) + ", " + text[1:]
    elif mutation == "nest":
        depth = draw(st.sampled_from([10, MAX_NESTING - 2, MAX_NESTING - 1, 900, 1100, 5000, 9000]))
        request_id = json.dumps(draw(st.integers() | st.text(max_size=5)))
        nested = "[" * depth + "]" * depth
        text = (
            '{"jsonrpc":"2.0","id":'
            + request_id
            + ',"method":"sessions/watch","params":{"x":'
            + nested
            + "}}"
        )
    elif mutation == "surrogate":
        at = draw(st.integers(0, len(text)))
        text = text[:at] + "\ud800" + text[at:]
    if draw(st.booleans()):
        return text.encode("utf-8", "surrogatepass")
    return text


any_input = (
    frames()
    | st.text()
    | st.binary()
    | st.sampled_from(["[]", "{}", "null", "NaN", '{"id":1e999}', "[" * 3000])
)


def _strict_loads(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _check_frame(text: str) -> dict[str, Any]:
    frame = _strict_loads(text)
    assert isinstance(frame, dict) and frame.get("jsonrpc") == "2.0" and "id" in frame, frame
    assert frame["id"] is None or (isinstance(frame["id"], int | str) and not isinstance(frame["id"], bool))
    assert ("result" in frame) != ("error" in frame), frame
    if "error" in frame:
        error = frame["error"]
        assert error["code"] in KNOWN_CODES and isinstance(error["message"], str), error
        assert set(error) <= {"code", "message", "data"}
    else:
        assert isinstance(frame["result"], dict)
    return frame


def _depth(value: Any) -> int:
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, list | dict):
            deepest = max(deepest, depth)
            todo.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


class TooDeep:
    """A well-formed envelope nested deeper than MAX_NESTING: not read, refused as invalidRequest
    with its id when the id is cheaply found, else null (protocol/frames.py)."""

    def __init__(self, request_id: Any) -> None:
        self.id = request_id


def _readable_id(data: str | bytes) -> Any:
    """The id a well-behaved reader sees in a well-formed envelope, else a sentinel."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return ...
    if _depth(obj) > MAX_NESTING:
        return TooDeep(obj.get("id") if isinstance(obj, dict) else None)
    if not isinstance(obj, dict) or obj.get("jsonrpc") != "2.0" or not isinstance(obj.get("method"), str):
        return ...
    if "params" in obj and not isinstance(obj["params"], dict):
        return ...
    request_id = obj.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, int | str) or len(str(request_id)) > 1000:
        return ...
    return request_id


def exchange(conn: Connection, data: str | bytes) -> None:
    """Feed one frame and check the one-reply rule."""
    was_closed = conn.state is State.CLOSED
    outputs = conn.receive(data)
    if was_closed:
        assert outputs == []
        return
    replies: list[str] = []
    for out in outputs:
        if isinstance(out, Send):
            replies.append(out.text)
        elif isinstance(out, Dispatch):
            answered = conn.error(out.id, RpcError.internal_error("fuzz gateway"))
            assert answered is not None
            replies.append(answered)
        else:
            assert isinstance(out, Close) and replies, outputs  # a close only follows the refusal
    assert len(replies) == 1, outputs
    frame = _check_frame(replies[0])
    expected = _readable_id(data)
    if isinstance(expected, TooDeep):
        assert frame["error"]["code"] == RPC_ERROR_CODES["invalidRequest"], (data, frame)
        assert frame["id"] in (None, expected.id), (data, frame)
    elif expected is not ... and frame.get("error", {}).get("code") != RPC_ERROR_CODES["parseError"]:
        assert frame["id"] == expected, (data, frame)


@FUZZ
@given(any_input)
def test_any_input_before_the_handshake_gets_exactly_one_valid_reply(data: str | bytes) -> None:
    exchange(make_connection(), data)


@FUZZ
@given(any_input)
def test_any_input_after_the_handshake_gets_exactly_one_valid_reply(data: str | bytes) -> None:
    conn = make_connection()
    conn.receive(hello())
    exchange(conn, data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(any_input, min_size=1, max_size=12), st.booleans())
def test_a_stream_of_frames_keeps_the_connection_answering(stream: list[str | bytes], greet: bool) -> None:
    conn = make_connection()
    if greet:
        conn.receive(hello())
    for data in stream:
        exchange(conn, data)
    if conn.state is not State.CLOSED:  # still serving after all that
        exchange(conn, '{"jsonrpc":"2.0","id":"last","method":"initialize","params":{}}')


def test_huge_numbers_anywhere_are_answered() -> None:
    conn = make_connection()
    conn.receive(hello())
    for frame in (
        '{"jsonrpc":"2.0","id":%s,"method":"sessions/list"}' % ("9" * 5000),
        '{"jsonrpc":"2.0","id":1,"method":"sessions/list","params":{"limit":%s}}' % ("9" * 5000),
        '{"jsonrpc":"2.0","id":2,"method":"sessions/list","params":{"limit":1e400}}',
        '{"jsonrpc":"2.0","id":3,"method":"sessions/list","params":{"limit":-1e-400}}',
    ):
        exchange(conn, frame)
