"""Projections of a session's events into what the session protocol shows (docs/protocol.md).

A pure projection, a deterministic fold with no I/O, no clock and no randomness, so the
gateway can rebuild it by replaying a session's log and get the same items, ids and pages:

* :class:`ItemsProjection` turns events into timeline items (docs/protocol.md, "Item kinds"): every event
  gives the ``item/started`` / ``item/completed`` pushes it causes, and the projection keeps the
  current items for ``session/subscribe`` snapshots and ``session/history`` pages.

The session summaries live in :mod:`actors.views.summary`; the ordered store of the items and its
pages in :mod:`actors.views.timeline`; the conversions from event shapes to wire shapes (speakers,
attachments, tool displays, settlements, a fork's copied messages) in :mod:`actors.views.wire`.

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

from collections.abc import Callable, Iterable
from typing import Any, Final, Literal

import msgspec
from msgspec import UNSET

from sessionloop.actors import events as E
from sessionloop.actors.errors import compact_error
from sessionloop.actors.settings.texts import Text, denial_reason
from sessionloop.actors.views.timeline import Page, Timeline, TurnView, reasoning_id
from sessionloop.actors.views.wire import (
    failed_result,
    imported_items,
    wire_attachment,
    wire_display,
    wire_settlement,
    wire_speaker,
)
from sessionloop.protocol.limits import one_line
from sessionloop.protocol.schemas_items import (
    AgentMessageItem,
    AgentModel,
    NoticeItem,
    PlanEntry,
    PlanItem,
    QueueEntry,
    QueueItem,
    ReasoningItem,
    SessionItem,
    ToolCallItem,
    TurnItem,
    Undelivered,
    UsageItem,
    UsagePart,
    UserMessageItem,
)
from sessionloop.protocol.schemas_types import ApprovalSettlement, TurnOutcome

__all__ = [
    "attempt_item_id",
    "ItemsProjection",
    "Push",
    "PushMethod",
    "retry_discarded",
]

PushMethod = Literal["item/started", "item/completed"]
Push = tuple[PushMethod, SessionItem]

STARTED: Final = "item/started"
COMPLETED: Final = "item/completed"

# Human-facing texts: text objects, rendered in the server's language when a frame is sent
# (actors.settings.texts; ``en`` by default, ``zh`` supported). Those without values are shared.
TEXT_BEFORE_TOOL: Final = Text("undelivered.before-tool")
TEXT_NO_REPLY: Final = Text("undelivered.no-reply")
LABEL_CONTEXT: Final = Text("usage.context")
LABEL_REPLY: Final = Text("usage.reply")


def retry_discarded(cause: str) -> Text:
    """The ``undelivered.reason`` of an agent message a retry dropped (the version the retry replaced);
    ``cause`` is raw (the provider's status or error)."""
    return Text("undelivered.retry-discarded", cause=cause)


_TERMINAL: Final = frozenset({"completed", "failed", "denied", "aborted"})


def _settlement(settlement: E.Settlement | None) -> ApprovalSettlement | None:
    return None if settlement is None else wire_settlement(settlement)


def _unique(existing: Callable[[str], bool], base: str) -> str:
    """A deterministic id: ``base``, or ``base.2``, ``base.3`` ... when taken."""
    if not existing(base):
        return base
    n = 2
    while existing(f"{base}.{n}"):
        n += 1
    return f"{base}.{n}"


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
        self._turns: dict[str, TurnView] = {}
        self._timeline = Timeline(self._turns)
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
        return self._timeline.items()

    def item(self, item_id: str) -> SessionItem | None:
        """The current copy of one timeline item, or None."""
        return self._timeline.item(item_id)

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
        return self._timeline.history_page(before, limit)

    def snapshot_items(self, limit: int | None = None, *, singletons: bool = True) -> Page:
        """The items of a ``session/subscribe`` snapshot and its ``before`` cursor.

        The newest history page plus every item of the turn in flight, merged in timeline order
        (things said during the turn stay between its items); then, with ``singletons``, the
        current plan, usage and queue when there are any.
        """
        items, before = self._timeline.snapshot_page(limit)
        if singletons:
            items.extend(x for x in (self.plan_item(), self.usage_item(), self.queue_item()) if x is not None)
        return items, before

    # --- session and fork -------------------------------------------------------------------------

    def _created(self, e: E.SessionCreated) -> list[Push]:
        # An agent message is marked undelivered in rooms only (a room's child has no window).
        self._room = e.kind == "room"
        return []

    def _deleted(self, e: E.SessionDeleted) -> list[Push]:
        """The history is gone for every reader; nothing is pushed (the gateway drops the session)."""
        self._timeline.clear()
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
            for item in imported_items(f"fork.{index}", message, results, e.at):
                pushes.append(self._done(item))
        return pushes

    # --- inputs and the queue -----------------------------------------------------------------------

    def _queue_push(self, at: int) -> list[Push]:
        """The queue item: the waiting inputs, replaced whole, itemId ``queue``."""
        entries = [
            QueueEntry(text=self._notice_turns.get(i.turn_id, i.text), attachments=len(i.attachments),
                       speaker=wire_speaker(i.speaker, i.source))
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
            view = self._turns[e.turn_id] = TurnView(turn_id=e.turn_id)
            self._turn_order.append(e.turn_id)
        view.source, view.started_at, view.live = e.source, e.at, True
        pushes: list[Push] = [(STARTED, self._timeline.put(TurnItem(item_id=e.turn_id, at=e.at, turn_id=e.turn_id,
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
                attachments=[wire_attachment(a) for a in i.attachments], speaker=wire_speaker(i.speaker, i.source),
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
        self._timeline.move_to_end(turn_id)
        turn = TurnItem(item_id=turn_id, at=view.started_at or at, turn_id=turn_id, source=view.source,
                        outcome=outcome, ended_at=at, reason=reason, step_id=step_id)
        pushes.append(self._done(turn))
        return pushes

    def _close_calls(self, view: TurnView, *, stopped: bool) -> list[Push]:
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

    def _mark_unsent_reply(self, view: TurnView) -> list[Push]:
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
        self._timeline.remove(lambda item: item.turn_id in gone)
        for turn_id in gone:
            for call_id in self._turns.pop(turn_id).calls:
                self._call_args.pop(call_id, None)
                self._displays.pop(call_id, None)
                self._ended_by_turn.discard(call_id)
        self._turn_order = self._turn_order[:index]
        return []

    # --- model calls and tools ----------------------------------------------------------------------

    def _view(self, turn_id: str) -> TurnView:
        view = self._turns.get(turn_id)
        if view is None:  # a step of a turn we never saw start (damaged log): keep it archived
            view = self._turns[turn_id] = TurnView(turn_id=turn_id, live=False)
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
            reasoning = ReasoningItem(item_id=reasoning_id(item_id), at=e.at, turn_id=e.turn_id,
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
            pushes.append((STARTED, self._timeline.put(item)))
        pushes.extend(self._usage_push(e))
        return pushes

    def _agent_message(self, e: E.LlmCompleted, view: TurnView, item_id: str) -> AgentMessageItem:
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
                                          display=wire_display(e.display))
        self._displays[e.call_id] = e.display
        return [(STARTED, self._timeline.put(running))]

    def _tool_finished(self, e: E.ToolFinished) -> list[Push]:
        """The final card. A call its turn's stop already closed stays ``aborted``, even when the tool
        returns a result after the stop."""
        if e.call_id in self._ended_by_turn:
            return []
        item = self._call(e.turn_id, e.call_id, "?", e.at)
        status = e.status
        if status == "completed" and failed_result(e.output, e.exit_code):
            status = "failed"
        denied = status == "denied" and e.settlement is not None
        done = msgspec.structs.replace(
            item,
            status=status,
            reason=denial_reason(e.settlement) if denied else item.reason,
            args=self._call_args.get(e.call_id, item.args),
            result=UNSET if e.not_executed else e.output,
            duration_ms=e.duration_ms or None,
            display=wire_display(self._displays.get(e.call_id), e.exit_code),
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
        return [(STARTED, self._timeline.put(msgspec.structs.replace(item, approval_id=e.approval_id)))]

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
        return [(STARTED, self._timeline.put(settled))]

    # --- notices, plan, compression ------------------------------------------------------------------

    def _notice(self, e: E.NoticePosted) -> list[Push]:
        """A notice item: topic, text, noticeId, facts, canContinue (tool-limit); a notice that
        opened a turn carries ``entry: opened``."""
        text = Text.stored(e.text, e.text_key, e.text_values)
        if e.turn_id is not None and e.starts_turn and e.turn_id not in self._turns:
            self._turns[e.turn_id] = TurnView(turn_id=e.turn_id, started_at=e.at)
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
        item_id = _unique(lambda candidate: self._timeline.has(candidate), f"compress.{at}")
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
        return (COMPLETED, self._timeline.put(item))


def attempt_item_id(step_id: str, attempt: int) -> str:
    """The item a model step's answer streams as in its ``attempt`` (1: the step id itself; a
    later attempt after one that had streamed gets a fresh id, ``<step>.a<attempt>``)."""
    return step_id if attempt <= 1 else f"{step_id}.a{attempt}"

