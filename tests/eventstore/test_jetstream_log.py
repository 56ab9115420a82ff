"""The event log on JetStream (eventstore/jetstream_log.py) against a real nats-server with file
storage in a temporary directory, on a free loopback port."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from sessionloop.cli.workers import nats_server_binary
from sessionloop.eventstore import WrongExpectedVersion
from sessionloop.eventstore.batch import ANY_VERSION
from sessionloop.eventstore.errors import CommitTooLarge, InvalidStreamName
from sessionloop.eventstore.jetstream_log import JetStreamLog, stream_of_token, token_of_stream

T = TypeVar("T")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NatsServer:
    """A nats-server subprocess with JetStream on a port and store directory that survive restarts."""

    def __init__(self, store_dir: Path) -> None:
        self.store_dir = store_dir
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = store_dir.parent / "nats.log"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [nats_server_binary(), "-js", "-sd", str(self.store_dir), "-a", "127.0.0.1", "-p", str(self.port)],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"nats-server exited: {self.log.read_text()}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"nats-server did not listen on {self.port}: {self.log.read_text()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "js")
    server.start()
    yield server
    server.stop()


def run(factory: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(factory(), 30)
    return asyncio.run(bounded())


async def _log(server: NatsServer, **kw: Any) -> JetStreamLog:
    return await JetStreamLog.connect(server.url, **kw)


# --- naming -----------------------------------------------------------------------------------------


def test_subject_tokens_are_reversible_and_safe() -> None:
    for name in ("session-abc", "session-ü/é.* >x", "s-" + "x" * 398):
        token = token_of_stream(name)
        assert set(token) <= set("abcdefghijklmnopqrstuvwxyz234567")
        assert stream_of_token(token) == name


def test_an_invalid_stream_name_is_refused_before_publishing() -> None:
    with pytest.raises(InvalidStreamName):
        token_of_stream("s-" + "x" * 500)
    with pytest.raises(InvalidStreamName):
        stream_of_token("not a token!")


# --- append and read ----------------------------------------------------------------------------------


def test_append_then_read_stream_round_trips_versions_and_bytes(nats_server: NatsServer) -> None:
    async def go() -> None:
        log = await _log(nats_server)
        try:
            a = await log.append("session-a", [b"e1", b"e2"], 0, "c-1")
            b = await log.append("session-a", [b"e3"], 2, "c-2")
            await log.append("session-b", [b"other"], 0, "c-3")
            assert (a.first_version, a.last_version, b.first_version, b.last_version) == (1, 2, 3, 3)
            assert not a.duplicate and b.first_position > a.first_position
            events = await log.read_stream("session-a")
            assert [(e.version, e.event, e.commit_id) for e in events] == [
                (1, b"e1", "c-1"), (2, b"e2", "c-1"), (3, b"e3", "c-2")]
            assert [e.event for e in await log.read_stream("session-a", 2, limit=1)] == [b"e2"]
            assert await log.read_stream("session-none") == []
            assert await log.stream_version("session-a") == 3
            everything = await log.read_all()
            assert [(e.stream, e.version) for e in everything] == [
                ("session-a", 1), ("session-a", 2), ("session-a", 3), ("session-b", 1)]
            assert [e.stream for e in await log.read_all(after=b.first_position)] == ["session-b"]
        finally:
            await log.close()
    run(go)


def test_expected_version_conflict_is_refused_with_the_actual_version(nats_server: NatsServer) -> None:
    async def go() -> None:
        writer, other = await _log(nats_server), await _log(nats_server)
        try:
            await writer.append("session-a", [b"e1"], 0, "c-1")
            await other.append("session-a", [b"e2", b"e3"], 1, "c-2")  # writer's cached head is now stale
            with pytest.raises(WrongExpectedVersion) as err:
                await writer.append("session-a", [b"late"], 1, "c-3")
            assert (err.value.expected, err.value.actual) == (1, 3)
            with pytest.raises(WrongExpectedVersion) as err:
                await writer.append("session-a", [b"new"], 0, "c-4")
            assert err.value.actual == 3
            assert [e.event for e in await writer.read_stream("session-a")] == [b"e1", b"e2", b"e3"]
            any_version = await writer.append("session-a", [b"e4"], ANY_VERSION, "c-5")
            assert any_version.first_version == 4
        finally:
            await writer.close()
            await other.close()
    run(go)


def test_server_fence_refuses_a_writer_whose_cache_agrees_with_its_expectation(nats_server: NatsServer) -> None:
    """The stale writer's own cache says version 1, so only the server's subject sequence check
    can refuse it: err_code 10071 becomes WrongExpectedVersion with the actual version."""
    async def go() -> None:
        stale, other = await _log(nats_server), await _log(nats_server)
        try:
            await stale.append("session-a", [b"e1"], 0, "c-1")
            await other.append("session-a", [b"e2"], 1, "c-2")
            with pytest.raises(WrongExpectedVersion) as err:
                await stale.append("session-a", [b"stale"], 1, "c-3")
            assert err.value.actual == 2
        finally:
            await stale.close()
            await other.close()
    run(go)


def test_a_retried_publish_with_the_same_commit_id_is_deduplicated(nats_server: NatsServer) -> None:
    async def go() -> None:
        log, retrier = await _log(nats_server), await _log(nats_server)
        try:
            first = await log.append("session-a", [b"e1", b"e2"], 0, "commit-x")
            # a retry from a writer that never saw the ack: same commit id, same expectation
            again = await retrier.append("session-a", [b"e1", b"e2"], 0, "commit-x")
            assert again.duplicate
            assert (again.first_version, again.last_version, again.first_position) == (
                first.first_version, first.last_version, first.first_position)
            assert len(await log.read_stream("session-a")) == 2
            # a later retry, after the stream moved on, still finds the original commit
            await log.append("session-a", [b"e3"], 2, "commit-y")
            late = await retrier.append("session-a", [b"e1", b"e2"], 0, "commit-x")
            assert late.duplicate and late.first_position == first.first_position
            assert [e.event for e in await log.read_all()] == [b"e1", b"e2", b"e3"]
        finally:
            await log.close()
            await retrier.close()
    run(go)


def test_a_commit_above_the_message_bound_is_refused_by_name(nats_server: NatsServer) -> None:
    async def go() -> None:
        log = await _log(nats_server, max_commit_bytes=4096)
        try:
            with pytest.raises(CommitTooLarge) as err:
                await log.append("session-a", [b"x" * 5000], 0, "c-1")
            assert err.value.limit == 4096 and err.value.size > 5000
            with pytest.raises(ValueError, match="commit id"):
                await log.append("session-a", [b"x"], 0, "bad id\r\n")
            assert await log.stream_version("session-a") == 0
        finally:
            await log.close()
    run(go)


def test_the_log_survives_a_restart_of_nats_server(nats_server: NatsServer) -> None:
    async def write() -> None:
        log = await _log(nats_server)
        try:
            await log.append("session-a", [b"e1"], 0, "c-1")
            await log.append("session-a", [b"e2"], 1, "c-2")
        finally:
            await log.close()

    async def read() -> list[bytes]:
        log = await _log(nats_server)
        try:
            await log.append("session-a", [b"e3"], 2, "c-3")
            return [e.event for e in await log.read_stream("session-a")]
        finally:
            await log.close()

    run(write)
    nats_server.stop()
    nats_server.start()
    assert run(read) == [b"e1", b"e2", b"e3"]
