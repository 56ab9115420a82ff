"""A copy of the event store rebuilt key by key: what ``compact`` and ``backup`` write.

LMDB does not zero the pages a transaction frees (a purge's, a pruned feed's): their bytes stay in
the file until later commits reuse them. Nor does it zero a freed page's buffer when it reuses it
in memory, so a page written later (a purge's tombstone, say) can carry deleted bytes in its unused
end; a page-by-page copy (``mdb_env_copy2`` with ``MDB_CP_COMPACT``) keeps them. So the copy is
rebuilt here key by key, every page of it written from live data.
:class:`~eventstore.lmdb_recorder.LmdbRecorder` decides when (inside a read transaction for a
backup; on the group commit's leader, with every reader held at the gate, for a compaction) and
what happens to the copy.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import lmdb

from sessionloop.eventstore.errors import StorageError

__all__ = ["COPY_BATCH", "compacted_copy"]

#: entries copied per write transaction of a compacted copy: bounds the memory its dirty pages take
COPY_BATCH = 10_000


def compacted_copy(env: lmdb.Environment, known: dict[str, Any], map_size: int, dest: str, path: str) -> str:
    """The store's live data, as one read transaction of ``env`` sees it, written into a fresh
    environment in the directory ``dest``: returns its ``data.mdb``, owner-only and fsynced.

    ``known`` are the named databases the store opened (name -> handle); ``map_size`` the map the
    store was opened with; ``path`` the store's own directory, for error messages.

    Every named database is created there with the source's flags and filled from a cursor
    over the source, in key order (appended: pages filled, never split), in write
    transactions of ``COPY_BATCH`` entries; then each one's entry count is checked against
    the source's. The main database must hold nothing but the named databases (a plain key
    there would not be copied, so it fails the copy). The fresh environment's reused page
    buffers hold only pages of the copy itself, so whatever a page's unused end holds is
    live data too. Its map is twice the source's: the file grows only by the pages written,
    and a ``dupsort`` database (its new keys are inserted, not appended) may take more pages
    than in the source. Raises :class:`StorageError` when the copy is incomplete."""
    with env.begin() as src:
        names = [bytes(k) for k in src.cursor().iternext(keys=True, values=False)]
        dbs = {name: _source_db(env, known, name, src, path) for name in names}
        copy = lmdb.open(dest, map_size=2 * max(map_size, int(env.info()["map_size"])),
                         max_dbs=len(dbs) + 2, sync=False, metasync=False, lock=False, readahead=False,
                         writemap=False, meminit=True, mode=0o600)
        try:
            _copy_databases(src, dbs, copy)
        finally:
            copy.close()
    copied = os.path.join(dest, "data.mdb")
    os.chmod(copied, 0o600)
    fd = os.open(copied, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return copied


def _source_db(env: lmdb.Environment, known: dict[str, Any], name: bytes, txn: Any, path: str) -> Any:
    """The handle of the named database ``name`` (opened at open, or now in ``txn`` for one
    this release does not know of, so it is copied too)."""
    handle = known.get(name.decode("utf-8", "replace"))
    if handle is not None:
        return handle
    try:
        return env.open_db(name, txn=txn, create=False)
    except lmdb.Error as e:
        raise StorageError(f"the main database of the event store at {path} holds {name!r}, which is "
                           f"not a named database ({e}); it cannot be copied", path=path) from e


def _copy_databases(src: Any, dbs: dict[bytes, Any], copy: lmdb.Environment) -> None:
    """Every key and value of every database in ``dbs`` (name -> handle, read in ``src``) into the
    fresh environment ``copy``, the same named databases with the same flags; fails if any
    entry did not make it (``putmulti`` skips, not fails, a key appended out of order)."""
    for name, db in dbs.items():
        flags = db.flags(src)
        with copy.begin(write=True) as txn:
            target = copy.open_db(name, txn=txn, **flags)
        items = src.cursor(db=db).iternext(keys=True, values=True)
        while True:
            with copy.begin(write=True, db=target) as txn:
                consumed, _ = txn.cursor().putmulti(itertools.islice(items, COPY_BATCH), append=True)
            if consumed < COPY_BATCH:
                break
        with copy.begin(db=target) as txn:
            copied, wanted = txn.stat(target)["entries"], src.stat(db)["entries"]
        if copied != wanted:
            raise StorageError(f"the copy of database {name.decode('utf-8', 'replace')!r} holds {copied} "
                               f"entries, the store {wanted}; the copy is incomplete")
