"""The per-app event feed of the Session Loop API, with its retention (SPEC §3, §5)."""

from __future__ import annotations

import time

from sessionloop.eventstore import EventStore
from sessionloop.eventstore.events import InputAccepted, LlmStarted, TurnCompleted, TurnStarted

assert not InputAccepted.feed  # inputs are not in the bots' feed; their turn events are


def test_only_feed_visible_events_are_indexed_for_the_app(store):
    store.append("session-a", [TurnStarted(turn_id="t"), LlmStarted(turn_id="t", step_id="s"),
                               TurnCompleted(turn_id="t", output_text="x")], 0, feed="bot")
    store.append("session-b", [TurnStarted(turn_id="u")], 0)  # not an app's session
    feed = store.read_feed("bot")
    assert [type(e.event).__name__ for e in feed] == ["TurnStarted", "TurnCompleted"]
    assert store.read_feed("other") == []


def test_the_feed_cursor_is_the_global_position(store):
    for i in range(5):
        store.append("session-a", [TurnStarted(turn_id=str(i))], i, feed="bot")
    first = store.read_feed("bot", after=0, limit=2)
    rest = store.read_feed("bot", after=first[-1].position, limit=10)
    assert [e.event.turn_id for e in first + rest] == ["0", "1", "2", "3", "4"]


def test_the_feed_keeps_at_most_the_configured_events_per_app(store_path):
    with EventStore.open(store_path, durability="nosync", feed_max_events=10) as s:
        for i in range(25):
            s.append("session-a", [TurnStarted(turn_id=str(i))], i, feed="bot")
        s.append("session-b", [TurnStarted(turn_id="x")], 0, feed="other")
        feed = s.read_feed("bot", limit=100)
        assert [e.event.turn_id for e in feed] == [str(i) for i in range(15, 25)]
        assert len(s.read_feed("other")) == 1
        # the log itself is never pruned
        assert s.stream_version("session-a") == 25


def test_feed_entries_older_than_the_retention_time_are_pruned(store_path):
    with EventStore.open(store_path, durability="nosync", feed_ttl_s=0.05, prune_interval_s=0) as s:
        s.append("session-a", [TurnStarted(turn_id="old")], 0, feed="bot")
        time.sleep(0.1)
        s.append("session-a", [TurnStarted(turn_id="new")], 1, feed="bot")
        assert [e.event.turn_id for e in s.read_feed("bot")] == ["new"]
