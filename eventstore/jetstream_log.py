"""The event log on NATS JetStream: the narrow interface (SPEC §12) behind a replicated log.

A first slice of issue 23 ("Beyond one machine"): the log only, beside the LMDB store (which stays
the embedded default and is not changed by this module).

Theory of operation:

* one JetStream stream (``SL_LOG``, file storage, ``replicas`` copies: R=1 on one server, R=3 on
  a cluster, where a publish is acknowledged once a majority of the copies stored it) holds every session stream's
  commits; a session stream is the subject ``sl.log.<shard>.<token>``, where ``shard`` is the
  store's ``hash(stream) mod S`` (``keys.shard_of``) and ``token`` the stream name's UTF-8 in
  lower-case base32 without padding: reversible, and only ``[a-z2-7]``, so any stream name the LMDB
  store accepts (``keys.validate_stream``: at most 400 bytes, no NUL) is one safe subject token;
* one message per commit (SPEC §12: one log record per commit). Its payload is a msgpack
  :class:`LogCommit` (stream, first version, time, commit id, the events' bytes); its headers
  ``Sl-First-Version`` and ``Sl-Count`` say which stream versions it holds, so a direct get of the
  subject's last message gives the stream's version without decoding the payload;
* optimistic concurrency: ``expected_version`` counts events, the server's fence counts subject
  sequences. The log keeps a bounded cache stream -> (version, last subject sequence), refreshed
  from the server when it disagrees, and publishes with ``Nats-Expected-Last-Subject-Sequence``
  (0 for a new stream). The server refuses a stale one (``err_code`` 10071) and the append raises
  :class:`~eventstore.errors.WrongExpectedVersion` carrying the stream's actual version;
* idempotency: ``Nats-Msg-Id`` is the commit id, so a retried publish inside the stream's
  duplicate window is acknowledged as a duplicate and the append returns the original commit's
  result (``duplicate=True``). The server checks the expected sequence first, so a retry that
  finds the stream moved on (its original landed, then more) is refused on the sequence; the log
  then looks the commit id up where the original would be and returns it as the duplicate;
* positions are the JetStream stream sequences of commits: every event of one commit has its
  commit's position (LMDB gives each event its own), so ``read_all(after)`` resumes by commit.

Only asyncio, no threads. No ``nats`` exception leaves this module: a refused or unanswered publish
becomes :class:`~eventstore.errors.StorageUnavailable` (``outcome="unknown"`` when it may have
landed: retry with the same commit id, which dedups), any other server error
:class:`~eventstore.errors.StorageError`. On a cluster that lost its majority (two of three servers
down) a publish is not acknowledged: it raises StorageUnavailable, outcome unknown, after
``request_timeout_s``; when the servers are back, the retry with the same commit id writes it once.
"""

from __future__ import annotations

import asyncio
import base64
import random
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Any

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext, api

from sessionloop.eventstore import keys as K
from sessionloop.eventstore.batch import ANY_VERSION
from sessionloop.eventstore.errors import (
    NOT_WRITTEN,
    UNKNOWN,
    CommitTooLarge,
    EventDecodeError,
    InvalidStreamName,
    StorageError,
    StorageUnavailable,
    WrongExpectedVersion,
)
from sessionloop.eventstore.records import AppendResult, RecordedEvent

__all__ = ["DEFAULT_MAX_COMMIT_BYTES", "DEFAULT_STREAM", "JetStreamLog", "LogCommit", "stream_of_token",
           "token_of_stream", "without_userinfo"]

DEFAULT_STREAM = "SL_LOG"
SUBJECT_PREFIX = "sl.log"
#: a commit's payload bound below the server's max payload (1 MiB by default): large enough for
#: a turn's events, small enough that one commit never stalls a replica's catch-up
DEFAULT_MAX_COMMIT_BYTES = 512 * 1024
#: headroom for the headers the log adds (ids, versions) inside the server's max payload
HEADER_ALLOWANCE = 512
MAX_COMMIT_ID_BYTES = 128
MAX_EVENTS_PER_COMMIT = 10_000
#: streams whose (version, last sequence) the log remembers; the rest are read from the server
HEAD_CACHE_SIZE = 100_000
#: an append with ANY_VERSION retries this many times when other writers keep moving the stream,
#: sleeping a random "full jitter" backoff between tries (base * 2**try, capped) so racing writers
#: spread out instead of colliding again on the next round trip
ANY_VERSION_ATTEMPTS = 16
CONTENTION_BACKOFF_BASE_S = 0.002
CONTENTION_BACKOFF_CAP_S = 0.1
#: the server refused the expected subject sequence: 10071 it is another one; 10164 (clustered
#: streams) another commit with an expectation on the subject is still being replicated
WRONG_LAST_SEQUENCE = (10071, 10164)
IN_FLIGHT = 10164
#: a clustered stream still replicates an earlier publish with this commit id (a retry came too
#: soon): it may yet land, so the append's outcome is unknown and the caller retries later
MSG_ID_IN_PROCESS = 10158

