"""Who is on the other end of a connection, and what the transport serves them: sans-I/O data.

:class:`Peer` is an authenticated connection (who, on which approval surface, how the server asks
the transport to close it); :class:`AppCredential` what an app token stands for;
:class:`ProtocolService` the interface the transport (``transport.py``, the I/O shell) serves,
which the gateway implements without the transport importing it. No socket, thread or clock here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from sessionloop.protocol.web_login import Login

__all__ = ["AppCredential", "Peer", "ProtocolService"]


class Peer(msgspec.Struct, kw_only=True):
    """An authenticated connection (a ``SessionPeer``): who, on which approval surface,
    and how the server asks the transport to close it."""

    platform: str
    user_id: str
    surface: str = "cli"
    app_id: str | None = None
    disconnect: Any = None  # Callable[[int, str], None]
    #: the page's login, for a connection the login cookie opened (closed when it ends)
    login: Login | None = None

    @property
    def is_owner(self) -> bool:
        return self.app_id is None


class AppCredential(msgspec.Struct, frozen=True, kw_only=True):
    app_id: str
    platform: str


class ProtocolService(Protocol):
    def connect(self, peer: Peer, send: Callable[[str], None]) -> Any: ...

    def resolve_file(self, session_id: str, handle: str) -> tuple[str, str] | None: ...

    def can_read(self, peer: Peer, session_id: str) -> bool: ...

    def going_offline(self) -> None: ...

    # optional: ``GET /api/models/<source>``; a JSON-able answer, or None for an unknown source
    def options(self, peer: Peer, source: str, dependency: str | None) -> Any: ...


    # optional: ``GET /api/loop/events``; the app's feed after ``cursor`` (None: from the present) to
    # ``deliver`` (False: stop), ``ended`` if it stops by itself; returns (the cursor it starts
    # after, stop). Raises a domain error (``forbidden``, ``cursor-expired`` with ``oldestCursor``)
    def watch_feed(self, peer: Peer, cursor: int | None, deliver: Callable[[Any], bool],
                   ended: Callable[[BaseException], None]) -> tuple[int, Callable[[], None]]: ...
