"""Errors of the actor layer (the ``ActorError`` branch of the tree in ``eventstore/errors.py``).

Each leaf's ``code`` is the business code the protocol layer puts in ``error.data.code``. A
message may be a text object (``actors.settings.texts.Text``): ``str(error)`` is its English, and the
gateway renders it in the server's language when the error reaches a client.
"""

from __future__ import annotations

from typing import Any

from sessionloop.actors.settings.texts import Text
from sessionloop.eventstore.errors import SessionloopError


class ActorError(SessionloopError):
    code = "actor"


class NotFound(ActorError):
    """The session (or turn, approval, task) does not exist, or the caller may not see it."""

    code = "not-found"


class Forbidden(ActorError):
    code = "forbidden"


class InvalidCommand(ActorError):
    """The command is malformed or not allowed in the session's current state."""

    code = "invalid"


class Conflict(ActorError):
    code = "conflict"


class SessionBusy(ActorError):
    """The command needs an idle session (compact, rewind, fork) and a turn is running."""

    code = "busy"


class CompactionFailed(ActorError):
    """A compaction did not happen (``session/compress``: not compressed): the summary model is not
    available or failed, the history changed while it ran, or it was cancelled; the message
    says which, and so does the compress notice. No summary was committed."""

    code = "compaction-failed"


def compact_error(event: Any) -> str:
    """The reason of an ``agent.context.compact-failed`` as a text object when it has a key
    (rendered in the owner's language when the error is sent), else as it was stored."""
    return Text.stored(event.error, event.error_key, event.error_values)


class CursorExpired(ActorError):
    """A feed cursor older than the retention (7 days, 10,000 events per app): the events after it
    are partly gone. ``oldest_cursor`` (``data.oldestCursor`` on the wire) resumes without a gap
    from what is left; starting there still misses what retention took, so the bot should know."""

    code = "cursor-expired"

    def __init__(self, after: int, oldest: int) -> None:
        super().__init__(f"cursor {after} is older than the event feed's retention (7 days, 10,000 events per "
                         f"app): events after it were taken out; the oldest cursor to resume after is {oldest}",
                         oldestCursor=str(oldest))
        self.after = after
        self.oldest_cursor = oldest


class ExpectedTurnMismatch(ActorError):
    code = "expected-turn-mismatch"


class SessionParked(ActorError):
    """Supervision gave up on the session after repeated failures; the reason says why."""

    code = "parked"


class RequestTimeout(ActorError):
    """An actor did not answer in time (every wait on an actor has a timeout)."""

    code = "timeout"


class HostClosed(ActorError):
    code = "shutdown"

    def __init__(self) -> None:
        super().__init__(Text("error.host-closed"))


class Unsupported(ActorError):
    code = "unsupported"


class SessionElsewhere(ActorError):
    """A message for a session this worker does not run (``serve --workers``: its shard is another
    worker's, which requests for it are relayed to); nothing was done."""

    code = "unavailable"

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id} runs on another worker", retryAfterMs=1000)
