from __future__ import annotations

import json

import pytest

from sessionloop.eventstore import (
    ANY_VERSION,
    NO_STREAM,
    EventDecodeError,
    InvalidStreamName,
    StoreClosed,
    WrongExpectedVersion,
)
from sessionloop.eventstore.lmdb_env import durability_mismatch
from tests.eventstore.union import Opened, Retitled, Stepped, open_test_store


def turn(i: int) -> Stepped:
    return Stepped(step=f"t{i}", at=i)


def test_append_to_a_new_stream_starts_at_version_one(store):
    result = store.append("session-a", [Opened(name="a")], NO_STREAM)
    assert (result.first_version, result.last_version) == (1, 1)
    assert store.stream_version("session-a") == 1


def test_events_come_back_in_order_with_versions_and_positions(store):
    store.append("session-a", [turn(1), turn(2)], 0)
    store.append("session-b", [turn(3)], 0)
    store.append("session-a", [turn(4)], 2)
    events = store.read_stream("session-a")
    assert [e.version for e in events] == [1, 2, 3]
    assert [e.event.step for e in events] == ["t1", "t2", "t4"]
    assert [e.position for e in events] == [1, 2, 4]
    assert all(e.stream == "session-a" for e in events)


def test_wrong_expected_version_names_stream_and_versions_and_writes_nothing(store):
    store.append("session-a", [turn(1)], 0)
    head = store.head_position
    with pytest.raises(WrongExpectedVersion) as info:
        store.append("session-a", [turn(2)], 5)
    assert info.value.stream == "session-a"
    assert (info.value.expected, info.value.actual) == (5, 1)
    assert "session-a" in str(info.value)
    assert store.stream_version("session-a") == 1
    assert store.head_position == head


def test_expecting_no_stream_fails_when_the_stream_exists(store):
    store.append("session-a", [turn(1)], NO_STREAM)
    with pytest.raises(WrongExpectedVersion):
        store.append("session-a", [turn(2)], NO_STREAM)


def test_any_version_skips_the_check(store):
    store.append("session-a", [turn(1)], ANY_VERSION)
    store.append("session-a", [turn(2)], ANY_VERSION)
    assert store.stream_version("session-a") == 2


def test_appending_nothing_is_refused(store):
    with pytest.raises(ValueError, match="at least one event"):
        store.append("session-a", [], 0)


@pytest.mark.parametrize(
    "name, reason",
    [("", "non-empty"), ("nocategory", "<category>-<id>"), ("session-a\x00b", "NUL"),
     ("session-" + "x" * 500, "longer")],
)
def test_invalid_stream_names_are_refused_with_the_reason(store, name, reason):
    with pytest.raises(InvalidStreamName, match=reason):
        store.append(name, [turn(1)], 0)


def test_read_stream_from_a_version_with_a_limit(store):
    for i in range(10):
        store.append("session-a", [turn(3 * i), turn(3 * i + 1), turn(3 * i + 2)], 3 * i)
    page = store.read_stream("session-a", from_version=5, limit=7)
    assert [e.version for e in page] == list(range(5, 12))
    assert store.read_stream("session-a", from_version=31) == []
    assert store.read_stream("session-zzz") == []


def test_read_stream_does_not_leak_into_a_stream_whose_name_extends_it(store):
    store.append("session-a", [turn(1)], 0)
    store.append("session-ab", [turn(2)], 0)
    store.append("session-a", [turn(3)], 1)
    assert [e.event.step for e in store.read_stream("session-a")] == ["t1", "t3"]
    assert store.stream_version("session-ab") == 1


def test_global_log_after_a_position_in_commit_order(store):
    store.append("session-a", [turn(1), turn(2)], 0)
    store.append("session-b", [turn(3)], 0)
    store.append("session-a", [turn(4)], 2)
    assert [e.position for e in store.read_all(0)] == [1, 2, 3, 4]
    assert [e.event.step for e in store.read_all(1, limit=2)] == ["t2", "t3"]
    assert store.read_all(4) == []
    assert [e.position for e in store.iter_all(0, page=1)] == [1, 2, 3, 4]


