"""The asyncio client of the session protocol and the Session Loop API (``loop/*``).

    async with AsyncClient("ws://127.0.0.1:8765/session", token) as bot:
        s = await bot.create(container_id="inbox", title="Alice")
        receipt = await bot.send(s.session_id, "hello", idempotency_key="m1")
        result = await bot.wait_for_turn(s.session_id, receipt.turn_id)

Theory of operation
-------------------
One task (:meth:`AsyncClient._run`) owns the connection, through websockets' reconnecting iterator
(``async for ws in connect(...)``: transient failures to connect are retried with its backoff,
fatal ones such as a refused token end it). For every WebSocket it starts a reader, sends
``initialize``, renews what the client had subscribed to (``loop/watch`` for the event streams,
then ``sessions/watch``, ``background/watch`` and every ``session/subscribe``, whose fresh snapshot
is queued as a notification), and only then lets calls through. A call waits for a connection,
takes a token of its own pacing bucket (the server's per-connection limit, docs/protocol.md), sends
its request and waits for the reply, all within its timeout. When the connection is lost under a
request, a method that is safe to repeat (:data:`~sessionloop.client.wire.RETRY_SAFE`) is sent
again on the next connection; ``loop/send`` is, because its idempotency key makes the repeat answer
the first receipt. Any other such call raises :class:`ConnectionLost` (its outcome is unknown).
A ``rejected`` error frame (back-pressure) or an ``unavailable`` one (the worker process that runs
the session is away, ``serve --workers``) means nothing was done: it is waited out
(``retryAfterMs``) and sent again; a ``rejected`` receipt of ``send`` (the quota) is sent again
with the same key after its ``retryAfterMs`` while the call's time allows, then returned.

Everything the client holds is bounded: requests in flight (``max_in_flight``), queued
notifications (``max_notifications``: beyond it they are dropped and the consumer is told once,
:class:`NotificationsDropped`), each event stream's live buffer (``max_watch_buffer``: beyond it the
stream catches up from the store instead), frames (``max_frame_bytes``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator
from dataclasses import replace
from importlib import metadata
from typing import Any, cast

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.client import backoff, process_exception
from websockets.exceptions import ConnectionClosed

from sessionloop.client.errors import (
    CallTimeout,
    ClientClosed,
    ClientError,
    ConnectFailed,
    ConnectionLost,
    InvalidArguments,
    Rejected,
    RpcFailed,
    Unavailable,
)
from sessionloop.client.link import Link, Lost, connect_error, describe
from sessionloop.client.options import ClientOptions, Pace, check_options, pace_for
from sessionloop.client.stream import EventStream, parse_cursor
from sessionloop.client.wire import (
    ENVELOPE,
    OWNER_METHODS,
    RETRY_SAFE,
    Notification,
    check_params,
    decode_push,
    python_name,
)
from sessionloop.protocol.connection import TokenBucket
from sessionloop.protocol.handshake import SESSION_PROTOCOL_VERSION
from sessionloop.protocol.limits import DEFAULT_WAIT_MS, MAX_WAIT_MS, MIN_WAIT_MS
from sessionloop.protocol.registry import METHODS, MethodSpec
from sessionloop.protocol.schemas import ClientInfo, Empty, InitializeParams, InitializeResult
from sessionloop.protocol.schemas_loop import (
    LoopCreateResult,
    LoopEventParams,
    LoopListEventsResult,
    LoopSendResult,
    LoopWaitForTurnResult,
)

__all__ = ["AsyncClient", "ClientOptions", "NotificationsDropped"]  # ClientOptions: re-exported

class NotificationsDropped(ClientError):
    """Notifications were dropped because nobody took them (``max_notifications``); what they said
    is lost: subscribe again for fresh snapshots."""

    code = "notifications-dropped"


class AsyncClient:
    """A connection to a sessionloop server that reconnects; see the module docstring.

    ``token`` is the owner's or an app's. The Session Loop API (:meth:`create`, :meth:`send`,
    :meth:`wait_for_turn`, :meth:`list_events`, :meth:`watch`) needs an app token; every other
    method of the protocol is a method named after it (``sessions/list`` -> :meth:`sessions_list`,
    ``session/config/get`` -> ``session_config_get``), taking the params Struct or its fields as
    keyword arguments and returning the result Struct; :meth:`call` reaches any method by name.
    """

    def __init__(self, url: str, token: str, options: ClientOptions | None = None, **overrides: Any) -> None:
        if not token:
            raise InvalidArguments("a token is required (the owner's, DATA/token, or an app's from apps.toml)")
        self.url = url
        self._token = token
        try:
            self.options = replace(options or ClientOptions(), **overrides)
        except TypeError as e:
            raise InvalidArguments(f"unknown client option: {e}") from None
        check_options(self.options)
        self.info: InitializeResult | None = None
        self.connections = 0  # WebSockets initialized so far (1 + reconnections)
        self._link: Link | None = None
        self._ready = asyncio.Event()
        self._fatal: ClientError | None = None
        self._closing = False
        self._runner: asyncio.Task[None] | None = None
        self._last_error: BaseException | None = None
        self.pace: Pace = pace_for(self.options, None)  # until a server announces its limits
        self._bucket: TokenBucket | None = None
        self._slots = asyncio.Semaphore(self.pace.max_in_flight)
        self._set_pace(self.pace)
        self._streams: list[EventStream] = []
        self._notes: deque[Notification] = deque()
        self._notes_dropped = 0
        self._notes_wake = asyncio.Event()
        self._subscribed: dict[str, None] = {}  # session ids, in the order subscribed
        self._watching: set[str] = set()  # sessions/watch, background/watch

    # --- lifetime ----------------------------------------------------------------------------------

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> InitializeResult:
        """Connect and initialize, trying for ``connect_timeout`` seconds. Raises
        :class:`TokenRefused`, :class:`ConnectFailed`, :class:`Unsupported` (protocol version)."""
        if self._runner is None:
            self._runner = asyncio.create_task(self._run(), name="sessionloop-client")
        try:
            async with asyncio.timeout(self.options.connect_timeout):
                await self._wait_link()
        except TimeoutError:
            await self.close()
            why = f": {describe(self._last_error)}" if self._last_error is not None else ""
            raise ConnectFailed(f"cannot connect to {self.url} within {self.options.connect_timeout:g} s{why}",
                                url=self.url) from None
        except BaseException:
            await self.close()
            raise
        assert self.info is not None
        return self.info

    async def close(self) -> None:
        """Close the connection; calls still waiting raise :class:`ClientClosed`."""
        self._closing = True
        if self._fatal is None:
            self._fatal = ClientClosed("the client was closed")
        self._wake_all()
        link = self._link
        if link is not None:
            await link.ws.close()
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._runner

    def _delays(self) -> Generator[float]:
        o = self.options
        return backoff(initial_delay=o.reconnect_initial, min_delay=o.reconnect_min, max_delay=o.reconnect_max)

    def _retryable(self, exc: Exception) -> Exception | None:
        self._last_error = exc
        return process_exception(exc)

    async def _run(self) -> None:
        try:
            # closed on the way out, whatever the way: the connection it holds goes with it
            async with contextlib.aclosing(self._attempts_to_connect()) as attempts:
                async for ws in attempts:
                    link = Link(ws)
                    try:
                        await self._serve(link)
                    except (ConnectionClosed, Lost):
                        pass
                    finally:
                        self._drop(link)
                    if self._closing or not self.options.reconnect:
                        break
        except ClientError as e:
            self._fatal = self._fatal or e
        except Exception as e:  # the iterator gave up: a fatal failure to connect
            self._fatal = self._fatal or connect_error(self.url, e)
        finally:
            if self._fatal is None:
                self._fatal = ConnectionLost(f"the connection to {self.url} ended and reconnect is off")
            self._wake_all()

    def _attempts_to_connect(self) -> AsyncGenerator[ClientConnection]:
        """websockets' reconnecting iterator (an async generator, so it can be closed)."""
        reconnecting = connect(self.url, additional_headers={"Authorization": f"Bearer {self._token}"},
                               open_timeout=self.options.open_timeout, max_size=self.options.max_frame_bytes,
                               compression=None, ping_interval=self.options.ping_interval,
                               ping_timeout=self.options.ping_timeout, reconnect_delays=self._delays,
                               process_exception=self._retryable)
        return cast(AsyncGenerator[ClientConnection], reconnecting.__aiter__())

    async def _serve(self, link: Link) -> None:
        reader = asyncio.create_task(self._read(link))
        try:
            try:
                version = metadata.version("sessionloop")
            except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
                version = "0"
            params = InitializeParams(protocol_version=SESSION_PROTOCOL_VERSION,
                                      client=ClientInfo(name=self.options.client_name, version=version))
            try:
                self.info = await link.request("initialize", params)
            except RpcFailed as e:  # an incompatible server: retrying cannot help
                self._fatal = e
                raise
            self._set_pace(pace_for(self.options, self.info.rate_limits))
            await self._renew(link)
            self.connections += 1
            self._link = link
            self._ready.set()
            await reader
        finally:
            reader.cancel()

    async def _renew(self, link: Link) -> None:
        """What this client had subscribed to, on a new connection (before any call gets through)."""
        if self._streams:
            await link.request("loop/watch", Empty())
        for method in sorted(self._watching):
            await link.request(method, Empty())
        for session_id in list(self._subscribed):
            try:
                snapshot = await link.request("session/subscribe", METHODS["session/subscribe"].params(
                    session_id=session_id))
            except RpcFailed as e:  # e.g. deleted meanwhile: the subscription ends, the consumer is told
                self._subscribed.pop(session_id, None)
                self._note(Notification("session/subscribe", e))
                continue
            self._note(Notification("session/subscribe", snapshot))
        for stream in self._streams:
            if self.connections:
                stream.reconnected()

    def _drop(self, link: Link) -> None:
        link.lose()
        if self._link is link:
            self._link = None
            self._ready.clear()

    def _wake_all(self) -> None:
        self._ready.set()
        self._notes_wake.set()
        for stream in self._streams:
            stream.wake()

    def _raise_if_fatal(self) -> None:
        if self._fatal is not None:
            raise self._fatal

    async def _wait_link(self) -> Link:
        while True:
            self._raise_if_fatal()
            link = self._link
            if link is not None and not link.lost:
                return link
            self._ready.clear()  # set again by the next initialized connection, or a fatal end
            await self._ready.wait()

    # --- the reader --------------------------------------------------------------------------------

    async def _read(self, link: Link) -> None:
        try:
            async for text in link.ws:
                self._dispatch(link, text if isinstance(text, str) else text.decode("utf-8", "replace"))
        except ConnectionClosed:
            pass
        except ClientError:  # a frame we cannot read: nothing after it can be trusted; reconnect
            await link.ws.close(1002, "unreadable frame")
        finally:
            link.lose()

    def _dispatch(self, link: Link, text: str) -> None:
        try:
            frame = ENVELOPE.decode(text)
        except msgspec.DecodeError as e:
            raise ClientError(f"the server sent a frame that is not JSON-RPC: {e}") from e
        if frame.method is not None and frame.id is None:
            params = decode_push(frame.method, frame.params)
            if isinstance(params, LoopEventParams):
                for stream in self._streams:
                    stream.offer(params.event)
            else:
                self._note(Notification(frame.method, params))
            return
        link.resolve(frame)

    def _note(self, note: Notification) -> None:
        if len(self._notes) >= self.options.max_notifications:
            self._notes_dropped += 1
        else:
            self._notes.append(note)
        self._notes_wake.set()

    # --- calls -------------------------------------------------------------------------------------

    async def call(self, method: str, params: msgspec.Struct | None = None, *, timeout: float | None = None,
                   **fields: Any) -> Any:
        """Call ``method`` with ``params`` (its params Struct) or with its fields as keyword
        arguments; returns its result Struct. Raises :class:`InvalidArguments` (nothing sent),
        an :class:`RpcFailed` subclass for an error reply, :class:`CallTimeout`,
        :class:`ConnectionLost` (a call not safe to repeat was cut off)."""
        spec = METHODS.get(method)
        if spec is None:
            raise InvalidArguments(f"no method {method[:100]!r} in protocol {SESSION_PROTOCOL_VERSION}")
        if method == "initialize":
            raise InvalidArguments("initialize is sent by the client itself on every connection")
        checked = check_params(spec, params, fields)
        result = await self._request(method, checked, timeout, method in RETRY_SAFE)
        self._track(method, checked)
        return result

    async def _request(self, method: str, params: msgspec.Struct, timeout: float | None, retry_safe: bool) -> Any:
        limit = self.options.call_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                return await self._attempts(method, params, retry_safe)
        except TimeoutError as e:
            if isinstance(e, ClientError):
                raise
            raise CallTimeout(f"{method}: no answer within {limit:g} s", method=method) from None

    async def _attempts(self, method: str, params: msgspec.Struct, retry_safe: bool) -> Any:
        while True:
            link = await self._wait_link()
            try:
                async with self._slots:
                    await self._pace()
                    return await link.request(method, params)
            except Lost as lost:
                if retry_safe or not lost.sent:
                    continue
                raise ConnectionLost(f"{method}: the connection was lost before the answer; whether it was "
                                     "carried out is unknown", method=method) from None
            except (Rejected, Unavailable) as e:  # back-pressure, or the session's worker is away: nothing done
                await asyncio.sleep((e.retry_after_ms or 100) / 1000)

    def _set_pace(self, pace: Pace) -> None:
        """Keep to ``pace`` from now on (a new bucket; a new in-flight limit for the calls that
        start from now: those in flight finish under the one they started with)."""
        if pace.max_in_flight != self.pace.max_in_flight:
            self._slots = asyncio.Semaphore(pace.max_in_flight)
        rate = pace.requests_per_second
        if rate != self.pace.requests_per_second or pace.burst != self.pace.burst or self._bucket is None:
            self._bucket = TokenBucket(rate, pace.burst) if rate is not None else None
        self.pace = pace

    async def _pace(self) -> None:
        loop = asyncio.get_running_loop()
        while self._bucket is not None and (wait_ms := self._bucket.take(loop.time())) is not None:
            await asyncio.sleep(wait_ms / 1000)

    def _track(self, method: str, params: Any) -> None:
        if method == "session/subscribe":
            self._subscribed[params.session_id] = None
        elif method == "session/unsubscribe":
            self._subscribed.pop(params.session_id, None)
        elif method in ("sessions/watch", "background/watch"):
            self._watching.add(method)

    # --- notifications -----------------------------------------------------------------------------

    async def next_notification(self, timeout: float | None = None) -> Notification:
        """The next push other than ``loop/event`` (those go to :meth:`watch` streams), in arrival
        order. Raises ``TimeoutError`` after ``timeout`` seconds, :class:`NotificationsDropped`
        once after some were dropped, the client's fatal error once it is closed."""
        async with asyncio.timeout(timeout):
            while True:
                if self._notes_dropped:
                    dropped, self._notes_dropped = self._notes_dropped, 0
                    raise NotificationsDropped(f"{dropped} notifications were dropped: nobody took them "
                                               f"(max_notifications={self.options.max_notifications})",
                                               dropped=dropped)
                if self._notes:
                    return self._notes.popleft()
                self._raise_if_fatal()
                self._notes_wake.clear()
                await self._notes_wake.wait()

    async def notifications(self) -> AsyncIterator[Notification]:
        """Every push but ``loop/event``, in order, until the client is closed."""
        while True:
            try:
                yield await self.next_notification()
            except ClientClosed:
                return

    # --- the Session Loop API ----------------------------------------------------------------------

    async def create(self, *, container_id: str | None = None, space: Any = None, title: str | None = None,
                     activity: str | None = None, permission_mode: str | None = None,
                     initial_message: Any = None, chat: Any = None, account: str | None = None,
                     place: Any = None, timeout: float | None = None) -> LoopCreateResult:
        """``loop/create``: a session of this app, placed in ``container_id`` (a room) or ``space``
        (``{"spaceId": ...}``); ``initial_message={"text", "idempotency_key"}`` is accepted in the same
        commit, and makes the call safe to repeat (the same key answers the same session)."""
        fields = {"container_id": container_id, "space": space, "title": title, "activity": activity,
                  "permission_mode": permission_mode, "initial_message": initial_message, "chat": chat,
                  "account": account, "place": place}
        params = check_params(METHODS["loop/create"], None, {k: v for k, v in fields.items() if v is not None})
        result: LoopCreateResult = await self._request("loop/create", params, timeout, initial_message is not None)
        return result

    async def send(self, session_id: str, text: str, idempotency_key: str, attachments: list[Any] | None = None,
                   *, traceparent: str | None = None, timeout: float | None = None) -> LoopSendResult:
        """``loop/send``: the receipt (``accepted``, ``queued``, ``duplicate``: the same key was
        seen, this is its turn; ``rejected``: over quota). Sent again with the same key after a lost
        connection (the server answers the first receipt) and, with ``honour_rejected``, after a
        ``rejected`` receipt's ``retryAfterMs`` while ``timeout`` allows; then the rejected receipt
        is returned. Raises :class:`Conflict` when the key was used for another message."""
        fields: dict[str, Any] = {"session_id": session_id, "text": text, "idempotency_key": idempotency_key}
        if attachments:
            fields["attachments"] = attachments
        if traceparent is not None:
            fields["traceparent"] = traceparent
        params = check_params(METHODS["loop/send"], None, fields)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.options.call_timeout if timeout is None else timeout)
        while True:
            receipt: LoopSendResult = await self._request("loop/send", params, max(0.0, deadline - loop.time()), True)
            if receipt.state != "rejected" or not self.options.honour_rejected:
                return receipt
            wait = (receipt.retry_after_ms or 1000) / 1000
            if loop.time() + wait >= deadline:
                return receipt
            await asyncio.sleep(wait)

    async def wait_for_turn(self, session_id: str, turn_id: str, timeout_ms: int | None = None, *,
                            timeout: float | None = None) -> LoopWaitForTurnResult:
        """``loop/waitForTurn``: ``completed`` (``output_text``), ``failed`` (``code``, ``message``) or
        ``timeout`` (only this wait ended, never the turn). ``timeout_ms`` is the server's wait
        (default 60 s, clamped to 1-600 s); the call's own ``timeout`` defaults to that plus
        ``call_timeout``, and running out of it is a ``timeout`` result too."""
        params = check_params(METHODS["loop/waitForTurn"], None, {"session_id": session_id, "turn_id": turn_id,
                                                                  **({} if timeout_ms is None else
                                                                     {"timeout_ms": timeout_ms})})
        wait_ms = DEFAULT_WAIT_MS if timeout_ms is None else min(MAX_WAIT_MS, max(MIN_WAIT_MS, timeout_ms))
        limit = wait_ms / 1000 + self.options.call_timeout if timeout is None else timeout
        try:
            result: LoopWaitForTurnResult = await self._request("loop/waitForTurn", params, limit, True)
        except CallTimeout:
            return LoopWaitForTurnResult(state="timeout")
        return result

    async def list_events(self, session_id: str | None = None, after: str | int | None = None,
                          limit: int | None = None, *, timeout: float | None = None) -> LoopListEventsResult:
        """``loop/listEvents``: the app's stored events after the cursor ``after`` (a page; ask
        again with ``next_cursor`` while it is set)."""
        cursor = parse_cursor("after", after)
        fields: dict[str, Any] = {"session_id": session_id, "limit": limit,
                                  "after": None if cursor is None else str(cursor)}
        params = check_params(METHODS["loop/listEvents"], None, {k: v for k, v in fields.items() if v is not None})
        result: LoopListEventsResult = await self._request("loop/listEvents", params, timeout, True)
        return result

    def watch(self, after: str | int | None = None, *, max_buffer: int | None = None) -> EventStream:
        """The app's events as they happen, after the cursor ``after`` when given (from the store
        first), across reconnections with no gap and no duplicate: see :mod:`sessionloop.client.stream`."""
        return EventStream(self, after, max_buffer or self.options.max_watch_buffer, self.options.resume_window)

    async def _start_stream(self, stream: EventStream) -> None:
        first = not self._streams
        self._streams.append(stream)
        if first:
            try:
                await self._request("loop/watch", Empty(), None, True)
            except BaseException:
                self._streams.remove(stream)
                raise

    def _forget_stream(self, stream: EventStream) -> None:
        if stream in self._streams:
            self._streams.remove(stream)


def _owner_method(name: str, spec: MethodSpec) -> Callable[..., Any]:
    async def method(self: AsyncClient, params: msgspec.Struct | None = None, /, *, timeout: float | None = None,
                     **fields: Any) -> Any:
        return await self.call(name, params, timeout=timeout, **fields)

    method.__name__ = method.__qualname__ = python_name(name)
    method.__doc__ = (f"``{name}``: params :class:`~protocol.schemas.{spec.params.__name__}` (or its fields as "
                      f"keyword arguments), result :class:`~protocol.schemas.{spec.result.__name__}`.")
    return method


for _name, _spec in OWNER_METHODS.items():
    setattr(AsyncClient, python_name(_name), _owner_method(_name, _spec))
