"""What the world sees of a session after a commit: the publish half of the session shell
(:class:`SessionPublisher`, mixed into ``actors.session.actor.SessionBehaviour``).

Only after a commit is durable do its pushes go to the session's subscribers (the timeline's
items, coalesced; an answer taken in place streamed where its outcome is), its listing record to
the listing, and the commit to the runtime's commit listeners as a value
(``actors.system.ports.Commit``). The listing record is computed while the commit is prepared
(:meth:`SessionPublisher._meta`, written in the same append) and handed on after it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.session.context import estimated_context_tokens
from sessionloop.actors.session.decide import AgentConfig
from sessionloop.actors.session.drive import system_messages
from sessionloop.actors.session.effects import Deltas
from sessionloop.actors.session.messages import now_ms
from sessionloop.actors.session.state import SessionState
from sessionloop.actors.session.stream_sink import StreamSink, close_cards
from sessionloop.actors.system.ports import Commit
from sessionloop.actors.system.pubsub import SessionChannel
from sessionloop.actors.views.summary import encode_summary_record, rewrites_listing, summary_record
from sessionloop.protocol.schemas_items import AgentMessageItem, ReasoningItem

if TYPE_CHECKING:
    from sessionloop.actors.system.runtime import Runtime

log = logging.getLogger("sessionloop.session")

_SINGLETONS = frozenset({"queue", "plan", "usage"})  # items a push replaces whole, never appended to
#: a model step's outcome: where the live frames of an answer taken in place go out (``_publish``)
_STEP_END = (E.LlmCompleted, E.LlmFailed)


class SessionPublisher:
    """The pushes, the listing record and the commit listeners of one session's commits."""

    rt: Runtime
    sid: str
    stream: str
    state: SessionState
    channel: SessionChannel
    items: Any
    last_record: Any
    record_dirty: bool
    _sink: StreamSink | None
    _sent_queue: Any
    _active: bool | None

    if TYPE_CHECKING:  # the shell's (actors.session.actor.SessionBehaviour)
        def config(self) -> AgentConfig: ...

        def _app_id(self) -> str | None: ...

    def push_usage_estimate(self) -> None:
        """When a snapshot has no usage yet, the server has it estimated and pushes it after the
        snapshot (docs/protocol.md, subscribing). Called right
        after a subscriber got its snapshot: a session with history that no model call has
        reported usage on (forked, imported, every call failed) gets the usage item its next
        model call would have, estimated as the mock counts (characters / 4), pushed to its
        subscribers (all of them: none has usage, and each sees every seq, gapless). Derived from
        committed state and not kept in ``items`` (a fold of the log, which ``replay --verify``
        rebuilds), nor written (a read writes nothing): every snapshot without usage is followed
        by one."""
        items, state = self.items, self.state
        if items is None or items.usage_item() is not None or not state.messages:
            return
        try:
            cfg = self.config()
            tokens = estimated_context_tokens(system_messages(cfg) + state.messages, cfg.context_chars)
            self.channel.publish("item/completed", items.estimated_usage(now_ms(), tokens))
        except Exception:  # an estimate is a courtesy: the subscription (answered already) stands
            log.exception("session %s: the usage estimate after a snapshot failed", self.sid)

    def _meta(self, events: list[E.Event]) -> bytes | None:
        """The listing record, rewritten by commits that change what a listing shows
        (:func:`rewrites_listing`, the rule ``replay --verify`` checks records by)."""
        if not rewrites_listing(events):
            return None
        self.last_record = summary_record(self.state, self._awaiting_approval(), self.rt.background(self.sid))
        self.record_dirty = True
        return encode_summary_record(self.last_record)

    def _awaiting_approval(self) -> bool:
        """The listing's attention flag: an approval was pushed and is not settled yet."""
        state = self.state
        return any((rec := state.tool_calls.get(c)) is not None and rec.approval_id is not None
                   and rec.settlement is None for c in state.batch)

    def _flags(self) -> dict[str, bool] | None:
        active = bool(self.state.current_turn or self.state.queue)
        if active == self._active:
            return None
        self._active = active
        return {"active": active}

    def _tell_listeners(self, events: list[E.Event], result: Any,
                        loop_deltas: dict[str, list[dict[str, Any]]] | None) -> None:
        """The commit, told to the runtime's commit listeners as a value (``actors.system.ports.Commit``),
        with the listing record when this commit wrote one."""
        record = self.last_record if self.record_dirty else None
        self.record_dirty = False
        self.rt.committed(Commit(self.sid, self.stream, events, result, self.state, record, loop_deltas,
                                 self.rt.store))

    def _publish(self, events: list[E.Event], inline: dict[str, Deltas]) -> None:
        """The pushes of a commit, in event order. An answer taken in place (``inline``) streams
        where its outcome is: ``item/started`` and its deltas just before the outcome's
        ``item/completed``, as they would have come had the answer streamed over time (before
        its commit); see ``_stream_in_place``."""
        if self.items is None:
            self.items = self.rt.build_items(self.stream)
            return  # built from the store, which already holds these events
        pushes: list[tuple[str, Any]] = []
        streams = bool(inline) and self.channel.has_subscribers
        for event in events:
            if streams and isinstance(event, _STEP_END) and (deltas := inline.get(event.step_id)):
                pushes.extend(self._stream_in_place(event, deltas))
            pushes.extend(self.items.apply(event))
        pushes = self._coalesce(pushes)
        if any(isinstance(e, E.TurnRewound) and e.chat_deleted for e in events):
            # the history was rewritten; what clients hold is void, they resubscribe
            pushes.append(("session/resync", None))
        if pushes:
            self.channel.publish_many(pushes)

    def _stream_in_place(self, outcome: Any, deltas: Deltas) -> list[tuple[str, Any]]:
        """The live pushes of an answer taken in place: what ``SessionChannel.stream`` sends for
        the same deltas of a model call streaming over time (``StreamSink``), an item's
        ``item/started`` with its first delta, then one ``item/delta`` per delta. They go out in
        the commit's one publication, between the pushes of the events before the outcome and the
        outcome's own; the channel does not keep their text for a snapshot as it does for a
        stream in flight, since no snapshot can fall between them (one is taken on this thread)
        and the outcome's ``item/completed`` in the same publication holds the whole text."""
        step_id, turn_id, sid, delta = outcome.step_id, outcome.turn_id, self.sid, self.rt.delta_payload
        thinking, at = f"{step_id}.thinking", now_ms()
        out: list[tuple[str, Any]] = []
        started: set[str] = set()
        for kind, text in deltas:
            item_id = step_id if kind == "text" else thinking
            if item_id not in started:
                started.add(item_id)
                kind_of = AgentMessageItem if kind == "text" else ReasoningItem
                out.append(("item/started", kind_of(item_id=item_id, at=at, turn_id=turn_id, text="")))
            out.append(("item/delta", delta(sid, item_id, text)))
        return out

    def _loop_deltas_in_place(
        self, events: list[E.Event], inline: dict[str, Deltas]
    ) -> dict[str, list[dict[str, Any]]] | None:
        """The ``assistant.delta`` data of the answers this commit took in place (what
        ``StreamSink`` hands a bot for each text delta), for the app's loop watchers; None when
        nobody watches (or no answer had text)."""
        app, watchers = self._app_id(), self.rt.loop_watchers
        if app is None or not watchers.any(app):
            return None
        out: dict[str, list[dict[str, Any]]] = {}
        for event in events:
            if isinstance(event, _STEP_END) and (deltas := inline.get(event.step_id)):
                step_id = event.step_id
                texts = [{"text": text, "itemId": step_id} for kind, text in deltas if kind == "text"]
                if texts:
                    out[step_id] = texts
        return out or None

    def _coalesce(self, pushes: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """One commit's pushes, with the whole-replacement items (queue, plan, usage) sent once,
        in their last state; a queue that did not change since it was last sent is not sent
        (an input that opens a turn at once never shows as queued)."""
        last: dict[str, int] = {}
        for i, (_, item) in enumerate(pushes):
            if item.item_id in _SINGLETONS:
                last[item.item_id] = i
        out = []
        for i, (method, item) in enumerate(pushes):
            if item.item_id in _SINGLETONS:
                if last[item.item_id] != i:
                    continue
                if item.item_id == "queue":
                    entries = msgspec.to_builtins(item.entries)
                    if entries == self._sent_queue:
                        continue
                    self._sent_queue = entries
            out.append((method, item))
        return out

    def _end_stream(self, events: list[E.Event]) -> None:
        """The model call's outcome is committed: its live items end, and the cards it announced
        that its answer does not hold are closed (aborted if the turn was stopped, else failed)."""
        if self._sink is not None:
            self._sink.close()
            self._sink = None
        cards = self.channel.end_streams()
        if not cards:
            return
        keep = {c.call_id for e in events if type(e) is E.LlmCompleted for c in e.tool_calls}
        status = "aborted" if any(type(e) is E.TurnAborted for e in events) else "failed"
        closing = close_cards(cards, keep, status)
        if closing:
            self.channel.publish_many(closing)


__all__ = ["SessionPublisher"]
