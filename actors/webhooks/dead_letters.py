"""Dead letters: the deliveries given up on, listed and sent again (``webhooks/deadLetters/*``,
``sessionloop webhooks``). A replay moves each back to the outbox with a fresh clock: the
deliverer of its shard's worker sends it again with its original ``webhook-id``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from sessionloop.actors.webhooks.events import webhook_type
from sessionloop.eventstore import EventStore, InvalidStreamName, OutboxItem
from sessionloop.protocol.schemas_webhooks import DeadLetter

__all__ = ["list_dead_letters", "replay_dead_letters"]

_ID = re.compile(r"^msg_(.+)_([0-9]{1,19})$")
_PAGE = 500


def _letter(store: EventStore[Any], item: OutboxItem) -> DeadLetter:
    recorded = store.event_at(item.position)
    stream = recorded.stream if recorded is not None else ""
    session_id = stream[len("session-"):] if stream.startswith("session-") else stream
    version = recorded.version if recorded is not None else 0
    kind = (webhook_type(recorded.event) if recorded is not None else None) or "unknown"
    return DeadLetter(id=f"msg_{session_id}_{version}", app=item.target, type=kind, session_id=session_id,
                      sequence=version, cursor=item.position, attempts=item.attempts, error=item.error,
                      since=item.since, dead_at=item.dead_at)


def _cursor(after: str | None) -> tuple[int, int] | None:
    if after is None:
        return None
    shard, position = after.split(".", 1)
    return int(shard), int(position)


def list_dead_letters(store: EventStore[Any], *, app: str | None = None, after: str | None = None,
                      limit: int = 100) -> tuple[list[DeadLetter], str | None]:
    """Up to ``limit`` dead letters (of ``app`` when given) after the cursor ``after``, and the
    cursor of the next page (None when this was the last)."""
    out: list[DeadLetter] = []
    cursor = _cursor(after)
    while len(out) < limit:
        page = store.read_outbox(None, cursor, _PAGE, dead=True)
        for item in page:
            cursor = (item.shard, item.position)
            if app is None or item.target == app:
                out.append(_letter(store, item))
                if len(out) >= limit:
                    more = store.read_outbox(None, cursor, 1, dead=True)
                    return out, f"{cursor[0]}.{cursor[1]}" if more else None
        if len(page) < _PAGE:
            break
    return out, None


def _all_keys(store: EventStore[Any], app: str | None) -> list[tuple[int, int]]:
    keys: list[tuple[int, int]] = []
    cursor: tuple[int, int] | None = None
    while True:
        page = store.read_outbox(None, cursor, _PAGE, dead=True)
        keys += [(i.shard, i.position) for i in page if app is None or i.target == app]
        if len(page) < _PAGE:
            return keys
        cursor = (page[-1].shard, page[-1].position)


def _key_of(store: EventStore[Any], message_id: str) -> tuple[int, int] | None:
    match = _ID.match(message_id)
    if match is None:
        return None
    stream, version = f"session-{match.group(1)}", int(match.group(2))
    try:
        found = store.read_stream(stream, version, 1)
    except InvalidStreamName:  # not a stream name the store takes
        return None
    if not found or found[0].version != version:
        return None
    return store.shard_of(stream), found[0].position


def replay_dead_letters(store: EventStore[Any], ids: Sequence[str] = (), *, everything: bool = False,
                        app: str | None = None) -> tuple[int, list[str]]:
    """Move the dead letters ``ids`` names (or, with ``everything``, all of them, of ``app`` when
    given) back to the outbox; ``(how many moved, the ids that named no dead letter)``."""
    if everything:
        keys = _all_keys(store, app)
        moved = store.replay_dead_letters(keys) if keys else 0
        return moved, []
    missing: list[str] = []
    keys = []
    for message_id in dict.fromkeys(ids):
        key = _key_of(store, message_id)
        dead = store.read_outbox([key[0]], (key[0], key[1] - 1), 1, dead=True) if key is not None else []
        if key is None or not dead or (dead[0].shard, dead[0].position) != key \
                or (app is not None and dead[0].target != app):
            missing.append(message_id)
        else:
            keys.append(key)
    moved = store.replay_dead_letters(keys) if keys else 0
    return moved, missing