def test_event_at_a_position_and_last_event(store):
    store.append("session-a", [turn(1), turn(2)], 0)
    assert store.event_at(2).event.step == "t2"
    assert store.event_at(3) is None
    assert store.last_event("session-a").version == 2
    assert store.last_event("session-none") is None


def test_streams_by_category_with_paging(store):
    for i in range(5):
        store.append(f"session-s{i}", [turn(i)], 0)
        store.append(f"session-s{i}", [turn(i)], 1)
    store.append("approval-s1.x", [turn(9)], 0)
    first = store.list_streams("session", limit=2)
    assert first.streams == ["session-s0", "session-s1"]
    second = store.list_streams("session", after=first.next_after, limit=2)
    assert second.streams == ["session-s2", "session-s3"]
    last = store.list_streams("session", after=second.next_after, limit=2)
    assert last.streams == ["session-s4"] and last.next_after is None
    assert store.list_streams("approval").streams == ["approval-s1.x"]
    assert store.count_streams("session") == 5


def test_a_session_and_its_approvals_share_a_shard(store):
    assert store.shard_of("session-abc") == store.shard_of("approval-abc.1") == store.shard_of("task-abc.9")


def test_shard_count_is_fixed_when_the_store_is_created(store_path):
    with open_test_store(store_path, durability="nosync", shards=7) as s:
        s.append("session-a", [turn(1)], 0)
    with open_test_store(store_path, durability="nosync", shards=64) as s:
        assert s.shards == 7
        assert s.stream_version("session-a") == 1


def test_data_survives_reopening(store_path):
    with open_test_store(store_path, durability="sync") as s:
        s.append("session-a", [Opened(name="a", title="hello")], 0)
        s.append("session-a", [Retitled(title="renamed")], 1)
    with open_test_store(store_path) as s:
        assert s.head_position == 2
        assert [type(e.event).__name__ for e in s.read_stream("session-a")] == ["Opened", "Retitled"]
        assert s.append("session-a", [turn(1)], 2).first_position == 3


def test_epochs_are_persisted_and_increase(store_path):
    with open_test_store(store_path, durability="nosync") as s:
        assert s.next_epoch() == 1
        assert s.next_epoch() == 2
    with open_test_store(store_path, durability="nosync") as s:
        assert s.next_epoch() == 3


def test_snapshots_replace_the_previous_one(store):
    assert store.load_snapshot("session-a") is None
    store.save_snapshot("session-a", 3, b"state-3")
    store.save_snapshot("session-a", 7, b"state-7")
    snap = store.load_snapshot("session-a")
    assert (snap.version, snap.state, snap.parts) == (7, b"state-7", ())


def test_snapshot_parts_are_written_once_and_kept_by_later_snapshots_until_replaced(store):
    store.save_snapshot("session-a", 3, b"s3", 2, {0: b"p0", 1: b"p1"})
    store.save_snapshot("session-a", 5, b"s5", 3, {2: b"p2"})  # 0 and 1 kept, 2 new
    assert store.load_snapshot("session-a").parts == (b"p0", b"p1", b"p2")
    store.save_snapshot("session-a", 6, b"s6", 2, {0: b"q0", 1: b"q1"})  # a history that changed: rewritten
    snap = store.load_snapshot("session-a")
    assert (snap.version, snap.state, snap.parts) == (6, b"s6", (b"q0", b"q1"))
    store.save_snapshot("session-a", 7, b"s7")  # no parts: none read back
    assert store.load_snapshot("session-a").parts == ()
    with pytest.raises(ValueError, match="part_count 1"):
        store.save_snapshot("session-a", 8, b"s8", 1, {1: b"beyond"})


