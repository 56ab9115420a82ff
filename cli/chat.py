"""``sessionloop chat [SESSION]``: a terminal client for one session over the session protocol.

Theory of operation (turn control and approvals, docs/protocol.md)
------------------------------------------------------------------

1. What the chat shows of the session comes from :class:`~cli.session_view.SessionView`: the
   snapshot of ``session/subscribe``, then every push, in order, rendered as it arrives (its
   docstring says how pushes are taken and how our turn is found).
2. A line from stdin becomes ``turn/send`` (the view is told the text first, so it can find the turn
   that takes it); the chat waits for that turn's end, asking approval cards meanwhile.
3. Ctrl-C during a turn sends ``turn/abort`` for it (a second Ctrl-C quits); Ctrl-C at the prompt
   and end of input quit. Everything shown is sanitized (``cli.output``).
4. Presence and approvals: the chat reports itself present (:class:`~cli.presence.Presence`) while
   it runs. An ``approval/requested`` (for any session the owner may answer, not only this
   one) becomes a card: tool, command and cwd, file and diff, params, every fact through
   ``sanitize_for_card``; then ``approve? [y/N]`` and ``note (enter to skip):`` are read from stdin
   (piped input works: the answers are the next lines) and sent with ``approval/respond`` and the
   card's ``contentHash``. Every ``approval/settled`` of a card shown is printed, whoever decided
   it (this chat, another client first, nobody present, time out, the turn ended); a card settled
   while its prompt waits stops being asked. End of input at the prompt answers no.

A pump task reads pushes all the time, so messages from other clients of the same session appear
while the prompt waits. Reading stdin happens on a short-lived daemon thread per line, so a pending
read never keeps the process alive.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import click

from sessionloop.cli.client import (
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
from sessionloop.cli.output import approval_card, approval_line, clean, settlement_text, timeline
from sessionloop.cli.presence import Presence
from sessionloop.cli.session_view import SessionView, pump, subscribe
from sessionloop.protocol.schemas import Approval, ApprovalRequested, ApprovalSettled

__all__ = ["chat"]


_CARD: Final = object()  # _until: an approval card is waiting to be asked
_SETTLED: Final = object()  # _prompt: the approval being asked was settled meanwhile


class _Lines:
    """Stdin, one line at a time, shared by the message prompt and the approval prompts.

    A read that was started but not taken (an approval card interrupted the message prompt) stays
    pending and is the next one taken, so no typed or piped line is lost or read twice.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._pending: asyncio.Future[str] | None = None

    def next(self, prompt: str | None) -> asyncio.Future[str]:
        """The pending read (after printing ``prompt``); wrap it in ``asyncio.shield`` to wait."""
        if self._pending is None:
            self._pending = _read_line(self.loop, prompt)
        elif prompt:
            click.echo(prompt, nl=False)
        return self._pending

    def taken(self) -> None:
        """The pending read's line was used."""
        self._pending = None


