"""The store's tests run against their own small union (tests/eventstore/union.py), not sessionloop's."""

from __future__ import annotations

import pytest

from tests.eventstore.union import open_test_store


@pytest.fixture
def store(store_path):
    s = open_test_store(store_path, durability="nosync")
    yield s
    s.close()
