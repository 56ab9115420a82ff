"""The closed set of what a session actor is asked from outside its package, as frozen values.

Two kinds, each matched in one place:

- a **command** (:class:`Command`) changes the session: :func:`actors.session.decide.decide_command`
  turns it into the events to commit (pure), the shell appends them, and the reply completes after
  the commit. ``drive`` says whether the default loop runs after it (an input or a settled call may
  start work; a rename does not need to).
- a **query** (:class:`Query`) reads the live session: :func:`actors.session.queries.answer` computes
  the value on the actor's thread and the reply gets it.

No callable travels in a message: a caller says *what* it wants with one of these types, and only
this package decides *how*. The session actor wraps them in its ``Decide`` and ``Ask`` messages
(:mod:`actors.session.actor`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from sessionloop.actors import events as E

# --- commands: decided into events -----------------------------------------------------------------


class Command(msgspec.Struct, frozen=True, kw_only=True):
    """A change to one session, decided by ``decide_command``."""

    drive: ClassVar[bool] = False


class Rename(Command, frozen=True, kw_only=True):
    title: str
    drive: ClassVar[bool] = True


class MarkSeen(Command, frozen=True, kw_only=True):
    """The owner has seen the session's latest state (``session/markSeen``)."""


class ClearPlan(Command, frozen=True, kw_only=True):
    """``session/plan/clear``: the plan item goes; nothing is written when there is no plan."""


class Archive(Command, frozen=True, kw_only=True):
    """Archive (``archived=True``) or unarchive; nothing is written when it already is."""

    archived: bool


class RevokeGrant(Command, frozen=True, kw_only=True):
    """``approval/grants/revoke``: not-found for a grant the session lacks or that already ended."""

    grant_id: str
    by: E.Speaker


class SetSetting(Command, frozen=True, kw_only=True):
    """A write to the session's own settings layer (``value=None`` deletes it), checked by the
    settings service the decision is given."""

    plugin: str
    key: str
    value: Any


class Rewind(Command, frozen=True, kw_only=True):
    """Record a rewind whose files were restored (``turn/rewind``); refused if a turn started meanwhile."""

    turn_id: str
    scope: str
    restored: list[str]
    removed: list[str]
    conflicts: list[str]
    chat_deleted: bool
    deleted_messages: int


class ImportFork(Command, frozen=True, kw_only=True):
    """Create this session as a fork of ``source_id``: its creation copied from the source's with
    the new id and title, then the copied messages; refused if the session already exists."""

    source_id: str
    source_created: E.SessionCreated
    session_id: str
    title: str
    turns: int | None
    messages: list[E.Message]
    drive: ClassVar[bool] = True


class PostTaskNotice(Command, frozen=True, kw_only=True):
    """A finished background task tells its session: a notice that opens a turn with the notice's
    English text as its input (ids made by the caller, so the decision stays pure)."""

    task_id: str
    turn_id: str
    input_id: str
    text: str
    text_key: str
    text_values: dict[str, Any]
    facts: dict[str, Any]
    drive: ClassVar[bool] = True


class SettleApproval(Command, frozen=True, kw_only=True):
    """How an approval of the running turn's call ended; nothing when the call is settled already
    or its turn is over."""

    turn_id: str
    call_id: str
    approval_id: str
    settlement: E.Settlement
    drive: ClassVar[bool] = True


class RecordTaskEnd(Command, frozen=True, kw_only=True):
    """A background task ended without a notice (stopped): the session commits a copy of the end
    for its listing record; nothing for a deleted or never-created session."""

    ended: E.TaskEnded


class NewSession(msgspec.Struct, frozen=True, kw_only=True):
    """A session as its creator describes it (the ``Create`` message): ``decide_create`` records
    it as ``session.created`` with the time and the session's id. The fields are those of
    ``events.SessionCreated`` but ``at`` and ``session_id`` (a test keeps the two in step)."""

    title: str = ""
    name: str = ""
    kind: E.SessionKind = "owner"
    parent_id: str | None = None
    root_id: str | None = None
    app_id: str | None = None
    platform: str | None = None
    instance: str | None = None
    account: str | None = None
    container_id: str | None = None
    space_id: str | None = None
    activity: E.Activity = "interactive"
    permission_mode: E.PermissionMode = "ask"
    cwd: str = ""
    model: str | None = None
    chat: E.ChatInfo | None = None
    place: E.PlaceRef | None = None
    forked_from: str | None = None
    fork_turns: int | None = None
    created_by: E.Speaker | None = None