def test_a_snapshot_whose_part_is_missing_is_refused_naming_the_part(store):
    store.save_snapshot("session-b", 2, b"s2", 2, {0: b"p0"})  # part 1 was never written
    with pytest.raises(EventDecodeError, match="part 1 of 2 is missing"):
        store.load_snapshot("session-b")


def test_a_closed_store_refuses_work(store_path):
    s = open_test_store(store_path, durability="nosync")
    s.close()
    with pytest.raises(StoreClosed):
        s.append("session-a", [turn(1)], 0)
    with pytest.raises(StoreClosed):
        s.read_stream("session-a")
    s.close()  # closing twice is harmless


def test_durability_is_reported(store_path):
    with open_test_store(store_path, durability="sync") as s:
        info = s.info()
        assert info["durability"] == "sync" and info["fsync_per_commit"] is True
    with open_test_store(store_path, durability="nosync") as s:
        assert s.info()["fsync_per_commit"] is False


def test_durability_is_checked_against_the_flags_lmdb_reads_back(store_path):
    """The store reports what LMDB says it does, and refuses to open when that is not what the
    durability needs (``durability_mismatch`` over the flags ``Environment.flags()`` returns)."""

    with open_test_store(store_path, durability="sync") as s:
        flags = s._rec.env_flags
        assert flags["sync"] is True and flags["metasync"] is True
        assert durability_mismatch("sync", flags) is None
        assert durability_mismatch("nosync", flags) == (
            "durability 'nosync' asked for sync=False, metasync=False, but LMDB reports sync=True, metasync=True")
        assert durability_mismatch("sync", {**flags, "metasync": False}) == (
            "durability 'sync' asked for sync=True, metasync=True, but LMDB reports sync=True, metasync=False")
    with open_test_store(store_path, durability="nosync") as s:
        assert durability_mismatch("nosync", s._rec.env_flags) is None


def test_unknown_durability_is_refused(store_path):
    with pytest.raises(ValueError, match="durability"):
        open_test_store(store_path, durability="sometimes")


def test_json_lines_export_names_each_event_and_its_place(store):
    store.append("session-a", [Opened(name="a", title="t")], 0)
    lines = list(store.export_jsonl("session-a"))
    assert len(lines) == 1

    row = json.loads(lines[0])
    assert row["stream"] == "session-a" and row["version"] == 1 and row["position"] == 1
    assert row["event"]["type"] == "test.opened" and row["event"]["title"] == "t"


def test_stream_metadata_is_written_with_the_append_and_can_be_scanned(store):
    store.append("session-a", [turn(1)], 0, meta=b"summary-a1")
    store.append("session-a", [turn(2)], 1)  # no meta: the previous record stays
    store.append("session-b", [turn(3)], 0, meta=b"summary-b")
    store.append("session-a", [turn(4)], 2, meta=b"summary-a2")
    assert store.stream_meta("session-a") == b"summary-a2"
    assert store.stream_meta("session-c") is None
    assert sorted(store.scan_stream_meta()) == [("session-a", b"summary-a2"), ("session-b", b"summary-b")]


def test_flags_mark_and_unmark_streams_in_the_same_commit(store):
    store.append("session-a", [turn(1)], 0, flags={"active": True})
    store.append("session-b", [turn(2)], 0, flags={"active": True})
    assert sorted(store.flagged("active")) == ["session-a", "session-b"]
    store.append("session-a", [turn(3)], 1, flags={"active": False})
    assert store.flagged("active") == ["session-b"]
    assert store.flagged("other") == []


def test_a_failed_append_changes_neither_metadata_nor_flags(store):
    store.append("session-a", [turn(1)], 0, meta=b"one", flags={"active": True})
    with pytest.raises(WrongExpectedVersion):
        store.append("session-a", [turn(2)], 7, meta=b"two", flags={"active": False})
    assert store.stream_meta("session-a") == b"one"
    assert store.flagged("active") == ["session-a"]
