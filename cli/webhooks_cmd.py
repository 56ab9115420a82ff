"""``sessionloop webhooks dead-letters|replay``: the deliveries the server gave up on
(docs/webhooks.md).

Each command works through a running server (``webhooks/deadLetters/list`` and ``/replay``, as the
owner: ``--url``, ``--token``) or, with ``--data``, on a data directory: ``dead-letters`` opens its
store read-only (it works while a server runs); ``replay`` writes and needs the writer lock, so it
refuses clearly while a server runs there (replay through the server instead). A replayed
delivery is sent by the server serving that data directory, with its original ``webhook-id``.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import click
import msgspec

from sessionloop.actors.webhooks.dead_letters import list_dead_letters, replay_dead_letters
from sessionloop.cli.client import Endpoint, connect, connection_options, run
from sessionloop.cli.output import echo_json, echo_table
from sessionloop.cli.session_log import open_store as open_session_store
from sessionloop.protocol.schemas_webhooks import DeadLetter, DeadLettersListResult, DeadLettersReplayResult

__all__ = ["webhooks"]

_HEADERS = ("ID", "APP", "TYPE", "ATTEMPTS", "DEAD AT", "LAST ERROR")


@click.group("webhooks")
def webhooks() -> None:
    """List and replay the webhook deliveries the server gave up on (dead letters).

    \b
    Examples:
      sessionloop webhooks dead-letters
      sessionloop webhooks dead-letters --data ./.sessionloop --app mybot --json
      sessionloop webhooks replay msg_3f2a9c_12
      sessionloop webhooks replay --all --app mybot
    """


def open_store(data_dir: str, *, readonly: bool = True) -> Any:
    """The data directory's event store; one clear line when there is none (or, to write, a server runs there)."""
    if not os.path.isdir(os.path.join(data_dir, "store")):
        raise click.ClickException(f"no event store in {data_dir}: not a data directory of sessionloop serve")
    return open_session_store(data_dir, "", readonly=readonly)


def _row(letter: DeadLetter) -> list[str]:
    at = datetime.datetime.fromtimestamp(letter.dead_at / 1000, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
    return [letter.id, letter.app, letter.type, str(letter.attempts), at, letter.error]


async def _list_remote(endpoint: Endpoint, app: str | None) -> list[DeadLetter]:
    out: list[DeadLetter] = []
    after = None
    async with connect(endpoint) as client:
        while True:
            page: DeadLettersListResult = await client.call(
                "webhooks/deadLetters/list", {"app": app, "after": after, "limit": 500})
            out += page.dead_letters
            after = page.next_after
            if after is None:
                return out


def _list_local(data_dir: str, app: str | None) -> list[DeadLetter]:
    store = open_store(data_dir)
    try:
        out: list[DeadLetter] = []
        after = None
        while True:
            page, after = list_dead_letters(store, app=app, after=after, limit=500)
            out += page
            if after is None:
                return out
    finally:
        store.close()


@webhooks.command("dead-letters")
@click.option("--app", default=None, help="Only this app's dead letters.")
@click.option("--data", "data_dir", default=None, help="Read this data directory's store (read-only) instead "
                                                       "of asking a server.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of dead letters.")
@connection_options
def dead_letters(app: str | None, data_dir: str | None, as_json: bool, endpoint: Endpoint) -> None:
    """List the deliveries given up on: id (the webhook-id), app, event type, attempts, when, last error."""
    found = _list_local(data_dir, app) if data_dir is not None else run(_list_remote(endpoint, app))
    if as_json:
        echo_json(msgspec.to_builtins(found))
    elif not found:
        click.echo("no dead letters", err=True)
    else:
        echo_table(_HEADERS, (_row(letter) for letter in found))


async def _replay_remote(endpoint: Endpoint, params: dict[str, Any]) -> DeadLettersReplayResult:
    async with connect(endpoint) as client:
        result: DeadLettersReplayResult = await client.call("webhooks/deadLetters/replay", params)
        return result


@webhooks.command("replay")
@click.argument("ids", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Every dead letter (of --app when given).")
@click.option("--app", default=None, help="With --all: only this app's dead letters.")
@click.option("--data", "data_dir", default=None, help="Write this data directory's store (no server may run "
                                                       "there) instead of asking a server.")
@connection_options
def replay(ids: tuple[str, ...], everything: bool, app: str | None, data_dir: str | None, endpoint: Endpoint) -> None:
    """Send dead letters again: IDS (webhook-ids, see dead-letters) or --all."""
    if everything == bool(ids):
        raise click.UsageError("give the ids of dead letters, or --all, not both")
    if data_dir is not None:
        store = open_store(data_dir, readonly=False)
        try:
            moved, missing = replay_dead_letters(store, ids, everything=everything, app=app)
        finally:
            store.close()
    else:
        result = run(_replay_remote(endpoint, {"ids": list(ids), "all": everything, "app": app}))
        moved, missing = result.replayed, result.missing
    click.echo(f"{moved} dead letter(s) queued for delivery again")
    if missing:
        raise click.ClickException(f"not dead letters: {', '.join(missing)}")
