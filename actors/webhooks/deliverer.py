"""The deliverer: reads the outbox of this process's shards and delivers each entry to its app's
webhook, on an asyncio loop in a thread of its own (never on an actor's thread).

Theory of operation. Every ``poll_s`` (and at once when woken) the loop reads outbox entries it does
not hold yet, up to ``MAX_HELD`` at a time (so a receiver that is down holds a bounded number in
memory; the rest wait in the store). An entry is *due* when its retry time came; due entries are
sent with one ``httpx.AsyncClient`` at most ``concurrency`` at once, at most ``per_target`` to one
app. A 2xx answer acknowledges it: the entry is deleted from the outbox, in a batch written by the
flusher after the answer. Any other outcome (another status, a timeout, a refused connection) is a
failed attempt: it is tried again after the schedule's next wait (``WebhookOptions.delay_after``),
unless that would come more than ``retry_window_s`` after the entry's clock started, in which case
it becomes a dead letter (moved in the store with its attempts and last error). A failed attempt also
makes its app's target *cool* for the schedule's wait after its consecutive failures: no attempt to
it starts until then, so a receiver that is down is probed by a few entries per wait instead of
every held one (a 2xx ends the cooling); an entry whose window ends while its target cools becomes
a dead letter without another attempt. A target refused by the address check (``guard.py``) or an
event that cannot be announced becomes a dead letter at once; an entry of an app with no webhook
(any more) is a failed attempt. An entry whose event was deleted (its session purged) or whose type
the app no longer asks for is acknowledged without a delivery.

At least once: an entry leaves the outbox only after its receiver answered 2xx, so a crash at any
point sends it again after the restart, with the same ``webhook-id``. Retry times and attempt
counts live in memory: after a restart an entry is tried at once and its window still counts from
its commit (or replay).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from typing import Any

import httpx
import msgspec

from sessionloop.actors.settings.apps import AppRegistry
from sessionloop.actors.webhooks.config import WebhookOptions, parse_networks
from sessionloop.actors.webhooks.events import message_for, sign
from sessionloop.actors.webhooks.guard import TargetRefused, guarded_transport
from sessionloop.eventstore import EventStore, OutboxItem, StoreError

__all__ = ["MAX_HELD", "WebhookDeliverer"]

log = logging.getLogger("sessionloop.webhooks")

#: outbox entries held in memory at once (the rest wait in the store)
MAX_HELD = 2000
_SCAN_PAGE = 500
_FULL_SCAN_S = 5.0
_STOP_GRACE_S = 2.0
_USER_AGENT = "sessionloop-webhooks/1"

Key = tuple[int, int]


class _Held(msgspec.Struct):
    item: OutboxItem
    attempts: int = 0
    due: float = 0.0  # time.time() of the next attempt
    error: str = ""
    busy: bool = False  # an attempt is in flight, or its ack / dead letter is being written


class _Target(msgspec.Struct):
    """One app's deliveries: how many are held and running, and its cooling after failures."""

    held: int = 0
    running: int = 0
    failures: int = 0  # consecutive failed attempts
    cool_until: float = 0.0  # time.time() before which no attempt to it starts
    error: str = ""


