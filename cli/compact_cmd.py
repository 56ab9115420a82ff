"""``sessionloop compact``: rewrite the event store's file without the pages LMDB freed.

A deleted session's events are purged in one transaction (``eventstore/purge.py``), but LMDB
does not zero the pages it frees: until later commits reuse them, the deleted bytes can be read
from ``data.mdb`` directly. This command swaps in a compacting copy (``EventStore.compact``), after
which they are gone from the file. It needs the writer lock, so the server must be stopped.
"""

from __future__ import annotations

import os

import click

from eventstore import EventStore
from eventstore.errors import StorageError, StoreLocked

from .serve import DEFAULT_DATA


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


@click.command("compact")
@click.option("--data", "data_dir", default=DEFAULT_DATA, show_default=True,
              help="Data directory (the event store is DATA/store).")
def compact(data_dir: str) -> None:
    """Rewrite DATA/store/data.mdb without its free pages: the bytes of deleted sessions (and of
    pruned feed entries and idempotency receipts) leave the disk, and the file shrinks to the
    data in use. Stop the server first (the command takes the writer lock). A crash during the
    copy leaves the old file in place.

    \b
    Example:
      sessionloop compact --data ./.sessionloop
    """
    path = os.path.join(data_dir, "store")
    if not os.path.exists(os.path.join(path, "data.mdb")):
        raise click.ClickException(f"no event store in {data_dir} (no {path}/data.mdb)")
    try:
        store = EventStore.open(path)
    except StoreLocked as e:
        raise click.ClickException(
            f"{data_dir} is in use by a running server ({e.holder}); stop it, then compact") from e
    except StorageError as e:
        raise click.ClickException(f"cannot open the event store in {data_dir}: {e}") from e
    try:
        before, after = store.compact()
    finally:
        store.close()
    click.echo(f"compacted {path}/data.mdb: {_mib(before)} -> {_mib(after)}")