class _Chat:
    """The read-send-stream loop, and the approval desk; returns the exit code.

    Approval pushes are handled by :meth:`_on_push` (on the pump): a request is queued as a card, a
    settlement is printed (and ends the prompt of its card). The cards are asked one at a time by the
    main loop, whether it waits at the message prompt or for a turn to end.
    """

    def __init__(self, client: Client, view: SessionView, interactive: bool) -> None:
        self.client, self.view, self.interactive = client, view, interactive
        self.quit = asyncio.Event()
        self.in_turn = False
        self.abort_sent = False
        self.failed = False
        self.eof = False
        self.presence = Presence(client, busy=lambda: self.in_turn)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._lines: _Lines | None = None
        # the approval desk
        self._cards: deque[Approval] = deque()
        self._card_ready = asyncio.Event()
        self._known: dict[str, Approval] = {}  # every approval pushed to us, by id
        self._shown: set[str] = set()  # cards printed
        self._settled: dict[str, ApprovalSettled] = {}
        self._ours: set[str] = set()  # settled by our answer
        self._asking: str | None = None
        self._answering: str | None = None  # the card whose approval/respond is on its way
        self._asking_settled = asyncio.Event()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self._lines = _Lines(loop)
        handled = _install_sigint(loop, self._interrupt)
        pumping = asyncio.create_task(pump(self.client, self.view, self._on_push))
        await self.presence.start()
        try:
            while not self.quit.is_set():
                text = await self._read_message(pumping)
                if text is None:
                    break
                if text.strip():
                    await self._turn(pumping, text)
        finally:
            if not pumping.done():
                await self.presence.stop()
            pumping.cancel()
            if handled:
                loop.remove_signal_handler(signal.SIGINT)
        if self.interactive:
            click.echo()
        return 1 if self.failed else 0

    async def _read_message(self, pumping: asyncio.Task[None]) -> str | None:
        """The next message: one line, or several joined where a line ends with a backslash.
        None at end of input or when the user quits. Approval cards arriving meanwhile are asked."""
        assert self._lines is not None
        parts: list[str] = []
        while not self.eof:
            if self._cards:
                await self._ask_cards(pumping)
                continue
            prompt = ("... " if parts else "> ") if self.interactive else None
            line = await self._until(pumping, asyncio.shield(self._lines.next(prompt)), cards=True)
            if line is _CARD:
                if self.interactive:
                    click.echo()  # the message prompt's line
                continue
            if line is None:
                return None
            self._lines.taken()
            if line == "":
                self.eof = True
                break
            self.presence.touch()
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
            while not self.quit.is_set():
                if await self._until(pumping, self.view.turn_done.wait(), cards=True) is not _CARD:
                    break
                await self._ask_cards(pumping)
        finally:
            self.in_turn = False

    async def _until(self, pumping: asyncio.Task[None], awaitable: Any, *, cards: bool = False) -> Any:
        """``awaitable``'s result; None when the user quits; :data:`_CARD` when ``cards`` and an
        approval card is waiting first; the pump's error if the connection ends."""
        waiting = asyncio.ensure_future(awaitable)
        quitting = asyncio.create_task(self.quit.wait())
        carding = asyncio.create_task(self._card_ready.wait()) if cards else None
        try:
            await asyncio.wait({waiting, quitting, pumping} | ({carding} if carding else set()),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            quitting.cancel()
            if carding is not None:
                carding.cancel()
            if not waiting.done():
                waiting.cancel()
        if pumping.done():
            pumping.result()  # raises ConnectionLost (or whatever ended it)
        if waiting.done() and not waiting.cancelled():
            return waiting.result()
        if carding is not None and self._card_ready.is_set() and not self.quit.is_set():
            return _CARD
        return None

    # --- approvals ------------------------------------------------------------------------------

    def _on_push(self, note: Notification) -> None:
        params = note.params
        if note.method == "approval/requested" and isinstance(params, ApprovalRequested):
            a = params.approval
            if a.id in self._known or a.id in self._settled or a.state != "pending":
                return  # the same card may be pushed again; take it once by id
            self._known[a.id] = a
            self._cards.append(a)
            self._card_ready.set()
        elif note.method == "approval/settled" and isinstance(params, ApprovalSettled):
            if params.approval_id in self._settled:
                return
            self._settled[params.approval_id] = params
            if params.approval_id in self._shown:
                self.view.say(self._settlement_line(params))
            if params.approval_id == self._asking:
                self._asking_settled.set()

    def _settlement_line(self, s: ApprovalSettled) -> str:
        a = self._known.get(s.approval_id)
        what = f" {clean(a.tool)}" if a else ""
        # The push may come before the reply to our answer (and even after the turn's end): while
        # the answer is on its way, the settlement is taken as ours; the reply corrects it if not.
        ours = None if s.approval_id == self._answering else s.approval_id in self._ours
        return f"[approval{what} {settlement_text(s, ours=ours)}]"

    async def _ask_cards(self, pumping: asyncio.Task[None]) -> None:
        """Ask every waiting card, in the order they came."""
        while self._cards and not self.quit.is_set():
            a = self._cards.popleft()
            if not self._cards:
                self._card_ready.clear()
            settled = self._settled.get(a.id)
            if settled is not None:  # settled before we got to it: say so, once
                what = approval_line(a).split("] ", 1)[1]
                self.view.say(f"[approval {settlement_text(settled)}] {what}")
                continue
            await self._ask(pumping, a)

    async def _ask(self, pumping: asyncio.Task[None], a: Approval) -> None:
        """Show the card, ask ``approve? [y/N]`` and a note, answer with the card's content hash."""
        self._shown.add(a.id)
        self._asking = a.id
        self._asking_settled.clear()
        try:
            for line in approval_card(a):
                self.view.say(line)
            answer = await self._prompt(pumping, "approve? [y/N] ")
            if answer is None or answer is _SETTLED:
                return
            approve = answer.strip().lower() in ("y", "yes")
            note = "" if self.eof else await self._prompt(pumping, "note (enter to skip): ")
            if note is None or note is _SETTLED:
                return
        finally:
            self._asking = None
        params: dict[str, Any] = {"approvalId": a.id, "decision": "approve" if approve else "deny",
                                  "contentHash": a.content_hash}
        if note.strip():
            params["note"] = note.strip()
        self._answering = a.id
        try:
            await self.client.call("approval/respond", params)
            self._ours.add(a.id)
        except RpcFailed as e:
            if e.data_code == "approval-settled":  # its approval/settled says how
                self.view.say(f"[approval {clean(a.tool)}: settled before this answer arrived; it did not count]")
            else:
                self.view.say(f"error: {e}")
        finally:
            self._answering = None

    async def _prompt(self, pumping: asyncio.Task[None], prompt: str) -> Any:
        """One answer line (stripped of its newline; "" at end of input), :data:`_SETTLED` when the
        card was settled elsewhere first, None when the user quits."""
        assert self._lines is not None
        if self._asking_settled.is_set():
            return _SETTLED
        self.view.ask(prompt)
        pending = self._lines.next(None)
        settled = asyncio.create_task(self._asking_settled.wait())
        try:
            line = await self._until(pumping, asyncio.wait({asyncio.shield(pending), settled},
                                                           return_when=asyncio.FIRST_COMPLETED))
        finally:
            settled.cancel()
        if line is None:
            self.view.answered("" if not self.interactive else None)
            return None
        if not pending.done():  # settled elsewhere first; the pending line goes to whoever reads next
            self.view.answered("" if not self.interactive else None)
            return _SETTLED
        self._lines.taken()
        text = pending.result()
        if text == "":
            self.eof = True
        self.presence.touch()
        text = text.rstrip("\r\n")
        self.view.answered(None if self.interactive else clean(text))
        return text

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

    While it runs the chat reports you present, so tool calls that need approval (sessions in
    permissionMode ask: exec, write_file...) are shown as a card and asked: `approve? [y/N]`, then an
    optional note (given to the model when you deny). With nobody present they are denied at once.

    \b
    Examples:
      sessionloop chat                       # a new session
      sessionloop chat 1a2266 --history 50   # continue one, with more context
      printf 'hello\\n' | sessionloop chat
      printf '!sleep 2000\\\\\\nslowly\\n' | sessionloop chat   # a two-line message
      printf '!tool exec {"command": "ls"}\\ny\\n\\n' | sessionloop chat   # approve, no note
    """
    code = run(_chat(endpoint, session, name, history))
    if code:
        sys.exit(code)
