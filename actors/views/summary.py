"""Session summaries (``SessionSummary`` in docs/protocol.md): the compact per-session listing record.

:class:`SummaryRecord` is what ``sessions/list`` needs of one session, small enough to keep for
every stored session in the store's ``stream_meta`` (encoded with :func:`encode_summary_record`),
so the listing is served without activating every actor. :func:`summary_record` builds it from a
:class:`SessionState`; :func:`summary_from_record` / :func:`node_from_record` turn it into the
protocol's :class:`SessionSummary` and tree :class:`SessionNode`; :func:`summary_of` /
:func:`summary_node` do the same for a live session. Pure functions: no I/O, no clock.

Kept apart from :mod:`actors.views.items` (the items timeline) and from :mod:`actors.views.index`
(the :class:`SummaryIndex` that holds these records).

Bounds: a record's title and name are at most ``protocol.limits.MAX_TITLE`` characters and its
reason ``MAX_REASON``, both when it is built and when it is read. The wire refuses longer titles,
but a store written by an older version may hold a 20 MB one (from a ``session/rename`` that was
accepted then); it is cut on read (:func:`protocol.limits.clip`), never refused, so that store
opens and ``sessions/list`` stays a small reply. The events keep what was written.
"""

from __future__ import annotations

from typing import Final, Literal, cast

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.session.state import SessionState
from sessionloop.actors.settings.context import DEFAULT_WORKSPACE
from sessionloop.actors.settings.texts import Text
from sessionloop.protocol.limits import MAX_REASON, MAX_TITLE, clip
from sessionloop.protocol.listing import (
    SessionNode,
    SortKey,
    TreeFields,
    completed_unread,
    sort_key,
)
from sessionloop.protocol.schemas_types import (
    ChatInfo,
    LastTurn,
    PlaceInfo,
    SessionKind,
    SessionSummary,
    TokenCount,
    TurnOutcome,
)

__all__ = [
    "ListingRow",
    "SummaryRecord",
    "decode_summary_record",
    "encode_summary_record",
    "listing_key",
    "listing_row",
    "node_from_record",
    "rewrites_listing",
    "summary_from_record",
    "summary_from_row",
    "summary_node",
    "summary_of",
    "summary_record",
]

DEFAULT_TITLE: Final = "New session"

#: A commit holding one of these rewrites the listing record (event structs are final: no
#: subclass to miss); :func:`rewrites_listing` adds the background-task events.
LISTING_EVENT_TYPES: Final = frozenset({
    E.SessionCreated, E.SessionRenamed, E.SessionArchived, E.SessionUnarchived, E.SessionDeleted,
    E.SessionSeen, E.SessionParked, E.SessionUnparked, E.TurnStarted, E.TurnCompleted, E.TurnFailed,
    E.TurnAborted, E.TurnLimitReached, E.MessagesImported, E.ToolApprovalRequested, E.ToolApprovalSettled,
    E.TaskEnded,
    # token accounting changes the listing too: the tokens of every model call, a summary call's included
    E.LlmCompleted, E.ContextCompacted, E.ContextCompactFailed,
})


def rewrites_listing(events: list[E.Event]) -> bool:
    """Whether a commit of ``events`` rewrites the session's listing record: the one rule the
    session actor writes records by and ``replay --verify`` checks them by.

    Besides :data:`LISTING_EVENT_TYPES`, ``background`` (running background tasks) moves when a
    task starts (the tool call that hands back its ``taskId``) or ends: with its notice, or, for
    an end the model is not told of (stopped), with the copy of ``task.ended`` the task service
    has the session commit."""
    for e in events:
        if type(e) in LISTING_EVENT_TYPES or (type(e) is E.ToolFinished and e.task_id) or (
                type(e) is E.NoticePosted and e.topic == "background-task"):
            return True
    return False


class SummaryRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """What :func:`summary_from_record` needs of one session, small enough to keep for every
    stored session (no messages), so ``sessions/list`` never activates an actor (an actor is
    activated on first use only).

    Encoded as a msgpack array: **append new fields at the end, with defaults**, never reorder or
    retype (records written before a field then still decode). ``title`` and ``name`` are kept
    apart because search matches a session's name, title and id, but not the default name of a session
    nobody named.
    """

    id: str
    title: str = ""
    name: str = ""
    kind: SessionKind = "owner"
    parent_id: str | None = None
    platform: str | None = None
    instance: str | None = None
    account: str | None = None
    chat: E.ChatInfo | None = None
    place: E.PlaceRef | None = None
    created_at: int = 0
    updated_at: int = 0
    last_reply_at: int | None = None
    seen_at: int = 0
    running: bool = False
    archived: bool = False
    attention: bool = False
    background: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    metered: bool = False  # a model call was accounted (tokens may still be 0/0)
    last_outcome: TurnOutcome | None = None
    last_ended_at: int | None = None
    last_reason: str | None = None
    deleted: bool = False  # the Session Loop API's listing skips deleted sessions
    status: str = "idle"  # the agent runtime's session status (``session_model.Status``), for SessionInfo
    app_id: str | None = None  # the app that created it (an app sees only the sessions it created)
    activity: str = "interactive"