H_FIRST = "Sl-First-Version"
H_COUNT = "Sl-Count"
H_MSG_ID = api.Header.MSG_ID.value
H_EXPECTED = api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value
#: nats-server (2.11 and later, stream.go ``getExpectedLastSeqPerSubjectForSubject``): the subject,
#: or a filter with wildcards, whose last sequence H_EXPECTED is checked against instead of the
#: published subject's
H_EXPECTED_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
#: the last token of a shard's fence subject (takeover markers; never a stream's token)
FENCE_TOKEN = "_fence"


class _InFlight(Exception):
    """The server refused a fenced publish while another one with the same fence was in flight (10164)."""


class LogCommit(msgspec.Struct, array_like=True):
    """The payload of one log message: one commit. ``events`` are the events' encoded bytes, kept
    as msgpack binaries (any bytes round-trip)."""

    stream: str
    first_version: int
    at: int
    commit_id: str | None
    events: list[bytes]
    #: what else the commit carries for a store materialized from the log (``log_replica.py``'s
    #: sidecar: the feed, idempotency claim, listing record...); opaque here, empty by default
    extra: bytes = b""


class _Head(msgspec.Struct, frozen=True):
    """A stream's version and the subject sequence of its last commit (0, 0: no commit yet)."""

    version: int
    seq: int
    commit_id: str | None = None


_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder(LogCommit)
_EMPTY = _Head(0, 0)
_UNREACHABLE = (nats.errors.TimeoutError, nats.errors.ConnectionClosedError, nats.errors.NoServersError,
                nats.errors.ConnectionReconnectingError, nats.errors.NoRespondersError,
                nats.js.errors.NoStreamResponseError, nats.js.errors.ServiceUnavailableError)


def token_of_stream(stream: str) -> str:
    """The subject token of a stream name (reversible; ``[a-z2-7]`` only); raises InvalidStreamName."""
    raw = K.validate_stream(stream)
    return base64.b32encode(raw).decode("ascii").rstrip("=").lower()


def stream_of_token(token: str) -> str:
    """Inverse of :func:`token_of_stream`; raises InvalidStreamName for a token it did not make."""
    try:
        padded = token.upper() + "=" * (-len(token) % 8)
        return base64.b32decode(padded, casefold=False).decode("utf-8")
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidStreamName(token, f"not a log subject token ({e})") from e


def without_userinfo(url: str) -> str:
    """``url`` without its token or user and password (``nats://TOKEN@host`` -> ``nats://host``)."""
    parts = urllib.parse.urlsplit(url if "://" in url else f"nats://{url}")
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


def _check_commit_id(commit_id: str | None) -> None:
    if commit_id is None:
        return
    raw = commit_id.encode("utf-8")
    if not raw or len(raw) > MAX_COMMIT_ID_BYTES:
        raise ValueError(f"commit id must be 1 to {MAX_COMMIT_ID_BYTES} bytes, got {len(raw)}")
    if not commit_id.isascii() or not commit_id.isprintable() or " " in commit_id:
        raise ValueError(f"commit id {commit_id!r} must be printable ASCII without spaces (a NATS header value)")


