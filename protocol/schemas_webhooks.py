"""Wire shapes of the owner's webhook methods (docs/webhooks.md, ``webhooks/deadLetters/*``):
the deliveries the server gave up on, listed and sent again."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from sessionloop.protocol.schemas_types import ShortName, Wire

__all__ = [
    "DeadLetter",
    "DeadLettersListParams",
    "DeadLettersListResult",
    "DeadLettersReplayParams",
    "DeadLettersReplayResult",
    "MAX_DEAD_LETTER_IDS",
]

#: dead letters one ``webhooks/deadLetters/list`` answers at most, and ids one replay names
DEAD_LETTERS_MAX_LIMIT = 500
MAX_DEAD_LETTER_IDS = 1000
#: ``msg_<session>_<version>``: the ``webhook-id`` of the delivery
MessageId = Annotated[str, Meta(min_length=5, max_length=200)]
#: the opaque page cursor of a listing (``<shard>.<position>``: the gateway checks its form)
PageCursor = Annotated[str, Meta(max_length=26)]


class DeadLetter(Wire, frozen=True, kw_only=True):
    """A delivery given up on: what it announced, to whom, how often it was tried, the last error."""

    id: str
    app: str
    type: str
    session_id: str
    sequence: int
    cursor: int
    attempts: int
    error: str
    since: int  # ms: when it was committed (or last replayed)
    dead_at: int  # ms: when it was given up on


class DeadLettersListParams(Wire, frozen=True, kw_only=True):
    app: ShortName | None = None
    after: PageCursor | None = None
    limit: Annotated[int, Meta(ge=1, le=DEAD_LETTERS_MAX_LIMIT)] = 100


class DeadLettersListResult(Wire, frozen=True, kw_only=True):
    dead_letters: list[DeadLetter]
    #: pass back as ``after`` for the next page (absent: this was the last)
    next_after: str | None = None


class DeadLettersReplayParams(Wire, frozen=True, kw_only=True):
    """Send again the dead letters ``ids`` names, or with ``all`` every one (of ``app`` when given)."""

    ids: Annotated[list[MessageId], Meta(max_length=MAX_DEAD_LETTER_IDS)] = []
    all: bool = False
    app: ShortName | None = None


class DeadLettersReplayResult(Wire, frozen=True, kw_only=True):
    replayed: int
    #: ids that named no dead letter (delivered, replayed already, or never one)
    missing: list[str] = []
