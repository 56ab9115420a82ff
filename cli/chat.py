"""``sessionloop chat [SESSION]``: a terminal client for one session over the session protocol.

Theory of operation (seed 004, 订阅与条目 and 回合控制)
-----------------------------------------------------

1. ``session/subscribe`` answers with a snapshot ``{epoch, seq, session, items}``; every later push
   of the session carries ``epoch`` and ``seq``. Pushes with ``seq <= snapshot.seq`` are dropped; a
   push of another epoch, or ``session/resync``, means "subscribe again" (the new snapshot replaces
   what we knew). :class:`SessionView` implements exactly that, and renders what it keeps.
2. A line from stdin becomes ``turn/send``. The reply is ``{}`` and names no turn, so the view finds
   *our* turn from the pushes: the ``user-message`` carrying the text we sent has the ``turnId`` it
   entered (``opened`` or ``joined``); a ``turn`` item started before that is taken tentatively.
3. ``item/delta`` text of an agent message is printed as it arrives; ``item/completed`` is the
   canonical copy (it may hold more than the deltas did, or arrive without any). Tool cards and
   notices are printed when they complete; the turn ends with its ``turn`` item's completion.
4. Ctrl-C during a turn sends ``turn/abort`` for it (a second Ctrl-C quits); Ctrl-C at the prompt
   and end of input quit. Everything shown is sanitized (``cli.output``).

A pump task reads pushes all the time, so messages from other clients of the same session appear
while the prompt waits. Reading stdin happens on a short-lived daemon thread per line, so a pending
read never keeps the process alive.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import click

from protocol.schemas import (
    AgentMessageItem,
    ItemDelta,
    ItemPush,
    NoticeItem,
    SessionResync,
    SubscribeResult,
    ToolCallItem,
    TurnItem,
    UserMessageItem,
)

from .client import (
    Client,
    ClientError,
    Endpoint,
    Notification,
    RpcFailed,
    connect,
    connection_options,
    resolve_session,
    run,
)
from .output import clean, notice_line, speaker_name, timeline, tool_card

__all__ = ["SessionView", "chat", "pump", "subscribe", "wait_for_turn"]

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
        if params.epoch != self.epoch:  # seed: epoch 变了就重新订阅
            self.needs_resubscribe = True
            return
        if params.seq <= self.seq:  # seed: 客户端丢掉 seq 不大于快照的推送
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
            if show:
                self._line(tool_card(item), key=(item.item_id, item.status))
        elif isinstance(item, NoticeItem):
            if show:
                self._line(notice_line(item), key=(item.item_id, "done"))
        elif isinstance(item, TurnItem) and item.outcome is not None and self._is_ours(item):
            self.outcome = item.outcome
            self._expect = None
            if show and item.outcome != "replied":
                self._line(f"[turn {item.outcome}]", key=(item.item_id, "done"))
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


async def pump(client: Client, view: SessionView) -> None:
    """Feed every push to ``view``; subscribe again when it asks (resync, new epoch)."""
    while True:
        view.feed(await client.next())
        if view.needs_resubscribe:
            view.reset(await subscribe(client, view.session_id))


class _Chat:
    """The read-send-stream loop; returns the exit code."""

    def __init__(self, client: Client, view: SessionView, interactive: bool) -> None:
        self.client, self.view, self.interactive = client, view, interactive
        self.quit = asyncio.Event()
        self.in_turn = False
        self.abort_sent = False
        self.failed = False
        self.eof = False
        self._tasks: set[asyncio.Task[Any]] = set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        handled = _install_sigint(loop, self._interrupt)
        pumping = asyncio.create_task(pump(self.client, self.view))
        try:
            while not self.quit.is_set():
                text = await self._read_message(loop, pumping)
                if text is None:
                    break
                if text.strip():
                    await self._turn(pumping, text)
        finally:
            pumping.cancel()
            if handled:
                loop.remove_signal_handler(signal.SIGINT)
        if self.interactive:
            click.echo()
        return 1 if self.failed else 0

    async def _read_message(self, loop: asyncio.AbstractEventLoop, pumping: asyncio.Task[None]) -> str | None:
        """The next message: one line, or several joined where a line ends with a backslash.
        None at end of input or when the user quits."""
        parts: list[str] = []
        while not self.eof:
            prompt = ("... " if parts else "> ") if self.interactive else None
            line = await self._until(pumping, _read_line(loop, prompt))
            if line is None:
                return None
            if line == "":
                self.eof = True
                break
            line = line.rstrip("\r\n")
            if not line.endswith("\\"):
                parts.append(line)
                return "\n".join(parts)
            parts.append(line[:-1])
        return "\n".join(parts) if parts else None

    async def _turn(self, pumping: asyncio.Task[None], text: str) -> None:
        self.view.expect(text)
        self.in_turn, self.abort_sent = True, False
        try:
            try:
                await self.client.call("turn/send", {"sessionId": self.view.session_id, "content": text})
            except RpcFailed as e:
                click.echo(f"error: {e}", err=True)
                self.failed = True
                return
            await self._until(pumping, self.view.turn_done.wait())
        finally:
            self.in_turn = False

    async def _until(self, pumping: asyncio.Task[None], awaitable: Any) -> Any:
        """``awaitable``'s result; None when the user quits; the pump's error if the connection ends."""
        waiting = asyncio.ensure_future(awaitable)
        quitting = asyncio.create_task(self.quit.wait())
        try:
            await asyncio.wait({waiting, quitting, pumping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            quitting.cancel()
            if not waiting.done():
                waiting.cancel()
        if pumping.done():
            pumping.result()  # raises ConnectionLost (or whatever ended it)
        return waiting.result() if waiting.done() and not waiting.cancelled() else None

    def _interrupt(self) -> None:
        if self.in_turn and not self.abort_sent:
            self.abort_sent = True
            click.echo("\n^C stopping the turn (Ctrl-C again quits)", err=True)
            task = asyncio.ensure_future(self._abort())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self.quit.set()

    async def _abort(self) -> None:
        params = {"sessionId": self.view.session_id}
        if self.view.turn_id is not None:
            params["turnId"] = self.view.turn_id
        try:
            await self.client.call("turn/abort", params)
        except RpcFailed as e:
            if e.data_code != "expected-turn-mismatch":  # the turn ended by itself meanwhile
                click.echo(f"error: {e}", err=True)
        except ClientError:
            pass  # the pump reports a lost connection


def _install_sigint(loop: asyncio.AbstractEventLoop, handler: Callable[[], None]) -> bool:
    try:
        loop.add_signal_handler(signal.SIGINT, handler)
        return True
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals
        return False


def _read_line(loop: asyncio.AbstractEventLoop, prompt: str | None) -> asyncio.Future[str]:
    """One line of stdin ("" at end of input), read on a daemon thread (see the module docstring)."""
    future: asyncio.Future[str] = loop.create_future()
    stdin = sys.stdin
    if prompt:
        click.echo(prompt, nl=False)

    def settle(line: str | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(line or "")

    def read() -> None:
        try:
            line, error = stdin.readline(), None
        except (OSError, ValueError) as e:
            line, error = None, ClientError(f"cannot read stdin: {e}")
        try:
            loop.call_soon_threadsafe(settle, line, error)
        except RuntimeError:  # the loop is gone: we quit while this read waited
            pass

    threading.Thread(target=read, name="sessionloop-stdin", daemon=True).start()
    return future


async def _chat(endpoint: Endpoint, ref: str | None, name: str | None, history: int) -> int:
    async with connect(endpoint) as client:
        assert client.info is not None
        if not client.info.features.send:
            raise ClientError(f"{endpoint.url} cannot run turns right now (features.send is false)")
        if ref is None:
            created = await client.call("session/create", {"name": name} if name else {})
            session_id = created.session.id
        else:
            session_id = await resolve_session(client, ref)
        snapshot = await subscribe(client, session_id)
        interactive = sys.stdin.isatty()
        click.echo(f"session {snapshot.session.id} \"{clean(snapshot.session.title)}\" on {endpoint.url}"
                   + (" (Ctrl-D quits, Ctrl-C stops a turn)" if interactive else ""), err=True)
        for line in timeline(snapshot.items)[-history:] if history > 0 else []:
            click.echo(line)
        return await _Chat(client, SessionView(snapshot), interactive).run()


@click.command("chat")
@click.argument("session", required=False)
@click.option("--name", help="Name of the session to create (when SESSION is not given).")
@click.option("--history", default=10, show_default=True, type=click.IntRange(min=0),
              help="How many lines of earlier conversation to show first.")
@connection_options
def chat(session: str | None, name: str | None, history: int, endpoint: Endpoint) -> None:
    """Talk to a session: each line you type is a turn; the answer streams back.

    Without SESSION a new session is created. SESSION is an id, a unique id prefix, or a title.
    End a line with a backslash to continue the message on the next line. Tool calls show as
    one-line cards, notices as [notice topic] lines. Ctrl-C stops a running turn (turn/abort);
    Ctrl-C at the prompt or Ctrl-D quits. Reads stdin, so it works in pipes.

    \b
    Examples:
      sessionloop chat                       # a new session
      sessionloop chat 1a2266 --history 50   # continue one, with more context
      printf 'hello\\n' | sessionloop chat
      printf '!sleep 2000\\\\\\nslowly\\n' | sessionloop chat   # a two-line message
    """
    code = run(_chat(endpoint, session, name, history))
    if code:
        sys.exit(code)
