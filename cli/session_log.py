"""Reading one session's log from a data directory, and the plain-line printing of the commands
that show it (``replay``, ``rerun``, ``events``, ``import``, ``trace``).

The store is opened read-only unless a command writes (a fork, an imported stream): read-only
works while a server runs on the data directory; a writer refuses clearly (StoreLocked) while one
does. Every error a user can cause is one line (``click.ClickException``).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

import click

from sessionloop.actors.events import open_store as open_event_store
from sessionloop.actors.replay.values import one_line
from sessionloop.cli.output import clean, echo_json
from sessionloop.cli.serve import DEFAULT_DATA
from sessionloop.eventstore import EventStore, RecordedEvent
from sessionloop.eventstore.errors import SessionloopError, StorageError, StoreLocked

__all__ = ["clock", "data_option", "json_option", "open_store", "print_json", "read_session", "say",
           "session_id_of", "short"]

data_option = click.option("--data", "data_dir", default=DEFAULT_DATA, show_default=True,
                           help="Data directory (the event store is DATA/store).")
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")


def session_id_of(text: str) -> str:
    """The session id a command line names: ``session-ID`` (the stream) or ``ID``."""
    return text.removeprefix("session-")


def open_store(data_dir: str, session_id: str, *, readonly: bool = True) -> EventStore:
    """The event store of ``data_dir``; a ClickException when there is none, a server holds the
    writer lock a writing command needs, or it cannot be opened."""
    path = os.path.join(data_dir, "store")
    if not os.path.isdir(path):
        raise click.ClickException(f"session {session_id} not found in {data_dir} (no event store there)")
    try:
        return open_event_store(path, readonly=readonly)
    except StoreLocked as e:
        raise click.ClickException(
            f"{data_dir} is in use by a running server ({e.holder}); this command writes and needs the "
            "writer lock: stop the server first, or copy the data directory and work on the copy") from e
    except StorageError as e:
        raise click.ClickException(f"cannot open the event store in {data_dir}: {e}") from e


def read_session(store: EventStore, data_dir: str, session_id: str) -> list[RecordedEvent]:
    """The session's events; one clear line (ClickException) when it does not exist or was
    deleted (a deleted session's stream holds only its tombstone: there is nothing to show)."""
    try:
        events = store.read_stream(f"session-{session_id}")
        deleted = bool(events) and store.purged(f"session-{session_id}")
    except SessionloopError as e:
        raise click.ClickException(str(e)) from e
    if deleted:
        raise click.ClickException(f"session {session_id} not found in {data_dir}: it was deleted")
    if not events:
        raise click.ClickException(f"session {session_id} not found in {data_dir}")
    return events


def print_json(value: Any) -> None:
    echo_json(value)


def say(line: str) -> None:
    """One line of text output, cleaned of characters that would make it read differently."""
    click.echo(clean(line))


def clock(at: int) -> str:
    """A commit time (ms) as ``HH:MM:SS.mmm`` UTC."""
    if not at:
        return "--:--:--.---"
    return datetime.fromtimestamp(at / 1000, tz=UTC).strftime("%H:%M:%S.%f")[:-3]


def short(value: Any, limit: int = 100) -> str:
    """A value as one short line (text excerpted, anything else as JSON)."""
    return one_line(value, limit)
