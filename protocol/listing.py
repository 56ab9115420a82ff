"""The pure rules of ``sessions/list`` and of the tree-computed summary fields (docs/protocol.md).

Two steps, both pure (no store, no clock), so the gateway can run them over whatever it holds:

1. :func:`compute_tree_fields` folds per-session raw records (:class:`SessionNode`: what a session
   knows about itself) into the fields that depend on the session tree: ``attention``,
   ``background``, ``tokens``, ``ancestors``, ``childCount`` and the ``section`` a child inherits
   from its root. :func:`apply_tree_fields` writes them into a :class:`SessionSummary`.
2. :func:`list_sessions` applies the list rules to the summaries visible to a connection:
   sections, children of a parent, room groups (``instance`` / ``platform``), archived,
   background, search, sort order, pagination, and the :class:`RoomGroup` list.

Each function says the rule it implements, in words. Errors are :class:`RpcError`
values raised for the gateway to answer: unknown parent -> ``not-found``; bad cursor ->
``invalidParams``. (``instance`` with ``platform`` and ``background`` with ``archived`` are refused
by ``SessionsListParams`` itself, which cannot even be constructed that way.)
"""

from __future__ import annotations

import base64
import binascii
import heapq
import re
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from typing import Final, Literal, Protocol, TypeVar, cast

import msgspec

from sessionloop.protocol.errors import RpcError
from sessionloop.protocol.limits import LIST_DEFAULT_LIMIT, LIST_MAX_LIMIT
from sessionloop.protocol.schemas import SessionsListParams, SessionsListResult
from sessionloop.protocol.schemas_types import (
    AncestorRef,
    RoomGroup,
    Section,
    SessionKind,
    SessionSummary,
    TokenCount,
)

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "ListRow",
    "SessionNode",
    "TreeFields",
    "apply_tree_fields",
    "completed_unread",
    "compute_room_groups",
    "compute_tree_fields",
    "list_sessions",
    "sort_key",
    "with_ancestors",
]

DEFAULT_LIMIT: Final = LIST_DEFAULT_LIMIT  # limit: 50 by default, at most 200
MAX_LIMIT: Final = LIST_MAX_LIMIT


