"""The audit of a workload run over the event feed: what it calls lost, duplicated, and stray."""

from __future__ import annotations

from sessionloop.cli.loadtest.engine import Books, audit, level_at
from sessionloop.cli.loadtest.record import Recorder
from sessionloop.cli.loadtest.workload import parse


def books(ended: dict[tuple[str, str], int]) -> Books:
    b = Books()
    b.turn_of_key = {"k1": ("s1", "t1"), "k2": ("s1", "t2"), "k3": ("s2", "t3")}
    b.ended = ended
    return b


def test_each_acknowledged_send_with_one_ended_turn_passes():
    a = audit(books({("s1", "t1"): 1, ("s1", "t2"): 1, ("s2", "t3"): 1}), Recorder([("p", "steady", 1.0)], 1.0))
    assert a.ok and (a.acknowledged, a.turns_found, a.missing, a.duplicated) == (3, 3, 0, 0)


def test_a_lost_turn_a_turn_ended_twice_and_a_stray_turn_each_fail_and_are_named():
    a = audit(books({("s1", "t1"): 2, ("s2", "t3"): 1, ("s2", "t9"): 1}), Recorder([("p", "steady", 1.0)], 1.0))
    assert not a.ok and (a.turns_found, a.missing, a.duplicated) == (1, 1, 2)
    assert any("key k2 acknowledged as turn t2, which never ended" in x for x in a.examples)
    assert any("turn t1 (key k1) ended 2 times" in x for x in a.examples)
    assert any("turn t9 ran, answering no send of this run" in x for x in a.examples)


def test_a_feed_past_its_retention_or_a_duplicate_not_deduplicated_fails_the_audit():
    b = books({("s1", "t1"): 1, ("s1", "t2"): 1, ("s2", "t3"): 1})
    b.failed_feeds.append("app #1: the feed no longer holds events after cursor 5")
    assert not audit(b, Recorder([("p", "steady", 1.0)], 1.0)).ok
    b = books({("s1", "t1"): 1, ("s1", "t2"): 1, ("s2", "t3"): 1})
    b.bad_duplicates.append("session s1: key k1 sent again was answered accepted")
    assert not audit(b, Recorder([("p", "steady", 1.0)], 1.0)).ok


def test_phases_ramp_linearly_from_the_previous_level_and_steady_ones_jump():
    w = parse("t", """
name = "t"
[[messages]]
text = "x"
[[phases]]
name = "up"
kind = "ramp-up"
seconds = 10
users = 100
[[phases]]
name = "hold"
seconds = 5
users = 40
[[phases]]
name = "down"
kind = "ramp-down"
seconds = 4
users = 0
""")
    assert [level_at(w, t) for t in (0, 5, 9.99, 10, 14, 15, 17, 19, 30)] == \
        [0, 50, 99.9, 40, 40, 40, 20, 0, 0]
