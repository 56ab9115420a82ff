"""Shared fixtures: real LMDB in temporary directories, never a mock of our own parts."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessionloop.actors.events import open_store
from sessionloop.cli.natsproc import NatsServer

# A human text with a key the catalogue lacks, a language a key lacks or a placeholder without a
# value raises instead of falling back (actors.settings.texts), here and in every server a test starts.
os.environ.setdefault("SESSIONLOOP_STRICT_TEXTS", "1")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def store_head(path: str) -> int:
    """The head position of the store at ``path``, read as a second process may: a read-only open."""
    store = open_store(path, readonly=True)
    try:
        return store.head_position
    finally:
        store.close()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A real nats-server with JetStream (file storage in the test's directory) on a free loopback port."""
    server = NatsServer(log_path=tmp_path / "nats.log", store_dir=tmp_path / "js")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def store_path(tmp_path):
    return str(tmp_path / "store")


@pytest.fixture
def store(store_path):
    """A store of sessionloop's events (tests/eventstore overrides it with a union of its own)."""
    s = open_store(store_path, durability="nosync")
    yield s
    s.close()


def processes_with_arg(arg: str) -> list[int]:
    """Host pids of live (not zombie) processes with ``arg`` as one of their arguments. A command
    in the sandbox sees its own PID namespace, so tests find its processes by a unique argument
    (``sleep 30.4711``) rather than by the pid it prints."""
    found: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            with open(f"/proc/{name}/stat") as f:
                zombie = f.read().split(") ", 1)[1].startswith("Z")
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if arg.encode() in args and not zombie:
            found.append(int(name))
    return found


def wait_no_process_with_arg(arg: str, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not processes_with_arg(arg):
            return True
        time.sleep(0.02)
    return False