_record_encoder: Final = msgspec.msgpack.Encoder()
_record_decoder: Final = msgspec.msgpack.Decoder(SummaryRecord)


def encode_summary_record(record: SummaryRecord) -> bytes:
    return _record_encoder.encode(record)


def decode_summary_record(data: bytes) -> SummaryRecord:
    """The record in ``data``, its title, name and reason cut to their bounds (see the module
    docstring). Raises ``msgspec.DecodeError`` / ``msgspec.ValidationError`` on bytes that are
    not a record."""
    return _bounded(_record_decoder.decode(data))


def _bounded(record: SummaryRecord) -> SummaryRecord:
    reason = record.last_reason
    if len(record.title) <= MAX_TITLE and len(record.name) <= MAX_TITLE and (
            reason is None or len(reason) <= MAX_REASON):
        return record
    return msgspec.structs.replace(record, title=clip(record.title, MAX_TITLE), name=clip(record.name, MAX_TITLE),
                                   last_reason=clip(reason, MAX_REASON) if reason is not None else None)


def _last_turn(state: SessionState) -> tuple[TurnOutcome | None, int | None, str | None]:
    """``lastTurn`` and ``reason``: the latest ended turn; one without an outcome counts as silent;
    the reason only for an error, and only when the agent gave one."""
    turn = state.last_turn()
    if turn is None:
        return None, None, None
    outcome = turn.outcome if turn.outcome in ("replied", "silent", "aborted", "error") else "silent"
    reason = clip(turn.reason, MAX_REASON) if outcome == "error" and turn.reason else None
    return cast(TurnOutcome, outcome), turn.ended_at, reason


def summary_record(state: SessionState, attention: bool = False, background: int = 0) -> SummaryRecord:
    """The record of ``state``. ``attention`` (unsettled pushed approvals) and ``background``
    (running background tasks) live in other streams, so the caller passes them."""
    created = state.created
    outcome, ended_at, reason = _last_turn(state)
    # positional, in field order: a 28-field struct built from keywords costs ~6x more (msgspec
    # matches keywords one by one past 16 fields), and every turn's commit builds one
    return SummaryRecord(
        state.session_id,  # id
        clip(state.title, MAX_TITLE),  # title
        clip(created.name, MAX_TITLE) if created is not None else "",  # name
        created.kind if created is not None else "owner",  # kind
        created.parent_id if created is not None else None,  # parent_id
        created.platform if created is not None else None,  # platform
        created.instance if created is not None else None,  # instance
        created.account if created is not None else None,  # account
        created.chat if created is not None else None,  # chat
        created.place if created is not None else None,  # place
        state.created_at,  # created_at
        state.updated_at,  # updated_at
        state.last_reply_at,  # last_reply_at
        state.seen_at,  # seen_at
        state.current_turn is not None,  # running
        state.archived,  # archived
        attention,  # attention
        background,  # background
        state.tokens_in,  # tokens_in
        state.tokens_out,  # tokens_out
        state.last_usage is not None,  # metered
        outcome,  # last_outcome
        ended_at,  # last_ended_at
        reason,  # last_reason
        state.deleted,  # deleted
        state.status.value,  # status
        created.app_id if created is not None else None,  # app_id
        created.activity if created is not None else "interactive",  # activity
    )


def tombstone_record(state: SessionState, now: int) -> SummaryRecord:
    """The listing record a deleted session keeps: ids, tree place, owner and ``deleted``, no
    title, name, reason or place name (a delete clears the session's history), so ``sessions/list``
    skips it, ``sessions/changed`` removes it and its children's ancestors stay known."""
    created = state.created
    return SummaryRecord(
        id=state.session_id, kind=created.kind if created is not None else "owner",
        parent_id=created.parent_id if created is not None else None, created_at=state.created_at,
        updated_at=now, deleted=True, status=state.status.value,
        app_id=created.app_id if created is not None else None,
        activity=created.activity if created is not None else "interactive",
    )


def _title(record: SummaryRecord) -> str:
    """A summary's title: the session's title, else its name (and a default name when it has neither)."""
    return record.title or record.name or DEFAULT_TITLE


def _own_tokens(record: SummaryRecord) -> TokenCount | None:
    """The session's own tokens; None while no model call has been accounted yet."""
    if not record.metered and not record.tokens_in and not record.tokens_out:
        return None
    return TokenCount(input=record.tokens_in, output=record.tokens_out)


def node_from_record(record: SummaryRecord) -> SessionNode:
    """The input of ``protocol.listing.compute_tree_fields`` for this session."""
    return SessionNode(
        id=record.id,
        title=_title(record),
        parent_id=record.parent_id,
        kind=record.kind,
        attention=record.attention,
        background=record.background,
        running=record.running,
        tokens=_own_tokens(record),
    )


