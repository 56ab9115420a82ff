"""Projections of a session's events into what the session protocol shows (docs/protocol.md).

A pure projection, a deterministic fold with no I/O, no clock and no randomness, so the
gateway can rebuild it by replaying a session's log and get the same items, ids and pages:

* :class:`ItemsProjection` turns events into timeline items (docs/protocol.md, "Item kinds"): every event
  gives the ``item/started`` / ``item/completed`` pushes it causes, and the projection keeps the
  current items for ``session/subscribe`` snapshots and ``session/history`` pages.

The session summaries live in :mod:`actors.views.summary`.

Theory of operation of the items. The timeline is one list ordered by *ordinal*: the position at
which an item first appeared, which is the order of the events in the log (so "merged by time").
An item is *in flight* while its turn is running and *archived* otherwise; items without a turn
(notices outside turns, imported messages) are archived at once. History pages walk the archived
items backwards from the newest; a snapshot is the newest page plus every in-flight item. A turn's
``turn`` item is pushed when the turn starts, and on its end moves to after the turn's last item,
where history places it: after the last message of that turn that was stored.

Three items are singletons, not timeline entries: ``plan``, ``usage`` and ``queue``, each with its
kind as its fixed itemId. They are kept apart and replaced whole.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import Any, Final, Literal, cast

import msgspec
from msgspec import UNSET

from sessionloop.actors import events as E
from sessionloop.actors.approvals.grants import Grant
from sessionloop.actors.errors import NotFound, compact_error
from sessionloop.actors.session.context import is_summary, summary_text
from sessionloop.actors.settings.texts import Text, denial_reason
from sessionloop.protocol.limits import one_line
from sessionloop.protocol.schemas_types import (
    AgentMessageItem,
    AgentModel,
    ApprovalGrant,
    ApprovalSettlement,
    CommandDisplay,
    FileChangeDisplay,
    GrantTerms,
    ItemAttachment,
    NoticeItem,
    PlanEntry,
    PlanItem,
    QueueEntry,
    QueueItem,
    ReasoningItem,
    SessionItem,
    Speaker,
    ToolCallItem,
    ToolDisplay,
    TurnItem,
    TurnOutcome,
    Undelivered,
    UsageItem,
    UsagePart,
    UserMessageItem,
)

__all__ = [
    "attempt_item_id",
    "HISTORY_DEFAULT_LIMIT",
    "HISTORY_MAX_LIMIT",
    "ItemsProjection",
    "Page",
    "Push",
    "PushMethod",
    "retry_discarded",
]

HISTORY_DEFAULT_LIMIT: Final = 100  # session/history: limit defaults to 100, at most 200
HISTORY_MAX_LIMIT: Final = 200

PushMethod = Literal["item/started", "item/completed"]
Push = tuple[PushMethod, SessionItem]
#: a page of items and the cursor of the next older page (None when there is nothing older)
Page = tuple[list[SessionItem], str | None]

STARTED: Final = "item/started"
COMPLETED: Final = "item/completed"

# Human-facing texts: text objects, rendered in the server's language when a frame is sent
# (actors.settings.texts; ``en`` by default, ``zh`` supported). Those without values are shared.
TEXT_SUMMARY_MARKER: Final = Text("notice.summary-marker")
TEXT_BEFORE_TOOL: Final = Text("undelivered.before-tool")
TEXT_NO_REPLY: Final = Text("undelivered.no-reply")
LABEL_CONTEXT: Final = Text("usage.context")
LABEL_REPLY: Final = Text("usage.reply")


def retry_discarded(cause: str) -> Text:
    """The ``undelivered.reason`` of an agent message a retry dropped (the version the retry replaced);
    ``cause`` is raw (the provider's status or error)."""
    return Text("undelivered.retry-discarded", cause=cause)

_MESSAGE_KINDS: Final = (UserMessageItem, AgentMessageItem, NoticeItem)
_ATTACHMENT_KINDS: Final = frozenset({"image", "audio", "video", "file"})
_TERMINAL: Final = frozenset({"completed", "failed", "denied", "aborted"})


# --- conversions from event shapes to wire shapes ---------------------------------------------------


def _speaker(speaker: E.Speaker | None, source: str | None = None) -> Speaker | None:
    """The wire speaker; ``source`` is the input's injection source (a person's own message has none)."""
    if speaker is None:
        return None
    return Speaker(
        platform=speaker.platform,
        owner=speaker.owner,
        user_id=speaker.user_id,
        nickname=speaker.nickname,
        source=source,
    )


def _attachment(ref: E.AttachmentRef) -> ItemAttachment:
    """``src`` is ``blob:<sha256>``, an internal reference the gateway replaces by a signed,
    epoch-bound download handle before anything leaves the server (docs/protocol.md, "Transport")."""
    kind = ref.kind if ref.kind in _ATTACHMENT_KINDS else "file"
    return ItemAttachment(kind=cast(Literal["image", "audio", "video", "file"], kind), name=ref.name,
                          src=f"blob:{ref.sha256}")


def _display(display: E.ToolDisplay | None, exit_code: int | None = None) -> ToolDisplay | None:
    """A tool card's display: none when the command or path is not a string; the exit code only
    once the call ended (``exit_code`` comes from the finished call)."""
    if display is None:
        return None
    if display.kind == "command":
        if not isinstance(display.command, str):
            return None
        return CommandDisplay(command=display.command, cwd=display.cwd, exit_code=exit_code, sandbox=display.sandbox)
    if not isinstance(display.path, str):
        return None
    return FileChangeDisplay(path=display.path, removed=display.removed, added=display.added)


def _settlement(settlement: E.Settlement | None) -> ApprovalSettlement | None:
    return None if settlement is None else wire_settlement(settlement)


def wire_settlement(s: E.Settlement) -> ApprovalSettlement:
    """The wire settlement (the tool card's, ``approval/settled``'s), with a grant it made or used."""
    grant = wire_terms(s.grant) if s.grant is not None else None
    return ApprovalSettlement(state=s.state, source=s.source, at=s.at, by=_speaker(s.by), grant=grant,
                              grant_id=s.grant_id)


def wire_terms(terms: E.GrantTerms) -> GrantTerms:
    return GrantTerms(scope=terms.scope, tool=terms.tool, command_prefix=terms.command_prefix,
                      expires_at=terms.expires_at)


def wire_grant(session_id: str, g: Grant) -> ApprovalGrant:
    """A grant as ``approval/grants/list`` shows it."""
    return ApprovalGrant(id=g.id, session_id=session_id, decision=g.decision, terms=wire_terms(g.terms),
                         turn_id=g.turn_id, at=g.at, by=_speaker(g.by))


def _failed_result(output: Any, exit_code: int | None) -> bool:
    """A finished call is ``failed`` when its result is a JSON object with ``error``, or its exit code is not 0."""
    return (isinstance(output, dict) and "error" in output) or (exit_code is not None and exit_code != 0)


def _decoded_result(content: str) -> Any:
    """A stored tool message's content back to JSON when it is JSON (the fold encodes non-strings)."""
    if content[:1] in ("{", "["):
        try:
            return msgspec.json.decode(content)
        except msgspec.DecodeError:
            return content
    return content


def _unique(existing: Callable[[str], bool], base: str) -> str:
    """A deterministic id: ``base``, or ``base.2``, ``base.3`` ... when taken."""
    if not existing(base):
        return base
    n = 2
    while existing(f"{base}.{n}"):
        n += 1
    return f"{base}.{n}"


def clamp_history_limit(limit: int | None) -> int:
    """A ``session/history`` limit: 100 when not given, at most 200 (and at least one message)."""
    if limit is None:
        return HISTORY_DEFAULT_LIMIT
    return max(1, min(limit, HISTORY_MAX_LIMIT))


# --- items --------------------------------------------------------------------------------------------


class _TurnView(msgspec.Struct, kw_only=True):
    """What the items projection remembers of one turn."""

    turn_id: str
    source: str | None = None
    started_at: int = 0
    live: bool = True
    first: int | None = None  # ordinal of its first item: where its in-flight range starts
    calls: list[str] = []
    messages: list[str] = []  # agent-message item ids, in order
    completion_tokens: int = 0


class ItemsProjection:
    """A session's timeline items as a deterministic fold of its events.

    Feed every event of the session, in log order, to :meth:`apply`; it returns the pushes the
    event causes. The same events always give the same pushes, items and pages. ``apply`` never
    raises on odd input (an event about a call or turn it never saw is projected as well as it can
    be, or ignored), so a damaged log never stops a subscription.
    """

    def __init__(self, session_id: str = "", *, context_window: int | None = None) -> None:
        self.session_id = session_id
        #: the model's context window, when known, gives ``usage.usageRatio`` and ``contextWindow``
        self.context_window = context_window
        self._keys: list[int] = []  # ordinals, ascending; parallel to _items
        self._items: list[SessionItem] = []
        self._ordinal: dict[str, int] = {}
        self._next = 0
        self._turns: dict[str, _TurnView] = {}
        self._turn_order: list[str] = []
        self._inputs: dict[str, E.InputAccepted] = {}  # the queue, in FIFO order
        #: turn id -> the text of the host notice that opens it (a background task's end): its
        #: input is the agent's; the queue shows the notice's text, as the notice item does
        self._notice_turns: dict[str, str] = {}
        self._call_args: dict[str, Any] = {}
        self._answer_ids: dict[str, str] = {}  # step id -> the item its answer streams as (after a retry)
        self._displays: dict[str, E.ToolDisplay | None] = {}
        self._ended_by_turn: set[str] = set()  # calls closed by their turn's end
        self._room = False
        self._plan: PlanItem | None = None
        self._usage: UsageItem | None = None
        self._queue: QueueItem | None = None
        self._handlers: dict[type, Callable[[Any], list[Push]]] = {
            E.SessionCreated: self._created,
            E.SessionDeleted: self._deleted,
            E.MessagesImported: self._imported,
            E.InputAccepted: self._input,
            E.InputDropped: self._input_dropped,
            E.TurnStarted: self._turn_started,
            E.TurnCompleted: self._turn_completed,
            E.TurnFailed: self._turn_failed,
            E.TurnAborted: self._turn_aborted,
            E.TurnLimitReached: self._turn_limit,
            E.LlmCompleted: self._llm_completed,
            E.LlmRetried: self._llm_retried,
            E.ToolStarted: self._tool_started,
            E.ToolFinished: self._tool_finished,
            E.ToolApprovalRequested: self._approval_requested,
            E.ToolApprovalSettled: self._approval_settled,
            E.NoticePosted: self._notice,
            E.PlanUpdated: self._plan_updated,
            E.PlanCleared: self._plan_cleared,
            E.ContextCompacted: self._compacted,
            E.ContextCompactFailed: self._compact_failed,
            E.TurnRewound: self._rewound,
        }

    # --- public reading API -------------------------------------------------------------------------

    def apply(self, event: E.Event | E.UnknownEvent) -> list[Push]:
        """Fold one event; returns the pushes it causes, in order. Unknown events give none."""
        handler = self._handlers.get(type(event))
        return handler(event) if handler is not None else []

    def apply_all(self, events: Iterable[E.Event | E.UnknownEvent]) -> list[Push]:
        """Fold many events (replay); returns all their pushes."""
        pushes: list[Push] = []
        for event in events:
            pushes.extend(self.apply(event))
        return pushes

    def items(self) -> list[SessionItem]:
        """Every current timeline item, archived and in flight, in timeline order."""
        return list(self._items)

    def item(self, item_id: str) -> SessionItem | None:
        """The current copy of one timeline item, or None."""
        pos = self._position(item_id)
        return None if pos is None else self._items[pos]

    def plan_item(self) -> PlanItem | None:
        """The current plan; None when there is none (an empty plan is no plan)."""
        return self._plan if self._plan is not None and self._plan.entries else None

    def usage_item(self) -> UsageItem | None:
        """The latest usage; None before the first model call that reported tokens."""
        return self._usage

    def queue_item(self) -> QueueItem | None:
        """The inputs waiting for a turn; None when empty (a snapshot leaves an empty queue out)."""
        return self._queue if self._queue is not None and self._queue.entries else None

    def in_flight(self) -> bool:
        """Whether a turn is running (its items are not in history yet)."""
        return any(view.live for view in self._turns.values())

    def history_page(self, before: str | None = None, limit: int | None = None) -> Page:
        """One ``session/history`` page: archived items older than ``before``.

        ``limit`` counts messages (user messages, agent messages and notices: the archive's
        messages), default 100, max 200; tool calls, reasoning and turn items ride along with them.
        A turn's tool-call group is never split across pages, so a page may hold more messages
        than ``limit``. Returns ``(items, before)``; ``before`` is the opaque cursor of the next
        older page (the id of this page's first item), None when there is nothing older.

        Raises :class:`NotFound` when ``before`` no longer names an archived item (removed by a
        rewind, or never issued): ``session/history`` then answers ``not-found``.
        """
        end = len(self._items)
        if before is not None:
            pos = self._position(before)
            if pos is None or not self._archived(self._items[pos]):
                raise NotFound(Text("error.history-cursor", cursor=repr(before)), before=before)
            end = pos
        start = self._page_start(end, clamp_history_limit(limit))
        page = [item for item in self._items[start:end] if self._archived(item)]
        return page, self._cursor(start)

    def snapshot_items(self, limit: int | None = None, *, singletons: bool = True) -> Page:
        """The items of a ``session/subscribe`` snapshot and its ``before`` cursor.

        The newest history page plus every item of the turn in flight, merged in timeline order
        (things said during the turn stay between its items); then, with ``singletons``, the
        current plan, usage and queue when there are any.
        """
        end = len(self._items)
        start = self._page_start(end, clamp_history_limit(limit))
        low = min([start, *self._live_starts()])
        items = [
            item
            for pos, item in enumerate(self._items[low:end], start=low)
            if pos >= start or not self._archived(item)
        ]
        if singletons:
            items.extend(x for x in (self.plan_item(), self.usage_item(), self.queue_item()) if x is not None)
        return items, self._cursor(start)

    # --- the ordered store ------------------------------------------------------------------------

    def _position(self, item_id: str) -> int | None:
        ordinal = self._ordinal.get(item_id)
        if ordinal is None:
            return None
        pos = bisect_left(self._keys, ordinal)
        return pos if pos < len(self._keys) and self._keys[pos] == ordinal else None

    def _put(self, item: SessionItem) -> SessionItem:
        """Insert a new item at the end, or replace the item with the same id in place."""
        pos = self._position(item.item_id)
        if pos is None:
            view = self._turns.get(item.turn_id) if item.turn_id is not None else None
            if view is not None and view.first is None:
                view.first = self._next
            self._ordinal[item.item_id] = self._next
            self._keys.append(self._next)
            self._items.append(item)
            self._next += 1
        else:
            self._items[pos] = item
        return item

    def _move_to_end(self, item_id: str) -> None:
        pos = self._position(item_id)
        if pos is None:
            return
        item = self._items.pop(pos)
        del self._keys[pos]
        del self._ordinal[item_id]
        self._put(item)

    def _remove(self, gone: Callable[[SessionItem], bool]) -> None:
        keep = [(key, item) for key, item in zip(self._keys, self._items, strict=True) if not gone(item)]
        for item in self._items:
            if gone(item):
                self._ordinal.pop(item.item_id, None)
        self._keys = [key for key, _ in keep]
        self._items = [item for _, item in keep]

    def _archived(self, item: SessionItem) -> bool:
        view = self._turns.get(item.turn_id) if item.turn_id is not None else None
        return view is None or not view.live

    def _live_starts(self) -> list[int]:
        """Positions of the first item of each running turn."""
        # bisect: the first item may be gone (moved turn item), the next one then starts the range
        return [bisect_left(self._keys, view.first) for view in self._turns.values()
                if view.live and view.first is not None]

    # --- pages ------------------------------------------------------------------------------------

    def _is_message(self, pos: int) -> bool:
        item = self._items[pos]
        return isinstance(item, _MESSAGE_KINDS) and self._archived(item)

    def _page_start(self, end: int, limit: int) -> int:
        """Where the page of ``limit`` archived messages ending before ``end`` starts."""
        count, pos = 0, end
        while pos > 0:
            pos -= 1
            if self._is_message(pos):
                count += 1
                if count == limit:
                    break
        else:
            return 0
        start = self._keep_tool_group(self._with_reasoning(pos))
        return start if self._message_before(start) else 0  # leading odd items join the oldest page

    def _with_reasoning(self, pos: int) -> int:
        """A message's page also takes the reasoning of its model call, just before it."""
        item = self._items[pos]
        if pos > 0 and isinstance(item, AgentMessageItem):
            prev = self._items[pos - 1]
            if isinstance(prev, ReasoningItem) and prev.item_id == _reasoning_id(item.item_id):
                return pos - 1
        return pos

    def _keep_tool_group(self, start: int) -> int:
        """A turn's tool-call group is never split across two pages: when ``start`` falls between the
        first and the last tool call of one turn, the page grows back to the message before the first
        call."""
        turn_id = self._items[start].turn_id
        if turn_id is None or not self._tool_call_from(start, turn_id):
            return start
        first_call: int | None = None
        pos = start - 1
        while pos >= 0 and self._items[pos].turn_id in (turn_id, None):
            if isinstance(self._items[pos], ToolCallItem) and self._items[pos].turn_id == turn_id:
                first_call = pos
            pos -= 1
        if first_call is None:
            return start
        pos = first_call - 1
        while pos >= 0 and self._items[pos].turn_id in (turn_id, None):
            if self._is_message(pos) and self._items[pos].turn_id == turn_id:
                return self._with_reasoning(pos)
            pos -= 1
        return first_call

    def _tool_call_from(self, start: int, turn_id: str) -> bool:
        pos = start
        while pos < len(self._items) and self._items[pos].turn_id in (turn_id, None):
            if isinstance(self._items[pos], ToolCallItem) and self._items[pos].turn_id == turn_id:
                return True
            pos += 1
        return False

    def _message_before(self, start: int) -> bool:
        return any(self._is_message(pos) for pos in range(start - 1, -1, -1))

    def _cursor(self, start: int) -> str | None:
        if start < len(self._items) and any(self._archived(self._items[p]) for p in range(start - 1, -1, -1)):
            return self._items[start].item_id
        return None

    # --- session and fork -------------------------------------------------------------------------

    def _created(self, e: E.SessionCreated) -> list[Push]:
        # An agent message is marked undelivered in rooms only (a room's child has no window).
        self._room = e.kind == "room"
        return []

    def _deleted(self, e: E.SessionDeleted) -> list[Push]:
        """The history is gone for every reader; nothing is pushed (the gateway drops the session)."""
        self._keys, self._items, self._ordinal = [], [], {}
        self._inputs.clear()
        self._notice_turns.clear()
        self._plan = self._usage = self._queue = None
        return []

    def _imported(self, e: E.MessagesImported) -> list[Push]:
        """A fork's copied messages, as archived items, by the rules of history: calls without a
        result are aborted, a summary is an ``event-marker`` notice."""
        results = {m.tool_call_id: m for m in e.messages if m.role == "tool" and m.tool_call_id}
        pushes: list[Push] = []
        for index, message in enumerate(e.messages):
            for item in _imported_items(f"fork.{index}", message, results, e.at):
                pushes.append(self._done(item))
        return pushes

    # --- inputs and the queue -----------------------------------------------------------------------

    def _queue_push(self, at: int) -> list[Push]:
        """The queue item: the waiting inputs, replaced whole, itemId ``queue``."""
        entries = [
            QueueEntry(text=self._notice_turns.get(i.turn_id, i.text), attachments=len(i.attachments),
                       speaker=_speaker(i.speaker, i.source))
            for i in self._inputs.values()
        ]
        self._queue = QueueItem(item_id="queue", at=at, entries=entries)
        return [(COMPLETED, self._queue)]

    def _input(self, e: E.InputAccepted) -> list[Push]:
        self._inputs[e.input_id] = e
        return self._queue_push(e.at)

    def _input_dropped(self, e: E.InputDropped) -> list[Push]:
        if self._inputs.pop(e.input_id, None) is None:
            return []
        return self._queue_push(e.at)

    # --- turns ------------------------------------------------------------------------------------

    def _turn_started(self, e: E.TurnStarted) -> list[Push]:
        """The turn's inputs leave the queue and appear as its user messages (entry ``opened``),
        then the turn item starts (its ``source`` is the source of the input that opened the turn)."""
        view = self._turns.get(e.turn_id)
        if view is None:
            view = self._turns[e.turn_id] = _TurnView(turn_id=e.turn_id)
            self._turn_order.append(e.turn_id)
        view.source, view.started_at, view.live = e.source, e.at, True
        pushes: list[Push] = [(STARTED, self._put(TurnItem(item_id=e.turn_id, at=e.at, turn_id=e.turn_id,
                                                           source=e.source)))]
        taken = [self._inputs.pop(i) for i in e.input_ids if i in self._inputs]
        opened_by_notice = self._notice_turns.pop(e.turn_id, None) is not None
        for i in taken:
            if i.source == "continue":  # turn/continue adds no user message (session_model, the fold)
                continue
            if opened_by_notice:  # the notice is the turn's entry; its input is text for the model
                continue
            pushes.append(self._done(UserMessageItem(
                item_id=i.input_id, at=i.at, turn_id=e.turn_id, text=i.text,
                attachments=[_attachment(a) for a in i.attachments], speaker=_speaker(i.speaker, i.source),
                entry="opened",
            )))
        # Pushes go in this order: the inputs, then the turn, then the queue; but the turn item must
        # sit first in the timeline so the turn's in-flight range starts at it.
        pushes = pushes[1:] + pushes[:1]
        if taken:
            pushes.extend(self._queue_push(e.at))
        return pushes

    def _end_turn(self, turn_id: str, at: int, outcome: TurnOutcome, *, stopped: bool, reason: str | None = None,
                  step_id: str | None = None) -> list[Push]:
        """Close the turn's unfinished calls, mark unsent room words, then complete the turn item."""
        view = self._turns.get(turn_id)
        if view is None:
            return []
        pushes = self._close_calls(view, stopped=stopped)
        if outcome != "replied":
            pushes.extend(self._mark_unsent_reply(view))
        view.live = False
        self._move_to_end(turn_id)
        turn = TurnItem(item_id=turn_id, at=view.started_at or at, turn_id=turn_id, source=view.source,
                        outcome=outcome, ended_at=at, reason=reason, step_id=step_id)
        pushes.append(self._done(turn))
        return pushes

    def _close_calls(self, view: _TurnView, *, stopped: bool) -> list[Push]:
        """Tool calls at turn end. Stopped turn: every unfinished call is ``aborted`` (also
        the generated, never executed ones). Otherwise (limit, error): a call generated but never
        executed is ``failed`` with ``notExecuted`` and no result; a call that was running has no
        result and was interrupted, which history shows as ``aborted`` (a call with no result)."""
        pushes: list[Push] = []
        for call_id in view.calls:
            item = self.item(call_id)
            if not isinstance(item, ToolCallItem) or item.status in _TERMINAL:
                continue
            if stopped or item.status == "running":
                closed = msgspec.structs.replace(item, status="aborted")
            else:
                closed = msgspec.structs.replace(item, status="failed", not_executed=True, result=UNSET,
                                                 args=self._call_args.get(call_id, UNSET))
            self._ended_by_turn.add(call_id)
            pushes.append(self._done(closed))
        return pushes

    def _mark_unsent_reply(self, view: _TurnView) -> list[Push]:
        """Undelivered: in a room, what she said after the last tool call of a turn that
        ended without a reply (silent, aborted, error) was never sent."""
        if not self._room or not view.messages:
            return []
        item = self.item(view.messages[-1])
        if not isinstance(item, AgentMessageItem) or item.undelivered is not None:
            return []
        return [self._done(msgspec.structs.replace(item, undelivered=Undelivered(reason=TEXT_NO_REPLY)))]

    def _turn_completed(self, e: E.TurnCompleted) -> list[Push]:
        return self._end_turn(e.turn_id, e.at, e.outcome, stopped=False)

    def _turn_failed(self, e: E.TurnFailed) -> list[Push]:
        return self._end_turn(e.turn_id, e.at, "error", stopped=False, reason=one_line(e.reason or e.code),
                              step_id=e.step_id)

    def _turn_aborted(self, e: E.TurnAborted) -> list[Push]:
        return self._end_turn(e.turn_id, e.at, "aborted", stopped=True)

    def _turn_limit(self, e: E.TurnLimitReached) -> list[Push]:
        # No outcome of its own: a turn's outcomes are replied/silent/aborted/error; the
        # ``tool-limit`` notice (with canContinue) is posted by the session as notice.posted.
        return self._end_turn(e.turn_id, e.at, "silent", stopped=False)

    def _rewound(self, e: E.TurnRewound) -> list[Push]:
        """``code-and-chat``: the items of that turn and later ones disappear; no pushes, the
        caller sends ``session/resync`` (the history was rewritten). ``code`` only leaves the timeline alone."""
        if not e.chat_deleted or e.turn_id not in self._turn_order:
            return []
        index = self._turn_order.index(e.turn_id)
        gone = set(self._turn_order[index:])
        self._remove(lambda item: item.turn_id in gone)
        for turn_id in gone:
            for call_id in self._turns.pop(turn_id).calls:
                self._call_args.pop(call_id, None)
                self._displays.pop(call_id, None)
                self._ended_by_turn.discard(call_id)
        self._turn_order = self._turn_order[:index]
        return []

    # --- model calls and tools ----------------------------------------------------------------------

    def _view(self, turn_id: str) -> _TurnView:
        view = self._turns.get(turn_id)
        if view is None:  # a step of a turn we never saw start (damaged log): keep it archived
            view = self._turns[turn_id] = _TurnView(turn_id=turn_id, live=False)
            self._turn_order.append(turn_id)
        return view

    def _llm_retried(self, e: E.LlmRetried) -> list[Push]:
        """A retry pushes nothing here: the discarded attempt's items were live only (their
        ``item/completed`` is pushed by the streaming session, see ``actors/session/stream_sink.py``).
        It names the item the answer streams as from now on, so the committed answer replaces
        the streamed one by itemId (``item/completed`` is the canonical copy and replaces by itemId)."""
        if e.next_item_id:
            self._answer_ids[e.step_id] = e.next_item_id
        return []

    def _llm_completed(self, e: E.LlmCompleted) -> list[Push]:
        """Reasoning, the agent message (itemId = step id, or the item a retry named) and the
        generated tool calls (status ``generating``, no args yet), then the
        usage item."""
        view = self._view(e.turn_id)
        view.completion_tokens += e.usage.completion_tokens
        item_id = self._answer_ids.pop(e.step_id, e.step_id)
        pushes: list[Push] = []
        if e.reasoning:
            reasoning = ReasoningItem(item_id=_reasoning_id(item_id), at=e.at, turn_id=e.turn_id,
                                      text=e.reasoning)
            pushes.append(self._done(reasoning))
        if e.text:
            pushes.append(self._done(self._agent_message(e, view, item_id)))
        for call in e.tool_calls:
            self._call_args[call.call_id] = call.args
            if call.call_id not in view.calls:
                view.calls.append(call.call_id)
            item = ToolCallItem(item_id=call.call_id, at=e.at, turn_id=e.turn_id, tool=call.name,
                                status="generating")
            pushes.append((STARTED, self._put(item)))
        pushes.extend(self._usage_push(e))
        return pushes

    def _agent_message(self, e: E.LlmCompleted, view: _TurnView, item_id: str) -> AgentMessageItem:
        """An agent message's ``model``: promptTokens of this call (the turn's latest context) and
        completionTokens summed over the turn so far; no tokens when the provider reported none."""
        reported = e.usage.prompt_tokens or e.usage.completion_tokens
        model = AgentModel(
            provider=e.provider or None,
            model=e.model or None,
            prompt_tokens=e.usage.prompt_tokens if reported else None,
            completion_tokens=view.completion_tokens if reported else None,
        )
        undelivered = Undelivered(reason=TEXT_BEFORE_TOOL) if self._room and e.tool_calls else None
        view.messages.append(item_id)
        return AgentMessageItem(item_id=item_id, at=e.at, turn_id=e.turn_id, text=e.text,
                                model=model, undelivered=undelivered)

    def _usage_push(self, e: E.LlmCompleted) -> list[Push]:
        """The usage item: the latest call's tokens, replaced whole, itemId ``usage``."""
        prompt, completion = e.usage.prompt_tokens, e.usage.completion_tokens
        if not prompt and not completion:
            return []
        return self._set_usage(e.at, [UsagePart(label=LABEL_CONTEXT, tokens=prompt),
                                      UsagePart(label=LABEL_REPLY, tokens=completion)])

    def _set_usage(self, at: int, parts: list[UsagePart]) -> list[Push]:
        """The usage item, replaced whole: its parts, their total and its share of the window."""
        self._usage = self._usage_item(at, parts)
        return [(COMPLETED, self._usage)]

    def _usage_item(self, at: int, parts: list[UsagePart]) -> UsageItem:
        tokens = sum(part.tokens for part in parts)
        window = self.context_window
        return UsageItem(item_id="usage", at=at, parts=parts, tokens=tokens, context_window=window,
                         usage_ratio=tokens / window if window else None)

    def estimated_usage(self, at: int, context_tokens: int) -> UsageItem:
        """A usage item for a session no model call has reported on yet (when a snapshot has no usage
        yet, the agent estimates one after it, sent as a push): the context its next model call would
        get. Not kept here: the projection stays a fold of the log (a live push, like a delta)."""
        return self._usage_item(at, [UsagePart(label=LABEL_CONTEXT, tokens=context_tokens)])

    def _call(self, turn_id: str, call_id: str, tool: str, at: int) -> ToolCallItem:
        """The current card of a call, created when the log never showed it being generated."""
        item = self.item(call_id)
        if isinstance(item, ToolCallItem):
            return item
        view = self._view(turn_id)
        if call_id not in view.calls:
            view.calls.append(call_id)
        return ToolCallItem(item_id=call_id, at=at, turn_id=turn_id, tool=tool, status="generating")

    def _tool_started(self, e: E.ToolStarted) -> list[Push]:
        """When the call starts to run, the same itemId turns ``running``, with args and display."""
        item = self._call(e.turn_id, e.call_id, e.tool, e.at)
        if e.call_id in self._ended_by_turn:
            return []
        self._call_args[e.call_id] = e.args
        running = msgspec.structs.replace(item, tool=e.tool, status="running", args=e.args,
                                          display=_display(e.display))
        self._displays[e.call_id] = e.display
        return [(STARTED, self._put(running))]

    def _tool_finished(self, e: E.ToolFinished) -> list[Push]:
        """The final card. A call its turn's stop already closed stays ``aborted``, even when the tool
        returns a result after the stop."""
        if e.call_id in self._ended_by_turn:
            return []
        item = self._call(e.turn_id, e.call_id, "?", e.at)
        status = e.status
        if status == "completed" and _failed_result(e.output, e.exit_code):
            status = "failed"
        denied = status == "denied" and e.settlement is not None
        done = msgspec.structs.replace(
            item,
            status=status,
            reason=denial_reason(e.settlement) if denied else item.reason,
            args=self._call_args.get(e.call_id, item.args),
            result=UNSET if e.not_executed else e.output,
            duration_ms=e.duration_ms or None,
            display=_display(self._displays.get(e.call_id), e.exit_code),
            task_id=e.task_id,
            not_executed=e.not_executed,
            approval_id=e.approval_id or item.approval_id,
            settlement=_settlement(e.settlement) or item.settlement,
        )
        return [self._done(done)]

    def _approval_requested(self, e: E.ToolApprovalRequested) -> list[Push]:
        """A call whose approval was requested carries ``approvalId`` (``item/started`` is pushed again)."""
        item = self._call(e.turn_id, e.call_id, "?", e.at)
        if item.status in _TERMINAL:
            return [self._done(msgspec.structs.replace(item, approval_id=e.approval_id))]
        return [(STARTED, self._put(msgspec.structs.replace(item, approval_id=e.approval_id)))]

    def _approval_settled(self, e: E.ToolApprovalSettled) -> list[Push]:
        """Once settled the call carries ``approvalId`` and ``settlement`` (pushed again); not approved
        -> ``denied``, and the card is final (completed); approved -> the call goes on (started again, then running)."""
        item = self._call(e.turn_id, e.call_id, "?", e.at)
        settlement = _settlement(e.settlement)
        settled = msgspec.structs.replace(item, approval_id=e.approval_id, settlement=settlement)
        if item.status in _TERMINAL:
            return [self._done(settled)]
        if e.settlement.state != "approved":
            return [self._done(msgspec.structs.replace(settled, status="denied", reason=denial_reason(e.settlement)))]
        return [(STARTED, self._put(settled))]

    # --- notices, plan, compression ------------------------------------------------------------------

    def _notice(self, e: E.NoticePosted) -> list[Push]:
        """A notice item: topic, text, noticeId, facts, canContinue (tool-limit); a notice that
        opened a turn carries ``entry: opened``."""
        text = Text.stored(e.text, e.text_key, e.text_values)
        if e.turn_id is not None and e.starts_turn and e.turn_id not in self._turns:
            self._turns[e.turn_id] = _TurnView(turn_id=e.turn_id, started_at=e.at)
            self._turn_order.append(e.turn_id)
            self._notice_turns[e.turn_id] = text
        item = NoticeItem(
            item_id=e.notice_id,
            at=e.at,
            turn_id=e.turn_id,
            topic=e.topic,
            text=text,
            notice_id=e.notice_id,
            facts=e.facts if e.facts else UNSET,
            can_continue=True if e.can_continue else None,
            entry="opened" if e.starts_turn and e.turn_id is not None else None,
        )
        return [self._done(item)]

    def _compress_notice(self, at: int, turn_id: str | None, text: str, facts: dict[str, Any]) -> list[Push]:
        """The notice of topic ``compress``; the event has no id, so one is made from its time
        (deterministic on replay)."""
        item_id = _unique(lambda candidate: candidate in self._ordinal, f"compress.{at}")
        return [self._done(NoticeItem(item_id=item_id, at=at, turn_id=turn_id, topic="compress", text=text,
                                      facts=facts))]

    def _compacted(self, e: E.ContextCompacted) -> list[Push]:
        """The compress notice, then the latest usage (``session/compress`` pushes it after compacting):
        the context the next model call gets, as the compaction estimated it."""
        pushes = self._compress_notice(e.at, e.turn_id, Text("notice.compressed", turns=e.turns),
                                       {"turns": e.turns, "chars": e.chars, "auto": e.auto})
        if e.context_tokens:
            pushes += self._set_usage(e.at, [UsagePart(label=LABEL_CONTEXT, tokens=e.context_tokens)])
        return pushes

    def _compact_failed(self, e: E.ContextCompactFailed) -> list[Push]:
        return self._compress_notice(e.at, e.turn_id, Text("notice.compress-failed", error=compact_error(e)),
                                     {"error": e.error, "auto": e.auto, "failed": True})

    def _plan_updated(self, e: E.PlanUpdated) -> list[Push]:
        """The plan item: replaced whole, itemId ``plan``."""
        entries = [PlanEntry(text=p.text, status=p.status) for p in e.entries]
        self._plan = PlanItem(item_id="plan", at=e.at, entries=entries)
        return [(COMPLETED, self._plan)]

    def _plan_cleared(self, e: E.PlanCleared) -> list[Push]:
        """An empty plan tells subscribers to drop it; snapshots then carry no plan."""
        self._plan = PlanItem(item_id="plan", at=e.at, entries=[])
        return [(COMPLETED, self._plan)]

    def _done(self, item: SessionItem) -> Push:
        return (COMPLETED, self._put(item))


def _reasoning_id(step_id: str) -> str:
    # Same suffix as the fold's thinking step (session_model: ``<step>.thinking``).
    return f"{step_id}.thinking"


def attempt_item_id(step_id: str, attempt: int) -> str:
    """The item a model step's answer streams as in its ``attempt`` (1: the step id itself; a
    later attempt after one that had streamed gets a fresh id, ``<step>.a<attempt>``)."""
    return step_id if attempt <= 1 else f"{step_id}.a{attempt}"


def _imported_items(
    item_id: str, message: E.Message, results: dict[str, E.Message], at: int
) -> list[SessionItem]:
    """The items of one copied message; system prompts and tool results give none of their own."""
    turn_id = message.turn_id
    if message.role == "user":
        return [UserMessageItem(item_id=item_id, at=at, turn_id=turn_id, text=message.content)]
    if message.role == "system" and is_summary(message):
        return [NoticeItem(item_id=item_id, at=at, topic="event-marker", text=TEXT_SUMMARY_MARKER,
                           facts={"summary": summary_text(message)})]
    if message.role != "assistant":
        return []
    items: list[SessionItem] = []
    if message.content:
        items.append(AgentMessageItem(item_id=item_id, at=at, turn_id=turn_id, text=message.content))
    items.extend(_imported_call(c, turn_id, results.get(c.call_id), at) for c in message.tool_calls)
    return items


def _imported_call(
    call: E.ToolCallSpec, turn_id: str | None, result: E.Message | None, at: int
) -> ToolCallItem:
    """A forked call's card: completed/failed from its copied result, ``aborted`` without one."""
    if result is None:
        return ToolCallItem(item_id=call.call_id, at=at, turn_id=turn_id, tool=call.name, status="aborted",
                            args=call.args)
    output = _decoded_result(result.content)
    status: Literal["completed", "failed"] = "failed" if _failed_result(output, None) else "completed"
    return ToolCallItem(item_id=call.call_id, at=at, turn_id=turn_id, tool=call.name, status=status,
                        args=call.args, result=output)
