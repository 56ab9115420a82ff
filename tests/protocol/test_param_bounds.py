"""Every field a client sends has a bound (SPEC §7), over every method of the registry.

One property walks the params Struct of every method in ``protocol.registry.METHODS``, through
nested Structs, unions, lists and dicts, and holds every string, bytes, list, dict, integer,
float and raw-JSON field to carrying a bound; a hypothesis test then sends an over-bound value for
each of those fields through a real :class:`~protocol.connection.Connection` and expects
``invalidParams`` naming the field, and the value right at the bound is accepted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_helpers import Peer, error_of, hello, make_connection

from sessionloop.protocol.connection import Limits
from sessionloop.protocol.errors import INVALID_PARAMS, RpcError
from sessionloop.protocol.frames import decode_params
from sessionloop.protocol.limits import MAX_INT, MAX_WAIT_MS, MIN_INT, MIN_WAIT_MS, TRACEPARENT_PATTERN
from sessionloop.protocol.registry import METHODS
from sessionloop.protocol.schemas import LoopWaitForTurnParams
from sessionloop.protocol.schemas_types import _DATA_URL_HEAD, JsonValue, Wire

#: A valid value for each string pattern the schemas use (a new pattern needs one here): a
#: prefix, which any characters may follow...
PATTERN_EXAMPLES = {_DATA_URL_HEAD: "data:text/plain;base64,"}
#: ... or a whole value of the pattern's one length (its bound), which nothing may follow.
WHOLE_PATTERN_EXAMPLES = {TRACEPARENT_PATTERN: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}

#: Types that hold a bounded set of values by themselves.
FINITE = (mi.NoneType, mi.BoolType, mi.LiteralType, mi.EnumType)
SIZED = (mi.StrType, mi.BytesType, mi.ByteArrayType, mi.MemoryViewType, mi.ListType, mi.SetType,
         mi.FrozenSetType, mi.VarTupleType, mi.DictType)
NUMBERS = (mi.IntType, mi.FloatType)


@dataclass(frozen=True)
class FieldStep:
    struct: mi.StructType
    name: str  # the wire name


ITEM = "item"  # into a list element


@dataclass(frozen=True)
class Leaf:
    """A field a client sends, found by the walk: where it is, its type, its Meta ``extra``."""

    method: str
    path: tuple[FieldStep | str, ...]
    type: mi.Type
    extra: dict[str, Any] | None

    @property
    def json_path(self) -> str:
        return "".join(f".{s.name}" if isinstance(s, FieldStep) else "[0]" for s in self.path)

    @property
    def name(self) -> str:
        return next(s.name for s in reversed(self.path) if isinstance(s, FieldStep))

    def __str__(self) -> str:
        holder = next(s.struct.cls.__name__ for s in reversed(self.path) if isinstance(s, FieldStep))
        return f"{self.method} params{self.json_path} ({type(self.type).__name__} in {holder})"


def walk(method: str, t: mi.Type, path: tuple[FieldStep | str, ...] = (), seen: frozenset[type] = frozenset(),
         extra: dict[str, Any] | None = None) -> list[Leaf]:
    """Every leaf under ``t`` that is not bounded by its type alone (lists and dicts are leaves
    too, and their items are walked on)."""
    if isinstance(t, mi.Metadata):
        return walk(method, t.type, path, seen, t.extra)
    if isinstance(t, mi.StructType):
        if t.cls in seen:  # a recursive shape is walked once
            return []
        return [leaf for f in t.fields
                for leaf in walk(method, f.type, (*path, FieldStep(t, f.encode_name)), seen | {t.cls})]
    if isinstance(t, mi.UnionType):
        return [leaf for x in t.types for leaf in walk(method, x, path, seen)]
    if isinstance(t, FINITE):
        return []
    leaves = [Leaf(method, path, t, extra)]
    if isinstance(t, (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)):
        leaves += walk(method, t.item_type, (*path, ITEM), seen)
    elif isinstance(t, mi.DictType):
        leaves += walk(method, t.key_type, (*path, ITEM), seen) + walk(method, t.value_type, (*path, ITEM), seen)
    return leaves


def unbounded(leaf: Leaf) -> str | None:
    """Why ``leaf`` is not bounded, or None if it is."""
    t = leaf.type
    if isinstance(t, SIZED):
        return None if t.max_length is not None else "no max_length"
    if isinstance(t, NUMBERS):
        low, high = (t.ge, t.gt), (t.le, t.lt)
        return None if any(v is not None for v in low) and any(v is not None for v in high) else "no ge/le"
    if isinstance(t, mi.AnyType):
        extra = leaf.extra or {}
        return None if "max_bytes" in extra and "max_depth" in extra else "raw JSON without max_bytes/max_depth"
    return f"a {type(t).__name__} the bound check does not know"


def all_leaves() -> list[Leaf]:
    return [leaf for name, spec in METHODS.items() for leaf in walk(name, mi.type_info(spec.params))]


LEAVES = all_leaves()


# --- the property: every field carries a bound -------------------------------------------------------


def test_every_field_of_every_method_a_client_sends_carries_a_bound() -> None:
    missing = [f"{leaf}: {why}" for leaf in LEAVES if (why := unbounded(leaf)) is not None]
    assert missing == []
    # the walk saw the fields that made the issue: titles, timeouts, attachment data, settings values
    seen = {str(leaf).split(" (")[0] for leaf in LEAVES}
    assert len({str(leaf) for leaf in LEAVES}) == len(LEAVES), "each leaf has its own name"
    assert {"session/rename params.title", "loop/waitForTurn params.timeoutMs",
            "turn/send params.attachments[0].data", "session/config/update params.value",
            "session/config/layer/update params.layer.key", "session/batch params.ids",
            "loop/send params.traceparent", "turn/send params.traceparent"} <= seen


class _Unbounded(Wire, frozen=True, kw_only=True):
    note: str
    count: int
    items: list[Annotated[str, msgspec.Meta(max_length=3)]]
    value: Any
    fine: Annotated[int, msgspec.Meta(ge=0, le=9)] = 0
    json: JsonValue = None


def test_the_bound_check_finds_every_kind_of_unbounded_field() -> None:
    found = {str(leaf): unbounded(leaf) for leaf in walk("x", mi.type_info(_Unbounded))}
    assert {k: v for k, v in found.items() if v is not None} == {
        "x params.note (StrType in _Unbounded)": "no max_length",
        "x params.count (IntType in _Unbounded)": "no ge/le",
        "x params.items (ListType in _Unbounded)": "no max_length",
        "x params.value (AnyType in _Unbounded)": "raw JSON without max_bytes/max_depth",
    }


# --- values: a minimal valid request with one field set -------------------------------------------------


def example(t: mi.Type) -> Any:
    """A small valid JSON value of type ``t``."""
    if isinstance(t, mi.Metadata):
        return example(t.type)
    if isinstance(t, mi.StructType):
        return minimal(t)
    if isinstance(t, mi.UnionType):
        return example(next(x for x in t.types if not isinstance(x, mi.NoneType)))
    if isinstance(t, mi.StrType):
        if t.pattern in WHOLE_PATTERN_EXAMPLES:
            return WHOLE_PATTERN_EXAMPLES[t.pattern]
        base = PATTERN_EXAMPLES[t.pattern] if t.pattern is not None else ""
        return base + "x" * max(1, t.min_length or 0)
    if isinstance(t, mi.IntType):
        return t.ge if t.ge is not None else max(0, t.gt + 1) if t.gt is not None else 0
    if isinstance(t, mi.BoolType):
        return True
    if isinstance(t, mi.LiteralType):
        return t.values[0]
    if isinstance(t, mi.ListType):
        return [example(t.item_type)] * (t.min_length or 0)
    if isinstance(t, mi.DictType):
        return {}
    if isinstance(t, (mi.AnyType, mi.NoneType)):
        return None
    raise AssertionError(f"no example for {t}")


def minimal(t: mi.StructType) -> dict[str, Any]:
    obj: dict[str, Any] = {t.tag_field: t.tag} if t.tag_field is not None else {}
    obj.update({f.encode_name: example(f.type) for f in t.fields if f.required})
    return obj


def params_with(leaf: Leaf, value: Any) -> dict[str, Any]:
    def build(path: tuple[FieldStep | str, ...]) -> Any:
        if not path:
            return value
        step, rest = path[0], path[1:]
        if step == ITEM:
            return [build(rest)]
        assert isinstance(step, FieldStep)
        return {**minimal(step.struct), step.name: build(rest)}

    return build(leaf.path)


def over_bound(leaf: Leaf, over: int, char: str) -> list[Any]:
    """Values just past the bound of ``leaf`` (``over`` past it), each of which must be refused.
    Strings end in ``over`` of ``char``: the bound counts characters, not bytes."""
    t = leaf.type
    if isinstance(t, mi.StrType) and t.pattern in WHOLE_PATTERN_EXAMPLES:
        return [example(t) + char * over]
    if isinstance(t, mi.StrType):
        base = example(t)[:-1]
        return [base + "x" * (t.max_length - len(base)) + char * over]
    if isinstance(t, mi.ListType):
        return [[example(t.item_type)] * (t.max_length + over)]
    if isinstance(t, mi.IntType):
        return [v for v in (t.ge - over if t.ge is not None else None, t.le + over if t.le is not None else None)
                if v is not None]
    if isinstance(t, mi.AnyType):
        extra = leaf.extra or {}
        deep: Any = char
        for _ in range(extra["max_depth"] + over):
            deep = [deep]
        return ["x" * (extra["max_bytes"] - 1) + char * over, deep]
    raise AssertionError(f"no over-bound value for {leaf}")


def at_bound(leaf: Leaf) -> list[Any]:
    """Values right at the bound of ``leaf``: each must be accepted."""
    t = leaf.type
    if isinstance(t, mi.StrType) and t.pattern in WHOLE_PATTERN_EXAMPLES:
        assert len(example(t)) == t.max_length, "a whole-value example is as long as its bound"
        return [example(t)]
    if isinstance(t, mi.StrType):
        base = example(t)[:-1]
        return [base + "x" * (t.max_length - len(base))]
    if isinstance(t, mi.ListType):
        return [[example(t.item_type)] * t.max_length]
    if isinstance(t, mi.IntType):
        return [t.ge, t.le]
    if isinstance(t, mi.AnyType):
        extra = leaf.extra or {}
        deep: Any = 1
        for _ in range(extra["max_depth"]):
            deep = [deep]
        return ["x" * (extra["max_bytes"] - 2), deep]  # + 2 quotes: exactly max_bytes
    raise AssertionError(f"no at-bound value for {leaf}")


BIG = Limits(max_frame_bytes=256 * 1024 * 1024, requests_per_second=None)


def send(method: str, params: dict[str, Any]) -> tuple[Peer, dict[str, Any]]:
    """``params`` to ``method`` through a real connection (initialized first, but for
    ``initialize`` itself), with a frame limit above every field bound."""
    peer = Peer(make_connection(limits=BIG))
    if method != "initialize":
        (ok,) = peer.feed(hello())
        assert "result" in ok, ok
    (reply,) = peer.feed(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                                    ensure_ascii=False))
    return peer, reply


def struct_path(leaf: Leaf) -> str:
    """The JSON path of the Struct holding the leaf's field (where ``__post_init__`` errors point)."""
    last = max(i for i, s in enumerate(leaf.path) if isinstance(s, FieldStep))
    return Leaf(leaf.method, leaf.path[:last], leaf.type, None).json_path


