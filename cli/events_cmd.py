"""``sessionloop events`` and ``sessionloop import``: a session's raw events out, and back in.

``events`` opens the store read-only (it works while a server runs) and prints each event, or
with ``--json`` the codec's JSON lines that ``import`` reads. ``import`` checks every line first,
then writes the events as a new stream with its listing record; it needs the writer lock, so it
refuses clearly (StoreLocked) while a server runs on the data directory.
"""

from __future__ import annotations

import os
import re
from typing import Any

import click
import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.events import encode_event, event_from_builtins, event_to_builtins
from sessionloop.actors.replay.values import fold_events
from sessionloop.actors.views.summary import encode_summary_record, summary_record
from sessionloop.cli.output import echo_json_line
from sessionloop.cli.session_log import (
    clock,
    data_option,
    json_option,
    open_store,
    read_session,
    say,
    session_id_of,
    short,
)
from sessionloop.eventstore.errors import EventDecodeError, WrongExpectedVersion

__all__ = ["events", "import_events"]

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@click.command("events")
@click.argument("session")
@data_option
@json_option
def events(session: str, data_dir: str, as_json: bool) -> None:
    """Print the raw events of SESSION; with --json as JSON lines, one object per event with its
    stream, version, position, commit time and the event in the codec's JSON form (the input of
    ``sessionloop import``). Opens the store read-only.

    \b
    Examples:
      sessionloop events 18f3a2c0d41e5b7a90c1d
      sessionloop events 18f3a2c0d41e5b7a90c1d --json > session.jsonl
    """
    session_id = session_id_of(session)
    store = open_store(data_dir, session_id)
    try:
        recorded = read_session(store, data_dir, session_id)
        if as_json:
            for line in store.export_jsonl(f"session-{session_id}"):
                echo_json_line(msgspec.json.decode(line))
            return
    finally:
        store.close()
    for rec in recorded:
        body = event_to_builtins(rec.event)
        tag = body.pop("type", "?")
        body.pop("at", None)
        say(f"v{rec.version:<5} pos {rec.position:<7} {clock(rec.at)}  {tag:<26} {short(body, 110)}")


class _ImportLine(msgspec.Struct):
    event: dict[str, Any]
    stream: str | None = None
    version: int | None = None


_line_decoder = msgspec.json.Decoder(_ImportLine)


def _parse_import(text: str, as_id: str | None) -> tuple[str, list[E.Event | E.UnknownEvent]]:
    """Validate every line; returns the target session id and the events. Raises ClickException
    naming the first bad line, before anything is written."""
    stream: str | None = None
    out: list[E.Event | E.UnknownEvent] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = _line_decoder.decode(line)
            event = event_from_builtins(item.event)
        except msgspec.DecodeError as e:
            raise click.ClickException(f"line {number}: not an exported event: {e}") from e
        except EventDecodeError as e:
            raise click.ClickException(f"line {number}: {e.args[0].split(': ', 1)[-1]}") from e
        if item.stream is not None:
            if stream is None:
                stream = item.stream
            elif item.stream != stream:
                raise click.ClickException(f"line {number}: stream {item.stream}, but the file started with {stream} "
                                           "(one session per file)")
        if not out and not isinstance(event, E.SessionCreated):
            raise click.ClickException(f"line {number}: the first event must be session.created, "
                                       f"got {E.event_tag(event)}")
        if item.version is not None and item.version != len(out) + 1:
            raise click.ClickException(f"line {number}: version {item.version}, expected {len(out) + 1}")
        out.append(event)
    if not out:
        raise click.ClickException("the file holds no events")
    if as_id is None and (stream is None or not stream.startswith("session-")):
        raise click.ClickException("the file names no session stream; give the new session id with --as")
    session_id = as_id if as_id is not None else session_id_of(stream or "")
    if not _ID.match(session_id):
        raise click.ClickException(f"invalid session id {session_id!r}: use letters, digits, '.', '_' and '-'")
    first = out[0]
    assert isinstance(first, E.SessionCreated)
    out[0] = msgspec.structs.replace(first, session_id=session_id)
    return session_id, out


@click.command("import")
@click.argument("file", type=click.File("r", encoding="utf-8"))
@data_option
@click.option("--as", "as_id", default=None, metavar="SESSION_ID",
              help="Import under this session id (default: the id in the file).")
def import_events(file: Any, data_dir: str, as_id: str | None) -> None:
    """Load a session exported with ``sessionloop events --json`` into a new stream.

    Every line is checked first; on a bad line nothing is written and the error names the line.
    An existing session id is refused (import it again with --as). Needs the writer lock.

    \b
    Examples:
      sessionloop events 18f3a2c0d41e5b7a90c1d --json > s.jsonl
      sessionloop import s.jsonl --data ./other --as copy-of-s
    """
    session_id, parsed = _parse_import(file.read(), as_id)
    state = fold_events(session_id, parsed)
    payloads = [e.raw if isinstance(e, E.UnknownEvent) else encode_event(e) for e in parsed]
    os.makedirs(os.path.join(data_dir, "store"), exist_ok=True)
    store = open_store(data_dir, session_id, readonly=False)
    stream = f"session-{session_id}"
    try:
        if store.stream_version(stream) > 0:
            raise click.ClickException(
                f"session {session_id} already exists in {data_dir}; choose another id with --as")
        store.append(stream, [msgspec.Raw(p) for p in payloads], expected_version=0,
                     meta=encode_summary_record(summary_record(state)),
                     flags={"active": bool(state.current_turn or state.queue)})
    except WrongExpectedVersion as e:
        raise click.ClickException(f"session {session_id} already exists in {data_dir}; choose another id with --as") \
            from e
    finally:
        store.close()
    click.echo(f"imported {len(parsed)} events as session {session_id} into {data_dir}")
