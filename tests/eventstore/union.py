"""The event union the store's own tests run against: a few facts of their own, none of sessionloop's.

The store is generic (the application hands its union in when it opens), so its tests use this
small union, not actors/events.py: a store test that passes here passes for any union.
"""

from __future__ import annotations

from typing import Any

import msgspec

from sessionloop.eventstore import EventStore, EventTypes


class Fact(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type"):
    """Base of the test facts; ``at`` in epoch milliseconds, as an application would keep it."""

    at: int = 0


class Opened(Fact, tag="test.opened", frozen=True, kw_only=True):
    name: str
    title: str | None = None


class Retitled(Fact, tag="test.retitled", frozen=True, kw_only=True):
    title: str


class Stepped(Fact, tag="test.stepped", frozen=True, kw_only=True):
    """The small, frequent fact (in the feed)."""

    step: str


class Finished(Fact, tag="test.finished", frozen=True, kw_only=True):
    """In the feed."""

    step: str
    output: str = ""


class Noted(Fact, tag="test.noted", frozen=True, kw_only=True):
    """A fact with a text body of any size (not in the feed)."""

    key: str = ""
    text: str = ""


class Touched(Fact, tag="test.touched", frozen=True, kw_only=True):
    pass


class Erased(Fact, tag="test.erased", frozen=True, kw_only=True):
    """A purge's tombstone."""


TEST_EVENTS: EventTypes[Fact] = EventTypes(
    (Opened, Retitled, Stepped, Finished, Noted, Touched, Erased), feed=(Stepped, Finished)
)


def open_test_store(path: str, **options: Any) -> EventStore[Fact]:
    """``EventStore.open`` with the test union."""
    return EventStore.open(path, events=TEST_EVENTS, **options)
