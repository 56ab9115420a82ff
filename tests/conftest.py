"""Shared fixtures: real LMDB in temporary directories, never a mock of our own parts."""

from __future__ import annotations

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def store_head(path: str) -> int:
    """The head position of the store at ``path``, read as a second process may: a read-only open."""
    from eventstore import EventStore

    store = EventStore.open(path, readonly=True)
    try:
        return store.head_position
    finally:
        store.close()


@pytest.fixture
def store_path(tmp_path):
    return str(tmp_path / "store")


@pytest.fixture
def store(store_path):
    from eventstore import EventStore

    s = EventStore.open(store_path, durability="nosync")
    yield s
    s.close()