class ListRow(Protocol):
    """What the list rules read of a session: a :class:`SessionSummary` has all of it; the server
    passes lighter rows and builds summaries for the page only (``list_sessions(materialize=)``)."""

    @property
    def id(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def parent_id(self) -> str | None: ...
    @property
    def section(self) -> Section: ...
    @property
    def platform(self) -> str | None: ...
    @property
    def instance(self) -> str | None: ...
    @property
    def account(self) -> str | None: ...
    @property
    def archived(self) -> bool: ...
    @property
    def attention(self) -> bool: ...
    @property
    def background(self) -> int: ...
    @property
    def error(self) -> bool: ...
    @property
    def unread(self) -> bool: ...
    @property
    def running(self) -> bool: ...
    @property
    def updated_at(self) -> int: ...


Row = TypeVar("Row", bound=ListRow)


# --- tree-computed fields -------------------------------------------------------------------------


class SessionNode(msgspec.Struct, frozen=True, kw_only=True):
    """What one session knows about itself; the input of :func:`compute_tree_fields`.

    ``attention``: it has approvals pushed to an approval surface and not settled yet;
    ``background``: its own running background tasks; ``running``: a turn of its own is running;
    ``tokens``: its own model calls (``None`` when nothing was accounted yet).
    """

    id: str
    title: str
    parent_id: str | None = None
    kind: SessionKind = "owner"
    attention: bool = False
    background: int = 0
    running: bool = False
    tokens: TokenCount | None = None


class TreeFields(msgspec.Struct, frozen=True, kw_only=True):
    root_id: str
    section: Section
    attention: bool
    background: int
    child_count: int
    tokens: TokenCount | None = None
    ancestors: list[AncestorRef] | None = None


def _effective_parents(by_id: dict[str, SessionNode]) -> dict[str, str | None]:
    """Each node's parent, with missing parents and cycles cut (the cut node becomes a root)."""
    parent: dict[str, str | None] = {}
    for start in by_id:
        path: list[str] = []
        on_path: set[str] = set()
        node: str | None = start
        while node is not None and node not in parent and node not in on_path:
            path.append(node)
            on_path.add(node)
            up = by_id[node].parent_id
            node = up if up in by_id and up != node else None
        if node is not None and node in on_path:  # a cycle closes at ``node``: cut it there
            parent[node] = None
        for current in reversed(path):
            if current not in parent:
                up = by_id[current].parent_id
                parent[current] = up if up in by_id and up != current else None
    return parent


def compute_tree_fields(nodes: Iterable[SessionNode]) -> dict[str, TreeFields]:
    """Fold the session tree into the fields computed over it; total: never raises on odd trees.

    * ``attention``: the session or any descendant has an unsettled pushed approval;
    * ``background``: its own running background tasks, plus the number of descendants (at any
      depth) that have a turn running or a background task running -- one per descendant; its own
      turn is ``running``, not background;
    * ``tokens``: own plus all descendants' tokens; ``None`` when none of them has any;
    * ``ancestors``: for a child, its parents from the root down (``None`` for a root);
    * ``child_count``: direct children; ``section``: the root's (``rooms`` for a room root).

    A parent that is not among ``nodes`` makes the node a root; a cycle is cut.
    """
    by_id = {node.id: node for node in nodes}
    parent = _effective_parents(by_id)
    children: dict[str, list[str]] = {node_id: [] for node_id in by_id}
    for node_id, up in parent.items():
        if up is not None:
            children[up].append(node_id)
    # Top-down (breadth first from the roots): each chain extends its parent's, and the
    # AncestorRef Structs are shared, so deep trees cost list copies, not new objects.
    chains: dict[str, list[AncestorRef]] = {node_id: [] for node_id, up in parent.items() if up is None}
    order = list(chains)
    for node_id in order:  # grows while iterating: a breadth-first walk
        if children[node_id]:
            chain = [*chains[node_id], AncestorRef(id=node_id, title=by_id[node_id].title)]
            for child in children[node_id]:
                chains[child] = chain
                order.append(child)
    attention = {node_id: node.attention for node_id, node in by_id.items()}
    busy_below = dict.fromkeys(by_id, 0)
    tokens: dict[str, tuple[int, int] | None] = {
        node_id: (node.tokens.input, node.tokens.output) if node.tokens else None
        for node_id, node in by_id.items()
    }
    for node_id in reversed(order):  # bottom-up: every child before its parent
        up = parent[node_id]
        if up is None:
            continue
        node = by_id[node_id]
        attention[up] = attention[up] or attention[node_id]
        busy_below[up] += busy_below[node_id] + (1 if node.running or node.background > 0 else 0)
        mine, theirs = tokens[up], tokens[node_id]
        if theirs is not None:
            tokens[up] = theirs if mine is None else (mine[0] + theirs[0], mine[1] + theirs[1])
    sections: dict[str, Section] = {
        root: "rooms" if by_id[root].kind == "room" else "owner" for root in by_id if parent[root] is None
    }
    result: dict[str, TreeFields] = {}
    for node_id, node in by_id.items():
        chain = chains[node_id]
        root_id = chain[0].id if chain else node_id
        total = tokens[node_id]
        result[node_id] = TreeFields(
            root_id=root_id,
            section=sections[root_id],
            attention=attention[node_id],
            background=node.background + busy_below[node_id],
            child_count=len(children[node_id]),
            tokens=TokenCount(input=total[0], output=total[1]) if total else None,
            ancestors=list(chain) if chain else None,
        )
    return result


def apply_tree_fields(summary: SessionSummary, fields: TreeFields) -> SessionSummary:
    """``summary`` with its tree-computed fields replaced by ``fields``."""
    return msgspec.structs.replace(
        summary,
        section=fields.section,
        attention=fields.attention,
        background=fields.background,
        child_count=fields.child_count,
        tokens=fields.tokens,
        ancestors=fields.ancestors,
    )


def with_ancestors(changed: Iterable[str], fields: dict[str, TreeFields]) -> list[str]:
    """The changed ids plus all their ancestors, each once (an update carries every ancestor of a change)."""
    seen: dict[str, None] = {}
    for session_id in changed:
        seen.setdefault(session_id)
        known = fields.get(session_id)
        for ref in reversed(known.ancestors or []) if known else ():
            seen.setdefault(ref.id)
    return list(seen)


def completed_unread(section: str, last_reply_at: int | None, seen_at: int | None) -> bool:
    """Unread after a finished reply: an owner-section session whose last reply is later than the owner's last
    ``session/markSeen``; rooms are never unread."""
    if section != "owner" or last_reply_at is None:
        return False
    return seen_at is None or last_reply_at > seen_at


# --- room groups ----------------------------------------------------------------------------------


def _is_root(summary: ListRow, ids: set[str]) -> bool:
    # A parent this identity cannot see counts as absent: nothing becomes unreachable.
    return summary.parent_id is None or summary.parent_id not in ids


def _default_label(platform: str, instance: str | None) -> str:
    return instance if instance is not None else platform


def compute_room_groups(
    summaries: Sequence[ListRow],
    label: Callable[[str, str | None], str] | None = None,
    ids: set[str] | None = None,
) -> list[RoomGroup]:
    """Non-archived rooms grouped by (platform, instance).

    Not affected by section, search or paging. Ordered by platform; within a platform the groups
    with an instance first (by instance id), the instance-less group last. ``label(platform,
    instance)`` names a group (the server gives labels; clients do not look them up).
    """
    if ids is None:
        ids = {s.id for s in summaries}
    groups: dict[tuple[str, str | None], list[ListRow]] = {}
    for s in summaries:
        if s.section == "rooms" and not s.archived and _is_root(s, ids):
            groups.setdefault((s.platform or "", s.instance), []).append(s)
    name = label or _default_label
    ordered = sorted(groups, key=lambda k: (k[0], k[1] is None, k[1] or ""))
    return [
        RoomGroup(
            platform=platform,
            instance=instance,
            label=name(platform, instance),
            rooms=len(groups[(platform, instance)]),
            accounts=len({r.account for r in groups[(platform, instance)] if r.account}),
            attention=sum(1 for r in groups[(platform, instance)] if r.attention),
        )
        for platform, instance in ordered
    ]


# --- search ---------------------------------------------------------------------------------------

_PLATFORM_GROUP: Final = re.compile(r"([^:\s]+):([^:\s]+)")


def _default_terms(summary: SessionSummary) -> Iterable[str]:
    return (summary.id, summary.title)


def _query_matcher(query: str) -> Callable[[Iterable[str]], bool]:
    """Case-insensitive substring on each term; ``platform:group`` also hits
    ``platform:<account>:group:<group>`` (the short form ``platform:group`` is accepted too)."""
    needle = query.strip().casefold()
    pair = _PLATFORM_GROUP.fullmatch(needle)

    def matches(terms: Iterable[str]) -> bool:
        for term in terms:
            folded = term.casefold()
            if needle in folded:
                return True
            if pair is not None:
                parts = folded.split(":")
                if len(parts) >= 4 and parts[0] == pair[1] and parts[-2] == "group" and parts[-1] == pair[2]:
                    return True
        return False

    return matches


# --- sort and pages -------------------------------------------------------------------------------

SortKey = tuple[int, int, int, int, int, int, str]
_CURSOR_VERSION: Final = 1
_CURSOR_DECODER: Final = msgspec.json.Decoder(tuple[Literal[1], int, int, int, int, int, int, str])
_CURSOR_SHAPE: Final = re.compile(r"[A-Za-z0-9_-]{1,2048}")


def sort_key(summary: ListRow, children: bool) -> SortKey:
    """Owner section: attention, error, completed-unread, running first, then newest activity;
    rooms and children: newest activity first; owner section before rooms."""
    newest = -summary.updated_at
    if children or summary.section == "rooms":
        return (0 if children else 1, 0, 0, 0, 0, newest, summary.id)
    return (
        0,
        int(not summary.attention),
        int(not summary.error),
        int(not summary.unread),
        int(not summary.running),
        newest,
        summary.id,
    )


def encode_cursor(key: SortKey) -> str:
    """An opaque cursor: the sort key of the last row of the page, base64url."""
    data = msgspec.json.encode((_CURSOR_VERSION, *key))
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: str) -> SortKey:
    """Raises ``RpcError`` (invalidParams) for anything that is not a cursor we issued."""
    try:
        if not _CURSOR_SHAPE.fullmatch(cursor):
            raise ValueError("shape")
        data = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        _, section, attention, error, unread, running, newest, session_id = _CURSOR_DECODER.decode(data)
    except (ValueError, binascii.Error, msgspec.DecodeError, RecursionError):
        raise RpcError.invalid_params("params.cursor: not a cursor from a previous page") from None
    return (section, attention, error, unread, running, newest, session_id)


