"""Every bound on what a client sends, in one table (every field a client sends has a bound).

The wire schemas (:mod:`protocol.schemas`, :mod:`protocol.schemas_types`,
:mod:`protocol.schemas_loop`) put these into ``msgspec.Meta`` constraints, so an over-bound value
is refused while decoding, as ``invalidParams`` naming the field; the in-process Session Loop API
(``actors/api/loop.py``) checks the same numbers, and the listing records read back from the
store are cut to them (``actors/views/summary.py``), so a store written before a bound existed
still lists small. Where the protocol's contract gives a number, it is that one; every other number is chosen
so that no real client reaches it while any reply built from such values stays small.

Pure data and one pure function; no I/O.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEFAULT_WAIT_MS",
    "HISTORY_DEFAULT_LIMIT",
    "HISTORY_MAX_LIMIT",
    "LIST_DEFAULT_LIMIT",
    "LIST_MAX_LIMIT",
    "LOOP_EVENTS_DEFAULT_LIMIT",
    "LOOP_EVENTS_MAX_LIMIT",
    "MAX_ATTACHMENTS",
    "MAX_ATTACHMENT_BYTES",
    "MAX_BATCH_IDS",
    "MAX_CURSOR",
    "MAX_DATA_URL_CHARS",
    "MAX_FILE_NAME",
    "MAX_GRANT_MS",
    "MAX_GRANT_PREFIX",
    "MAX_ID",
    "MAX_IDEMPOTENCY_KEY",
    "MAX_INT",
    "MAX_JSON_DEPTH",
    "MAX_JSON_VALUE_BYTES",
    "MAX_NAME",
    "MAX_NESTING",
    "MAX_PLACE_KEY",
    "MAX_QUERY",
    "MAX_REASON",
    "MAX_SPACE_ID",
    "MAX_TEXT_CHARS",
    "MAX_TITLE",
    "MAX_TRACEPARENT",
    "MAX_VERSION",
    "MAX_WAIT_MS",
    "MIN_INT",
    "MIN_WAIT_MS",
    "TRACEPARENT_PATTERN",
    "clip",
    "one_line",
]

# --- strings --------------------------------------------------------------------------------------

#: An approval grant's command prefix: a few shell words, never a script.
MAX_GRANT_PREFIX: Final = 1_000
#: An approval grant lasts at most 30 days.
MAX_GRANT_MS: Final = 30 * 24 * 3600 * 1000

#: Session, turn, task and approval ids we issue are 21 characters, content hashes 64: this
#: names none of ours and keeps the not-found message that echoes it short.
MAX_ID: Final = 256
#: Plugin ids, setting keys, platforms, instances, place keys, client name and version: short
#: identifiers a client copies from a reply or a config file.
MAX_NAME: Final = 256
#: A place key: ``workspace:<folder>`` holds a path of up to PATH_MAX (4096) characters.
MAX_PLACE_KEY: Final = 4_096 + 64
#: A session's title and name: shown in every ``sessions/list`` row and every ancestor path, so
#: 200 rows stay well under a megabyte (the same bound ``loop/create`` always had).
MAX_TITLE: Final = 1_000
#: ``sessions/list`` query: matched against titles, names and ids, none of which is longer.
MAX_QUERY: Final = MAX_TITLE
#: The one-sentence reason of a failed turn in a listing row; model error
#: texts can be long, the row stays small.
MAX_REASON: Final = 1_000
#: Opaque paging cursors we issue are under 200 characters.
MAX_CURSOR: Final = 1_024
#: ``initialize.protocolVersion``: "0.2.0"; echoed back in the ``unsupported`` refusal.
MAX_VERSION: Final = 64
#: the contract names no limit for ``space.spaceId``; an id, with the room the key's bound gives.
MAX_SPACE_ID: Final = 512
#: idempotencyKey is required, at most 512 characters.
MAX_IDEMPOTENCY_KEY: Final = 512
#: a message's text: at most 100,000 characters. Also the owner's ``turn/send`` content and an approval's note,
#: which reach the model the same way a message does.
MAX_TEXT_CHARS: Final = 100_000
#: An attachment's file name: NAME_MAX of every common file system.
MAX_FILE_NAME: Final = 255
#: A W3C Trace Context ``traceparent`` (``loop/send``, ``turn/send``): version 00 is exactly 55
#: characters, ``version-traceid-parentid-flags`` in lowercase hex.
MAX_TRACEPARENT: Final = 55
#: Its format (W3C Trace Context §3.2): version ``ff`` and all-zero trace or parent ids are invalid.
TRACEPARENT_PATTERN: Final = r"^(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$"

# --- collections and raw JSON ---------------------------------------------------------------------

#: at most 10 attachments per message (loop/send, and turn/send the same).
MAX_ATTACHMENTS: Final = 10
#: 20 MB per attachment and 20 MB in total (checked on the decoded bytes, each and all together).
MAX_ATTACHMENT_BYTES: Final = 20 * 1024 * 1024
_B64_CHARS: Final = 4 * -(-MAX_ATTACHMENT_BYTES // 3)
#: A data URL holding the largest attachment: its base64, MIME line breaks (2 per 76), a header.
MAX_DATA_URL_CHARS: Final = _B64_CHARS + _B64_CHARS // 76 * 2 + 512
#: ``session/batch`` ids: five full pages of the list (200 each); one reply line per failure.
MAX_BATCH_IDS: Final = 1_000
#: A setting's ``value`` (raw JSON), encoded: the largest legitimate one is a 100,000-character
#: system prompt (under 600 KB even with every character escaped).
MAX_JSON_VALUE_BYTES: Final = 1024 * 1024
#: Nesting of a setting's ``value``: settings are scalars or shallow objects.
MAX_JSON_DEPTH: Final = 32
#: Nesting of any JSON text a peer sends (a request frame; a model's tool-call arguments),
#: measured before it is parsed (:mod:`protocol.nesting`), so it holds on every Python: the
#: decoder's own limit is the interpreter's C recursion limit (~1,000 levels on 3.11, 1,500 on
#: 3.12, 10,000 on 3.13). No request of ours nests past a dozen levels.
MAX_NESTING: Final = 512

# --- numbers --------------------------------------------------------------------------------------

#: Any integer a client sends (offsets, timeouts): JSON has unbounded integers and msgspec keeps
#: them as Python ints, which overflow float arithmetic (``10**310 / 1000``); int64 is enough
#: for any position, count or time of ours.
MAX_INT: Final = 2**63 - 1
MIN_INT: Final = -(2**63)
#: sessions/list limit: 50 by default, at most 200.
LIST_DEFAULT_LIMIT: Final = 50
LIST_MAX_LIMIT: Final = 200
#: session/history limit: 100 by default, at most 200.
HISTORY_DEFAULT_LIMIT: Final = 100
HISTORY_MAX_LIMIT: Final = 200
#: ``loop/listEvents`` page: the contract names none; 1,000 events of at most a message each.
LOOP_EVENTS_DEFAULT_LIMIT: Final = 100
LOOP_EVENTS_MAX_LIMIT: Final = 1_000
#: a wait's timeout: 60 s by default, clamped to 1–600 s (within int64 a timeout is clamped, never refused).
DEFAULT_WAIT_MS: Final = 60_000
MIN_WAIT_MS: Final = 1_000
MAX_WAIT_MS: Final = 600_000


def one_line(text: str, limit: int = 300) -> str:
    """The first non-empty line of ``text``, cut to ``limit`` characters: a reason as a person
    reads it in a list, a card or a log line (the whole text stays in the event)."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return clip(line, limit)


def clip(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its first ``limit - 1`` and "…".

    For values stored before their bound existed (a 20 MB title written by an older version):
    they are cut when read, never refused, so such a store still opens and lists.
    """
    if len(text) <= limit:
        return text
    return text[: limit - 1] + "…"
