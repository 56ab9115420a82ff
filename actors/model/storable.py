"""A model's answer made storable before it becomes an ``llm.completed`` event.

Why: a model can be talked into any tool call, and every answer is recorded whole (the event
``rerun --provider replay`` plays back). An answer the store cannot encode used to fail the
session's commit: msgpack refuses integers outside ``-2**63 .. 2**64-1`` (a 310-digit
``timeoutMs``), and a model call that is re-issued after the failure gets the same answer, so the
session failed three times and was parked. :func:`storable_response` is applied where the
session turns a provider's answer into the event (``SessionActor._llm_completed``, the one place
every provider's answer passes: the mock's answer taken in place and every ``generate`` result),
so no provider has to get this right on its own.

What it changes, and nothing else (an answer that can be stored is returned as it is):

* a tool call whose arguments cannot be stored keeps its name and id, and its arguments become
  ``{"$unstorable": "<why>"}`` (:func:`refused_args`); the registry refuses such a call with
  that sentence (:func:`refusal_of`), so the call fails with ``{"error": "argument 'timeoutMs':
  integer out of range; ..."}`` for the model and the turn goes on. Arguments cannot be stored
  when they encode to more than :data:`MAX_ARGS_BYTES` of JSON, nest deeper than
  :data:`MAX_ARGS_DEPTH`, or hold an integer outside int64, a NaN or infinite float (JSON
  cannot carry them: a client would read ``null``), a string that is not UTF-8 (a lone
  surrogate), a key that is not a string or a value that is not JSON at all;
* a call id that could not name an approval (empty, over :data:`MAX_CALL_ID` characters, or
  outside printable ASCII: the approval's stream name holds it, and stream names are at most 400
  bytes) or that repeats an earlier id of the same answer (each call gets its own result) is
  replaced by a fresh ``call_<n>``;
* token counts outside ``0 .. 2**63-1`` are clamped into it.

A model that writes ``{"$unstorable": ...}`` itself only makes its own call fail with its own
sentence. Pure functions; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from sessionloop.actors.events import ToolCallSpec, Usage
from sessionloop.actors.model.base import ModelResponse
from sessionloop.protocol.limits import MAX_INT, MIN_INT

__all__ = [
    "MAX_ARGS_BYTES",
    "MAX_ARGS_DEPTH",
    "MAX_CALL_ID",
    "UNSTORABLE_KEY",
    "args_problem",
    "refusal_of",
    "refused_args",
    "storable_response",
    "usable_call_id",
]

#: A call's arguments, encoded as JSON: the largest legitimate ones carry a file's content
#: (``write_file``); a workspace snapshot keeps files up to 1 MiB, and no model writes more in one
#: call.
MAX_ARGS_BYTES: Final = 1024 * 1024
#: Nesting of a call's arguments: tool schemas are objects of scalars and shallow lists.
MAX_ARGS_DEPTH: Final = 32
#: A call id: providers issue ids of about 30 characters; an approval's stream name is
#: ``approval-<session>.<turn>.<call id>`` and must stay under 400 bytes.
MAX_CALL_ID: Final = 128
#: The key of the arguments that replace ones that cannot be stored.
UNSTORABLE_KEY: Final = "$unstorable"
#: How much of a key a refusal quotes when it names the argument.
_KEY_CHARS: Final = 64
_PATH_CHARS: Final = 200

_json_encoder: Final = msgspec.json.Encoder()
_INT_RANGE: Final = "arguments hold integers from -2**63 to 2**63-1"


def storable_response(response: ModelResponse) -> ModelResponse:
    """``response`` with every tool call's arguments and id storable and its usage in range.

    Returns ``response`` itself when nothing had to change (the common case costs one walk of
    each call's arguments). Never raises.
    """
    calls = _storable_calls(response.tool_calls)
    usage = _storable_usage(response.usage)
    if calls is None and usage is None:
        return response
    # built anew, not ``structs.replace``: a provider may answer with any object of these fields
    return ModelResponse(text=response.text, reasoning=response.reasoning,
                         tool_calls=list(response.tool_calls) if calls is None else calls,
                         usage=response.usage if usage is None else usage, model=response.model,
                         provider=response.provider)


def refused_args(problem: str) -> dict[str, str]:
    """The arguments that stand in for ones that cannot be stored; ``problem`` says why."""
    return {UNSTORABLE_KEY: problem}


def refusal_of(args: Any) -> str | None:
    """The sentence of arguments made by :func:`refused_args`, or None for any other value."""
    if isinstance(args, dict) and len(args) == 1:
        problem = args.get(UNSTORABLE_KEY)
        if isinstance(problem, str):
            return problem
    return None


def args_problem(args: Any) -> str | None:
    """Why ``args`` cannot be stored (a sentence naming the argument), or None when it can.

    The size is measured first by msgspec's encoder, so the walk only runs over a bounded value;
    when the encoder cannot encode it at all (too deep, not UTF-8, not JSON), the walk, which
    stops at :data:`MAX_ARGS_DEPTH`, finds out where.
    """
    try:
        size: int | None = len(_json_encoder.encode(args))
    except (TypeError, ValueError, RecursionError, OverflowError):  # UnicodeEncodeError is a ValueError
        size = None
    if size is not None and size > MAX_ARGS_BYTES:
        return f"the arguments are {size} bytes of JSON; at most {MAX_ARGS_BYTES}"
    problem = _walk(args, strings=size is None)
    if problem is None and size is None:
        problem = "the arguments cannot be encoded as JSON"
    return problem


# --- the walk -----------------------------------------------------------------------------------


def _walk(args: Any, strings: bool) -> str | None:
    """The first value of ``args`` that cannot be stored, depth first; ``strings``: also check
    that every string is UTF-8 (only needed when the encoder already failed)."""
    todo: list[tuple[Any, int, str]] = [(args, 0, "")]
    while todo:
        value, depth, path = todo.pop()
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, str):
            if strings and not _utf8(value):
                return f"{_where(path)}: a string that is not UTF-8 (a lone surrogate)"
        elif isinstance(value, int):
            if not MIN_INT <= value <= MAX_INT:
                return f"{_where(path)}: integer out of range; {_INT_RANGE}"
        elif isinstance(value, float):
            if not math.isfinite(value):
                return f"{_where(path)}: {value} is not a JSON number"
        elif isinstance(value, dict | list | tuple):
            if depth >= MAX_ARGS_DEPTH:
                return f"{_where(path)}: nests deeper than {MAX_ARGS_DEPTH} levels"
            problem = _push_children(todo, value, depth + 1, path, strings)
            if problem is not None:
                return problem
        else:
            return f"{_where(path)}: {type(value).__name__} is not a JSON type"
    return None


def _push_children(todo: list[tuple[Any, int, str]], value: Any, depth: int, path: str,
                   strings: bool) -> str | None:
    if not isinstance(value, dict):
        todo.extend((item, depth, f"{path}[{i}]") for i, item in enumerate(value))
        return None
    prefix = f"{path}." if path else ""
    for key, item in value.items():
        if not isinstance(key, str):
            return f"{_where(path)}: the key {_clip(repr(key))} is not a string"
        if strings and not _utf8(key):
            return f"{_where(path)}: a key that is not UTF-8 (a lone surrogate)"
        todo.append((item, depth, prefix + _clip(key)))
    return None


def _utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _clip(key: str) -> str:
    return key if len(key) <= _KEY_CHARS else key[: _KEY_CHARS - 1] + "…"


def _where(path: str) -> str:
    if not path:
        return "the arguments"
    if len(path) > _PATH_CHARS:
        path = path[: _PATH_CHARS - 1] + "…"
    return f"argument {path!r}"


# --- calls and usage ----------------------------------------------------------------------------


def _storable_calls(calls: Sequence[ToolCallSpec]) -> list[ToolCallSpec] | None:
    """The calls with storable arguments and usable, distinct ids; None when all already were."""
    out: list[ToolCallSpec] = []
    changed = False
    seen: set[str] = set()
    taken = {c.call_id for c in calls if isinstance(c.call_id, str)}
    for index, call in enumerate(calls):
        call_id = call.call_id
        if not _usable_id(call_id) or call_id in seen:
            call_id = _fresh_id(index, taken)
        seen.add(call_id)
        problem = args_problem(call.args)
        args = call.args if problem is None else refused_args(problem)
        name = call.name if isinstance(call.name, str) and _utf8(call.name) else "(not a tool name)"
        if call_id is call.call_id and problem is None and name is call.name:
            out.append(call)
            continue
        changed = True
        out.append(ToolCallSpec(call_id=call_id, name=name, args=args))
    return out if changed else None


def usable_call_id(call_id: Any) -> bool:
    """Whether ``call_id`` is kept as it is when the answer is stored (else it is replaced)."""
    return isinstance(call_id, str) and 0 < len(call_id) <= MAX_CALL_ID and call_id.isascii() \
        and call_id.isprintable()


_usable_id = usable_call_id


def _fresh_id(index: int, taken: set[str]) -> str:
    candidate, n = f"call_{index + 1}", 1
    while candidate in taken:
        n += 1
        candidate = f"call_{index + 1}_{n}"
    taken.add(candidate)
    return candidate


def _storable_usage(usage: Any) -> Usage | None:
    """``usage`` with both counts clamped into ``0 .. 2**63-1``; None when they already were."""
    counts = (getattr(usage, "prompt_tokens", 0), getattr(usage, "completion_tokens", 0))
    clamped = tuple(min(max(c, 0), MAX_INT) if isinstance(c, int) and not isinstance(c, bool) else 0
                    for c in counts)
    if isinstance(usage, Usage) and clamped == counts:
        return None
    return Usage(prompt_tokens=clamped[0], completion_tokens=clamped[1])
