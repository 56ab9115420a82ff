"""How deeply a JSON text nests, found without parsing it, so a depth bound holds on every Python.

Why: msgspec (like ``json``) recurses once per level and gives up with ``RecursionError`` at the
interpreter's C recursion limit, which is not ours to choose and moved between versions: about
1,000 levels on 3.11 (less the Python frames already on the stack), 1,500 on 3.12, 10,000 on
3.13. A bound that rests on it lets a 5,000-level request through on 3.13 that 3.11 refused. So
every JSON text a peer sends us (a request frame, a model's tool-call arguments) is measured here
first, and one deeper than :data:`~protocol.limits.MAX_NESTING` is refused before msgspec sees it.

:func:`nests_deeper` is exact on valid JSON and linear in the text's length on any input, in
C-speed ``bytes`` operations (no per-character Python loop, no regex backtracking):

1. a text with at most ``limit`` opening brackets cannot nest deeper (two ``count`` calls: the
   answer for nearly every real request);
2. escape pairs (``\\\\``, then ``\\"``) are dropped, after which every ``"`` delimits a string,
   and the strings are dropped (they may hold any bracket);
3. what is left is reduced to its brackets, ``{}`` written as ``[]``;
4. while empty pairs ``[]`` (the leaves) are a good part of it, a pass removes them all, which
   lowers the depth by exactly one (and a forest of small values to nothing);
5. the rest is read as runs of ``[`` and of ``]``: the depth is the largest sum of opening runs
   less the closing runs before them.

Pure; no I/O.
"""

from __future__ import annotations

import operator
import re
from itertools import accumulate, chain
from typing import Final

__all__ = ["nesting_depth", "nests_deeper"]

_TO_SQUARE: Final = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS: Final = bytes(c for c in range(256) if c not in b"[]{}")
_RUN: Final = re.compile(rb"\[+|\]+")
#: A pass removing the leaves costs a copy of the text; it is made while the leaves are at
#: least 1/_PASS_SHARE of it (else reading runs is cheaper), at most _MAX_PASSES times.
_PASS_SHARE: Final = 16
_MAX_PASSES: Final = 64


def nests_deeper(text: str | bytes, limit: int) -> bool:
    """Whether the JSON ``text`` nests deeper than ``limit`` levels (an object or array is a level).

    Exact on valid JSON; on any other input an estimate (that text is refused as a parse error
    if it is not refused as too deep). Never raises on ``str`` or ``bytes`` input.
    """
    opening = text.count("[") + text.count("{") if isinstance(text, str) else text.count(b"[") + text.count(b"{")
    if opening <= limit:
        return False
    return nesting_depth(text) > limit


def nesting_depth(text: str | bytes) -> int:
    """The number of levels of the JSON ``text`` (0 for a scalar); see the module doc."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = b"".join(unescaped.split(b'"')[::2]).translate(_TO_SQUARE, _NOT_BRACKETS)
    passes = 0
    while brackets and passes < _MAX_PASSES and brackets.count(b"[]") * _PASS_SHARE >= len(brackets):
        brackets = brackets.replace(b"[]", b"")
        passes += 1
    if not brackets:
        return passes
    runs = list(map(len, _RUN.findall(brackets)))
    if brackets.startswith(b"]"):  # not JSON: a closing bracket first
        runs.insert(0, 0)
    opening, closing = runs[0::2], chain((0,), runs[1::2])
    deepest: int = max(accumulate(map(operator.sub, opening, closing)))
    return passes + max(0, deepest)
