"""``watch``: the app's events as one stream that survives reconnections with no gap and no duplicate.

Theory of operation
-------------------
A stream registers for live events first (``loop/watch``, once per connection for all streams),
then, when it has a cursor to start from, reads the stored feed after it (``loop/listEvents``,
page by page, as the consumer takes events) and only then hands out the live events that came in
meanwhile, dropping those it already gave from the feed: the rule of RELIABILITY.md ("register live
first, read history up to the committed position, drop duplicates at the boundary").

After a reconnection (the client renews ``loop/watch`` first) or when the live buffer overflowed
(``max_buffer`` events the consumer did not take: they are dropped, not kept), the stream catches up
again from its anchor, so what was missed comes from the store. The anchor is the cursor the stream
started after while it has handed out fewer than ``window`` events, then the oldest of the last
``window`` cursors it handed out: live events of different sessions can arrive a little out of
cursor order (each session's commits are told from its own thread), so catching up from the very
last cursor could skip an event that was committed before it and not yet told. Everything handed
out above the anchor is remembered, so a repeat is dropped. An event committed more than
``window`` events before one already handed out and not told by then would be missed: that is
the bound.

``assistant.delta`` events (cursor ``"0"``) are live only: they are handed out as they come and
never caught up; those queued when a catch-up starts are dropped.

A stream without a starting cursor (``watch()``) starts from the live events (registered by
:meth:`EventStream.start` or the first iteration), anchored just before the first stored one it
hears: a disconnection before it hears one loses what happened meanwhile. Pass ``after`` (a cursor from a
receipt, an event or ``list_events``; ``"0"`` for everything retained) to start from the store.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

from sessionloop.client.errors import InvalidArguments
from sessionloop.protocol.limits import MAX_INT
from sessionloop.protocol.schemas_loop import LoopEvent

if TYPE_CHECKING:
    from sessionloop.client.aio import AsyncClient

__all__ = ["EventStream"]

#: events asked for per ``loop/listEvents`` page while catching up
PAGE_SIZE = 200


def parse_cursor(field: str, value: str | int | None) -> int | None:
    """A cursor as the server sends it (a string of digits) or an int; None stays None."""
    if value is None:
        return None
    text = str(value)
    if not text.isascii() or not text.isdigit() or len(text) > 19 or int(text) > MAX_INT:
        raise InvalidArguments(f"{field} must be a cursor (digits, from 0 to 2**63 - 1), not {text[:40]!r}")
    return int(text)


class EventStream:
    """An async iterator of :class:`~protocol.schemas_loop.LoopEvent`; see the module docstring.
    Made by :meth:`AsyncClient.watch`; ``last_cursor`` is the cursor of the last stored event handed
    out (save it to start a later stream after it)."""

    def __init__(self, client: AsyncClient, after: str | int | None, max_buffer: int, window: int) -> None:
        if max_buffer < 1 or window < 1:
            raise InvalidArguments("max_buffer and window must be at least 1")
        self._client = client
        self._after = parse_cursor("after", after)
        self._max_buffer = max_buffer
        self._window: deque[int] = deque(maxlen=window)
        self._seen: set[int] = set()
        self._floor: int | None = None  # seen holds every cursor handed out above it
        self._origin: int | None = None  # without ``after``: just before the first stored live event
        self._live: deque[LoopEvent] = deque()
        self._history: deque[LoopEvent] = deque()
        self._catchup_after: int | None = None  # the next page to read, while catching up
        self._resume = self._after is not None
        self._wake = asyncio.Event()
        self._started = False
        self._closed = False
        self.last_cursor: str | None = None if self._after is None else str(self._after)
        self.overflows = 0  # times the live buffer overflowed (each followed by a catch-up)
        self.catch_ups = 0

    def __aiter__(self) -> EventStream:
        return self

    async def start(self) -> EventStream:
        """Register for live events now (the first iteration does it otherwise): events from here on
        reach the stream even before it is iterated. Returns the stream."""
        if not self._started:
            self._started = True
            await self._client._start_stream(self)
        return self

    async def __anext__(self) -> LoopEvent:
        await self.start()
        while True:
            if self._closed:
                raise StopAsyncIteration
            self._client._raise_if_fatal()
            if self._history:
                event = self._history.popleft()
                if self._fresh(event):
                    return self._handed(event)
                continue
            if self._catchup_after is not None:
                await self._read_page(self._catchup_after)
                continue
            if self._resume:
                self._start_catch_up()
                continue
            if self._live:
                event = self._live.popleft()
                if event.cursor == "0":
                    return event
                if self._fresh(event):
                    return self._handed(event)
                continue
            self._wake.clear()
            await self._wake.wait()

    async def aclose(self) -> None:
        """Stop the stream: the iteration ends; the client forgets it."""
        self._closed = True
        self._wake.set()
        self._client._forget_stream(self)

    # --- what the client tells it ------------------------------------------------------------------

    def offer(self, event: LoopEvent) -> None:
        """A live event from the connection (the client's reader)."""
        if self._closed:
            return
        if self._after is None and self._origin is None and event.cursor != "0":
            self._origin = int(event.cursor) - 1
        if len(self._live) >= self._max_buffer:
            self._live.clear()  # the store has them: a catch-up reads them again
            self._resume = True
            self.overflows += 1
        else:
            self._live.append(event)
        self._wake.set()

    def reconnected(self) -> None:
        """``loop/watch`` was renewed on a new connection: catch up on what happened in between."""
        self._resume = True
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    # --- catching up ---------------------------------------------------------------------------------

    def _anchor(self) -> int | None:
        if len(self._window) == self._window.maxlen:
            oldest = min(self._window)
            return oldest if self._floor is None else max(oldest, self._floor)
        if self._after is not None:
            return self._after
        return self._origin

    def _start_catch_up(self) -> None:
        self._resume = False
        anchor = self._anchor()
        self._live = deque(e for e in self._live if e.cursor != "0")  # live-only pieces of the past
        if anchor is not None:
            self._catchup_after = anchor
            self.catch_ups += 1

    async def _read_page(self, after: int) -> None:
        page = await self._client.list_events(after=str(after), limit=PAGE_SIZE)
        self._history.extend(page.events)
        self._catchup_after = int(page.next_cursor) if page.next_cursor is not None else None

    # --- handing out ---------------------------------------------------------------------------------

    def _fresh(self, event: LoopEvent) -> bool:
        cursor = int(event.cursor)
        return cursor not in self._seen

    def _handed(self, event: LoopEvent) -> LoopEvent:
        cursor = int(event.cursor)
        self._window.append(cursor)
        self._seen.add(cursor)
        if self.last_cursor is None or cursor > int(self.last_cursor):
            self.last_cursor = event.cursor
        self._prune()
        return event

    def _prune(self) -> None:
        """Keep ``seen`` bounded: once it is twice the window (and no catch-up is under way, whose
        repeats it must still catch), forget the cursors below the window's oldest: the anchor
        never goes below it again."""
        limit = 2 * (self._window.maxlen or 1)
        if len(self._seen) <= limit or self._catchup_after is not None or self._history:
            return
        floor = min(self._window)
        if self._floor is not None and floor < self._floor:
            floor = self._floor
        self._floor = floor
        self._seen = {c for c in self._seen if c >= floor}