class JetStreamLog:
    """The event log on one JetStream stream; open it with :meth:`connect`, close it with :meth:`close`.

    Bytes in, bytes out: the application's codec (``codec.EventTypes``) stays with the caller.
    Not safe to share between event loops; any number of tasks of one loop may use it.
    """

    def __init__(self, nc: Client, js: JetStreamContext, stream: str, shards: int, max_commit_bytes: int,
                 direct: bool = True) -> None:
        self._nc = nc
        #: reads of a head or commit by direct get (any replica answers); off at R>1, where a
        #: replica behind the leader would answer with an older head: such reads go to the leader
        self._direct = direct
        self._js = js
        self.stream = stream
        self.shards = shards
        self.max_commit_bytes = max_commit_bytes
        self._heads: OrderedDict[str, _Head] = OrderedDict()

    @classmethod
    async def connect(cls, url: str | Sequence[str], *, stream: str = DEFAULT_STREAM, replicas: int = 1,
                      shards: int = 16,
                      max_commit_bytes: int = DEFAULT_MAX_COMMIT_BYTES, duplicate_window_s: float = 120.0,
                      connect_timeout_s: float = 5.0, request_timeout_s: float = 5.0,
                      **options: Any) -> JetStreamLog:
        """Connect to ``url`` (one server, or a cluster's servers as a list or comma-separated: the
        client moves to another one when its server goes away) and create the log's stream if it does
        not exist (file storage, ``replicas`` copies: 1 on one server, 3 on a cluster, where a commit
        is acknowledged once a majority stored it; direct gets allowed, deletes of single messages
        denied, purges of a subject allowed: ``erase``).
        An existing stream must have ``replicas`` copies (StorageError otherwise). ``options`` go to
        ``nats.connect`` (a token, credentials); ``request_timeout_s`` bounds every JetStream request
        (a publish unanswered by then raises StorageUnavailable, outcome unknown). Raises
        StorageUnavailable when no server answers, StorageError when the stream cannot be created
        or has other subjects."""
        if not 1 <= replicas <= 5:
            raise ValueError(f"replicas must be 1 to 5, got {replicas}")
        if shards < 1:
            raise ValueError(f"shards must be at least 1, got {shards}")
        if not 0.05 <= request_timeout_s <= 60:
            raise ValueError(f"request_timeout_s must be 0.05 to 60 s, got {request_timeout_s}")
        if max_commit_bytes < 1024:
            raise ValueError(f"max_commit_bytes must be at least 1024, got {max_commit_bytes}")
        servers = [u.strip() for u in url.split(",")] if isinstance(url, str) else list(url)
        try:
            nc = await nats.connect(servers, connect_timeout=connect_timeout_s, allow_reconnect=True,
                                    max_reconnect_attempts=-1, **options)
        except (*_UNREACHABLE, OSError) as e:
            shown = ", ".join(without_userinfo(u) for u in servers)
            raise StorageUnavailable(f"no NATS server answered at {shown}", reason="io-error") from e
        limit = min(max_commit_bytes, nc.max_payload - HEADER_ALLOWANCE)
        log = cls(nc, nc.jetstream(timeout=request_timeout_s), stream, shards, limit, direct=replicas == 1)
        try:
            await log._ensure_stream(replicas, duplicate_window_s)
        except BaseException:
            await nc.close()
            raise
        return log

    async def _ensure_stream(self, replicas: int, duplicate_window_s: float) -> None:
        subjects = [f"{SUBJECT_PREFIX}.>"]
        try:
            try:
                info = await self._js.stream_info(self.stream)
            except nats.js.errors.NotFoundError:
                await self._js.add_stream(api.StreamConfig(
                    name=self.stream, subjects=subjects, storage=api.StorageType.FILE, num_replicas=replicas,
                    allow_direct=True, deny_delete=True, duplicate_window=duplicate_window_s))
                # purges stay allowed: deleting a session erases its commits from the log (``erase``)
                return
        except _UNREACHABLE as e:
            raise StorageUnavailable(f"JetStream did not answer for stream {self.stream}", reason="io-error") from e
        except nats.js.errors.APIError as e:
            raise StorageError(f"cannot create the log stream {self.stream}: {e.description}") from e
        if info.config.subjects != subjects:
            raise StorageError(f"stream {self.stream} exists with subjects {info.config.subjects}, not {subjects}")
        if info.config.num_replicas != replicas:
            raise StorageError(f"stream {self.stream} exists with {info.config.num_replicas} replicas, not {replicas}")

    async def close(self) -> None:
        await self._nc.close()

    @property
    def jetstream(self) -> JetStreamContext:
        """The JetStream context of the log's connection (for ``leases.py``, on the same server)."""
        return self._js

    # --- naming -----------------------------------------------------------------------------------

    def shard_of(self, stream: str) -> int:
        return K.shard_of(stream, self.shards)

    def subject_of(self, stream: str) -> str:
        """``sl.log.<shard>.<token>``; raises InvalidStreamName."""
        token = token_of_stream(stream)
        return f"{SUBJECT_PREFIX}.{self.shard_of(stream)}.{token}"

    # --- writes -----------------------------------------------------------------------------------

    async def append(self, stream: str, events: Sequence[bytes], expected_version: int = ANY_VERSION,
                     commit_id: str | None = None) -> AppendResult:
        """Append one commit of ``events`` (encoded events) to ``stream``, as one message.

        ``expected_version``: the stream's version now (0: it must not exist; ANY_VERSION: no
        check). ``commit_id`` is the message id: a retry with it returns the original commit's
        result with ``duplicate=True`` and writes nothing. Raises ValueError for bad arguments,
        InvalidStreamName, CommitTooLarge, WrongExpectedVersion (nothing written), or
        StorageUnavailable / StorageError as the module docstring says.
        """
        subject = self._checked(stream, events, expected_version, commit_id)
        # an append with a version check is tried again only when the server refused it while
        # another commit to the stream was in flight (R>1: err_code 10164) and the stream has not
        # moved yet; the next try then meets the version that commit left
        attempts = ANY_VERSION_ATTEMPTS
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(random.uniform(0, min(CONTENTION_BACKOFF_CAP_S,
                                                          CONTENTION_BACKOFF_BASE_S * 2 ** attempt)))
            head = await self._head_or_landed(stream, subject, expected_version, commit_id)
            if isinstance(head, AppendResult):
                return head
            result = await self._publish(stream, subject, head, list(events), commit_id)
            if result is not None:
                return result
            fresh = await self._refresh(stream, subject)
            original = await self._landed(stream, subject, commit_id, expected_version, fresh.version)
            if original is not None:
                return original
            if expected_version != ANY_VERSION and fresh.version != expected_version:
                raise WrongExpectedVersion(stream, expected_version, fresh.version)
        raise StorageUnavailable(f"stream {stream!r} kept moving (or had a commit in flight) under {attempts} "
                                 "tries of one append", outcome=NOT_WRITTEN, reason="contention")

    def _checked(self, stream: str, events: Sequence[bytes], expected_version: int, commit_id: str | None) -> str:
        """The stream's subject, once the append's arguments are valid (ValueError, InvalidStreamName)."""
        subject = self.subject_of(stream)
        if not events:
            raise ValueError("append needs at least one event")
        if len(events) > MAX_EVENTS_PER_COMMIT:
            raise ValueError(f"a commit holds at most {MAX_EVENTS_PER_COMMIT} events, got {len(events)}")
        if expected_version < ANY_VERSION:
            raise ValueError(f"expected_version must be >= 0 or ANY_VERSION, got {expected_version}")
        _check_commit_id(commit_id)
        return subject

    # --- the shard fence (leases.py's ShardOwner) --------------------------------------------------

    async def write_fence(self, shard: int, node: str, epoch: int) -> int:
        """Write a takeover marker on ``shard``'s fence subject (``sl.log.<shard>._fence``, not a
        stream's: ``_`` is outside the tokens' alphabet) and return its stream sequence: the
        shard's last sequence for :meth:`append_fenced`. Forgets the shard's cached heads (another
        node may have moved them). Raises StorageUnavailable / StorageError."""
        payload = _enc.encode({"node": node, "epoch": epoch, "at": time.time_ns() // 1_000_000})
        try:
            ack = await self._js.publish(f"{SUBJECT_PREFIX}.{shard}.{FENCE_TOKEN}", payload)
        except _UNREACHABLE as e:  # before APIError: some of them are API errors too
            raise StorageUnavailable(f"JetStream did not acknowledge the fence of shard {shard}",
                                     reason="io-error") from e
        except nats.js.errors.APIError as e:
            raise StorageError(f"cannot write the fence of shard {shard}: {e.description}") from e
        for stream in [name for name in self._heads if self.shard_of(name) == shard]:
            del self._heads[stream]
        return int(ack.seq)

    async def append_fenced(self, stream: str, events: Sequence[bytes], expected_version: int,
                            commit_id: str | None, shard_seq: int, extra: bytes = b"") -> AppendResult | None:
        """Append as :meth:`append` does, but the server checks the last sequence of the stream's
        whole shard (``Nats-Expected-Last-Subject-Sequence-Subject: sl.log.<shard>.>``) against
        ``shard_seq`` instead of the stream's own: nothing was written to any stream of the shard,
        nor a fence, since the caller's last write. The stream's version is checked against the
        caller's view (the shard's only writer while its fence holds). None when the server
        refused it on the shard's sequence and it is not a retry of a commit that landed: another
        node wrote to the shard (a fence). ``extra`` travels in the commit (``LogCommit.extra``).
        Raises what :meth:`append` raises."""
        subject = self._checked(stream, events, expected_version, commit_id)
        head = await self._head_or_landed(stream, subject, expected_version, commit_id)
        if isinstance(head, AppendResult):
            return head
        fence = (f"{SUBJECT_PREFIX}.{self.shard_of(stream)}.>", shard_seq)
        for attempt in range(ANY_VERSION_ATTEMPTS):
            try:
                result = await self._publish(stream, subject, head, list(events), commit_id, fence, extra)
                break
            except _InFlight:  # a publish with the same fence is being replicated: wait for it to settle
                await asyncio.sleep(random.uniform(0, min(CONTENTION_BACKOFF_CAP_S,
                                                          CONTENTION_BACKOFF_BASE_S * 2 ** (attempt + 1))))
        else:
            raise StorageUnavailable(f"the shard of stream {stream!r} kept a fenced publish in flight under "
                                     f"{ANY_VERSION_ATTEMPTS} tries", outcome=NOT_WRITTEN, reason="contention")
        if result is not None:
            return result
        fresh = await self._refresh(stream, subject)
        return await self._landed(stream, subject, commit_id, expected_version, fresh.version)

    async def _landed(self, stream: str, subject: str, commit_id: str | None, expected_version: int,
                      actual: int) -> AppendResult | None:
        """The original result when a refused append is a retry of a commit that landed, else None.

        The server checks the expected sequence before its duplicate window (nats-server 2.15), so
        a retry after the stream moved on is refused, not acknowledged as a duplicate: look for
        the commit id where the retried commit would be (right after ``expected_version``; for
        ANY_VERSION anywhere in the stream), reading at most the stream's commits."""
        if commit_id is None or actual <= max(expected_version, 0):
            return None
        head = self._heads.get(stream)
        if head is not None and head.commit_id == commit_id:
            return await self._result_of(head.seq, duplicate=True)
        last = head.seq if head is not None else (await self._refresh(stream, subject)).seq
        async with aclosing(self._commits(subject, 1, last)) as commits:
            async for seq, commit in commits:
                if commit.commit_id == commit_id:
                    end = commit.first_version + len(commit.events) - 1
                    return AppendResult(stream, commit.first_version, end, seq, seq, commit.at, True)
                if expected_version != ANY_VERSION and commit.first_version > expected_version:
                    return None
        return None

    async def _head_or_landed(self, stream: str, subject: str, expected_version: int,
                              commit_id: str | None) -> _Head | AppendResult:
        """The stream's head to publish after; the original result when the stream is past
        ``expected_version`` because this commit (a retry) landed; else raises WrongExpectedVersion."""
        try:
            return await self._head(stream, subject, expected_version)
        except WrongExpectedVersion as e:
            original = await self._landed(stream, subject, commit_id, expected_version, e.actual)
            if original is None:
                raise
            return original

    async def _head(self, stream: str, subject: str, expected_version: int) -> _Head:
        head = self._heads.get(stream)
        if head is None or (expected_version != ANY_VERSION and head.version != expected_version):
            head = await self._refresh(stream, subject)
        if expected_version != ANY_VERSION and head.version != expected_version:
            raise WrongExpectedVersion(stream, expected_version, head.version)
        return head

    async def _publish(self, stream: str, subject: str, head: _Head, events: list[bytes], commit_id: str | None,
                       fence: tuple[str, int] | None = None, extra: bytes = b"") -> AppendResult | None:
        """Publish the commit after ``head``; None when the server refused it on the sequence
        (the stream's, or with ``fence`` (filter, sequence) the last sequence of that filter's)."""
        first = head.version + 1
        at = time.time_ns() // 1_000_000
        payload = _enc.encode(LogCommit(stream, first, at, commit_id, events, extra))
        if len(payload) > self.max_commit_bytes:
            raise CommitTooLarge(stream, len(payload), self.max_commit_bytes)
        headers = {H_EXPECTED: str(head.seq), H_FIRST: str(first), H_COUNT: str(len(events))}
        if fence is not None:
            headers[H_EXPECTED_SUBJECT], headers[H_EXPECTED] = fence[0], str(fence[1])
        if commit_id is not None:
            headers[H_MSG_ID] = commit_id
        try:
            ack = await self._js.publish(subject, payload, headers=headers)
        except nats.js.errors.APIError as e:
            if e.err_code == IN_FLIGHT and fence is not None:
                raise _InFlight from e
            if e.err_code in WRONG_LAST_SEQUENCE:
                self._heads.pop(stream, None)
                return None
            if isinstance(e, _UNREACHABLE) or e.err_code == MSG_ID_IN_PROCESS:
                raise self._unknown(stream, e) from e
            raise StorageError(f"JetStream refused the commit to stream {stream!r}: {e.description} "
                               f"(err_code {e.err_code})") from e
        except _UNREACHABLE as e:
            raise self._unknown(stream, e) from e
        if ack.duplicate:
            self._heads.pop(stream, None)
            return await self._result_of(ack.seq, duplicate=True)
        last = first + len(events) - 1
        self._remember(stream, _Head(last, ack.seq, commit_id))
        return AppendResult(stream, first, last, ack.seq, ack.seq, at)

    def _unknown(self, stream: str, e: Exception) -> StorageUnavailable:
        self._heads.pop(stream, None)
        return StorageUnavailable(f"JetStream did not acknowledge the commit to stream {stream!r} "
                                  f"({type(e).__name__}); retry with the same commit id", outcome=UNKNOWN,
                                  reason="io-error")

    def _remember(self, stream: str, head: _Head) -> None:
        self._heads[stream] = head
        self._heads.move_to_end(stream)
        while len(self._heads) > HEAD_CACHE_SIZE:
            self._heads.popitem(last=False)

    # --- reads ------------------------------------------------------------------------------------

    async def stream_version(self, stream: str) -> int:
        """The stream's version as the server has it (0 when it has no commit)."""
        return (await self._refresh(stream, self.subject_of(stream))).version

    async def _refresh(self, stream: str, subject: str) -> _Head:
        try:
            msg = await self._js.get_last_msg(self.stream, subject, direct=self._direct)
        except nats.js.errors.NotFoundError:
            self._heads.pop(stream, None)
            return _EMPTY
        except _UNREACHABLE as e:
            raise StorageUnavailable(f"JetStream did not answer a read of stream {stream!r}", reason="io-error") from e
        except nats.js.errors.APIError as e:
            raise StorageError(f"cannot read the head of stream {stream!r}: {e.description}") from e
        head = self._head_of(stream, msg)
        self._remember(stream, head)
        return head

    def _head_of(self, stream: str, msg: api.RawStreamMsg) -> _Head:
        hdrs = msg.headers or {}
        try:
            first, count = int(hdrs[H_FIRST]), int(hdrs[H_COUNT])
        except (KeyError, ValueError) as e:
            raise EventDecodeError(stream, 0, f"log message {msg.seq} has no valid {H_FIRST}/{H_COUNT}") from e
        return _Head(first + count - 1, int(msg.seq or 0), hdrs.get(H_MSG_ID))

    async def _result_of(self, seq: int, *, duplicate: bool) -> AppendResult:
        """The result of the commit at stream sequence ``seq`` (a duplicate's original)."""
        try:
            msg = await self._js.get_msg(self.stream, seq=seq, direct=self._direct)
        except _UNREACHABLE as e:
            raise StorageUnavailable(f"JetStream did not answer a read of commit {seq}", reason="io-error") from e
        except nats.js.errors.APIError as e:
            raise StorageError(f"cannot read commit {seq}: {e.description}") from e
        commit = self._decode(msg.data or b"", seq)
        last = commit.first_version + len(commit.events) - 1
        return AppendResult(commit.stream, commit.first_version, last, seq, seq, commit.at, duplicate)

    def _decode(self, data: bytes, seq: int) -> LogCommit:
        try:
            return _dec.decode(data)
        except msgspec.DecodeError as e:
            raise EventDecodeError(f"<log message {seq}>", 0, str(e)) from e

    async def read_stream(self, stream: str, from_version: int = 1,
                          limit: int | None = None) -> list[RecordedEvent[bytes]]:
        """Events of ``stream`` with version >= ``from_version``, oldest first, at most ``limit``
        (read through an ordered consumer on the stream's subject, up to its last commit now)."""
        if limit is not None and limit < 1:
            raise ValueError("limit must be at least 1")
        subject = self.subject_of(stream)
        head = await self._refresh(stream, subject)
        if head.seq == 0 or head.version < from_version:
            return []
        out: list[RecordedEvent[bytes]] = []
        async with aclosing(self._commits(subject, 1, head.seq)) as commits:
            async for seq, commit in commits:
                for i, data in enumerate(commit.events):
                    version = commit.first_version + i
                    if version >= from_version:
                        out.append(RecordedEvent(stream, version, seq, commit.at, data, commit.commit_id))
                        if limit is not None and len(out) >= limit:
                            return out
        return out

    async def read_all(self, after: int = 0, limit: int = 1000) -> list[RecordedEvent[bytes]]:
        """Events of every stream in commit order, from the commits after position ``after`` (a
        stream sequence), at most ``limit`` events (whole commits: a commit is never split)."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        try:
            info = await self._js.stream_info(self.stream)
        except _UNREACHABLE as e:
            raise StorageUnavailable(f"JetStream did not answer for stream {self.stream}", reason="io-error") from e
        last = info.state.last_seq
        out: list[RecordedEvent[bytes]] = []
        if last <= after:
            return out
        async with aclosing(self._commits(f"{SUBJECT_PREFIX}.>", after + 1, last)) as commits:
            async for seq, commit in commits:
                for i, data in enumerate(commit.events):
                    out.append(RecordedEvent(commit.stream, commit.first_version + i, seq, commit.at, data,
                                             commit.commit_id))
                if len(out) >= limit:
                    break
        return out

    async def shard_commits(self, shard: int, last: int, start: int = 1) -> AsyncGenerator[tuple[int, LogCommit], None]:
        """``(stream sequence, commit)`` of every commit of ``shard`` (all its streams, in the
        order they were written) from stream sequence ``start`` to ``last`` (a message of the
        shard: its owner's fence, or its last message, ``shard_head``). Fences are skipped."""
        async with aclosing(self._commits(f"{SUBJECT_PREFIX}.{shard}.>", start, last)) as commits:
            async for item in commits:
                yield item

    async def shard_head(self, shard: int) -> int:
        """The stream sequence of ``shard``'s last message (a commit or a fence), 0 when it has none."""
        try:
            msg = await self._js.get_last_msg(self.stream, f"{SUBJECT_PREFIX}.{shard}.>", direct=self._direct)
        except nats.js.errors.NotFoundError:
            return 0
        except _UNREACHABLE as e:
            raise StorageUnavailable(f"JetStream did not answer a read of shard {shard}", reason="io-error") from e
        except nats.js.errors.APIError as e:
            raise StorageError(f"cannot read the head of shard {shard}: {e.description}") from e
        return int(msg.seq or 0)

    async def erase(self, stream: str, keep_last: bool = False) -> None:
        """Delete ``stream``'s commits from the log (a purge of its subject; with ``keep_last`` its
        last commit, a tombstone, stays). Raises StorageUnavailable / StorageError."""
        subject = self.subject_of(stream)
        self._heads.pop(stream, None)
        try:
            await self._js.purge_stream(self.stream, subject=subject, keep=1 if keep_last else None)
        except _UNREACHABLE as e:  # before APIError: some of them are API errors too
            raise StorageUnavailable(f"JetStream did not answer the erasure of stream {stream!r}",
                                     reason="io-error") from e
        except nats.js.errors.APIError as e:
            raise StorageError(f"cannot erase stream {stream!r} from the log: {e.description}") from e

    async def _commits(self, subject: str, start: int, last: int) -> AsyncGenerator[tuple[int, LogCommit], None]:
        """``(stream sequence, commit)`` of the messages on ``subject`` from ``start`` to ``last``."""
        config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start,
                                    inactive_threshold=30.0)
        try:
            sub = await self._js.subscribe(subject, stream=self.stream, ordered_consumer=True, config=config)
        except _UNREACHABLE as e:
            raise StorageUnavailable(f"JetStream did not answer a read of {subject}", reason="io-error") from e
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=5.0)
                except nats.errors.TimeoutError as e:
                    raise StorageUnavailable(f"a read of {subject} stalled before commit {last}",
                                             reason="io-error") from e
                seq = msg.metadata.sequence.stream
                if not msg.subject.endswith(FENCE_TOKEN):  # a takeover marker is no commit
                    yield seq, self._decode(msg.data, seq)
                if seq >= last:
                    return
        finally:
            await sub.unsubscribe()