@pytest.mark.parametrize("leaf", LEAVES, ids=str)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(over=st.integers(1, 64), char=st.characters(codec="utf-8", exclude_characters="x"))
def test_a_value_over_the_bound_of_any_field_is_invalid_params_naming_the_field(leaf: Leaf, over: int,
                                                                                char: str) -> None:
    for value in over_bound(leaf, over, char):
        peer, reply = send(leaf.method, params_with(leaf, value))
        _, code, message = error_of(reply)
        assert code == INVALID_PARAMS, (leaf, message)
        if isinstance(leaf.type, mi.AnyType):  # checked in __post_init__: the holder's path, then the field
            assert message.startswith(f"params{struct_path(leaf)}: {leaf.name} "), message
        else:
            assert message.startswith(f"params{leaf.json_path}"), message
        assert not peer.dispatched, "refused before the gateway saw it"


@pytest.mark.parametrize("leaf", LEAVES, ids=str)
def test_a_value_right_at_the_bound_of_any_field_is_accepted(leaf: Leaf) -> None:
    decoder = METHODS[leaf.method].decoder
    for value in at_bound(leaf):
        raw = msgspec.Raw(json.dumps(params_with(leaf, value)).encode())
        decoded = decode_params(decoder, raw)
        assert not isinstance(decoded, RpcError), (leaf, decoded)


