"""Fixtures for protocol tests: a connection before and after the handshake.

The helpers live in ``protocol_helpers.py`` (a unique module name, so test modules can import them
whatever other test folders' conftest files are called).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from protocol_helpers import Peer, hello, make_connection


@pytest.fixture
def fresh() -> Peer:
    """A connection before the handshake."""
    return Peer(make_connection())


@pytest.fixture
def peer() -> Iterator[Peer]:
    """A connection after a successful handshake."""
    p = Peer(make_connection())
    (reply,) = p.feed(hello())
    assert "result" in reply, reply
    yield p