# --- the list -------------------------------------------------------------------------------------


def _candidates(summaries: Sequence[Row], params: SessionsListParams, ids: set[str]) -> list[Row]:
    if params.parent_id is not None:  # direct children only; section does not apply
        if params.parent_id not in ids:
            raise RpcError.not_found(f"session {params.parent_id} does not exist", sessionId=params.parent_id)
        return [s for s in summaries if s.parent_id == params.parent_id]
    rows = [s for s in summaries if _is_root(s, ids)]
    if params.section is not None:
        rows = [s for s in rows if s.section == params.section]
    return rows


def _filtered(rows: list[Row], params: SessionsListParams) -> list[Row]:
    if params.instance is not None:  # the rooms this adapter instance took over
        rows = [s for s in rows if s.section == "rooms" and s.instance == params.instance]
    if params.platform is not None:  # the rooms of this platform with no instance recorded yet
        rows = [
            s for s in rows if s.section == "rooms" and s.platform == params.platform and s.instance is None
        ]
    if params.background:  # archived or not, background > 0
        rows = [s for s in rows if s.background > 0]
    elif params.archived:
        rows = [s for s in rows if s.archived]
    else:
        rows = [s for s in rows if not s.archived]
    return rows


def list_sessions(
    summaries: Sequence[Row],
    params: SessionsListParams,
    *,
    search_terms: Callable[[Row], Iterable[str]] | None = None,
    group_label: Callable[[str, str | None], str] | None = None,
    materialize: Callable[[Row], SessionSummary] | None = None,
    key: Callable[[Row, bool], SortKey] = sort_key,
) -> SessionsListResult:
    """Answer ``sessions/list`` over the summaries visible to the caller (tree fields applied).

    ``summaries`` are :class:`SessionSummary` values or lighter rows with the same fields
    (:class:`ListRow`), then ``materialize(row)`` gives the summary of each row of the page;
    ``key`` is :func:`sort_key` or one that remembers it for rows seen before.
    ``search_terms(summary)`` gives the texts ``query`` matches: by default id and title; the
    gateway passes name, title and id but leaves out default names (the default name of an unnamed session
    does not match). Raises :class:`RpcError`: ``not-found`` for an unknown ``parentId``,
    ``invalidParams`` for a bad cursor.

    The page is the ``limit`` smallest sort keys after the cursor (a bounded heap, not a sort of
    every row: the list of 100,000 sessions is answered in time linear in them).
    """
    after = decode_cursor(params.cursor) if params.cursor is not None else None
    ids = {s.id for s in summaries}
    rows = _filtered(_candidates(summaries, params, ids), params)
    if params.query is not None and params.query.strip():
        matches, terms = _query_matcher(params.query), search_terms or _default_terms
        rows = [s for s in rows if matches(terms(s))]  # type: ignore[arg-type]
    children = params.parent_id is not None
    keyed = [(key(s, children), s) for s in rows]
    if after is not None:
        keyed = [pair for pair in keyed if pair[0] > after]
    limit = params.limit or DEFAULT_LIMIT
    page = heapq.nsmallest(limit, keyed, key=itemgetter(0))
    more = len(keyed) > limit
    # without materialize the rows are the summaries themselves (a SessionSummary is a ListRow)
    sessions = [materialize(s) for _, s in page] if materialize is not None else [cast(SessionSummary, s)
                                                                                  for _, s in page]
    return SessionsListResult(
        sessions=sessions,
        groups=compute_room_groups(summaries, group_label, ids),
        next_cursor=encode_cursor(page[-1][0]) if more and page else None,
    )
