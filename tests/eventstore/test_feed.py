"""The per-app event feed of the Session Loop API, with its retention (SPEC §3, §5)."""

from __future__ import annotations

import time

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
