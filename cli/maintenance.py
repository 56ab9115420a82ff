"""Maintenance of a data directory: ``sessionloop compact`` and ``sessionloop backup``.

``compact`` rewrites the event store's file without the pages LMDB freed. A deleted session's
events are purged in one transaction (``eventstore/purge.py``), but LMDB
does not zero the pages it frees: until later commits reuse them, the deleted bytes can be read
from ``data.mdb`` directly. This command swaps in a compacting copy (``EventStore.compact``), after
which they are gone from the file. It needs the writer lock, so the server must be stopped.

``backup`` copies a data directory while its server runs: the store as one consistent read
transaction (compacted), then the files beside it (the token, the download-signing secret,
``apps.toml``, ``config.toml``, attachments, workspaces), owner-only. Attachments are written
before the events that name them, so every attachment the copied store names is copied (unless a
delete removes it in between). Restore by serving the copy: ``sessionloop serve --data DEST``.
"""

from __future__ import annotations

import os
import shutil

import click

from sessionloop.actors.events import open_store
from sessionloop.cli.serve import DEFAULT_DATA
from sessionloop.eventstore.errors import StorageError, StoreLocked


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
        store = open_store(path)
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


#: what a data directory holds beside the store, copied by ``backup`` when present
_FILES = ("token", "secret", "web-logouts", "apps.toml", "config.toml")  # web-logouts: a restore keeps them
_DIRS = ("blobs", "workspaces")


@click.command("backup")
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--data", "data_dir", default=DEFAULT_DATA, show_default=True,
              help="Data directory to back up (the event store is DATA/store).")
def backup(dest: str, data_dir: str) -> None:
    """Copy the data directory to DEST (a new directory) while the server keeps running: the
    event store as one consistent snapshot (compacted: no freed pages), then the token, secret,
    the web page's logouts, apps.toml, config.toml, attachments and workspaces, readable by the
    owner only. Serve the
    copy with --data DEST to restore it.

    \b
    Example:
      sessionloop backup /backups/sessionloop-$(date +%F) --data ./.sessionloop
    """
    path = os.path.join(data_dir, "store")
    if not os.path.exists(os.path.join(path, "data.mdb")):
        raise click.ClickException(f"no event store in {data_dir} (no {path}/data.mdb)")
    if os.path.exists(dest):
        raise click.ClickException(f"{dest} exists: a backup goes into a new directory")
    try:
        store = open_store(path, readonly=True)
    except StorageError as e:
        raise click.ClickException(f"cannot open the event store in {data_dir}: {e}") from e
    try:
        os.makedirs(dest, mode=0o700)
        size = store.backup(os.path.join(dest, "store"))
    except OSError as e:
        raise click.ClickException(f"cannot write the backup to {dest}: {e.strerror or e}") from e
    finally:
        store.close()
    try:
        for name in _FILES:
            if os.path.exists(os.path.join(data_dir, name)):
                shutil.copy2(os.path.join(data_dir, name), os.path.join(dest, name))
                os.chmod(os.path.join(dest, name), 0o600)
        for name in _DIRS:
            if os.path.isdir(os.path.join(data_dir, name)):
                # symlinks stay links (a workspace may hold one pointing anywhere): never followed
                shutil.copytree(os.path.join(data_dir, name), os.path.join(dest, name), symlinks=True)
    except OSError as e:
        raise click.ClickException(f"the store was copied to {dest} but copying the files beside it failed: "
                                   f"{e.strerror or e}") from e
    click.echo(f"backed up {data_dir} to {dest}: store {_mib(size)}")
