"""Following one subscribed session over the session protocol, and rendering it in a terminal.

Theory of operation (subscriptions, items and turn control, docs/protocol.md)
-----------------------------------------------------------------------------

1. ``session/subscribe`` answers with a snapshot ``{epoch, seq, session, items}``; every later push
   of the session carries ``epoch`` and ``seq``. Pushes with ``seq <= snapshot.seq`` are dropped; a
   push of another epoch, or ``session/resync``, means "subscribe again" (the new snapshot replaces
   what we knew). :class:`SessionView` implements exactly that, and renders what it keeps.
2. Before a line is sent with ``turn/send`` (the reply is ``{}`` and names no turn) the view is told
   the text (:meth:`SessionView.expect`) and finds *our* turn from the pushes: the ``user-message``
   carrying the text we sent has the ``turnId`` it entered (``opened`` or ``joined``); a ``turn``
   item started before that is taken tentatively.
3. ``item/delta`` text of an agent message is printed as it arrives; ``item/completed`` is the
   canonical copy (it may hold more than the deltas did, or arrive without any). Tool cards and
   notices are printed when they complete; the turn ends with its ``turn`` item's completion.
   Everything shown is sanitized (``cli.output``).

:func:`pump` feeds every push to the view (and subscribes again when it asks);
:func:`wait_for_turn` follows pushes until our turn ends. Used by ``sessionloop chat``
(``cli/chat.py``) and ``sessionloop send --wait``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import click

from sessionloop.cli.client import Client, Notification
from sessionloop.cli.output import clean, notice_line, speaker_name, tool_card, turn_line
from sessionloop.protocol.schemas import (
    AgentMessageItem,
    ItemDelta,
    ItemPush,
    NoticeItem,
    SessionResync,
    SubscribeResult,
    ToolCallItem,
    TurnItem,
    UserMessageItem,
    is_unset,
)

__all__ = ["Emit", "SessionView", "pump", "subscribe", "wait_for_turn"]

Emit = Callable[[str, bool], None]  # (text, end the line)
_ITEM_PUSHES = frozenset({"item/started", "item/completed", "item/delta"})
_SILENT_DELTAS = frozenset({"tool-call", "reasoning"})  # shown on completion, not streamed


def _echo(text: str, newline: bool) -> None:
    click.echo(text, nl=newline)


class SessionView:
    """What one client knows of a subscribed session: the snapshot position, our turn, the display.

    ``emit`` prints; ``None`` keeps the view silent (``send --wait`` only wants the answer).
    """

    def __init__(self, snapshot: SubscribeResult, emit: Emit | None = _echo) -> None:
        self.session_id = snapshot.session.id
        self.emit = emit
        self.needs_resubscribe = False
        self.turn_done = asyncio.Event()
        self.turn_id: str | None = None
        self.outcome: str | None = None
        self.reason: str | None = None  # why our turn ended in error (the turn item's reason)
        self.answers: dict[str, str] = {}  # agent-message itemId -> canonical text, of our turn
        self._expect: str | None = None
        self._turn_confirmed = False
        self._kinds: dict[str, str] = {}
        self._streamed: dict[str, str] = {}
        self._streaming: str | None = None
        self._mid_line = False
        self._shown: set[tuple[str, str]] = set()
        self.reset(snapshot)

    # --- positions ----------------------------------------------------------------------------

    def reset(self, snapshot: SubscribeResult) -> None:
        """Take a (new) snapshot: its epoch and seq, and whatever it already says about our turn."""
        self.epoch, self.seq = snapshot.epoch, snapshot.seq
        self.needs_resubscribe = False
        for item in snapshot.items:
            if self._expect is not None:
                self._settle(item, show=False)

    def expect(self, text: str) -> None:
        """Before ``turn/send``: the next turn that takes ``text`` is ours."""
        self._expect = text.strip()
        self._turn_confirmed = False
        self.turn_id = None
        self.outcome = None
        self.reason = None
        self.answers.clear()
        self.turn_done.clear()

    @property
    def answer(self) -> str:
        """The agent's reply in our turn: its last non-empty message."""
        texts = [t for t in self.answers.values() if t.strip()]
        return texts[-1] if texts else ""

    # --- pushes -------------------------------------------------------------------------------

    def feed(self, note: Notification) -> None:
        """Apply one push (any method; pushes of other sessions and old ``seq`` are ignored)."""
        params = note.params
        if note.method == "session/resync" and isinstance(params, SessionResync):
            if params.session_id == self.session_id:
                self.needs_resubscribe = True
            return
        if note.method not in _ITEM_PUSHES or not isinstance(params, ItemPush | ItemDelta):
            return
        if params.session_id != self.session_id:
            return
        if params.epoch != self.epoch:  # another epoch: subscribe again
            self.needs_resubscribe = True
            return
        if params.seq <= self.seq:  # a push not newer than the snapshot is dropped
            return
        if isinstance(params, ItemDelta):
            self._delta(params.item_id, params.text)
        elif note.method == "item/started":
            self._started(params.item)
        else:
            self._settle(params.item, show=True)

    def _started(self, item: Any) -> None:
        self._kinds[item.item_id] = str(type(item).__struct_config__.tag)
        if isinstance(item, TurnItem) and item.outcome is None and self._expect is not None \
                and self.turn_id is None:
            self.turn_id = item.item_id  # tentative until our user-message names its turn

    def _delta(self, item_id: str, text: str) -> None:
        text = clean(text)
        self._streamed[item_id] = self._streamed.get(item_id, "") + text
        if self._kinds.get(item_id) in _SILENT_DELTAS or item_id.endswith(".thinking"):
            return
        if self._streaming != item_id:
            self._end_line()
            self._streaming = item_id
        self._write(text)

    def _settle(self, item: Any, *, show: bool) -> None:
        """An ``item/completed`` (or a snapshot item): record what concerns our turn, then show it."""
        if isinstance(item, UserMessageItem):
            if self._expect is not None and not self._turn_confirmed and item.text.strip() == self._expect:
                self._turn_confirmed, self.turn_id = True, item.turn_id
                return  # the user typed it: not echoed
            if show:
                self._line(f"[{speaker_name(item)}] {clean(item.text)}", key=(item.item_id, "done"))
        elif isinstance(item, AgentMessageItem):
            if self.turn_id is not None and item.turn_id == self.turn_id:
                self.answers[item.item_id] = item.text
            if show:
                self._agent(item)
        elif isinstance(item, ToolCallItem):
            # A denied call completes twice: once when the approval settles (no result yet), then
            # with the result the model got ("denied: ... note"); the second is the card to show.
            if show and not (item.status == "denied" and is_unset(item.result)):
                self._line(tool_card(item), key=(item.item_id, item.status))
        elif isinstance(item, NoticeItem):
            if show:
                self._line(notice_line(item), key=(item.item_id, "done"))
        elif isinstance(item, TurnItem) and item.outcome is not None and self._is_ours(item):
            self.outcome = item.outcome
            self.reason = item.reason
            self._expect = None
            if show and item.outcome != "replied":
                self._line(turn_line(item), key=(item.item_id, "done"))
            self._end_line()
            self.turn_done.set()

    def _is_ours(self, item: TurnItem) -> bool:
        return self._expect is not None and self.turn_id is not None and item.item_id == self.turn_id

    # --- display ------------------------------------------------------------------------------

    def _agent(self, item: AgentMessageItem) -> None:
        key = (item.item_id, "done")
        if key in self._shown:
            return
        self._shown.add(key)
        text = clean(item.text) + "".join(f" [{a.kind}: {clean(a.name)}]" for a in item.attachments)
        streamed = self._streamed.pop(item.item_id, None)
        if streamed is not None and self._streaming == item.item_id and text.startswith(streamed):
            self._write(text[len(streamed):])
        else:
            self._end_line()
            self._write(text)
        self._end_line(force=True)

    def say(self, text: str) -> None:
        """Print a line of the chat's own (approval cards, settlements) between the session's output."""
        self._end_line()
        if self.emit is not None:
            self.emit(text, True)

    def ask(self, prompt: str) -> None:
        """Print a prompt; its line stays open for the answer (output arriving meanwhile ends it)."""
        self._end_line()
        if self.emit is not None:
            self.emit(prompt, False)
            self._mid_line = True

    def answered(self, echo: str | None) -> None:
        """The answer to :meth:`ask` came: ``echo`` completes the prompt's line (piped input is not
        echoed by a terminal); ``None`` when the terminal already ended it."""
        if echo is not None and self._mid_line and self.emit is not None:
            self.emit(echo, True)
        self._mid_line = False
        self._streaming = None

    def _line(self, text: str, key: tuple[str, str]) -> None:
        if key in self._shown:
            return
        self._shown.add(key)
        self._end_line()
        if self.emit is not None:
            self.emit(text, True)

    def _write(self, text: str) -> None:
        if self.emit is not None and text:
            self.emit(text, False)
            self._mid_line = not text.endswith("\n")

    def _end_line(self, force: bool = False) -> None:
        if self.emit is not None and (self._mid_line or force):
            self.emit("", True)
        self._mid_line = False
        self._streaming = None


async def subscribe(client: Client, session_id: str) -> SubscribeResult:
    snapshot: SubscribeResult = await client.call("session/subscribe", {"sessionId": session_id})
    return snapshot


async def wait_for_turn(client: Client, view: SessionView, timeout: float | None) -> bool:
    """Follow pushes until our turn ends (True) or ``timeout`` seconds pass (False)."""
    pumping = asyncio.create_task(pump(client, view))
    done_waiting = asyncio.create_task(view.turn_done.wait())
    try:
        await asyncio.wait({pumping, done_waiting}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (pumping, done_waiting):
            task.cancel()
    if pumping.done() and not pumping.cancelled() and pumping.exception() is not None:
        pumping.result()
    return view.turn_done.is_set()


async def pump(client: Client, view: SessionView, on_push: Callable[[Notification], None] | None = None) -> None:
    """Feed every push to ``view`` (and ``on_push``); subscribe again when the view asks (resync,
    new epoch)."""
    while True:
        note = await client.next()
        view.feed(note)
        if on_push is not None:
            on_push(note)
        if view.needs_resubscribe:
            view.reset(await subscribe(client, view.session_id))
