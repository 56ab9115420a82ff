"""What subscribers see while one model step streams: the ``on_delta`` of a model call.

A :class:`StreamSink` runs on the worker loop's thread, called by the provider
(``actors/model/base.py``): text and reasoning deltas become live items of the session's channel
(``item/started`` with the first delta, then ``item/delta``; never persisted),
a tool call whose name is known becomes a ``generating`` card (the card is out while the
model still generates the arguments), and a retry restarts what the failed attempt had shown.

How a retry looks to a subscriber, and why. A provider may try a call again after an attempt
already streamed text (a 500 in the middle of a stream, a lost connection). The protocol's item model
says an ``item/delta`` appends to an item's streaming text and ``item/completed`` is the one
canonical copy, by itemId; it also names "the version a retry dropped" as an
agent-message of its own marked ``undelivered``. So the sink does exactly that:

1. the failed attempt's items are closed: ``item/completed`` of the agent message with the text
   it had streamed and ``undelivered.reason`` "discarded: the model call was tried again after
   HTTP 500", its reasoning as it was, and each announced card ``failed`` with ``notExecuted``
   (generated, never run: the live-only shape of such calls);
2. the next attempt streams as a **fresh item** ``<step>.a<attempt>``, so no client appends the
   new text to the old (reusing the itemId would depend on every client resetting an item's
   streaming text on a second ``item/started``, which the protocol does not promise);
3. the retry is committed as ``llm.retried`` with that item id (``next_item_id``), so the
   projection gives the committed answer the same id and its ``item/completed`` replaces the
   streamed copy; the stored text is the successful attempt's only.

The discarded copy is live only, like the text it was made of: a snapshot taken after the retry
does not hold it and history does not show it (live items are never stored). A retry before anything was
shown (a 429 before the first chunk) changes no item id.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Final

import msgspec

from sessionloop.actors.model.base import RetryNotice
from sessionloop.actors.model.storable import usable_call_id
from sessionloop.actors.settings.texts import Text
from sessionloop.actors.views.items import attempt_item_id, retry_discarded
from sessionloop.protocol.schemas_items import AgentMessageItem, ReasoningItem, ToolCallItem, Undelivered

__all__ = ["StreamSink", "close_cards"]

_CAUSES: Final = {cause: Text(f"retry.cause.{cause}") for cause in ("timeout", "connection", "stream", "error")}


def _cause(notice: RetryNotice) -> str:
    if notice.status:
        return f"HTTP {notice.status}"
    return _CAUSES.get(notice.cause or "error", notice.cause)


def close_cards(cards: dict[str, ToolCallItem], keep: set[str], status: str) -> list[tuple[str, Any]]:
    """``item/completed`` for announced cards whose calls the committed answer does not have
    (the call failed or was stopped before its answer was whole): ``aborted`` when the turn was
    stopped, else ``failed``; both ``notExecuted`` (generated, never run)."""
    return [("item/completed", msgspec.structs.replace(card, status=status, not_executed=True))
            for call_id, card in cards.items() if call_id not in keep]


class StreamSink:
    """The ``on_delta`` of one model step (see the module docstring).

    ``delta(session_id, item_id, text)`` builds an ``item/delta`` payload; ``loop_delta(data)``
    (or None) emits a bot's live ``assistant.delta``; ``on_retry(notice, next_item_id)``
    has the session record the retry; ``fault`` is the crash-point hook; ``now()`` the clock in ms.
    ``close()`` (from the actor thread, when the step's outcome is committed or the call is
    cancelled) makes every later call a no-op, so a late delta cannot revive a finished item.
    """

    def __init__(self, *, channel: Any, session_id: str, step_id: str, turn_id: str | None,
                 delta: Callable[[str, str, str], Any], on_retry: Callable[[RetryNotice, str], None],
                 now: Callable[[], int], fault: Callable[[str], None] = lambda point: None,
                 loop_delta: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.channel = channel
        self.session_id = session_id
        self.step_id = step_id
        self.turn_id = turn_id
        self._delta = delta
        self._on_retry = on_retry
        self._now = now
        self._fault = fault
        self._loop_delta = loop_delta
        self.item_id = step_id  # the agent message this attempt streams as
        self.thinking = f"{step_id}.thinking"
        self.shown = False  # this attempt has pushed something
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        with self._lock:
            self._closed = True

    # --- what the provider calls ----------------------------------------------------------------

    def __call__(self, kind: str, text: str) -> None:
        self._fault("model-stream")
        with self._lock:
            if self._closed:
                return
            self.shown = True
            item_id = self.item_id if kind == "text" else self.thinking
            # item/started first, then its deltas; kept so a snapshot now holds the text
            self.channel.stream(item_id, self._start, self._push, text)
        if self._loop_delta is not None and kind == "text":
            self._loop_delta({"text": text, "itemId": item_id})

    def tool_call(self, call_id: str, name: str) -> None:
        """The card is out while the arguments stream, ``generating``, no args yet."""
        if not usable_call_id(call_id):
            return  # the stored answer gets another id (storable.py): its card comes with the commit
        with self._lock:
            if self._closed:
                return
            self.shown = True
            self.channel.stream_card(ToolCallItem(item_id=call_id, at=self._now(), turn_id=self.turn_id,
                                                  tool=name, status="generating"))

    def retrying(self, notice: RetryNotice) -> None:
        """The attempt ``notice.attempt`` failed and the call goes on: close what it showed and
        stream the next attempt as a fresh item; have the session record ``llm.retried``."""
        with self._lock:
            if self._closed:
                return
            next_item = ""
            if self.shown:
                discarded = self.item_id
                reason = Undelivered(reason=retry_discarded(_cause(notice)))
                self.channel.discard([self.item_id, self.thinking], lambda item, text: _closed(item, text, reason))
                next_item = attempt_item_id(self.step_id, notice.attempt + 1)
                self.item_id, self.thinking = next_item, f"{next_item}.thinking"
                self.shown = False
                if self._loop_delta is not None:
                    self._loop_delta({"text": "", "itemId": discarded, "discarded": True})
        self._on_retry(notice, next_item)

    # --- items ----------------------------------------------------------------------------------

    def _start(self, item_id: str) -> Any:
        """The live-only start of a streamed message or reasoning; ``item/completed`` brings the whole."""
        if item_id == self.item_id:
            return AgentMessageItem(item_id=item_id, at=self._now(), turn_id=self.turn_id, text="")
        return ReasoningItem(item_id=item_id, at=self._now(), turn_id=self.turn_id, text="")

    def _push(self, item_id: str, text: str) -> Any:
        return self._delta(self.session_id, item_id, text)


def _closed(item: Any, text: str, reason: Undelivered) -> Any:
    """The final copy of an item a retry discarded."""
    if isinstance(item, AgentMessageItem):
        return msgspec.structs.replace(item, text=text, undelivered=reason)
    if isinstance(item, ToolCallItem):
        return msgspec.structs.replace(item, status="failed", not_executed=True)
    return msgspec.structs.replace(item, text=text)