class NewInput(msgspec.Struct, frozen=True, kw_only=True):
    """An input as its sender gives it (the ``Send`` message, or the first input of a ``Create``),
    with the ids the sender picked: ``decide_input`` records it as ``input.accepted``. The fields
    are those of ``events.InputAccepted`` but ``at``."""

    input_id: str
    turn_id: str
    text: str = ""
    attachments: list[E.AttachmentRef] = []
    source: str | None = None
    speaker: E.Speaker | None = None
    idempotency_key: str | None = None
    traceparent: str | None = None


class Quota(msgspec.Struct, frozen=True, kw_only=True):
    """The Session Loop API's quota on a ``Send``: at most ``per_session`` unfinished turns in the
    session and ``per_app`` in all of ``app_id``'s sessions; over it the input is ``rejected``
    (nothing stored) with ``retry_after_ms``."""

    app_id: str
    per_session: int
    per_app: int
    retry_after_ms: int


class CheckpointImage(msgspec.Struct, frozen=True):
    path: str
    existed: bool
    content: bytes | None


class RecordCheckpoints(Command, frozen=True, kw_only=True):
    """Before-images of files a tool call is about to change, each recorded once per turn."""

    turn_id: str
    call_id: str
    images: list[CheckpointImage]


# --- queries: answered from the live session ----------------------------------------------------


class Query(msgspec.Struct, frozen=True, kw_only=True):
    """A read of one live session, answered by ``queries.answer``."""


class Wake(Query, frozen=True, kw_only=True):
    """Nothing but the activation: a session with unfinished work resumes when it is loaded."""


class Exists(Query, frozen=True, kw_only=True):
    """True when the session was created and not deleted."""


class StatusOf(Query, frozen=True, kw_only=True):
    """``idle | running | waiting_tool | completed | failed | cancelled``."""


class StateCopy(Query, frozen=True, kw_only=True):
    """A copy of the folded state."""


class ForkSource(Query, frozen=True, kw_only=True):
    """A copy of the state with only what ended turns produced (a running turn is not a stable prefix)."""


class LastTurn(Query, frozen=True, kw_only=True):
    """The id of the last turn the session has, queued or running; None when there is none."""


class TurnEnd(Query, frozen=True, kw_only=True):
    """The outcome of ``turn_id`` if it has ended, None while it is queued or running;
    not-found for a turn the session never had."""

    turn_id: str


class SettingsOf(Query, frozen=True, kw_only=True):
    """The session's own settings layer (``plugin/key`` -> value)."""


class SettingRows(Query, frozen=True, kw_only=True):
    """The ``session/config/get`` rows for this session, as the asking connection's platform sees them."""

    platform: str | None


class ActiveGrants(Query, frozen=True, kw_only=True):
    """The grants that settle calls now."""


class HistoryPage(Query, frozen=True, kw_only=True):
    """One page of the timeline's items older than ``before`` (the items and the next cursor)."""

    before: str | None
    limit: int | None  # None: the projection's default


class CallerOf(Query, frozen=True, kw_only=True):
    """What a session made with ``context='caller'`` takes from this (the calling) session."""


class AgentConfigOf(Query, frozen=True, kw_only=True):
    """The configuration the session's agent runs with now (settings layers resolved)."""


class ProjectionView(Query, frozen=True, kw_only=True):
    """The version, a copy of the state and the timeline's items, as a subscriber is served them."""


__all__ = [
    "ActiveGrants",
    "AgentConfigOf",
    "Archive",
    "CallerOf",
    "CheckpointImage",
    "ClearPlan",
    "Command",
    "Exists",
    "ForkSource",
    "HistoryPage",
    "ImportFork",
    "LastTurn",
    "MarkSeen",
    "PostTaskNotice",
    "ProjectionView",
    "Query",
    "RecordCheckpoints",
    "RecordTaskEnd",
    "Rename",
    "RevokeGrant",
    "Rewind",
    "SetSetting",
    "SettingRows",
    "SettingsOf",
    "SettleApproval",
    "StateCopy",
    "StatusOf",
    "TurnEnd",
    "Wake",
]
