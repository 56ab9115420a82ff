"""The synchronous client: :class:`~sessionloop.client.aio.AsyncClient` on an event loop of its own.

    with Client("ws://127.0.0.1:8765/session", token) as bot:
        s = bot.create(container_id="inbox", title="Alice")
        receipt = bot.send(s.session_id, "hello", idempotency_key="m1")
        print(bot.wait_for_turn(s.session_id, receipt.turn_id).output_text)

Every method blocks the calling thread until the asyncio client's call ends (its own timeouts
apply) and raises what it raises; any number of threads may call at once. The loop runs in one
daemon thread per client, started by the constructor and stopped by :meth:`Client.close`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import msgspec

from sessionloop.client.aio import AsyncClient, ClientOptions
from sessionloop.client.stream import EventStream
from sessionloop.client.wire import OWNER_METHODS, Notification, python_name
from sessionloop.protocol.registry import MethodSpec
from sessionloop.protocol.schemas import InitializeResult
from sessionloop.protocol.schemas_loop import (
    LoopCreateResult,
    LoopEvent,
    LoopListEventsResult,
    LoopSendResult,
    LoopWaitForTurnResult,
)

__all__ = ["Client", "EventIterator"]

T = TypeVar("T")


class Client:
    """A blocking client; the same methods as :class:`AsyncClient`, connected on construction."""

    def __init__(self, url: str, token: str, options: ClientOptions | None = None, **overrides: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sessionloop-client", daemon=True)
        self._thread.start()
        self._closed = False
        try:
            self.aio: AsyncClient = self._run(self._make(url, token, options, overrides))
            self.info: InitializeResult = self._run(self.aio.connect())
        except BaseException:
            self._stop_loop()
            raise

    @staticmethod
    async def _make(url: str, token: str, options: ClientOptions | None, overrides: dict[str, Any]) -> AsyncClient:
        return AsyncClient(url, token, options, **overrides)  # on the loop: its Events belong to it

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self.aio.close())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    # --- the Session Loop API ----------------------------------------------------------------------

    def create(self, **kwargs: Any) -> LoopCreateResult:
        """See :meth:`AsyncClient.create`."""
        return self._run(self.aio.create(**kwargs))

    def send(self, session_id: str, text: str, idempotency_key: str, attachments: list[Any] | None = None,
             *, traceparent: str | None = None, timeout: float | None = None) -> LoopSendResult:
        """See :meth:`AsyncClient.send`."""
        return self._run(self.aio.send(session_id, text, idempotency_key, attachments, traceparent=traceparent,
                                       timeout=timeout))

    def wait_for_turn(self, session_id: str, turn_id: str, timeout_ms: int | None = None, *,
                      timeout: float | None = None) -> LoopWaitForTurnResult:
        """See :meth:`AsyncClient.wait_for_turn`."""
        return self._run(self.aio.wait_for_turn(session_id, turn_id, timeout_ms, timeout=timeout))

    def list_events(self, session_id: str | None = None, after: str | int | None = None, limit: int | None = None,
                    *, timeout: float | None = None) -> LoopListEventsResult:
        """See :meth:`AsyncClient.list_events`."""
        return self._run(self.aio.list_events(session_id, after, limit, timeout=timeout))

    def watch(self, after: str | int | None = None, *, max_buffer: int | None = None) -> EventIterator:
        """See :meth:`AsyncClient.watch`: an iterator of events (``next(it)`` blocks)."""
        return EventIterator(self, self.aio.watch(after, max_buffer=max_buffer))

    def call(self, method: str, params: msgspec.Struct | None = None, *, timeout: float | None = None,
             **fields: Any) -> Any:
        """See :meth:`AsyncClient.call`."""
        return self._run(self.aio.call(method, params, timeout=timeout, **fields))

    def next_notification(self, timeout: float | None = None) -> Notification:
        """See :meth:`AsyncClient.next_notification`."""
        return self._run(self.aio.next_notification(timeout))


class EventIterator:
    """A :class:`~sessionloop.client.stream.EventStream` for threads: ``for event in bot.watch(...)``."""

    def __init__(self, client: Client, stream: EventStream) -> None:
        self._client = client
        self.stream = stream
        #: the stream's next event, kept across a caller's timeout so no event is lost to it
        self._next: asyncio.Future[LoopEvent] | None = None

    def __iter__(self) -> Iterator[LoopEvent]:
        return self

    def __next__(self) -> LoopEvent:
        return self.next()

    def next(self, timeout: float | None = None) -> LoopEvent:
        """The next event; ``TimeoutError`` after ``timeout`` seconds (the stream goes on)."""

        async def take() -> LoopEvent:
            if self._next is None:
                self._next = asyncio.ensure_future(self.stream.__anext__())
            async with asyncio.timeout(timeout):
                await asyncio.wait([self._next])
            future, self._next = self._next, None
            return future.result()

        try:
            return self._client._run(take())
        except StopAsyncIteration:
            raise StopIteration from None

    @property
    def last_cursor(self) -> str | None:
        return self.stream.last_cursor

    def close(self) -> None:
        self._client._run(self.stream.aclose())


def _sync_owner_method(name: str, spec: MethodSpec) -> Callable[..., Any]:
    def method(self: Client, params: msgspec.Struct | None = None, /, *, timeout: float | None = None,
               **fields: Any) -> Any:
        return self.call(name, params, timeout=timeout, **fields)

    method.__name__ = method.__qualname__ = python_name(name)
    method.__doc__ = (f"``{name}``: params :class:`~protocol.schemas.{spec.params.__name__}` (or its fields as "
                      f"keyword arguments), result :class:`~protocol.schemas.{spec.result.__name__}`.")
    return method


for _name, _spec in OWNER_METHODS.items():
    setattr(Client, python_name(_name), _sync_owner_method(_name, _spec))
