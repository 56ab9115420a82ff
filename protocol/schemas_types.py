"""The data shapes of the session protocol (docs/protocol.md): summaries, items, approvals, tasks, settings.

Method params/results and the registry live in :mod:`protocol.schemas`; this module holds the
shapes they are made of, so both the gateway (building them) and clients (parsing them) share one
definition.

Conventions, all from msgspec's guidance and the contract:

* every Struct derives from :class:`Wire`: frozen, keyword-only, camelCase on the wire
  (``rename="camel"``: ``session_id`` <-> ``sessionId``), ``omit_defaults`` so optional fields are
  simply absent, and unknown keys accepted (an object schema never refuses extra keys);
* consequence of ``omit_defaults``: a field that must always be on the wire has **no default**,
  and optional fields default to ``None`` (or ``UNSET`` where ``null`` is a meaningful value);
* tagged unions use stable tags on ``kind`` (items, tool displays) or ``scope`` (setting layers);
* times are epoch milliseconds (``int``);
* every field a client sends is bounded (:mod:`protocol.limits` has the numbers and why): strings
  and lists through ``Meta(max_length=...)``, integers through ``Meta(ge=..., le=...)``, raw JSON
  (:data:`JsonValue`) by its encoded size and depth, checked in the holder's ``__post_init__``
  with :func:`check_json_value`. Shapes only the server sends (summaries, items) carry no
  bounds: a client decoding them must not break on data stored before a bound existed.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from sessionloop.protocol.limits import (
    MAX_DATA_URL_CHARS,
    MAX_FILE_NAME,
    MAX_ID,
    MAX_INT,
    MAX_JSON_DEPTH,
    MAX_JSON_VALUE_BYTES,
    MAX_NAME,
    MAX_PLACE_KEY,
    MAX_TEXT_CHARS,
    MAX_TITLE,
    MIN_INT,
)

__all__ = [
    "AncestorRef",
    "Approval",
    "ApprovalDiff",
    "ApprovalFacts",
    "ApprovalOrigin",
    "ApprovalSettlement",
    "BackgroundCall",
    "BackgroundTask",
    "ChatInfo",
    "ClientInfo",
    "CommandDisplay",
    "DataUrl",
    "Features",
    "FileChangeDisplay",
    "GlobalLayer",
    "Id",
    "Identity",
    "ItemAttachment",
    "JsonValue",
    "LastTurn",
    "OutgoingAttachment",
    "OverrideTarget",
    "Participant",
    "PlaceInfo",
    "PlaceLayer",
    "PlatformLayer",
    "PlatformTypeLayer",
    "RoomGroup",
    "SessionSummary",
    "SessionTarget",
    "SettingActual",
    "SettingLayer",
    "SettingLayerInfo",
    "SettingRow",
    "ShortName",
    "Speaker",
    "Text",
    "TokenCount",
    "Title",
    "ToolDisplay",
    "Wire",
    "check_json_value",
    "decode_data_url",
    "is_unset",
]


class Wire(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True, forbid_unknown_fields=False
):
    """Base of every wire Struct (see the module docstring for why each option).

    msgspec inherits every option but ``kw_only`` (it applies to the fields a class declares), so
    each subclass repeats ``kw_only=True``; without it a required field after an inherited optional
    one is a TypeError at import.
    """


# --- bounded fields (what clients send) ---------------------------------------------------------

Id = Annotated[str, Meta(max_length=MAX_ID)]
ShortName = Annotated[str, Meta(max_length=MAX_NAME)]
Title = Annotated[str, Meta(max_length=MAX_TITLE)]
Text = Annotated[str, Meta(max_length=MAX_TEXT_CHARS)]
#: Raw JSON passed through (a setting's value). msgspec cannot bound ``Any`` while decoding, so
#: the ``extra`` carries the bounds and the holder's ``__post_init__`` calls check_json_value.
JsonValue = Annotated[Any, Meta(extra={"max_bytes": MAX_JSON_VALUE_BYTES, "max_depth": MAX_JSON_DEPTH})]

_json_encoder: Final = msgspec.json.Encoder()


def check_json_value(field: str, value: Any) -> None:
    """Raise ``ValueError`` naming ``field`` if ``value`` encodes to more than
    MAX_JSON_VALUE_BYTES, nests deeper than MAX_JSON_DEPTH or holds an integer outside int64
    (JSON integers are unbounded and ``math.isfinite(10**400)`` overflows; JSON floats are
    finite, msgspec refuses ``1e400``). msgspec turns the error into a ``ValidationError``, so
    the client gets ``invalidParams``. The size is checked first, by msgspec's encoder, so the
    walk only ever runs over a bounded value."""
    size = len(_json_encoder.encode(value))
    if size > MAX_JSON_VALUE_BYTES:
        raise ValueError(f"{field} is {size} bytes of JSON; at most {MAX_JSON_VALUE_BYTES}")
    todo: list[tuple[Any, int]] = [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, int) and not MIN_INT <= item <= MAX_INT:
            raise ValueError(f"{field} holds an integer outside int64")
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth >= MAX_JSON_DEPTH:
            raise ValueError(f"{field} nests deeper than {MAX_JSON_DEPTH} levels")
        todo.extend((child, depth + 1) for child in children)


# --- identities and handshake pieces ------------------------------------------------------------


class Identity(Wire, frozen=True, kw_only=True):
    """Who a connection is, as the transport authenticated it (``identity {platform, userId}``)."""

    platform: str
    user_id: str


class ClientInfo(Wire, frozen=True, kw_only=True):
    name: ShortName
    version: ShortName


class Features(Wire, frozen=True, kw_only=True):
    """Feature bits: which services are present right now."""

    send: bool
    rewind: bool
    compress: bool
    settings: bool


class RateLimits(Wire, frozen=True, kw_only=True):
    """The connection's request limits, as ``initialize`` announces them (docs/protocol.md,
    Transport): a token bucket of ``burst`` tokens refilled at ``requestsPerSecond`` (null: no rate
    limit), one token a request, and at most ``maxInFlight`` requests unanswered. A request beyond
    either is ``rejected`` with ``retryAfterMs``."""

    requests_per_second: float | None
    burst: int
    max_in_flight: int


# --- session summaries and room groups ------------------------------------------------------------

SessionKind = Literal["owner", "room", "task"]
Section = Literal["owner", "rooms"]
TurnOutcome = Literal["replied", "silent", "aborted", "error"]


class ChatInfo(Wire, frozen=True, kw_only=True):
    type: str
    multi_party: bool


class PlaceInfo(Wire, frozen=True, kw_only=True):
    key: str
    kind: Literal["window", "workspace"]
    name: str


class TokenCount(Wire, frozen=True, kw_only=True):
    input: int
    output: int


class LastTurn(Wire, frozen=True, kw_only=True):
    outcome: TurnOutcome
    ended_at: int


class AncestorRef(Wire, frozen=True, kw_only=True):
    """A parent on the path from the root (``ancestors``) or an approval's source chain."""

    id: str
    title: str