class WebhookDeliverer:
    """Delivers the outbox of ``store``'s owned shards (all of them when it owns all) to the
    webhooks of ``apps``' manifests. :meth:`start` starts its thread; :meth:`close` stops it."""

    def __init__(self, store: EventStore[Any], apps: AppRegistry, options: WebhookOptions) -> None:
        self.store = store
        self.apps = apps
        self.options = options
        self._allowed = parse_networks(options.allow_networks)
        owned = store.owned_shards
        self._shards = sorted(owned) if owned is not None else list(range(store.shards))
        self._held: dict[Key, _Held] = {}
        self._acks: list[Key] = []
        self._dead: list[tuple[int, int, int, str]] = []
        self._targets: dict[str, _Target] = {}
        self._running = 0
        self._next_due = 0.0  # the earliest time something held may start (from the last _due)
        self._next_sweep = 0.0
        self._seen = 0  # the highest position a scan saw
        self._need_full = True
        self._next_full = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sessionloop-webhooks", daemon=True)
        #: counters for /metrics and tests: attempts, delivered, failed attempts, dead letters
        self.stats: Counter[str] = Counter()

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Look at the whole outbox now (after a replay): thread-safe."""
        self._need_full = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:
                pass  # closing

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self.wake()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # --- the loop -------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:
            log.exception("the webhook deliverer stopped")

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        client: httpx.AsyncClient | None = None  # made at the first delivery (its TLS context costs)
        tasks: set[asyncio.Task[None]] = set()
        try:
            while not self._stop.is_set():
                try:
                    self._scan()
                except StoreError as e:
                    log.warning("webhooks: the outbox could not be read: %s", e)
                due = self._due()
                if due and client is None:
                    client = self._client()
                for key, held in due:
                    assert client is not None
                    task = asyncio.create_task(self._attempt(client, key, held))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                await self._flush()
                await self._sleep()
            if tasks:  # a stop: attempts in flight get a moment to finish (else they are sent again later)
                await asyncio.wait(list(tasks), timeout=min(self.options.timeout_s, _STOP_GRACE_S))
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._flush()
        finally:
            if client is not None:
                await client.aclose()

    def _client(self) -> httpx.AsyncClient:
        opts = self.options
        return httpx.AsyncClient(transport=guarded_transport(self._allowed, opts.concurrency),
                                 timeout=httpx.Timeout(opts.timeout_s), follow_redirects=False, trust_env=False)

    async def _sleep(self) -> None:
        """Until the next poll, the next due entry, or a wake (a replay, an attempt that ended)."""
        assert self._wake is not None
        wait = min(self.options.poll_s, self._next_due - time.time())
        try:
            await asyncio.wait_for(self._wake.wait(), max(0.005, wait))
        except TimeoutError:
            pass
        self._wake.clear()

    def _scan(self) -> None:
        """Take entries not held yet: those committed since the last scan (positions only grow),
        and every few seconds, after a replay, or when a scan stopped for lack of room, all of
        them from the start (a replayed dead letter keeps its old position)."""
        room = MAX_HELD - len(self._held)
        if room <= 0:
            return
        now = time.monotonic()
        if self._need_full or now >= self._next_full:
            self._next_full = now + _FULL_SCAN_S
            self._need_full = False
            after: Key | None = None
            while room > 0:
                page = self.store.read_outbox(self._shards, after, _SCAN_PAGE)
                room -= self._take(page)
                if len(page) < _SCAN_PAGE:
                    return
                after = (page[-1].shard, page[-1].position)
            self._need_full = True
            return
        page = self.store.read_outbox(self._shards, None, room, min_position=self._seen)
        self._take(page)
        if len(page) >= room:
            self._need_full = True

    def _take(self, page: list[OutboxItem]) -> int:
        taken = 0
        for item in page:
            key = (item.shard, item.position)
            self._seen = max(self._seen, item.position)
            if key not in self._held and len(self._held) < MAX_HELD:
                self._held[key] = _Held(item)
                self._targets.setdefault(item.target, _Target()).held += 1
                taken += 1
        return taken

    def _due(self) -> list[tuple[Key, _Held]]:
        """The held entries to start now: due, of a target that is not cooling after failures
        and has room, within the overall concurrency. A target that failed cools for the
        schedule's wait after its consecutive failures, so a receiver that is down is tried by a
        few entries per wait, not by every held one."""
        now, opts = time.time(), self.options
        self._sweep(now)
        self._next_due = now + opts.poll_s
        cooling = [t.cool_until for t in self._targets.values() if t.held and t.cool_until > now]
        if cooling:
            self._next_due = min(self._next_due, *cooling)
        room = opts.concurrency - self._running
        open_ = {name for name, t in self._targets.items()
                 if t.held > t.running and t.running < opts.per_target and t.cool_until <= now}
        out: list[tuple[Key, _Held]] = []
        if room <= 0 or not open_:
            return out
        for key, held in self._held.items():
            target = held.item.target
            if held.busy or target not in open_:
                continue
            if held.due > now:
                self._next_due = min(self._next_due, held.due)
                continue
            state = self._targets[target]
            held.busy = True
            state.running += 1
            out.append((key, held))
            if state.running >= opts.per_target:
                open_.discard(target)
            if len(out) >= room or not open_:
                break
        self._running += len(out)
        return out

    def _sweep(self, now: float) -> None:
        """Once a second: the held entries of a cooling target whose window ended become dead letters."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + 1.0
        window = self.options.retry_window_s
        for key, held in self._held.items():
            state = self._targets[held.item.target]
            if not held.busy and state.cool_until > now and held.item.since / 1000 + window < now:
                held.busy = True
                self._give_up(key, held, held.error or f"not tried again: the receiver kept failing ({state.error})")

    # --- one attempt ------------------------------------------------------------------------------

    async def _attempt(self, client: httpx.AsyncClient, key: Key, held: _Held) -> None:
        try:
            await self._try(client, key, held)
        except Exception as e:  # a bug must not lose the entry: it stays in the outbox
            log.exception("webhooks: delivering %s failed unexpectedly", key)
            self._failed(key, held, f"internal error: {type(e).__name__}")
        finally:
            self._running -= 1
            self._targets[held.item.target].running -= 1
            if self._wake is not None:
                self._wake.set()  # room for the next one

    async def _try(self, client: httpx.AsyncClient, key: Key, held: _Held) -> None:
        item = held.item
        manifest = self.apps.find(item.target)
        hook = manifest.webhook if manifest is not None else None
        if hook is None:  # not registered yet, or its webhook was removed: tried again, then a dead letter
            return self._failed(key, held, f"app {item.target!r} has no webhook configured")
        recorded = self.store.event_at(item.position)
        if recorded is None:
            return self._ack(key)  # its session was deleted
        message = message_for(item.target, recorded)
        if message is None:
            return self._give_up(key, held, "the event at this position is not one a webhook announces")
        if message.type not in hook.events:
            return self._ack(key)  # the app no longer asks for this type
        stamp = int(time.time())
        headers = {"content-type": "application/json", "user-agent": _USER_AGENT, "webhook-id": message.id,
                   "webhook-timestamp": str(stamp), "webhook-signature": sign(hook.key(), message.id, stamp,
                                                                              message.body)}
        self.stats["attempts"] += 1
        try:
            async with client.stream("POST", hook.url, content=message.body, headers=headers) as response:
                status = response.status_code
        except httpx.HTTPError as e:
            if isinstance(e.__cause__, TargetRefused) or isinstance(e, httpx.UnsupportedProtocol):
                held.attempts += 1
                return self._give_up(key, held, str(e))
            return self._failed(key, held, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
        if 200 <= status < 300:
            self.stats["delivered"] += 1
            self._targets[item.target].failures = 0
            return self._ack(key)
        return self._failed(key, held, f"HTTP {status}")

    def _ack(self, key: Key) -> None:
        self._acks.append(key)

    def _failed(self, key: Key, held: _Held, error: str) -> None:
        self.stats["failed"] += 1
        held.attempts += 1
        held.error = error
        now, opts = time.time(), self.options
        state = self._targets[held.item.target]
        state.failures += 1
        state.error = error
        state.cool_until = max(state.cool_until, now + opts.delay_after(state.failures))
        due = now + opts.delay_after(held.attempts)
        if due > held.item.since / 1000 + opts.retry_window_s:
            return self._give_up(key, held, error)
        held.due, held.busy = due, False

    def _give_up(self, key: Key, held: _Held, error: str) -> None:
        self._dead.append((key[0], key[1], held.attempts, error))
        log.warning("webhooks: delivery %s to app %s is a dead letter after %d attempt(s): %s", key,
                    held.item.target, held.attempts, error)

    async def _flush(self) -> None:
        """Write the acknowledgements and dead letters taken since the last flush (one group)."""
        acks, dead = self._acks, self._dead
        if not acks and not dead:
            return
        self._acks, self._dead = [], []
        try:
            if acks:
                await asyncio.to_thread(self.store.ack_outbox, acks)
            if dead:
                await asyncio.to_thread(self.store.dead_letter, dead)
        except StoreError as e:  # kept in memory: they are written again at the next flush
            log.warning("webhooks: acknowledgements could not be written (%s); retrying", e)
            self._acks[:0], self._dead[:0] = acks, dead
            return
        self.stats["dead"] += len(dead)
        for key in [*acks, *((shard, position) for shard, position, _a, _e in dead)]:
            held = self._held.pop(key, None)
            if held is not None:
                self._targets[held.item.target].held -= 1
