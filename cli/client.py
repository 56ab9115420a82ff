"""A small protocol client for the command line: one WebSocket, JSON-RPC calls, a queue of pushes.

Theory of operation
-------------------

Commands are synchronous click functions; each one calls :func:`run` on a coroutine that opens a
:class:`Client` (``async with connect(endpoint) as client``), makes its calls and returns. Inside,
one reader task owns the socket's receive side:

* a result or error frame resolves the future of the request with that id (``call``);
* a notification is decoded with the Struct registered for it in :data:`protocol.registry.NOTIFICATIONS`
  and queued, in arrival order, for :meth:`Client.next` / :meth:`Client.notifications`.

Frames are read in the order the server sent them, so a push sent before a reply is already queued
when ``call`` returns (the protocol's snapshot rule depends on this: no push of a session reaches a
connection before its ``session/subscribe`` reply, and later ones carry a larger ``seq``).

Results are decoded two-stage, as the server decodes params (STYLE: msgspec): the envelope with
``result: Raw``, then the method's result Struct from :data:`protocol.registry.METHODS`. A server
frame this client cannot read is a :class:`ClientError`, never a traceback.

Errors, all one line (``cli.main.CleanErrors`` prints them and exits 1)::

    SessionloopError
    └── ClientError                 (cli/)
        ├── ConnectFailed           url: nothing listens there, bad URL, handshake timed out
        ├── TokenRefused            url, status: the server answered 401/403 before the upgrade
        ├── ConnectionLost          the server closed the connection while we were using it
        └── RpcFailed               method, rpc_code, data_code: an error frame

Connection defaults, so ``sessionloop serve`` in one terminal and ``sessionloop chat`` in another
need nothing copied: ``--url`` (env ``SESSIONLOOP_URL``, default :data:`DEFAULT_URL`) and
``--token`` (env ``SESSIONLOOP_TOKEN``, else the owner token file ``./.sessionloop/token`` that
``serve`` writes on first start).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Final, TypeVar

import click
import msgspec
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import (
    ConnectionClosed,
    InvalidHandshake,
    InvalidStatus,
    InvalidURI,
)

from sessionloop.cli.serve import DEFAULT_DATA, DEFAULT_PORT, TOKEN_FILE
from sessionloop.client.errors import ClientError as WireError
from sessionloop.client.wire import ENVELOPE, Notification, decode_push, decode_result
from sessionloop.eventstore.errors import SessionloopError
from sessionloop.protocol.frames import request_frame
from sessionloop.protocol.handshake import SESSION_PROTOCOL_VERSION
from sessionloop.protocol.sanitize import sanitize_text
from sessionloop.protocol.schemas import InitializeResult, SessionsListResult, SessionSummary

__all__ = [
    "DEFAULT_URL",
    "Client",
    "ClientError",
    "ConnectFailed",
    "ConnectionLost",
    "Endpoint",
    "Notification",
    "RpcFailed",
    "TokenRefused",
    "connect",
    "connection_options",
    "resolve_session",
    "run",
]

DEFAULT_URL: Final = f"ws://127.0.0.1:{DEFAULT_PORT}/session"
CLIENT_NAME: Final = "sessionloop-cli"
OPEN_TIMEOUT_S: Final = 10.0
# As large as the server's default frame limit: a snapshot can carry many items.
MAX_FRAME_BYTES: Final = 64 * 1024 * 1024


# --- errors ---------------------------------------------------------------------------------------


class ClientError(SessionloopError):
    """Base of the command-line client's errors; ``str(e)`` is the one line the user sees."""

    code = "client"


class ConnectFailed(ClientError):
    code = "connect-failed"


class TokenRefused(ClientError):
    code = "token-refused"


class ConnectionLost(ClientError):
    code = "connection-lost"


class RpcFailed(ClientError):
    """An error frame: ``message`` is the server's, ``data_code`` its ``error.data.code`` if any."""

    code = "rpc"

    def __init__(self, method: str, rpc_code: int, message: str, data: Any) -> None:
        data_code = data.get("code") if isinstance(data, dict) else None
        shown = f"{method}: {message}" + (f" ({data_code})" if data_code else f" (JSON-RPC {rpc_code})")
        super().__init__(shown, method=method, rpcCode=rpc_code, dataCode=data_code)
        self.method = method
        self.rpc_code = rpc_code
        self.data_code = data_code
        #: the error object as the server sent it
        self.error: dict[str, Any] = {"code": rpc_code, "message": message, **({} if data is None else {"data": data})}


# --- wire envelopes: sessionloop.client's (one decoder per method, built once: STYLE rule 2) -----

#: ``call(..., plain=True)``: the result as the server sent it
_ANY: Final = msgspec.json.Decoder()


_CLOSED: Final = object()  # queued when the connection ends, after every push before it


