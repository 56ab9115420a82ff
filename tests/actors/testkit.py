"""Helpers for the pure tests of the actors' decisions (tests/actors/*/test_*.py)."""

from __future__ import annotations

from collections.abc import Sequence

from sessionloop.actors import events as E
from sessionloop.actors.events import decode_event, encode_event


def round_trip(events: Sequence[E.Event]) -> list[E.Event]:
    """``events`` encoded by the store's codec and decoded again, asserted equal to what went in:
    what a decision returns is what a reload reads."""
    decoded = [decode_event(encode_event(e)) for e in events]
    assert decoded == list(events)
    return [e for e in decoded if isinstance(e, E.Event)]
