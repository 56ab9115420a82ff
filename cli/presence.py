"""``presence/update`` for one chat connection: whether the owner is there to be asked.

The chat reports ``presence/update {active: true}`` before the first line is read, again at least
every minute while the user is active (typing, or a turn of theirs running), ``{active: false}``
once after 10 idle minutes and when it ends (:class:`Presence`). With nobody present, a tool call
that needs approval is denied at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Final

import click

from sessionloop.cli.client import Client, ClientError, RpcFailed

__all__ = ["PRESENCE_IDLE_S", "PRESENCE_REFRESH_S", "Presence"]

PRESENCE_REFRESH_S: Final = 60.0  # re-report present at least this often while the user is active
PRESENCE_IDLE_S: Final = 600.0  # a presence report counts for 10 minutes; idle that long -> absent
PRESENCE_STOP_TIMEOUT_S: Final = 2.0


class Presence:
    """``presence/update`` for one connection: the owner can only be asked to approve
    while a connection of theirs is present, and with nobody present a call is denied at once.

    * ``active: true`` at the start, again on activity when the last report is older than
      ``refresh_s`` (throttled), and every ``refresh_s`` while the user is active;
    * the user is active while ``busy()`` holds (a turn they sent is running) or within ``idle_s``
      of the last :meth:`touch` (a line typed); after that, one ``active: false`` -- the server stops
      counting this connection as present at once, as for a browser page gone to the background;
    * ``active: false`` when the chat ends (:meth:`stop`).

    Reports that fail because the connection ended are dropped: the pump reports the lost connection.
    """

    def __init__(self, client: Client, *, busy: Callable[[], bool] = lambda: False,
                 refresh_s: float = PRESENCE_REFRESH_S, idle_s: float = PRESENCE_IDLE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.busy, self.clock = client, busy, clock
        self.refresh_s, self.idle_s = refresh_s, idle_s
        self.active_at = clock()
        self.reported: bool | None = None
        self.reported_at = float("-inf")
        self._tasks: set[asyncio.Task[Any]] = set()
        self._beat: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Report present now (awaited: a turn sent right after must find us present), then beat.
        A server without presence is told once: its approvals cannot reach this chat."""
        try:
            await self.report(True)
        except RpcFailed as e:
            click.echo(f"warning: approvals cannot be asked here: {e}", err=True)
            return
        self._beat = asyncio.create_task(self._heartbeat(), name="sessionloop-presence")

    async def stop(self) -> None:
        """Report not present (best effort, briefly) and stop beating."""
        if self._beat is not None:
            self._beat.cancel()
        for task in list(self._tasks):
            task.cancel()
        try:
            await asyncio.wait_for(self.report(False), PRESENCE_STOP_TIMEOUT_S)
        except (ClientError, TimeoutError):
            pass

    def touch(self) -> None:
        """The user did something: report present unless a fresh report already says so."""
        self.active_at = self.clock()
        if self.reported is not True or self.active_at - self.reported_at >= self.refresh_s:
            task = asyncio.ensure_future(self._quietly(True))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def active(self) -> bool:
        return self.busy() or self.clock() - self.active_at < self.idle_s

    async def tick(self) -> None:
        """One beat: re-report present while active; report absent once when the user went idle."""
        if self.active():
            await self._quietly(True)
        elif self.reported:
            await self._quietly(False)

    async def report(self, active: bool) -> None:
        await self.client.call("presence/update", {"active": active})
        self.reported, self.reported_at = active, self.clock()

    async def _quietly(self, active: bool) -> None:
        try:
            await self.report(active)
        except ClientError:
            pass

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.tick()
