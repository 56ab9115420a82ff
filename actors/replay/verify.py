"""Verification of a session's log: "does what the system serves follow from the log?".

:func:`verify` rebuilds the state, the listing record and the protocol items from the raw events
and compares them with what the system has: the stored snapshot (the fold at its version), the
listing record (``summary_record`` of the fold at the commit that wrote it), the history paged
from the items and the pushes a client that subscribed at a snapshot boundary received; given a
:class:`~sessionloop.actors.replay.live.LiveView`, also what a live host serves -- its session
actor's projection and state, the gateway's ``session/history`` pages and ``session/subscribe``
snapshot. The first difference is reported (:class:`Difference`) with its field path, the value
expected from the events and the value the system has. Pure: the live answers arrive as values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.replay.live import LiveView
from sessionloop.actors.replay.values import ABSENT, first_difference, plain, singleton_items, wire_item
from sessionloop.actors.session.state import SessionState, bound, copy_state, decode_state, evolve, new_state
from sessionloop.actors.settings.texts import LANGUAGES
from sessionloop.actors.views.items import ItemsProjection
from sessionloop.actors.views.summary import (
    SummaryRecord,
    decode_summary_record,
    rewrites_listing,
    summary_record,
)
from sessionloop.actors.views.timeline import HISTORY_MAX_LIMIT
from sessionloop.eventstore.records import RecordedEvent, Snapshot

__all__ = ["NOT_FROM_EVENTS", "Difference", "VerifyReport", "verify"]

#: Listing-record fields that are not a function of the session's own events (other streams).
NOT_FROM_EVENTS: Final = frozenset({"attention", "background"})


class Difference(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    """Where what the system serves differs from what the events say.

    ``check`` names the served thing (``snapshot``, ``listing record``, ``history``, ``pushes``);
    ``expected`` is the value rebuilt from the raw events, ``got`` the served one; ``version`` is
    the event version the compared value belongs to.
    """

    check: str
    path: str
    expected: Any = None
    got: Any = None
    version: int | None = None
    note: str | None = None


class VerifyReport(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    """What :func:`verify` compared and the first difference.

    ``compared`` is ``live`` when a live host's answers (:class:`LiveView`) were compared too
    (``live_epoch``, ``history_pages``, ``snapshot_items`` say what it served), ``offline`` when
    only what the store holds was (``offline_reason`` says why, when the caller knows).
    """

    session_id: str
    compared: str
    events: int = 0
    snapshot_version: int | None = None
    snapshot_note: str | None = None
    listing_version: int | None = None
    history_items: int = 0
    live_epoch: int | None = None
    history_pages: int | None = None
    snapshot_items: int | None = None
    offline_reason: str | None = None
    remote_url: str | None = None  # the running server asked over the wire (its actor's state is not)
    difference: Difference | None = None

    @property
    def ok(self) -> bool:
        return self.difference is None


def _commit_end(events: Sequence[RecordedEvent], index: int) -> int:
    """Index of the last event that may belong to the same commit as ``events[index]``.

    Events of one commit share the commit's time and have consecutive positions; two commits in
    the same millisecond may look like one, so the caller treats every index up to this one as a
    possible end of the commit.
    """
    end = index
    while end + 1 < len(events):
        a, b = events[end], events[end + 1]
        if b.at != a.at or b.position != a.position + 1 or b.commit_id != a.commit_id:
            break
        end += 1
    return end


def _record_plain(record: SummaryRecord) -> dict[str, Any]:
    out = plain(record)
    for key in NOT_FROM_EVENTS:
        out.pop(key, None)
    return out


def verify(session_id: str, events: Sequence[RecordedEvent], snapshot: Snapshot | None,
           meta: bytes | None, live: LiveView | None = None) -> VerifyReport:
    """Rebuild state, listing record and protocol items from ``events`` and compare them with the
    stored ``snapshot``, the stored listing record ``meta`` and the history paged from the
    rebuilt items; with ``live`` (:func:`serve_live_view`), also with what a live host serves:
    its session actor's projection and state, ``session/history`` pages and the
    ``session/subscribe`` snapshot, as the gateway sends them.

    Returns a report whose ``difference`` is the first one found (snapshot, listing record,
    history, then the live checks), or None when everything agrees.
    """
    report = VerifyReport(session_id=session_id, compared="live" if live is not None else "offline",
                          events=len(events))
    # the commits that rewrote the record, by the rule the session actor writes it by
    summary_at = [i for i, r in enumerate(events)
                  if isinstance(r.event, E.Event) and rewrites_listing([r.event])]
    candidates: set[int] = set()
    if summary_at:
        last = summary_at[-1]
        candidates = set(range(last, _commit_end(events, last) + 1))
    snap_at = snapshot.version if snapshot is not None else None
    state = new_state(session_id)
    snap_state: Any = None
    records: list[tuple[int, SummaryRecord]] = []
    for i, rec in enumerate(events):
        evolve(state, rec.event)
        if snap_at is not None and rec.version == snap_at:
            snap_state = copy_state(state)
        if i in candidates:
            records.append((rec.version, summary_record(state)))
    full = ItemsProjection(session_id)
    full.apply_all(r.event for r in events)
    report.difference = (_check_snapshot(report, snapshot, snap_state, events)
                         or _check_listing(report, meta, records)
                         or _check_history(report, session_id, events, full, state, snap_at)
                         or (_check_live(report, full, state, live) if live is not None else None))
    return report


def _check_snapshot(report: VerifyReport, snapshot: Snapshot | None, folded: Any,
                    events: Sequence[RecordedEvent]) -> Difference | None:
    if snapshot is None:
        return None
    report.snapshot_version = snapshot.version
    last = events[-1].version if events else 0
    if snapshot.version > last or folded is None:
        return Difference(check="snapshot", path="version", expected=f"a version between 1 and {last}",
                          got=snapshot.version, note="the snapshot claims events the stream does not have")
    decoded = decode_state(snapshot.state, snapshot.parts)
    if decoded is None:
        report.snapshot_note = "written in another state format: activation ignores it and replays the events"
        return None
    # a live session's snapshot is bounded (``state.bound``: the last turns' records); one of format 2 is whole
    found = first_difference(plain(bound(folded) if decoded.bounded else folded), plain(decoded))
    if found is None:
        return None
    path, expected, got = found
    return Difference(check="snapshot", path=f"state.{path}", expected=expected, got=got, version=snapshot.version)


def _check_listing(report: VerifyReport, meta: bytes | None,
                   records: list[tuple[int, SummaryRecord]]) -> Difference | None:
    if not records:
        return None
    version, expected = records[-1]
    if meta is None:
        return Difference(check="listing record", path="record", expected="a listing record", got=ABSENT,
                          version=version, note="sessions/list would not show this session")
    try:
        stored = decode_summary_record(meta)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        return Difference(check="listing record", path="record", expected="a listing record",
                          got=f"undecodable bytes ({e})", version=version)
    got = _record_plain(stored)
    for candidate_version, candidate in reversed(records):
        if first_difference(_record_plain(candidate), got) is None:
            report.listing_version = candidate_version
            return None
    found = first_difference(_record_plain(expected), got)
    assert found is not None
    path, want, have = found
    return Difference(check="listing record", path=f"record.{path}", expected=want, got=have, version=version)


def _check_history(report: VerifyReport, session_id: str, events: Sequence[RecordedEvent], full: ItemsProjection,
                   state: SessionState, snap_at: int | None) -> Difference | None:
    report.history_items = len(full.items())
    found = _check_pages(full, state)
    if found is not None or state.deleted:
        return found
    for boundary in sorted({0, snap_at or 0}):
        found = _check_pushes(full, session_id, events, boundary)
        if found is not None:
            return found
    return None


def _check_pages(full: ItemsProjection, state: SessionState) -> Difference | None:
    """``session/history`` paged from the newest to the oldest gives every archived item once, in order."""
    running = state.current_turn
    archived = [wire_item(i) for i in full.items() if running is None or i.turn_id != running]
    paged: list[Any] = []
    before: str | None = None
    seen: set[str] = set()
    while True:
        page, before = full.history_page(before, HISTORY_MAX_LIMIT)  # the pages ask_served asked for
        paged[:0] = [wire_item(i) for i in page]
        if before is None:
            break
        if before in seen:
            return Difference(check="history", path="before", expected="a cursor to an older page", got=before,
                              note="session/history repeats a cursor")
        seen.add(before)
    found = first_difference(archived, paged)
    if found is None:
        return None
    path, expected, got = found
    return Difference(check="history", path=f"history{path}", expected=expected, got=got,
                      note="session/history pages vs the items of all events")


def _check_pushes(full: ItemsProjection, session_id: str, events: Sequence[RecordedEvent],
                  boundary: int) -> Difference | None:
    """A client that subscribed at ``boundary`` and applied every later push holds the same items
    as a subscription made now (``item/completed`` is the canonical copy of an item, by its
    id: docs/protocol.md)."""
    partial = ItemsProjection(session_id)
    partial.apply_all(r.event for r in events if r.version <= boundary)
    view = {i.item_id: wire_item(i) for i in partial.items() + singleton_items(partial)}
    removed = False
    for rec in events:
        if rec.version <= boundary:
            continue
        if isinstance(rec.event, (E.TurnRewound, E.SessionDeleted)):
            removed = True
        for _method, item in partial.apply(rec.event):
            view[item.item_id] = wire_item(item)
    for key in ("plan", "queue"):  # an empty plan or queue is how a push says "none"
        if key in view and not view[key].get("entries"):
            del view[key]
    expected = {i.item_id: wire_item(i) for i in full.items() + singleton_items(full)}
    note = f"a client subscribed at version {boundary} and applying the pushes since"
    for item_id, want in expected.items():
        if item_id not in view:
            return Difference(check="pushes", path=f"items[{item_id!r}]", expected=want, got=ABSENT, note=note,
                              version=boundary)
        found = first_difference(want, view[item_id])
        if found is not None:
            path, a, b = found
            return Difference(check="pushes", path=f"items[{item_id!r}].{path}", expected=a, got=b, note=note,
                              version=boundary)
    extra = [k for k in view if k not in expected]
    if extra and not removed:
        return Difference(check="pushes", path=f"items[{extra[0]!r}]", expected=ABSENT, got=view[extra[0]],
                          note=note, version=boundary)
    return None



def _check_live(report: VerifyReport, full: ItemsProjection, state: SessionState,
                live: LiveView) -> Difference | None:
    """The live host's answers against the rebuild, its human text in the host's language (in
    each language for a remote host; the first difference in English when none agrees)."""
    languages = [live.language] if live.language is not None else list(LANGUAGES)
    first: Difference | None = None
    for language in languages:
        found = _check_live_in(report, full, state, live, language)
        if found is None:
            return None
        first = first or found
    return first


def _check_live_in(report: VerifyReport, full: ItemsProjection, state: SessionState,
                   live: LiveView, language: str) -> Difference | None:
    report.live_epoch = live.epoch
    report.remote_url = live.remote_url
    sid = live.session_id
    if live.error is not None:
        if state.deleted:
            return None  # a deleted session is not served: that is what the events say
        return Difference(check="live subscribe", path="error", expected="a subscription snapshot", got=live.error,
                          note="the live host refused to serve the session")
    if state.deleted:
        return Difference(check="live subscribe", path="session", expected="not-found (the events delete the session)",
                          got="a subscription snapshot", note="the live host serves a deleted session")
    report.history_pages = len(live.history)
    report.snapshot_items = len(live.snapshot["items"])
    decorate = live.decorate if live.decorate is not None else (lambda _sid, item: item)

    def served(items: Iterable[Any]) -> list[Any]:
        return [wire_item(decorate(sid, i), language) for i in items]

    expected_pages: list[Any] = []
    before: str | None = None
    while True:
        page, before = full.history_page(before, HISTORY_MAX_LIMIT)  # the pages ask_served asked for
        expected_pages.append({"items": served(page), "before": before})
        if before is None or len(expected_pages) > len(live.history):
            break
    found_item = None if live.remote else _compare_items([wire_item(i) for i in full.items() + singleton_items(full)],
                                                          live.items)
    if found_item is not None:
        where, a, b = found_item
        return Difference(check="live projection", path=where, expected=a, got=b, version=live.version,
                          note="the live session actor's items vs the items of all events")
    snap_items, snap_before = full.snapshot_items()
    for check, path, want, got, note in (
        ("live history", "pages", expected_pages, live.history,
         "session/history pages from the live host vs pages of the items of all events"),
        ("live snapshot", "snapshot", {"items": served(snap_items), "before": snap_before}, live.snapshot,
         "the live host's session/subscribe snapshot vs the snapshot of the items of all events"),
        ("live state", "state", _live_state_expected(state, live.state), live.state,
         "the live session actor's state vs the fold of all events (bounded, as the actor keeps it)"),
    ):
        if live.remote and check == "live state":
            continue  # a server answers over the wire, not with its actor's state
        found = first_difference(want, got)
        if found is not None:
            where, a, b = found
            where = path if where == "$" else f"{path}{where}" if where.startswith("[") else f"{path}.{where}"
            return Difference(check=check, path=where, expected=a, got=b, note=note, version=live.version)
    return None


def _live_state_expected(state: SessionState, served: Any) -> Any:
    """The fold of all events as the live actor keeps it: a live session's state is bounded
    (``state.bound``: its last turns' records)."""
    bounded = isinstance(served, dict) and served.get("bounded") is True
    return plain(bound(copy_state(state)) if bounded else state)


def _compare_items(expected: list[Any], got: list[Any]) -> tuple[str, Any, Any] | None:
    """Two lists of wire items compared by item id (``items['<id>'].field``), then their order."""
    want = {i.get("itemId"): i for i in expected}
    have = {i.get("itemId"): i for i in got if isinstance(i, dict)}
    for item_id, item in want.items():
        if item_id not in have:
            return f"items[{item_id!r}]", item, ABSENT
        found = first_difference(item, have[item_id])
        if found is not None:
            path, a, b = found
            return f"items[{item_id!r}].{path}", a, b
    extra = [k for k in have if k not in want]
    if extra:
        return f"items[{extra[0]!r}]", ABSENT, have[extra[0]]
    if list(want) != list(have) or len(got) != len(expected):
        return "order", list(want), [i.get("itemId") if isinstance(i, dict) else i for i in got]
    return None