class SessionSummary(Wire, frozen=True, kw_only=True):
    """One row of the session list (a summary). Tree fields: see ``listing.compute_tree_fields``."""

    id: str
    title: str
    child_count: int
    kind: SessionKind
    section: Section
    created_at: int
    updated_at: int
    running: bool
    error: bool
    unread: bool
    attention: bool
    archived: bool
    background: int
    parent_id: str | None = None
    platform: str | None = None
    instance: str | None = None
    account: str | None = None
    chat: ChatInfo | None = None
    place: PlaceInfo | None = None
    last_reply_at: int | None = None
    tokens: TokenCount | None = None
    last_turn: LastTurn | None = None
    reason: str | None = None
    ancestors: list[AncestorRef] | None = None


class RoomGroup(Wire, frozen=True, kw_only=True):
    """Non-archived rooms grouped by platform + adapter instance."""

    platform: str
    label: str
    rooms: int
    accounts: int
    attention: int
    instance: str | None = None


# --- attachments ----------------------------------------------------------------------------------


class ItemAttachment(Wire, frozen=True, kw_only=True):
    """An attachment shown on an item; ``src`` is a media URL or an opaque file handle, or absent."""

    kind: Literal["image", "audio", "video", "file"]
    name: str
    src: str | None = None


# Only the header is checked here (cheap on 20 MB strings); decode_data_url checks the payload.
_DATA_URL_HEAD: Final = r"^data:[^,]*;base64,"