# --- where to connect -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Endpoint:
    """``--url`` and ``--token`` as given; the token is looked up only when a command connects."""

    url: str = DEFAULT_URL
    token: str | None = None

    def resolve_token(self) -> str:
        """The token to send: ``--token``/``SESSIONLOOP_TOKEN``, else ``./.sessionloop/token``.

        Raises :class:`ClientError` saying how to get one when there is none.
        """
        if self.token:
            return self.token
        path = os.path.join(DEFAULT_DATA, TOKEN_FILE)
        try:
            with open(path) as f:
                token = f.read().strip()
        except FileNotFoundError:
            token = ""
        except OSError as e:
            raise ClientError(f"cannot read the token file {path}: {e.strerror or e}") from e
        if not token:
            raise ClientError(
                "no token: pass --token or set SESSIONLOOP_TOKEN (sessionloop serve prints the owner "
                f"token on first start and saves it to DATA/token; here it looks in ./{path})"
            )
        return token


def connection_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--url`` and ``--token`` to a command; it receives them as ``endpoint: Endpoint``."""

    @click.option("--token", envvar="SESSIONLOOP_TOKEN", default=None, show_envvar=True,
                  help="Owner or app token (default: ./.sessionloop/token, written by `sessionloop serve`).")
    @click.option("--url", envvar="SESSIONLOOP_URL", default=DEFAULT_URL, show_default=True, show_envvar=True,
                  help="The server's session endpoint.")
    @functools.wraps(f)
    def wrapper(*args: Any, url: str, token: str | None, **kwargs: Any) -> Any:
        return f(*args, endpoint=Endpoint(url, token), **kwargs)

    return wrapper


T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine to completion (the commands are synchronous click functions)."""
    return asyncio.run(coro)


# --- the client -----------------------------------------------------------------------------------


class Client:
    """One initialized connection. Use :func:`connect`; every method may raise :class:`ClientError`."""

    def __init__(self, ws: ClientConnection, url: str) -> None:
        self.url = url
        self.info: InitializeResult | None = None
        self._ws = ws
        self._next_id = 0
        self._pending: dict[int, tuple[str, asyncio.Future[Any], bool]] = {}
        self._pushes: asyncio.Queue[Notification | object] = asyncio.Queue()
        self._lost: ConnectionLost | None = None
        self._reader = asyncio.create_task(self._read(), name="sessionloop-client-reader")

    async def initialize(self) -> InitializeResult:
        """The handshake (docs/protocol.md, Handshake); an incompatible server is an ``unsupported`` RpcFailed."""
        try:
            version = metadata.version("sessionloop")
        except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
            version = "0"
        self.info = await self.call("initialize", {"protocolVersion": SESSION_PROTOCOL_VERSION,
                                                    "client": {"name": CLIENT_NAME, "version": version}})
        return self.info

    async def call(self, method: str, params: Any = None, *, plain: bool = False) -> Any:
        """Send a request and wait for its reply: the method's result Struct (plain data if unknown,
        or with ``plain``: the result as the server sent it, for a caller that compares it).

        ``params`` is a dict with the wire's camelCase keys or a params Struct. Raises
        :class:`RpcFailed` on an error frame, :class:`ConnectionLost` if the connection ends first.
        """
        if self._lost is not None:
            raise self._lost
        self._next_id += 1
        request_id = self._next_id
        frame = request_frame(request_id, method, params)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = (method, future, plain)
        try:
            await self._ws.send(frame)
        except ConnectionClosed:
            self._pending.pop(request_id, None)
            raise self._lost or self._connection_lost() from None
        return await future

    async def next(self, timeout: float | None = None) -> Notification:
        """The next push in arrival order; ``TimeoutError`` after ``timeout`` seconds, ConnectionLost
        once the connection has ended and every earlier push was taken."""
        if self._lost is not None and self._pushes.empty():
            raise self._lost
        item = await asyncio.wait_for(self._pushes.get(), timeout)
        if item is _CLOSED:
            self._pushes.put_nowait(_CLOSED)  # later callers get the same answer
            assert self._lost is not None
            raise self._lost
        assert isinstance(item, Notification)
        return item

    async def notifications(self) -> AsyncIterator[Notification]:
        """Every push, in order, until the connection ends (then ConnectionLost)."""
        while True:
            yield await self.next()

    async def close(self) -> None:
        await self._ws.close()
        self._reader.cancel()
        try:
            await self._reader
        except asyncio.CancelledError:
            pass

    # --- the reader ----------------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            async for text in self._ws:
                self._dispatch(text if isinstance(text, str) else text.decode("utf-8", "replace"))
        except ConnectionClosed:
            pass
        except ClientError as e:  # a frame we cannot read: nothing after it can be trusted
            self._lost = ConnectionLost(str(e))
            await self._ws.close(1002, "unreadable frame")
        finally:
            self._lost = self._lost or self._connection_lost()
            for _, future, _ in self._pending.values():
                if not future.done():
                    future.set_exception(self._lost)
            self._pending.clear()
            self._pushes.put_nowait(_CLOSED)

    def _dispatch(self, text: str) -> None:
        try:
            frame = ENVELOPE.decode(text)
        except msgspec.DecodeError as e:
            raise ClientError(f"the server sent a frame that is not JSON-RPC: {e}") from e
        if frame.method is not None and frame.id is None:
            self._pushes.put_nowait(Notification(frame.method, self._decode_push(frame.method, frame.params)))
            return
        pending = self._pending.pop(frame.id, None) if isinstance(frame.id, int) else None
        if pending is None:
            if frame.error is not None:  # an error about no request of ours (id null): say it
                raise ClientError(f"the server reported an error: {frame.error.message}")
            return
        method, future, plain = pending
        if future.done():
            return
        if frame.error is not None:
            future.set_exception(RpcFailed(method, frame.error.code, frame.error.message, frame.error.data))
            return
        try:
            future.set_result(_ANY.decode(frame.result) if plain else decode_result(method, frame.result))
        except (msgspec.DecodeError, WireError) as e:
            future.set_exception(ClientError(str(e) if isinstance(e, WireError) else
                                             f"{method}: the server's result is not what this client reads: {e}"))

    @staticmethod
    def _decode_push(method: str, params: msgspec.Raw) -> Any:
        """``sessionloop.client``'s push decoding, its error as this module's (a ``SessionloopError``)."""
        try:
            return decode_push(method, params)
        except WireError as e:
            raise ClientError(str(e)) from e

    def _connection_lost(self) -> ConnectionLost:
        code, reason = self._ws.close_code, self._ws.close_reason
        detail = f" (code {code}{': ' + reason if reason else ''})" if code is not None else ""
        return ConnectionLost(f"the server closed the connection{detail}")


