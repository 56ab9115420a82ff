"""The listing index takes a commit's record without its lock while nobody watches, and applies the
queued records in commit order on the next read or watch; with watchers a record is applied and
told at once."""

from __future__ import annotations

import threading

from sessionloop.actors.system.ports import Commit
from sessionloop.actors.views.index import SummaryIndex
from sessionloop.actors.views.summary import SummaryRecord


def commit_of(record: SummaryRecord) -> Commit:
    return Commit(record.id, f"session-{record.id}", [], None, None, record, None, None)  # type: ignore[arg-type]


def test_records_committed_while_nobody_watches_are_read_in_commit_order() -> None:
    index = SummaryIndex()
    index.committed(commit_of(SummaryRecord(id="a", title="first")))
    index.committed(commit_of(SummaryRecord(id="a", title="second")))
    index.committed(commit_of(SummaryRecord(id="b", title="other")))
    assert len(index._pending) == 3  # nothing applied yet: no lock was taken
    assert index.get("a").title == "second"
    assert sorted(r.id for r in index.records()) == ["a", "b"] and not index._pending
    index.committed(commit_of(SummaryRecord(id="b", deleted=True)))
    assert [row.record.id for row in index.rows()] == ["a"]


def test_a_watch_applies_what_is_queued_and_then_hears_every_commit_at_once() -> None:
    index = SummaryIndex()
    index.committed(commit_of(SummaryRecord(id="a")))
    heard: list[tuple[list[str], list[str]]] = []
    index.watch("w", lambda upserts, removes: heard.append((upserts, removes)))
    assert index.get("a") is not None and heard == []  # applied before the watch began: nothing to tell
    index.committed(commit_of(SummaryRecord(id="c", parent_id="a")))
    assert heard == [(["c", "a"], [])] and not index._pending
    index.unwatch("w")
    index.committed(commit_of(SummaryRecord(id="c", parent_id="a", deleted=True)))
    assert heard == [(["c", "a"], [])] and index.descendants("a") == []


def test_many_threads_committing_at_once_lose_no_record() -> None:
    index = SummaryIndex()

    def commits(n: int) -> None:
        for i in range(500):
            index.committed(commit_of(SummaryRecord(id=f"s{n}-{i % 50}", title=str(i))))

    threads = [threading.Thread(target=commits, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(index) == 8 * 50
    assert {r.title for r in index.records()} == {str(i) for i in range(450, 500)}