class OutgoingAttachment(Wire, frozen=True, kw_only=True):
    """An attachment sent to the agent: ``data`` must be a base64 ``data:`` URL."""

    data: Annotated[str, Meta(pattern=_DATA_URL_HEAD, max_length=MAX_DATA_URL_CHARS)]
    name: Annotated[str, Meta(max_length=MAX_FILE_NAME)]


class DataUrl(msgspec.Struct, frozen=True):
    mime: str
    payload: bytes


_B64_BODY = re.compile(rb"[A-Za-z0-9+/]*={0,2}")


def decode_data_url(data: str) -> DataUrl | None:
    """Decode a base64 data URL, or ``None`` if it is not one (the gateway answers invalidParams).

    The declared MIME is returned as given; the contract has the server sniff the real type from the
    file header instead, so callers should not trust it.
    """
    head, sep, body = data.partition(",")
    if not sep or not re.match(_DATA_URL_HEAD, head + ","):
        return None
    raw = "".join(body.split()).encode("ascii", "replace")
    if not _B64_BODY.fullmatch(raw):
        return None
    try:
        payload = base64.b64decode(raw + b"=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    return DataUrl(mime=head[5:].split(";", 1)[0], payload=payload)


# --- tool displays --------------------------------------------------------------------------------


class _Display(Wire, tag_field="kind", frozen=True, kw_only=True):
    pass


class CommandDisplay(_Display, tag="command", frozen=True, kw_only=True):
    command: str
    cwd: str | None = None
    exit_code: int | None = None
    #: an extension of the protocol's display: the sandbox policy the command runs under
    sandbox: str | None = None


class FileChangeDisplay(_Display, tag="file-change", frozen=True, kw_only=True):
    path: str
    removed: str | None = None
    added: str | None = None


ToolDisplay = CommandDisplay | FileChangeDisplay


# --- approvals ------------------------------------------------------------------------------------


class Speaker(Wire, frozen=True, kw_only=True):
    """Who spoke or answered (user-message speaker, settlement.by): ``owner`` decides owner-ness."""

    platform: str
    owner: bool
    user_id: str | None = None
    nickname: str | None = None
    source: str | None = None  # injection source, when not a person typed it


SettlementSource = Literal["answer", "absent", "timeout", "ineligible", "rate-limit", "turn-ended", "shutdown",
                           "grant"]


class GrantTerms(Wire, frozen=True, kw_only=True):
    """What a grant covers (extension, protocol 0.2.1): calls of ``tool`` (``exec`` commands whose
    shell words start with ``commandPrefix``) in the ``turn`` or ``session``, until ``expiresAt``."""

    scope: Literal["turn", "session"]
    tool: str
    command_prefix: str | None = None
    expires_at: int


class ApprovalSettlement(Wire, frozen=True, kw_only=True):
    """How an approval ended; same shape as ``approval/settled`` minus the id. Extensions
    (0.2.1): ``grant``, the grant this answer made (its id is the approval's); ``grantId``, the
    grant that settled this call (``source: "grant"``)."""

    state: Literal["approved", "denied", "expired", "cancelled"]
    source: SettlementSource
    at: int
    by: Speaker | None = None
    grant: GrantTerms | None = None
    grant_id: str | None = None


class ApprovalGrant(Wire, frozen=True, kw_only=True):
    """A grant in ``approval/grants/list`` (0.2.1)."""

    id: str
    session_id: str
    decision: Literal["approve", "deny"]
    terms: GrantTerms
    turn_id: str
    at: int
    by: Speaker | None = None


class Participant(Wire, frozen=True, kw_only=True):
    platform: str
    user_id: str


class ApprovalOrigin(Wire, frozen=True, kw_only=True):
    kind: Literal["hand", "autonomous"]
    participants: list[Participant]


class ApprovalDiff(Wire, frozen=True, kw_only=True):
    path: str
    patch: str


class ApprovalFacts(Wire, frozen=True, kw_only=True):
    """Verbatim arguments: may hold control/bidi/zero-width characters (sanitize before display)."""

    params: dict[str, Any]
    command: str | None = None
    cwd: str | None = None
    diff: ApprovalDiff | None = None
    sandbox: str | None = None  # extension: the sandbox policy the command would run under


class Approval(Wire, frozen=True, kw_only=True):
    id: str
    session_id: str
    origin: ApprovalOrigin
    target: Literal["tool"]
    tool: str
    facts: ApprovalFacts
    options: list[Literal["approve", "deny"]]
    content_hash: str
    expires_at: int
    state: Literal["pending", "approved", "denied", "expired", "cancelled"]
    turn_id: str | None = None
    call_id: str | None = None
    chain: list[AncestorRef] | None = None


# --- background tasks -----------------------------------------------------------------------------


class BackgroundCall(Wire, frozen=True, kw_only=True):
    tool: str
    turn_id: str
    call_id: str


class BackgroundTask(Wire, frozen=True, kw_only=True):
    """Work running in the background for the owner."""

    id: str
    session_id: str
    kind: Literal["tool-call"]
    label: str
    status: Literal["running", "completed", "failed", "stopped", "aborted"]
    started_at: int
    call: BackgroundCall | None = None
    ended_at: int | None = None
    last_line: str | None = None
    last_output_at: int | None = None
    reason: str | None = None
    exit_code: int | None = None
    display: ToolDisplay | None = None


# --- session settings -----------------------------------------------------------------------------


class _Layer(Wire, tag_field="scope", frozen=True, kw_only=True):
    pass


class GlobalLayer(_Layer, tag="global", frozen=True, kw_only=True):
    pass


class PlatformLayer(_Layer, tag="platform", frozen=True, kw_only=True):
    platform: ShortName


class PlatformTypeLayer(_Layer, tag="platformType", frozen=True, kw_only=True):
    platform: ShortName
    type: ShortName


class PlaceLayer(_Layer, tag="place", frozen=True, kw_only=True):
    key: Annotated[str, Meta(max_length=MAX_PLACE_KEY)]


SettingLayer = GlobalLayer | PlatformLayer | PlatformTypeLayer | PlaceLayer


class SessionTarget(_Layer, tag="session", frozen=True, kw_only=True):
    """An override written on one session's own layer (session/config/overrides targets)."""

    session_id: str
    title: str
    parent: AncestorRef | None = None


OverrideTarget = GlobalLayer | PlatformLayer | PlatformTypeLayer | PlaceLayer | SessionTarget

SettingSource = Literal["default", "global", "platform", "platformType", "place", "session"]


class SettingActual(Wire, frozen=True, kw_only=True):
    value: Any
    label: str | None = None


class SettingRow(Wire, frozen=True, kw_only=True):
    """One setting ``(plugin, key)``; ``field`` is the plugin's field declaration, passed through."""

    plugin: str
    key: str
    field: dict[str, Any]
    prominence: Literal["composer", "common", "advanced"]
    value: Any = UNSET
    effective: Any = UNSET
    source: SettingSource | None = None
    actual: SettingActual | None = None


class SettingLayerInfo(Wire, frozen=True, kw_only=True):
    layer: SettingLayer
    label: str | None = None
    platform: str | None = None
    type: str | None = None


def is_unset(value: object) -> bool:
    """True for msgspec's ``UNSET`` (an absent ``Any`` field), False for every value incl. None."""
    return isinstance(value, UnsetType)