@asynccontextmanager
async def connect(endpoint: Endpoint, *, initialize: bool = True) -> AsyncIterator[Client]:
    """An open, initialized :class:`Client`; closed on exit.

    Raises :class:`ConnectFailed` (one line: "cannot connect to URL: why") when nothing answers,
    :class:`TokenRefused` for a 401/403 before the upgrade, :class:`ClientError` without a token.
    """
    token = endpoint.resolve_token()
    ws = await _open(endpoint.url, token)
    client = Client(ws, endpoint.url)
    try:
        if initialize:
            await client.initialize()
        yield client
    finally:
        await client.close()


async def _open(url: str, token: str) -> ClientConnection:
    where = f"cannot connect to {url}"
    try:
        return await ws_connect(url, additional_headers={"Authorization": f"Bearer {token}"},
                                open_timeout=OPEN_TIMEOUT_S, max_size=MAX_FRAME_BYTES)
    except InvalidStatus as e:
        status = e.response.status_code
        if status == 401:
            raise TokenRefused(f"the server refused the token ({url}: HTTP 401); check --token / "
                               "SESSIONLOOP_TOKEN") from None
        if status == 403:
            raise TokenRefused(f"the server refused the connection ({url}: HTTP 403, forbidden)") from None
        body = bytes(e.response.body or b"").decode("utf-8", "replace").strip().splitlines()
        raise ConnectFailed(f"{where}: HTTP {status}{': ' + body[0] if body else ''}") from None
    except InvalidURI as e:
        raise ConnectFailed(f"{where}: not a ws:// or wss:// URL") from e
    except InvalidHandshake as e:
        raise ConnectFailed(f"{where}: {e}") from e
    except ConnectionRefusedError:
        raise ConnectFailed(f"{where}: connection refused (is `sessionloop serve` running?)") from None
    except TimeoutError:
        raise ConnectFailed(f"{where}: no answer within {OPEN_TIMEOUT_S:g} s") from None
    except OSError as e:
        raise ConnectFailed(f"{where}: {e.strerror or e}") from None


# --- naming sessions ------------------------------------------------------------------------------


async def resolve_session(client: Client, ref: str) -> str:
    """The session id ``ref`` names: an id, a unique id prefix, or a unique exact title.

    Looks among root sessions, archived or not. A ``ref`` that matches nothing is returned as it
    is, so a child session's full id still works and an unknown one gets the server's not-found.
    Raises :class:`ClientError` when ``ref`` is ambiguous.
    """
    found: list[SessionSummary] = []
    for archived in (None, True):
        page: SessionsListResult = await client.call(
            "sessions/list", {"query": ref, "limit": 200, **({"archived": True} if archived else {})})
        found.extend(page.sessions)
    if any(s.id == ref for s in found):
        return ref
    for matches in ([s for s in found if s.id.startswith(ref)],
                    [s for s in found if s.title == ref],
                    [s for s in found if s.title.casefold() == ref.casefold()]):
        if len(matches) == 1:
            return matches[0].id
        if matches:
            shown = ", ".join(f"{s.id} ({sanitize_text(s.title)})" for s in matches[:5])
            more = f" and {len(matches) - 5} more" if len(matches) > 5 else ""
            raise ClientError(f"{ref!r} matches {len(matches)} sessions: {shown}{more}; give the full id")
    return ref