class ListingRow(msgspec.Struct, gc=False):
    """What the list rules (``protocol.listing.list_sessions``: filters, sort, room groups, search)
    read of one session, with the record and tree fields its :class:`SessionSummary` is built from.

    ``sessions/list`` over 100,000 sessions builds one of these per visible session and a summary
    only for the rows of the page: a summary (two dozen fields, nested Structs) costs several
    times a row. Every field here has the value of the same-named field of the summary
    (:func:`summary_from_row`, a test holds them equal). ``order`` is the row's sort key in a list
    that is not a parent's (``protocol.listing.sort_key``), computed once with the row.
    Not tracked by the cyclic GC: it refers to records and tree fields, nothing refers back."""

    id: str
    title: str
    parent_id: str | None
    section: Literal["owner", "rooms"]
    platform: str | None
    instance: str | None
    account: str | None
    place: E.PlaceRef | None
    archived: bool
    attention: bool
    background: int
    error: bool
    unread: bool
    running: bool
    updated_at: int
    record: SummaryRecord
    tree: TreeFields | None
    order: SortKey | None = None


def listing_row(record: SummaryRecord, tree: TreeFields | None = None) -> ListingRow:
    """The row of a record, with the tree fields from ``tree`` (see :func:`summary_from_record`).

    The derived fields (section, error, unread, and the tree's attention and background) are
    decided here and only here; :func:`summary_from_row` copies them."""
    section: Literal["owner", "rooms"] = "rooms" if record.kind == "room" else "owner"
    if tree is not None:
        section = tree.section
    row = ListingRow(
        record.id, _title(record), record.parent_id, section, record.platform, record.instance,
        record.account, record.place, record.archived,
        tree.attention if tree is not None else record.attention,
        tree.background if tree is not None else record.background,
        record.last_outcome == "error",
        completed_unread(section, record.last_reply_at, record.seen_at or None),
        record.running, record.updated_at, record, tree,
    )
    row.order = sort_key(row, False)
    return row


def listing_key(row: ListingRow, children: bool) -> SortKey:
    """``protocol.listing.sort_key`` of a row, the one computed with it when it can be."""
    return row.order if not children and row.order is not None else sort_key(row, children)


def summary_from_record(record: SummaryRecord, tree: TreeFields | None = None) -> SessionSummary:
    """The ``SessionSummary`` of a record, with the tree fields from ``tree``.

    Without ``tree`` the session stands alone: its own attention, background and tokens, no
    children, and a task's section is ``owner`` (a task takes its root's section, which only the
    tree knows). ``unread`` follows the section: only a session in the owner section is ever unread,
    a room never is.
    """
    return summary_from_row(listing_row(record, tree))


def summary_from_row(row: ListingRow) -> SessionSummary:
    """The ``SessionSummary`` of a :class:`ListingRow`: its fields plus the record's details."""
    record, tree = row.record, row.tree
    last_turn = None
    if record.last_outcome is not None and record.last_ended_at is not None:
        last_turn = LastTurn(outcome=record.last_outcome, ended_at=record.last_ended_at)
    chat, place = record.chat, row.place
    return SessionSummary(
        id=row.id,
        title=row.title,
        parent_id=row.parent_id,
        child_count=tree.child_count if tree is not None else 0,
        kind=record.kind,
        section=row.section,
        platform=row.platform,
        instance=row.instance,
        account=row.account,
        chat=ChatInfo(type=chat.type, multi_party=chat.multi_party) if chat is not None else None,
        place=PlaceInfo(key=place.key, kind=place.kind, name=place_name(place)) if place is not None else None,
        created_at=record.created_at,
        updated_at=row.updated_at,
        last_reply_at=record.last_reply_at,
        running=row.running,
        error=row.error,
        unread=row.unread,
        attention=row.attention,
        archived=row.archived,
        background=row.background,
        tokens=tree.tokens if tree is not None else _own_tokens(record),
        ancestors=tree.ancestors if tree is not None else None,
        last_turn=last_turn,
        reason=record.last_reason if row.error else None,
    )


def place_name(place: E.PlaceRef) -> str:
    """A place's display name (``PlaceInfo.name``): the default workspace is named by the text
    ``place.default-workspace`` in the server's language (a text object, rendered when sent); other
    places keep their own name."""
    if place.key == DEFAULT_WORKSPACE:
        return _DEFAULT_WORKSPACE_NAME
    return place.name


_DEFAULT_WORKSPACE_NAME: Final = Text("place.default-workspace")


def summary_of(
    state: SessionState, tree: TreeFields | None = None, *, attention: bool = False, background: int = 0
) -> SessionSummary:
    """The ``SessionSummary`` of a live session; same result as going through its record."""
    return summary_from_record(summary_record(state, attention, background), tree)


def summary_node(state: SessionState, *, attention: bool = False, background: int = 0) -> SessionNode:
    """The tree node of a live session: what it knows about itself, the input of the tree-computed
    fields."""
    return node_from_record(summary_record(state, attention, background))
