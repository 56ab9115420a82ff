"""The in-memory index of every session's listing record (built to answer ``sessions/list`` over
100,000 stored sessions in under a second without activating any actor).

Loaded once at open from the store's per-stream metadata records, then kept current by the
sessions themselves: every commit that changes a summary writes the record in its own append
and hands it here. Watchers (``sessions/watch``) hear about each change with the changed
session's ancestors, whose tree-computed fields (attention, background, tokens, childCount)
may have moved with it: a ``sessions/changed`` push carries the full summary of the changed session
and of each of its ancestors.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from sessionloop.actors.system.ports import Commit
from sessionloop.actors.views.summary import (
    ListingRow,
    SummaryRecord,
    decode_summary_record,
    listing_row,
    node_from_record,
    summary_from_record,
)
from sessionloop.protocol.listing import TreeFields, compute_tree_fields

log = logging.getLogger("sessionloop.summaries")

Watcher = Callable[[list[str], list[str]], None]


class SummaryIndex:
    def __init__(self, store: Any = None) -> None:
        """An empty index, or with ``store`` the one loaded from it (:meth:`load`)."""
        self._lock = threading.Lock()
        self._records: dict[str, SummaryRecord] = {}
        self._children: dict[str, set[str]] = {}
        self._watchers: dict[Any, Watcher] = {}
        self._rows: dict[str, ListingRow] = {}  # rows of sessions in no tree, by the record they came from
        #: records committed while nobody watched, applied on the next read or watch (``committed``)
        self._pending: deque[SummaryRecord] = deque()
        if store is not None:
            self.load(store)

    def load(self, store: Any) -> None:
        """Read every session's listing record from ``store`` (the composition root calls it once,
        after the runtime's start-up repairs rewrote the records they change and before any
        session runs)."""
        for stream, meta in store.scan_stream_meta():
            if not stream.startswith("session-"):
                continue
            try:
                record = decode_summary_record(meta)
            except (msgspec.DecodeError, msgspec.ValidationError):
                log.warning("skipping an unreadable listing record of %s", stream)
                continue
            if not record.deleted:
                with self._lock:
                    self._put(record)

    def __len__(self) -> int:
        self._sync()
        return len(self._records)

    def get(self, session_id: str) -> SummaryRecord | None:
        if self._pending:
            self._sync()
        return self._records.get(session_id)

    def records(self) -> list[SummaryRecord]:
        self._sync()
        with self._lock:
            return list(self._records.values())

    def _put(self, record: SummaryRecord) -> None:
        self._records[record.id] = record
        if record.parent_id is not None:
            self._children.setdefault(record.parent_id, set()).add(record.id)

    def _drop(self, session_id: str) -> SummaryRecord | None:
        self._rows.pop(session_id, None)
        gone = self._records.pop(session_id, None)
        if gone is not None and gone.parent_id is not None:
            self._children.get(gone.parent_id, set()).discard(session_id)
        return gone

    def committed(self, commit: Commit) -> None:
        """A commit listener (``actors.system.ports``): the listing record the commit wrote, if any.

        While nobody watches (an in-process host; a server with no ``sessions/watch``), the record is
        queued without taking the lock and applied, in commit order, by the next read or watch: many
        pool threads committing at once then never queue on the index's lock (on two cores they
        convoyed behind it). With watchers it is applied and told at once."""
        record = commit.record
        if record is None:
            return
        if not self._watchers:
            self._pending.append(record)  # a deque's append is atomic
            if not self._watchers:  # a watch that began meanwhile applies it (it drains first)
                return
        self.update(record)

    def update(self, record: SummaryRecord | None = None) -> None:
        """Apply the queued records and ``record`` (if given), then tell the watchers what changed."""
        with self._lock:
            changes = self._drain()
            if record is not None:
                changes.append(self._apply(record))
            watchers = list(self._watchers.values())
        for upserts, removes in changes:
            for watch in watchers:
                try:
                    watch(upserts, removes)
                except Exception:  # one broken watcher must not stop the others
                    log.exception("a sessions/watch watcher failed")

    def _sync(self) -> None:
        if self._pending:
            self.update()

    def _drain(self) -> list[tuple[list[str], list[str]]]:
        changes = []
        pending = self._pending
        while pending:
            changes.append(self._apply(pending.popleft()))
        return changes

    def _apply(self, record: SummaryRecord) -> tuple[list[str], list[str]]:
        """``record`` into the index (the lock held); the ids to upsert and to remove."""
        removed = record.deleted
        if removed:
            gone = self._drop(record.id)
            parent = gone.parent_id if gone is not None else record.parent_id
        else:
            self._put(record)
            parent = record.parent_id
        chain = self._ancestors(parent)
        return ([] if removed else [record.id]) + chain, [record.id] if removed else []

    def _ancestors(self, parent_id: str | None) -> list[str]:
        chain: list[str] = []
        seen: set[str] = set()
        while parent_id is not None and parent_id not in seen and parent_id in self._records:
            seen.add(parent_id)
            chain.append(parent_id)
            parent_id = self._records[parent_id].parent_id
        return chain

    def descendants(self, session_id: str) -> list[str]:
        """Every session below ``session_id``, each after its parent (archive and delete take
        children along; a delete purges them in the reverse order)."""
        self._sync()
        with self._lock:
            return self._below(session_id)

    def _below(self, session_id: str) -> list[str]:
        out: list[str] = []
        todo = list(self._children.get(session_id, ()))
        while todo:
            sid = todo.pop()
            out.append(sid)
            todo.extend(self._children.get(sid, ()))
        return out

    def _root(self, session_id: str) -> str:
        seen = {session_id}
        rec = self._records.get(session_id)
        while rec is not None and rec.parent_id is not None and rec.parent_id in self._records \
                and rec.parent_id not in seen:
            seen.add(rec.parent_id)
            rec = self._records[rec.parent_id]
        return rec.id if rec is not None else session_id

    def summaries_for(self, ids: Iterable[str], visible: Callable[[SummaryRecord], bool] | None = None) -> list[Any]:
        """Summaries of ``ids`` with their tree fields, computed over their trees only (not over
        every stored session: a push must not cost a scan of 100,000 records)."""
        self._sync()
        with self._lock:
            wanted = [sid for sid in ids if sid in self._records]
            nodes: dict[str, SummaryRecord] = {}
            for root in {self._root(sid) for sid in wanted}:
                for sid in [root, *self._below(root)]:
                    nodes[sid] = self._records[sid]
        kept = {sid: r for sid, r in nodes.items() if visible is None or visible(r)}
        fields = compute_tree_fields(node_from_record(r) for r in kept.values())
        return [self._summary(kept[sid], fields, kept) for sid in wanted if sid in kept]

    @classmethod
    def _summary(cls, record: SummaryRecord, fields: dict[str, TreeFields], records: dict[str, SummaryRecord]) -> Any:
        """A summary with its tree fields; a child takes chat and place from its root session."""
        return summary_from_record(cls._rooted(record, fields, records), fields.get(record.id))

    @staticmethod
    def _rooted(
        record: SummaryRecord, fields: dict[str, TreeFields], records: dict[str, SummaryRecord]
    ) -> SummaryRecord:
        """The record as its summary shows it: a child takes chat and place from its root."""
        tree = fields.get(record.id)
        if tree is not None and tree.root_id != record.id:
            root = records.get(tree.root_id)
            if root is not None:
                return msgspec.structs.replace(record, chat=root.chat, place=root.place,
                                               platform=record.platform or root.platform)
        return record

    def watch(self, key: Any, watcher: Watcher) -> None:
        self._sync()
        with self._lock:
            self._watchers[key] = watcher

    def unwatch(self, key: Any) -> None:
        with self._lock:
            self._watchers.pop(key, None)

    def tree(self, visible: Callable[[SummaryRecord], bool] | None = None) -> tuple[
            list[SummaryRecord], dict[str, TreeFields]]:
        """The visible records and their tree fields (computed over the visible sessions)."""
        records = [r for r in self.records() if visible is None or visible(r)]
        return records, compute_tree_fields(node_from_record(r) for r in records)

    def summaries(self, visible: Callable[[SummaryRecord], bool] | None = None,
                  only: Iterable[str] | None = None) -> list[Any]:
        records, fields = self.tree(visible)
        by_id = {r.id: r for r in records}
        if only is not None:
            wanted = set(only)
            records = [r for r in records if r.id in wanted]
        return [self._summary(r, fields, by_id) for r in records]

    def rows(self, visible: Callable[[SummaryRecord], bool] | None = None) -> list[ListingRow]:
        """The listing rows of the visible sessions (what ``sessions/list`` pages over).

        Tree fields are computed over the sessions that have a parent or children among the
        visible ones only; a session in no tree (most of them, for a bot deployment) has its own
        fields, which :func:`listing_row` gives without a tree, and its row is kept until its
        record changes. So a list over 100,000 sessions folds no tree it does not need to."""
        self._sync()
        with self._lock:
            records = [r for r in self._records.values() if visible is None or visible(r)]
            linked = {sid for sid, kids in self._children.items() if kids}
            linked.update(r.id for r in records if r.parent_id is not None and r.parent_id in self._records)
        rows: list[ListingRow] = []
        in_trees: list[SummaryRecord] = []
        memo = self._rows
        for record in records:
            if record.id in linked:
                in_trees.append(record)
                continue
            row = memo.get(record.id)
            if row is None or row.record is not record:
                row = memo[record.id] = listing_row(record)
            rows.append(row)
        if in_trees:
            fields = compute_tree_fields(node_from_record(r) for r in in_trees)
            by_id = {r.id: r for r in in_trees}
            rows.extend(listing_row(self._rooted(r, fields, by_id), fields.get(r.id)) for r in in_trees)
        return rows

    def room_trees(self, visible: Callable[[SummaryRecord], bool] | None = None) -> list[Any]:
        """Summaries of every room and everything below it: what the room groups are counted from
        (a room whose child waits on an approval counts as needing attention)."""
        self._sync()
        with self._lock:
            rooms = [r.id for r in self._records.values() if r.kind == "room" and r.parent_id is None]
            ids = [sid for room in rooms for sid in (room, *self._below(room))]
        return self.summaries_for(ids, visible)
