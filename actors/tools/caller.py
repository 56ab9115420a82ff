"""Which tool call is running right now (the Session Loop API: ``context: 'caller'`` is only valid inside a
tool's ``execute()``). Set by the session actor around every tool run on the worker loop; a
contextvar, so tasks a tool starts inherit it and nothing else sees it."""

from __future__ import annotations

from contextvars import ContextVar

import msgspec


class CallerContext(msgspec.Struct, frozen=True, kw_only=True):
    session_id: str
    turn_id: str
    call_id: str


CURRENT_CALL: ContextVar[CallerContext | None] = ContextVar("sessionloop_current_call", default=None)
