"""The per-app event feed of the Session Loop API, with its retention (SPEC §3, §5)."""

from __future__ import annotations

import time

import pytest

from sessionloop.eventstore import FeedCursorExpired
from tests.eventstore.union import TEST_EVENTS, Finished, Noted, Stepped, open_test_store

assert not TEST_EVENTS.in_feed(Noted())  # the union names which types the feed indexes


def test_only_feed_visible_events_are_indexed_for_the_app(store):
    store.append("session-a", [Stepped(step="t"), Noted(key="s"),
                               Finished(step="t", output="x")], 0, feed="bot")
    store.append("session-b", [Stepped(step="u")], 0)  # not an app's session
    feed = store.read_feed("bot")
    assert [type(e.event).__name__ for e in feed] == ["Stepped", "Finished"]
    assert store.read_feed("other") == []


def test_the_feed_cursor_is_the_global_position(store):
    for i in range(5):
        store.append("session-a", [Stepped(step=str(i))], i, feed="bot")
    first = store.read_feed("bot", after=0, limit=2)
    rest = store.read_feed("bot", after=first[-1].position, limit=10)
    assert [e.event.step for e in first + rest] == ["0", "1", "2", "3", "4"]


def test_the_feed_keeps_at_most_the_configured_events_per_app(store_path):
    with open_test_store(store_path, durability="nosync", feed_max_events=10) as s:
        for i in range(25):
            s.append("session-a", [Stepped(step=str(i))], i, feed="bot")
        s.append("session-b", [Stepped(step="x")], 0, feed="other")
        feed = s.read_feed("bot", limit=100)
        assert [e.event.step for e in feed] == [str(i) for i in range(15, 25)]
        assert len(s.read_feed("other")) == 1
        # the log itself is never pruned
        assert s.stream_version("session-a") == 25


def test_feed_entries_older_than_the_retention_time_are_pruned(store_path):
    with open_test_store(store_path, durability="nosync", feed_ttl_s=0.05, prune_interval_s=0) as s:
        s.append("session-a", [Stepped(step="old")], 0, feed="bot")
        time.sleep(0.1)
        s.append("session-a", [Stepped(step="new")], 1, feed="bot")
        assert [e.event.step for e in s.read_feed("bot")] == ["new"]


def test_a_strict_read_after_a_cursor_retention_passed_raises_cursor_expired_with_the_oldest_cursor(store_path):
    with open_test_store(store_path, durability="nosync", feed_max_events=10) as s:
        positions = [s.append("session-a", [Stepped(step=str(i))], i, feed="bot").first_position for i in range(25)]
        oldest = positions[14]  # 0..14 were taken out: the last of them is the oldest cursor
        assert s.feed_floor("bot") == oldest
        with pytest.raises(FeedCursorExpired) as caught:
            s.read_feed("bot", after=positions[3], strict=True)
        assert caught.value.oldest == oldest and caught.value.code == "cursor-expired"
        # the oldest cursor itself reads the whole rest, without a gap
        assert [e.event.step for e in s.read_feed("bot", after=oldest, limit=100, strict=True)] == \
            [str(i) for i in range(15, 25)]
        # not strict: the old behaviour (whatever is left after the cursor)
        assert len(s.read_feed("bot", after=positions[3], limit=100)) == 10
        assert s.feed_floor("other") == 0


def test_the_feed_floor_follows_age_pruning_and_survives_a_reopen(store_path):
    with open_test_store(store_path, durability="nosync", feed_ttl_s=0.05, prune_interval_s=0) as s:
        old = s.append("session-a", [Stepped(step="old")], 0, feed="bot").first_position
        time.sleep(0.1)
        s.append("session-a", [Stepped(step="new")], 1, feed="bot")
        assert s.feed_floor("bot") == old
    with open_test_store(store_path, durability="nosync") as s:
        assert s.feed_floor("bot") == old
        with pytest.raises(FeedCursorExpired):
            s.read_feed("bot", after=old - 1, strict=True)


def test_a_purged_session_s_feed_entries_do_not_expire_cursors(store):
    first = store.append("session-a", [Stepped(step="a")], 0, feed="bot").first_position
    store.append("session-b", [Stepped(step="b")], 0, feed="bot")
    store.purge("session-a", [Noted(key="gone")], 1)
    assert store.feed_floor("bot") == 0
    assert [e.event.step for e in store.read_feed("bot", after=first - 1, strict=True)] == ["b"]
