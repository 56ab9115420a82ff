"""``sessions/list`` pages over light rows (``SummaryIndex.rows``) and builds summaries for the page
only; it must answer exactly what the list rules answer over every session's full summary."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionloop.actors import events as E
from sessionloop.actors.events import open_store
from sessionloop.actors.views.index import SummaryIndex
from sessionloop.actors.views.summary import (
    ListingRow,
    SummaryRecord,
    listing_key,
    listing_row,
    summary_from_record,
    summary_from_row,
)
from sessionloop.protocol.errors import RpcError
from sessionloop.protocol.listing import TreeFields, list_sessions, sort_key
from sessionloop.protocol.schemas import SessionsListParams
from sessionloop.protocol.schemas_types import AncestorRef, TokenCount

IDS = [f"s{i}" for i in range(10)]


@st.composite
def records(draw: Any) -> list[SummaryRecord]:
    out = []
    for i, sid in enumerate(draw(st.lists(st.sampled_from(IDS), unique=True, max_size=len(IDS)))):
        index = IDS.index(sid)
        kind = draw(st.sampled_from(["owner", "room", "task"]))
        window = draw(st.booleans())
        out.append(SummaryRecord(
            id=sid,
            title=draw(st.sampled_from(["", "Alpha", "beta task"])),
            name=draw(st.sampled_from(["", "named"])),
            kind=kind,
            # parents only among earlier ids: the store never holds a cycle
            parent_id=draw(st.none() | st.sampled_from(IDS[:index] or [None])) if index else None,
            platform=draw(st.sampled_from([None, "tg", "qq"])),
            instance=draw(st.sampled_from([None, "i1"])),
            account=draw(st.sampled_from([None, "acc"])),
            chat=E.ChatInfo(type="group") if window else None,
            place=E.PlaceRef(key="tg:acc:group:42", kind="window", name="g") if window else None,
            created_at=i,
            updated_at=draw(st.integers(0, 4)),
            last_reply_at=draw(st.none() | st.integers(0, 4)),
            seen_at=draw(st.integers(0, 4)),
            running=draw(st.booleans()),
            archived=draw(st.booleans()),
            attention=draw(st.booleans()),
            background=draw(st.integers(0, 2)),
            tokens_in=draw(st.integers(0, 3)),
            metered=draw(st.booleans()),
            last_outcome=draw(st.sampled_from([None, "replied", "error"])),
            last_ended_at=draw(st.none() | st.just(3)),
            last_reason=draw(st.sampled_from([None, "boom"])),
            app_id=draw(st.sampled_from([None, "app-a"])),
        ))
    return out


PARAMS = st.builds(
    dict,
    section=st.sampled_from([None, "owner", "rooms"]),
    parent_id=st.none() | st.sampled_from(IDS[:3]),
    archived=st.sampled_from([None, True, False]),
    background=st.sampled_from([None, True]),
    query=st.sampled_from([None, "alpha", "S1", "tg:42", "named"]),
    instance=st.sampled_from([None, "i1"]),
    limit=st.integers(1, 4),
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with open_store(str(tmp_path_factory.mktemp("listing-rows"))) as s:
        yield s


def index_of(store: Any, recs: list[SummaryRecord]) -> SummaryIndex:
    index = SummaryIndex(store)
    for record in recs:
        index.update(record)
    return index


def answer(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except RpcError as e:
        return ("error", e.code, e.message)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(recs=records(), raw=PARAMS, app_only=st.booleans())
def test_every_page_over_rows_equals_the_page_over_full_summaries(store: Any, recs: list[SummaryRecord],
                                                                   raw: dict[str, Any], app_only: bool) -> None:
    if raw["background"] and raw["archived"] is not None:
        raw["archived"] = None  # refused by the params themselves
    index = index_of(store, recs)
    visible = (lambda r: r.app_id == "app-a") if app_only else None

    def terms(row: Any) -> list[str]:
        record = index.get(row.id)
        return [row.id, *[t for t in (record.title, record.name) if t],
                *([row.place.key] if row.place is not None and row.place.kind == "window" else [])]

    cursor, pages = None, 0
    while True:
        params = SessionsListParams(**{k: v for k, v in raw.items() if v is not None}, cursor=cursor)
        full = answer(list_sessions, index.summaries(visible), params, search_terms=terms)
        light = answer(list_sessions, index.rows(visible), params, search_terms=terms,
                       materialize=summary_from_row, key=listing_key)
        assert light == full
        if isinstance(full, tuple) or full.next_cursor is None:
            break
        cursor, pages = full.next_cursor, pages + 1
        assert pages <= len(IDS)


@given(recs=records(), tree=st.none() | st.builds(
    TreeFields, root_id=st.sampled_from(IDS), section=st.sampled_from(["owner", "rooms"]),
    attention=st.booleans(), background=st.integers(0, 3), child_count=st.integers(0, 3),
    tokens=st.none() | st.just(TokenCount(input=1, output=2)),
    ancestors=st.none() | st.just([AncestorRef(id="s0", title="Alpha")])))
def test_a_rows_fields_are_its_summarys(recs: list[SummaryRecord], tree: TreeFields | None) -> None:
    for record in recs:
        row = listing_row(record, tree)
        summary = summary_from_record(record, tree)
        assert summary_from_row(row) == summary
        for field in msgspec.structs.fields(ListingRow):
            if field.name not in ("record", "tree", "order", "place"):
                assert getattr(row, field.name) == getattr(summary, field.name), field.name
        assert listing_key(row, False) == sort_key(summary, False)
        assert listing_key(row, True) == sort_key(summary, True)


def test_a_row_is_built_again_only_when_its_record_changed(store: Any) -> None:
    index = index_of(store, [SummaryRecord(id="a", title="one"), SummaryRecord(id="b", title="two")])
    first = {row.id: row for row in index.rows()}
    again = {row.id: row for row in index.rows()}
    assert again["a"] is first["a"] and again["b"] is first["b"]
    index.update(SummaryRecord(id="a", title="renamed"))
    third = {row.id: row for row in index.rows()}
    assert third["b"] is first["b"] and third["a"] is not first["a"] and third["a"].title == "renamed"
    index.update(SummaryRecord(id="c", parent_id="b"))  # b now has a child: its row carries tree fields
    rows = {row.id: row for row in index.rows()}
    assert rows["b"].tree is not None and rows["b"].tree.child_count == 1 and rows["c"].tree is not None
    index.update(SummaryRecord(id="c", parent_id="b", deleted=True))
    assert {row.id for row in index.rows()} == {"a", "b"}
