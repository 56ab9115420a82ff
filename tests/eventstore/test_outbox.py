"""The outbox (eventstore/outbox.py): deliveries owed for events, written in the events' commit,
acknowledged, given up as dead letters and replayed. Real LMDB in temporary directories."""

from __future__ import annotations

import struct

import lmdb
import pytest

from sessionloop.eventstore import ANY_VERSION, OutboxMark, WrongExpectedVersion
from tests.eventstore.union import Erased, Finished, Noted, Stepped, open_test_store


def mark(*flags: bool) -> OutboxMark:
    return OutboxMark("bot", list(flags))


def test_an_append_with_a_mark_owes_one_delivery_per_marked_event(store):
    result = store.append("session-a", [Stepped(step="t"), Noted(key="n"), Finished(step="t", output="x")], 0,
                          outbox=mark(True, False, True))
    items = store.read_outbox()
    shard = store.shard_of("session-a")
    assert [(i.shard, i.position, i.target) for i in items] == [
        (shard, result.first_position, "bot"), (shard, result.first_position + 2, "bot")]
    assert all(i.since == result.at and i.attempts == 0 and i.dead_at == 0 for i in items)
    assert store.event_at(items[1].position).event == Finished(step="t", output="x")


def test_a_refused_append_owes_nothing(store):
    store.append("session-a", [Stepped(step="t")], 0)
    with pytest.raises(WrongExpectedVersion):
        store.append("session-a", [Stepped(step="u")], 0, outbox=mark(True))
    assert store.read_outbox() == []


def test_a_mark_needs_one_flag_per_event(store):
    with pytest.raises(ValueError, match="one flag per event"):
        store.append("session-a", [Stepped(step="t")], 0, outbox=mark(True, True))
    assert store.stream_version("session-a") == 0


def test_entries_are_read_by_shard_and_page(store_path):
    with open_test_store(store_path, durability="nosync", shards=4) as s:
        for i in range(12):
            s.append(f"session-s{i}", [Stepped(step="t")], 0, outbox=mark(True))
        everything = s.read_outbox(limit=100)
        assert len(everything) == 12
        assert everything == sorted(everything, key=lambda i: (i.shard, i.position))
        one = everything[0].shard
        assert all(i.shard == one for i in s.read_outbox([one], limit=100))
        pages, after = [], None
        while page := s.read_outbox(after=after, limit=5):
            pages.extend(page)
            after = (page[-1].shard, page[-1].position)
        assert pages == everything


def test_acknowledged_entries_go_and_a_repeat_changes_nothing(store):
    store.append("session-a", [Stepped(step="t"), Stepped(step="u")], 0, outbox=mark(True, True))
    first, second = store.read_outbox()
    assert store.ack_outbox([(first.shard, first.position)]) == 1
    assert store.ack_outbox([(first.shard, first.position)]) == 0
    assert store.read_outbox() == [second]


def test_a_dead_letter_keeps_its_attempts_and_error_and_a_replay_starts_its_clock_again(store):
    store.append("session-a", [Stepped(step="t")], 0, outbox=mark(True))
    (item,) = store.read_outbox()
    assert store.dead_letter([(item.shard, item.position, 7, "connection refused " * 100)]) == 1
    assert store.read_outbox() == []
    (dead,) = store.read_outbox(dead=True)
    assert (dead.position, dead.attempts, dead.since) == (item.position, 7, item.since)
    assert dead.error.startswith("connection refused") and len(dead.error) == 500
    assert dead.dead_at >= item.since
    assert store.replay_dead_letters([(dead.shard, dead.position)]) == 1
    assert store.replay_dead_letters([(dead.shard, dead.position)]) == 0
    (again,) = store.read_outbox()
    assert (again.position, again.attempts, again.error, again.dead_at) == (item.position, 0, "", 0)
    assert again.since >= dead.dead_at
    assert store.read_outbox(dead=True) == []


def test_a_purge_takes_the_partitions_entries_and_dead_letters_with_it(store):
    store.append("session-a", [Stepped(step="t"), Stepped(step="u")], 0, outbox=mark(True, True))
    store.append("session-b", [Stepped(step="t")], 0, outbox=mark(True))
    first = store.read_outbox()[0] if store.read_outbox()[0].position == 1 else store.read_outbox()[1]
    store.dead_letter([(first.shard, first.position, 1, "down")])
    store.purge("session-a", [Erased(at=1)], ANY_VERSION)
    left = store.read_outbox() + store.read_outbox(dead=True)
    assert [store.event_at(i.position).stream for i in left] == ["session-b"]
    assert store.audit() == []


def test_entries_survive_a_reopen(store_path):
    with open_test_store(store_path) as s:
        s.append("session-a", [Stepped(step="t")], 0, outbox=mark(True))
    with open_test_store(store_path, readonly=True) as s:
        assert [i.target for i in s.read_outbox()] == ["bot"]


def test_the_audit_finds_an_entry_that_points_at_no_event(store_path):
    with open_test_store(store_path) as s:
        s.append("session-a", [Stepped(step="t")], 0, outbox=mark(True))
        (item,) = s.read_outbox()
        s.dead_letter([(item.shard, item.position, 1, "down")])
        assert s.audit() == []
    env = lmdb.open(store_path, max_dbs=16)
    try:
        with env.begin(write=True) as txn:
            txn.put(struct.pack(">HQ", 0, 999), b"\x95\xa3bot\x00\x00\xa0\x00", db=env.open_db(b"outbox", txn=txn))
    finally:
        env.close()
    with open_test_store(store_path) as s:
        assert s.audit() == ["outbox entry 0.999 points at no event of its shard"]
