"""``sanitize_for_card``: make verbatim tool arguments safe to show on an approval card.

What an approval card shows: an approval's ``facts`` are the tool's arguments verbatim and may
carry control characters, bidirectional controls and zero-width characters; a card must be
cleaned before display. Those characters are how a malicious argument makes a card *read*
differently from what will run (``rm -rf /`` shown reversed or hidden behind a zero-width joiner,
an ANSI escape repainting a terminal line). So they are removed, not escaped:

* control characters: C0 (U+0000–U+001F) except ``\\t`` and ``\\n``, DEL (U+007F) and C1
  (U+0080–U+009F) -- ``\\r`` goes too: it lets a line overwrite itself in a terminal;
* bidi controls: U+202A–U+202E (embeddings/overrides), U+2066–U+2069 (isolates), U+200E/U+200F
  (marks) and U+061C (Arabic letter mark);
* zero-width characters: U+200B–U+200D and U+2060 (word joiner), U+FEFF (BOM / ZWNBSP).

The function is applied to the *display* copy only: the approval's content hash is computed over
the verbatim facts, so cleaning never changes what the owner approves.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["REMOVED_CODEPOINTS", "sanitize_for_card", "sanitize_text"]


def _codepoints() -> frozenset[int]:
    controls = {c for c in range(0x20) if chr(c) not in "\t\n"} | {0x7F} | set(range(0x80, 0xA0))
    bidi = set(range(0x202A, 0x202F)) | set(range(0x2066, 0x206A)) | {0x200E, 0x200F, 0x061C}
    zero_width = set(range(0x200B, 0x200E)) | {0x2060, 0xFEFF}
    return frozenset(controls | bidi | zero_width)


REMOVED_CODEPOINTS: Final = _codepoints()
_TABLE: Final[dict[int, None]] = dict.fromkeys(REMOVED_CODEPOINTS)


def sanitize_text(text: str) -> str:
    """``text`` without the characters listed in the module docstring."""
    return text.translate(_TABLE)


def sanitize_for_card(value: Any) -> Any:
    """A copy of ``value`` with every string inside cleaned by :func:`sanitize_text`.

    Walks dicts (values; keys are left as they are so two keys can never collapse into one and
    hide an argument), lists and tuples; other values are returned unchanged. Iterative, so a
    deeply nested argument (tool-call arguments nest at most ``MAX_NESTING``, 512 levels:
    ``protocol/nesting.py``) cannot hit Python's recursion limit.
    """
    if isinstance(value, str):
        return sanitize_text(value)
    if not isinstance(value, dict | list | tuple):
        return value
    root: list[Any] = [None]
    # Each task: (source container, target container or a slot to fill, key in parent target)
    stack: list[tuple[Any, list[Any] | dict[Any, Any], Any]] = [(value, root, 0)]
    pending_tuples: list[tuple[list[Any] | dict[Any, Any], Any, list[Any]]] = []
    while stack:
        source, parent, slot = stack.pop()
        if isinstance(source, str):
            parent[slot] = sanitize_text(source)
        elif isinstance(source, dict):
            copy: dict[Any, Any] = dict.fromkeys(source)
            parent[slot] = copy
            stack.extend((item, copy, key) for key, item in source.items())
        elif isinstance(source, list | tuple):
            items: list[Any] = [None] * len(source)
            parent[slot] = items
            if isinstance(source, tuple):
                pending_tuples.append((parent, slot, items))
            stack.extend((item, items, index) for index, item in enumerate(source))
        else:
            parent[slot] = source
    # Tuples are rebuilt last, innermost first (they were found outermost first).
    for parent, slot, items in reversed(pending_tuples):
        parent[slot] = tuple(items)
    return root[0]
