"""Listing records are bounded when read: a store written before titles had a bound (a 20 MB
``session/rename`` accepted by an older version) still opens and lists small rows."""

from __future__ import annotations

from typing import Any

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.errors import InvalidCommand
from sessionloop.actors.events import open_store
from sessionloop.actors.replay.values import fold_events
from sessionloop.actors.views.index import SummaryIndex
from sessionloop.actors.views.summary import (
    SummaryRecord,
    decode_summary_record,
    encode_summary_record,
    summary_from_record,
    summary_record,
)
from sessionloop.protocol.limits import MAX_REASON, MAX_TITLE

HUGE = 20 * 1000 * 1000


@pytest.fixture
def store(tmp_path: Any) -> Any:
    with open_store(str(tmp_path / "store"), durability="nosync") as s:
        yield s


def old_record(session_id: str, title: str, name: str = "", reason: str | None = None) -> bytes:
    """The listing record as the version before the bound wrote it (no cut on the way in)."""
    return encode_summary_record(SummaryRecord(id=session_id, title=title, name=name, created_at=1, updated_at=2,
                                               last_outcome="error" if reason else None,
                                               last_ended_at=2 if reason else None, last_reason=reason))


def test_a_stored_record_with_a_20_mb_title_lists_with_the_title_cut_to_1000_characters(store: Any) -> None:
    title = "T" * HUGE
    store.append("session-big", [E.SessionCreated(at=1, session_id="big", name="n"),
                                 E.SessionRenamed(at=2, title=title)],
                 meta=old_record("big", title, name="N" * HUGE, reason="R" * HUGE))
    store.append("session-small", [E.SessionCreated(at=1, session_id="small", title="fine")],
                 meta=old_record("small", "fine"))
    index = SummaryIndex(store)
    rows = {row.id: row for row in index.rows()}
    assert rows["small"].title == "fine"
    big = rows["big"]
    assert len(big.title) == MAX_TITLE and big.title == "T" * (MAX_TITLE - 1) + "…"
    assert len(big.record.name) == MAX_TITLE
    (summary,) = index.summaries_for(["big"])
    assert summary.title == big.title and summary.error and len(summary.reason) == MAX_REASON


def test_a_session_renamed_to_20_mb_by_an_older_version_builds_a_record_with_a_bounded_title() -> None:
    state = fold_events("big", [E.SessionCreated(at=1, session_id="big", name="N" * HUGE),
                                E.SessionRenamed(at=2, title="T" * HUGE)])
    record = summary_record(state)
    assert len(record.title) == MAX_TITLE and len(record.name) == MAX_TITLE
    assert len(encode_summary_record(record)) < 3 * MAX_TITLE + 200  # what the next commit stores
    assert summary_from_record(record).title == record.title


def test_titles_names_and_reasons_within_their_bounds_are_read_whole() -> None:
    record = decode_summary_record(old_record("s", "t" * MAX_TITLE, name="n" * MAX_TITLE, reason="r" * MAX_REASON))
    assert (record.title, record.name, record.last_reason) == ("t" * MAX_TITLE, "n" * MAX_TITLE, "r" * MAX_REASON)
    cut = decode_summary_record(old_record("s", "t" * (MAX_TITLE + 1)))
    assert cut.title == "t" * (MAX_TITLE - 1) + "…"


def test_a_sessions_live_state_cuts_a_title_and_name_stored_before_the_bound() -> None:
    state = fold_events("big", [E.SessionCreated(at=1, session_id="big", title="T" * HUGE, name="N" * HUGE)])
    assert len(state.title) == MAX_TITLE and len(state.created.title) == MAX_TITLE
    assert len(state.created.name) == MAX_TITLE  # what fork and the approval chain copy
    renamed = fold_events("big", [E.SessionCreated(at=1, session_id="big"), E.SessionRenamed(at=2, title="T" * HUGE)])
    assert renamed.title == "T" * (MAX_TITLE - 1) + "…"


def test_the_python_api_refuses_a_title_or_name_over_the_bound_and_writes_nothing(open_host: Any) -> None:
    host = open_host()
    with pytest.raises(InvalidCommand, match="title: at most 1000 characters"):
        host.create(title="T" * (MAX_TITLE + 1))
    with pytest.raises(InvalidCommand, match="name: at most 1000 characters"):
        host.create(name="N" * (MAX_TITLE + 1))
    assert host.list() == []
    session = host.create(title="ok")
    with pytest.raises(InvalidCommand, match="title: at most 1000 characters"):
        session.rename("T" * (MAX_TITLE + 1))
    session.rename("T" * MAX_TITLE)  # at the bound: fine
