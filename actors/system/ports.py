"""The typed ports the composition root (``actors/api/host.py``) wires the runtime with.

A port is what one room needs of another, as a ``typing.Protocol``: the runtime is built with the
commit listeners it tells and the settings service it asks, both handed to its constructor; no
room writes an attribute onto another after construction, and no list of hooks is filled later.

- :class:`Commit` is what every commit listener hears after an append committed (the listing
  index, the Session Loop API's event feed, the settings service, metrics, tracing): facts as
  values, so no listener reaches into a session actor.
- :class:`CommitListener` is a listener; the runtime calls each on the committing session's
  thread, in the order the root gave them, and a failing one is logged and never fails the session.
- :class:`SessionSettings` is what the sessions and the runtime ask of the settings service
  (``actors/settings/service.py``): the layers that resolve a session's options, a session's
  setting writes, the language of human text, and the generation that invalidates cached options.
- :class:`HostPorts` is what a caller of ``Host.open`` may put in place of a runtime part (one
  provider for every session, the approval service, a wrapper of every tool's handler): a
  scripted or replayed model in tests and benchmarks, the recording's answers in ``rerun``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from sessionloop.actors import events as E
from sessionloop.eventstore import AppendResult, EventStore

if TYPE_CHECKING:
    from sessionloop.actors.approvals.actor import ApprovalService
    from sessionloop.actors.model import Provider
    from sessionloop.actors.session.state import SessionState
    from sessionloop.actors.system.runtime import Runtime
    from sessionloop.actors.tools import ToolSpec
    from sessionloop.actors.tools.registry import ToolHandler
    from sessionloop.actors.views.summary import SummaryRecord


class Commit(msgspec.Struct, frozen=True, gc=False):
    """One committed append of a session, as its listeners hear it.

    ``state`` is the session's state after the commit: read it on the calling thread, never keep
    or change it. ``record`` is the listing record this commit wrote (None when it left the
    listing as it was). ``loop_deltas``: step id -> the ``assistant.delta`` data of an answer
    taken in place in this commit, which the Session Loop API's watchers get just before that
    step's committed events. ``log`` is the store the events are in."""

    session_id: str
    stream: str
    events: Sequence[E.Event]
    result: AppendResult
    state: SessionState
    record: SummaryRecord | None
    loop_deltas: Mapping[str, list[dict[str, Any]]] | None
    log: EventStore


class CommitListener(Protocol):
    def __call__(self, commit: Commit, /) -> None: ...


class SessionSettings(Protocol):
    """What the runtime and the sessions ask of the settings service."""

    #: the language human text is rendered in when a frame is encoded (``actors.settings.texts``)
    language: str
    #: bumped when something every session's options depend on changed: cached options are dropped
    generation: int

    def resolve_config(self, state: Any, values: dict[str, Any]) -> None:
        """Overlay the layers' values on ``values`` (the agent options of ``state``'s session)."""

    def session_events(self, state: Any, plugin: str, key: str, value: Any, now: int) -> list[E.Event]:
        """The events of one write to the session's own layer, checked (refusals raised)."""

    def session_rows(self, state: Any, platform: str | None) -> Any:
        """The session's settings rows (``session/config/get``)."""

    def changed_elsewhere(self) -> None:
        """Something the fields depend on changed outside the layers (models were reloaded)."""

    def committed(self, commit: Commit) -> None:
        """A commit listener: settings values, new places and layers follow the sessions' commits."""


#: makes the approval service of a runtime (it needs the runtime: its sessions, store and timing)
ApprovalsFactory = Callable[["Runtime"], "ApprovalService"]
#: the handler a tool runs with instead of its own (given the tool, whose ``handler`` it may call)
ToolWrapper = Callable[["ToolSpec"], "ToolHandler"]


class HostPorts(msgspec.Struct, frozen=True, kw_only=True):
    """The runtime parts a caller of ``Host.open`` may hand in, each None for the real one.

    ``provider`` answers every session's model calls (else each session's configured model,
    ``actors.model.registry``); ``approvals`` makes the approval service (else the real
    ``ApprovalService`` with the host's timing); ``tool_handler`` is given each tool the runtime
    and the host register (the built-in tools and ``spawn_session``) and returns the handler it
    runs with."""

    provider: Provider | None = None
    approvals: ApprovalsFactory | None = None
    tool_handler: ToolWrapper | None = None

    def tool(self, spec: ToolSpec) -> ToolSpec:
        """``spec`` with the handler ``tool_handler`` gives it (``spec`` itself without one)."""
        if self.tool_handler is None:
            return spec
        return dataclasses.replace(spec, handler=self.tool_handler(spec))


__all__ = ["ApprovalsFactory", "Commit", "CommitListener", "HostPorts", "SessionSettings", "ToolWrapper"]