# --- point 6: numbers past every range ------------------------------------------------------------------


def test_a_310_digit_timeout_is_invalid_params_naming_timeout_ms() -> None:
    peer, reply = send("loop/waitForTurn", {"sessionId": "s", "turnId": "t", "timeoutMs": int("9" * 310)})
    _, code, message = error_of(reply)
    assert code == INVALID_PARAMS and message.startswith("params.timeoutMs: Expected `int` <= "), message
    assert not peer.dispatched


@pytest.mark.parametrize(("timeout", "clamped"), [(MAX_INT, MAX_WAIT_MS), (MIN_INT, MIN_WAIT_MS)])
def test_a_timeout_at_either_end_of_int64_is_clamped_not_refused(timeout: int, clamped: int) -> None:
    params = decode_params(METHODS["loop/waitForTurn"].decoder,
                           msgspec.Raw(json.dumps({"sessionId": "s", "turnId": "t", "timeoutMs": timeout}).encode()))
    assert isinstance(params, LoopWaitForTurnParams) and params.clamped_timeout_ms == clamped


@pytest.mark.parametrize("number", ["1e400", "-1e400", "1" + "0" * 400, str(2**63), str(-(2**63) - 1)])
def test_a_number_past_float_range_in_a_settings_value_is_invalid_params_naming_value(number: str) -> None:
    peer = Peer(make_connection())
    peer.feed(hello())
    frame = ('{"jsonrpc":"2.0","id":1,"method":"session/config/update","params":'
             '{"sessionId":"s","plugin":"agent","key":"maxSteps","value":' + number + '}}')
    (reply,) = peer.feed(frame)
    _, code, message = error_of(reply)
    assert code == INVALID_PARAMS and message.startswith("params"), message
    assert "value" in message and not peer.dispatched
