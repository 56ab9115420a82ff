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
it becomes a dead letter (moved in the store with its attempts and last error). A target refused by
the address check (``guard.py``), an app with no webhook any more, or an event that cannot be
announced becomes a dead letter at once. An entry whose event was deleted (its session purged) or
whose type the app no longer asks for is acknowledged without a delivery.

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
_USER_AGENT = "sessionloop-webhooks/1"

Key = tuple[int, int]


class _Held(msgspec.Struct):
    item: OutboxItem
    attempts: int = 0
    due: float = 0.0  # time.time() of the next attempt
    error: str = ""
    busy: bool = False  # an attempt is in flight, or its ack / dead letter is being written


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
        self._per_target: Counter[str] = Counter()
        self._running = 0
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
        opts = self.options
        transport = guarded_transport(self._allowed, opts.concurrency)
        timeout = httpx.Timeout(opts.timeout_s)
        async with httpx.AsyncClient(transport=transport, timeout=timeout, follow_redirects=False,
                                     trust_env=False) as client:
            tasks: set[asyncio.Task[None]] = set()
            while not self._stop.is_set():
                try:
                    self._scan()
                except StoreError as e:
                    log.warning("webhooks: the outbox could not be read: %s", e)
                for key, held in self._due():
                    task = asyncio.create_task(self._attempt(client, key, held))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                await self._flush()
                await self._sleep()
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._flush()

    async def _sleep(self) -> None:
        assert self._wake is not None
        now = time.time()
        waits = [h.due - now for h in self._held.values() if not h.busy]
        wait = min([self.options.poll_s, *waits]) if waits else self.options.poll_s
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
                taken += 1
        return taken

    def _due(self) -> list[tuple[Key, _Held]]:
        now, opts = time.time(), self.options
        out: list[tuple[Key, _Held]] = []
        for key, held in self._held.items():
            if self._running + len(out) >= opts.concurrency:
                break
            target = held.item.target
            if held.busy or held.due > now or self._per_target[target] >= opts.per_target:
                continue
            held.busy = True
            self._per_target[target] += 1
            out.append((key, held))
        self._running += len(out)
        return out

    # --- one attempt ------------------------------------------------------------------------------

    async def _attempt(self, client: httpx.AsyncClient, key: Key, held: _Held) -> None:
        try:
            await self._try(client, key, held)
        except Exception as e:  # a bug must not lose the entry: it stays in the outbox
            log.exception("webhooks: delivering %s failed unexpectedly", key)
            self._failed(key, held, f"internal error: {type(e).__name__}")
        finally:
            self._running -= 1
            self._per_target[held.item.target] -= 1

    async def _try(self, client: httpx.AsyncClient, key: Key, held: _Held) -> None:
        item = held.item
        manifest = self.apps.find(item.target)
        hook = manifest.webhook if manifest is not None else None
        if hook is None:
            return self._give_up(key, held, f"app {item.target!r} has no webhook configured")
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
            return self._ack(key)
        return self._failed(key, held, f"HTTP {status}")

    def _ack(self, key: Key) -> None:
        self._acks.append(key)

    def _failed(self, key: Key, held: _Held, error: str) -> None:
        self.stats["failed"] += 1
        held.attempts += 1
        held.error = error
        now, opts = time.time(), self.options
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
        for key in acks:
            self._held.pop(key, None)
        for shard, position, _a, _e in dead:
            self._held.pop((shard, position), None)
