"""The engine of ``sessionloop bench --workload``: it drives a deployment through
:mod:`sessionloop.client` as the workload says and returns the run's
:class:`~sessionloop.cli.loadtest.results.Result`.

Theory of operation
-------------------
Bots are app connections (``AsyncClient`` with an app token; ``client.connections`` of them, the
users spread over them in turn, the apps in turn). A turn is what a bot does: ``loop/send`` with an
idempotency key, then ``loop/waitForTurn`` for its end. A ``rejected`` receipt (the app's quota) is
counted and sent again with the same key after its ``retryAfterMs``; a send chosen as a duplicate
(``sessions.duplicates``) is sent a second time with the same key and text, and must be answered
``duplicate`` with the same turn.

* Closed loop (``users``): each virtual user sends, waits for the turn's end, thinks, and sends
  again; it opens a new session after ``sessions.turns`` turns. A phase changes the number of users
  linearly from the previous phase's (a ramp) or at once (``steady``); a user over the count stops
  after its turn. Latency runs from the send.
* Open loop (``rate``): turns arrive as a Poisson process whose rate follows the phases the same way
  (drawn by thinning), each on an idle session of the run or a new one, whatever the server's pace;
  latency runs from the *intended* arrival time, so a server that falls behind is charged for the
  wait (no coordinated omission, as wrk2 measures it).

The virtual owner (an owner connection, needed for approvals and watched sessions) reports itself
present, answers every ``approval/requested`` of the run's sessions as the message's ``approval``
says after its ``approval_delay``, and subscribes to the watched sessions (``session/subscribe``;
``client.owner_sessions`` per connection), timing the first ``item/delta`` of each of their turns.

After the last phase no new turn starts; those in flight get ``client.drain_s`` to end. Then the
audit reads each app's event feed (``loop/listEvents``, from the cursor it had before the run) and
checks that every acknowledged send has exactly one ended turn and no other turn ran in the run's
sessions (:func:`audit`). The feed keeps an app's last 10,000 events (7 days): the auditor reads it
while the run goes on, so only a run that outpaces it by that many events loses the audit, and then
the audit says so and fails.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import math
import os
import platform
import random
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

from sessionloop.cli.loadtest.record import Recorder
from sessionloop.cli.loadtest.results import Audit, Environment, Result, Sample, Target
from sessionloop.cli.loadtest.workload import Delay, Message, Workload
from sessionloop.client import AsyncClient, ClientError, ClientOptions, CursorExpired, Notification
from sessionloop.protocol.limits import LOOP_EVENTS_MAX_LIMIT, MAX_WAIT_MS

#: open loop: turns started and not ended at most; an arrival beyond it is an error (the load
#: generator's own bound, never the server's)
MAX_IN_FLIGHT = 100_000
#: how often the auditor reads the feeds while the run goes on (s)
AUDIT_POLL_S = 0.5
MAX_AUDIT_EXAMPLES = 20


@dataclass(frozen=True)
class Deployment:
    """Where to drive: the URL, the bots' app tokens (one per app), the owner's token if any."""

    url: str
    app_tokens: list[str]
    owner_token: str | None = None
    spawned: bool = False


@dataclass
class Slot:
    """A session of the run, as its user sees it."""

    session_id: str
    bot: int  # the index of its bot connection
    watched: bool
    turns: int = 0  # sends made (a duplicate resend not counted)


@dataclass
class Progress:
    """What the live view shows, updated every interval."""

    t_s: float
    phase: str
    sample: Sample
    turns: int  # ended so far
    errors: int  # so far
    seconds: float


@dataclass
class Books:
    """The audit's books: per distinct acknowledged send its turn, per duplicate the answer."""

    sessions: set[str] = field(default_factory=set)  # the run's session ids
    turn_of_key: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (session, turn)
    bad_duplicates: list[str] = field(default_factory=list)
    ended: dict[tuple[str, str], int] = field(default_factory=dict)  # (session, turn) -> end events seen
    failed_feeds: list[str] = field(default_factory=list)


def draw(rng: random.Random, d: Delay) -> float:
    """A delay in seconds."""
    mean = d.mean_ms / 1000
    if mean <= 0 or d.dist == "constant":
        return mean
    if d.dist == "exponential":
        return rng.expovariate(1 / mean)
    if d.dist == "uniform":
        return rng.uniform(0, 2 * mean)
    return rng.lognormvariate(math.log(mean), d.sigma)


def attachment(size: int, n: int) -> dict[str, str]:
    """A text attachment of ``size`` bytes, as a ``data:`` URL."""
    body = (f"attachment {n}\n".encode() * (size // 12 + 1))[:size]
    return {"data": "data:text/plain;base64," + base64.b64encode(body).decode(), "name": f"note-{n}.txt"}


def level_at(workload: Workload, t: float) -> float:
    """Users (closed loop) or arrivals per second (open loop) the phases ask for at ``t``."""
    start, before = 0.0, 0.0
    for p in workload.phases:
        target = float(p.users if p.users is not None else (p.rate or 0.0))
        if t < start + p.seconds:
            if p.kind == "steady":
                return target
            return before + (target - before) * (t - start) / p.seconds
        start, before = start + p.seconds, target
    return 0.0


class Run:
    def __init__(self, workload: Workload, text: str, label: str, target: Deployment,
                 on_progress: Callable[[Progress], None] | None = None, overrides: Sequence[str] = ()) -> None:
        self.w, self.text, self.label, self.target = workload, text, label, target
        self.overrides = list(overrides)
        self.rng = random.Random(workload.seed)
        self.on_progress = on_progress
        self.run_id = secrets.token_hex(4)
        self.rec = Recorder([(p.name, p.kind, p.seconds) for p in workload.phases], workload.client.interval_s)
        self.books = Books()
        self.bots: list[AsyncClient] = []
        self.bot_app: list[int] = []  # bot connection -> app index
        self.owners: list[AsyncClient] = []
        self.owner_load: list[int] = []
        self.slots: list[Slot] = []
        self.idle: list[Slot] = []  # open loop: sessions with turns left and none in flight
        self.approval_of: dict[str, Message] = {}  # session -> the message whose tool call waits
        self.delta_due: dict[str, float] = {}  # watched session -> intended time of its turn awaiting a delta
        self.tasks: set[asyncio.Task[Any]] = set()
        self.feed_after: list[int] = []
        self.stopping = False
        self.info: Any = None
        self.t0 = 0.0
        self.cum_weights = list(itertools.accumulate(m.weight for m in workload.messages))
        self.container = workload.sessions.container

    # --- time ---------------------------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self.t0

    # --- connections --------------------------------------------------------------------------

    async def connect(self) -> None:
        w, tokens = self.w, self.target.app_tokens
        peak = max(float(p.users or p.rate or 0) for p in w.phases)
        n = w.client.connections or max(len(tokens), math.ceil(peak / 10) if not w.open_loop else len(tokens) * 4)
        opts = ClientOptions(client_name="sessionloop-bench", honour_rejected=False, connect_timeout=30.0)
        self.bots = [AsyncClient(self.target.url, tokens[i % len(tokens)], opts) for i in range(n)]
        self.bot_app = [i % len(tokens) for i in range(n)]
        infos = await asyncio.gather(*(b.connect() for b in self.bots))
        self.info = infos[0]
        if w.needs_owner:
            if self.target.owner_token is None:
                raise ClientError("this workload has approvals to answer or sessions to watch: give the owner "
                                  "token (--token) too")
            await self.add_owner()
        self.feed_after = [await self.feed_head(self.bots[self.bot_app.index(a)]) for a in range(len(tokens))]

    async def add_owner(self) -> AsyncClient:
        assert self.target.owner_token is not None
        owner = AsyncClient(self.target.url, self.target.owner_token,
                            ClientOptions(client_name="sessionloop-bench-owner", max_notifications=100_000))
        await owner.connect()
        await owner.call("presence/update", active=True)
        self.owners.append(owner)
        self.owner_load.append(0)
        self.spawn(self.listen(owner))
        return owner

    async def feed_head(self, bot: AsyncClient) -> int:
        """The app's newest cursor before the run (its feed is read after it)."""
        after: str | None = None
        head = 0
        while True:
            page = await bot.list_events(after=after, limit=LOOP_EVENTS_MAX_LIMIT)
            if page.events:
                head = int(page.events[-1].cursor)
            if not page.next_cursor:
                return head
            after = page.next_cursor

    async def close(self) -> None:
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in [*self.bots, *self.owners]), return_exceptions=True)

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # --- the virtual owner --------------------------------------------------------------------

    async def listen(self, owner: AsyncClient) -> None:
        while True:
            try:
                note: Notification = await owner.next_notification()
            except ClientError:
                return
            if note.method == "item/delta":
                sid = getattr(note.params, "session_id", None)
                due = self.delta_due.pop(sid, None) if sid is not None else None
                if due is not None:
                    t = self.now()
                    self.rec.first_delta(t, t - due)
            elif note.method == "approval/requested":
                approval = note.params.approval
                message = self.approval_of.get(approval.session_id)
                if message is not None and approval.state == "pending":
                    self.spawn(self.answer(owner, approval, message))

    async def answer(self, owner: AsyncClient, approval: Any, message: Message) -> None:
        await asyncio.sleep(draw(self.rng, message.approval_delay))
        try:
            await owner.call("approval/respond", approval_id=approval.id, decision=message.approval,
                             content_hash=approval.content_hash)
            self.rec.count(self.now(), "approvals")
        except ClientError as e:
            self.rec.error(self.now(), f"approval/{type(e).__name__}", str(e))

    async def watch(self, sid: str) -> None:
        i = min(range(len(self.owners)), key=self.owner_load.__getitem__)
        if self.owner_load[i] >= self.w.client.owner_sessions:
            await self.add_owner()
            i = len(self.owners) - 1
        self.owner_load[i] += 1
        await self.owners[i].call("session/subscribe", session_id=sid)

    # --- sessions and turns -------------------------------------------------------------------

    async def open_session(self, user: int) -> Slot:
        s = self.w.sessions
        bot = user % len(self.bots)
        created = await self.bots[bot].create(container_id=self.container, title=f"bench {self.run_id} user {user}",
                                              permission_mode=s.permission_mode)
        slot = Slot(created.session_id, bot, watched=self.rng.random() < s.watched)
        self.books.sessions.add(slot.session_id)
        self.slots.append(slot)
        if slot.watched:
            await self.watch(slot.session_id)
        return slot

    async def turn(self, slot: Slot, intended: float, user: int) -> None:
        """One turn on ``slot``, its latency from ``intended``; errors recorded, never raised."""
        s, rec, bot = self.w.sessions, self.rec, self.bots[slot.bot]
        slot.turns += 1
        n = slot.turns
        message = self.rng.choices(self.w.messages, cum_weights=self.cum_weights)[0]
        text = message.text.replace("{n}", str(n)).replace("{user}", str(user))
        key = f"bench-{self.run_id}-{slot.session_id}-{n}"
        files = [attachment(s.attachment_bytes, n)] if self.rng.random() < s.attachments else None
        duplicate = self.rng.random() < s.duplicates
        if message.approval != "none":
            self.approval_of[slot.session_id] = message
        rec.in_flight += 1
        try:
            receipt = await self.send(bot, slot.session_id, text, key, files, intended)
            if receipt is None:
                return
            rec.count(self.now(), "acknowledged")
            self.books.turn_of_key[key] = (slot.session_id, str(receipt.turn_id))
            if slot.watched:
                self.delta_due[slot.session_id] = intended
            if duplicate:
                await self.resend(bot, slot.session_id, text, key, files, str(receipt.turn_id))
            timeout_ms = min(MAX_WAIT_MS, round(s.turn_timeout_s * 1000))
            result = await bot.wait_for_turn(slot.session_id, str(receipt.turn_id), timeout_ms)
            t = self.now()
            if result.state == "timeout":
                rec.error(t, "turn-timeout", f"session {slot.session_id}: turn {receipt.turn_id} not ended "
                                             f"within {s.turn_timeout_s:g} s")
            else:
                rec.turn_ended(t, t - intended, failed=result.state == "failed")
        except ClientError as e:
            rec.error(self.now(), type(e).__name__, str(e))
        finally:
            rec.in_flight -= 1
            self.delta_due.pop(slot.session_id, None)
            self.approval_of.pop(slot.session_id, None)

    async def send(self, bot: AsyncClient, sid: str, text: str, key: str, files: list[Any] | None,
                   intended: float) -> Any:
        """The receipt of a send, ``rejected`` ones waited out (counted); None if it never got in."""
        rec, limit = self.rec, self.w.sessions.turn_timeout_s
        rec.count(self.now(), "sent")
        while True:
            receipt = await bot.send(sid, text, key, files)
            if receipt.state != "rejected":
                return receipt
            rec.count(self.now(), "rejected")
            if self.now() - intended > limit:
                rec.error(self.now(), "rejected", f"session {sid}: still over quota after {limit:g} s")
                return None
            await asyncio.sleep((receipt.retry_after_ms or 1000) / 1000)

    async def resend(self, bot: AsyncClient, sid: str, text: str, key: str, files: list[Any] | None,
                     turn_id: str) -> None:
        rec = self.rec
        rec.count(self.now(), "sent")
        rec.count(self.now(), "duplicates_sent")
        again = await bot.send(sid, text, key, files)
        if again.state == "duplicate" and str(again.turn_id) == turn_id:
            rec.count(self.now(), "deduplicated")
        elif len(self.books.bad_duplicates) < MAX_AUDIT_EXAMPLES:
            self.books.bad_duplicates.append(f"session {sid}: key {key} sent again was answered {again.state} "
                                             f"turn {again.turn_id}, not duplicate of turn {turn_id}")

    # --- the two loops ------------------------------------------------------------------------

    async def closed_loop(self) -> None:
        users: dict[int, asyncio.Task[Any]] = {}
        end = self.w.seconds
        while (t := self.now()) < end:
            want = math.floor(level_at(self.w, t) + 1e-9)
            for u in range(want):
                if u not in users:
                    users[u] = self.spawn(self.user(u))
            for u in [u for u, task in users.items() if task.done()]:
                del users[u]
            await asyncio.sleep(0.05)
        self.stopping = True
        await self.drain()

    async def user(self, u: int) -> None:
        s = self.w.sessions
        sessions: list[Slot] = []
        turn = 0
        while not self.stopping and u < math.floor(level_at(self.w, self.now()) + 1e-9):
            try:
                if len(sessions) < s.per_user:
                    sessions.append(await self.open_session(u))
                slot = sessions[turn % len(sessions)]
            except ClientError as e:
                self.rec.error(self.now(), type(e).__name__, str(e))
                await asyncio.sleep(1.0)
                continue
            turn += 1
            await self.turn(slot, self.now(), u)
            if slot.turns >= s.turns:
                sessions.remove(slot)
            if not self.stopping:
                await asyncio.sleep(draw(self.rng, s.think))

    async def open_loop(self) -> None:
        w = self.w
        peak = max(p.rate or 0.0 for p in w.phases)
        end = w.seconds
        t_next = 0.0
        arrivals = 0
        while peak > 0:
            t_next += self.rng.expovariate(peak)
            if t_next >= end:
                break
            if self.rng.random() * peak > level_at(w, t_next):
                continue  # thinning: this candidate arrival is not one at the rate of t_next
            delay = t_next - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            arrivals += 1
            if self.rec.in_flight >= MAX_IN_FLIGHT:
                self.rec.error(self.now(), "generator-overloaded", f"{MAX_IN_FLIGHT:,} turns in flight: arrival "
                                                                   "dropped by the load generator")
                continue
            self.spawn(self.arrival(t_next, arrivals))
        await asyncio.sleep(max(0.0, end - self.now()))
        self.stopping = True
        await self.drain()

    async def arrival(self, intended: float, n: int) -> None:
        try:
            slot = self.idle.pop() if self.idle else await self.open_session(n)
        except ClientError as e:
            self.rec.error(self.now(), type(e).__name__, str(e))
            return
        await self.turn(slot, intended, n)
        if slot.turns < self.w.sessions.turns:
            self.idle.append(slot)

    async def drain(self) -> None:
        """After the last phase: wait for the turns in flight to end (users thinking are not waited for)."""
        deadline = self.now() + self.w.client.drain_s
        while self.rec.in_flight and self.now() < deadline:
            await asyncio.sleep(0.02)

    # --- progress and the audit ---------------------------------------------------------------

    async def ticker(self) -> None:
        step = self.w.client.interval_s
        k = 1
        while True:
            await asyncio.sleep(max(0.0, k * step - self.now()))
            t = self.now()
            sample = self.rec.sample(t, level_at(self.w, t))
            k += 1
            if self.on_progress is not None:
                tally = self.rec.all.tally
                self.on_progress(Progress(t, sample.phase, sample, tally.turns, tally.errors, self.w.seconds))

    async def read_feeds(self, final: bool) -> None:
        """Read every app's feed after its last cursor; ``final``: until its end."""
        for app, after in enumerate(self.feed_after):
            bot = self.bots[self.bot_app.index(app)]
            cursor: str | None = str(after)
            while True:
                try:
                    page = await bot.list_events(after=cursor, limit=LOOP_EVENTS_MAX_LIMIT)
                except CursorExpired as e:
                    self.books.failed_feeds.append(f"app #{app + 1}: the feed no longer holds events after cursor "
                                                   f"{cursor} (its retention): {e}")
                    self.feed_after[app] = 2**62
                    break
                for ev in page.events:
                    if ev.type in ("turn.completed", "turn.failed") and ev.session_id in self.books.sessions:
                        k = (ev.session_id, str(ev.turn_id))
                        self.books.ended[k] = self.books.ended.get(k, 0) + 1
                if page.events:
                    self.feed_after[app] = int(page.events[-1].cursor)
                    cursor = page.events[-1].cursor
                if not page.next_cursor or not final and not page.events:
                    break

    async def auditor(self) -> None:
        while True:
            await asyncio.sleep(AUDIT_POLL_S)
            try:
                await self.read_feeds(final=False)
            except ClientError:
                pass  # read again at the next poll, and to the end after the run

    async def run(self) -> Result:
        started = datetime.now(UTC).isoformat(timespec="seconds")
        await self.connect()
        self.t0 = time.monotonic()
        ticker = self.spawn(self.ticker())
        auditor = self.spawn(self.auditor())
        await (self.open_loop() if self.w.open_loop else self.closed_loop())
        end = self.now()
        ticker.cancel()
        auditor.cancel()
        if not self.rec.samples or self.rec.samples[-1].t_s < end - 1e-3:
            self.rec.sample(end, 0)
        self.rec.records[-1].end_s = max(self.rec.records[-1].end_s, end)
        unended = self.rec.in_flight
        if unended:
            self.rec.error(end, "not-ended", f"{unended} turns still in flight {self.w.client.drain_s:g} s after "
                                            "the last phase", unended)
        await self.read_feeds(final=True)
        return self.result(started, end)

    def result(self, started: str, end: float) -> Result:
        info = self.info
        return Result(
            workload=self.w.name if self.label == self.w.name else f"{self.w.name} ({self.label})",
            workload_toml=self.text, overrides=self.overrides, seed=self.w.seed,
            target=Target(url=self.target.url, spawned=self.target.spawned,
                          server_version=getattr(getattr(info, "server", None), "name", None),
                          protocol_version=getattr(info, "protocol_version", None)),
            environment=Environment(python=platform.python_version(), platform=platform.platform(),
                                    cpus=os.cpu_count() or 1, sessionloop=metadata.version("sessionloop")),
            started_at=started, duration_s=round(end, 3), interval_s=self.w.client.interval_s,
            phases=self.rec.phases(), overall=self.rec.overall(end), timeline=self.rec.samples,
            errors=sorted(self.rec.errors.values(), key=lambda e: -e.count), audit=audit(self.books, self.rec))


def audit(books: Books, rec: Recorder) -> Audit:
    """Every acknowledged send has exactly one ended turn in the feed, no other turn ran in the
    run's sessions, and every duplicate was answered as its original."""
    examples = list(books.failed_feeds) + list(books.bad_duplicates)
    ours = set(books.turn_of_key.values())
    missing = duplicated = found = 0
    for key, k in books.turn_of_key.items():
        seen = books.ended.get(k, 0)
        if seen == 1:
            found += 1
        elif seen == 0:
            missing += 1
            if len(examples) < MAX_AUDIT_EXAMPLES:
                examples.append(f"session {k[0]}: key {key} acknowledged as turn {k[1]}, which never ended")
        else:
            duplicated += 1
            if len(examples) < MAX_AUDIT_EXAMPLES:
                examples.append(f"session {k[0]}: turn {k[1]} (key {key}) ended {seen} times")
    for k in books.ended:
        if k not in ours:
            duplicated += 1
            if len(examples) < MAX_AUDIT_EXAMPLES:
                examples.append(f"session {k[0]}: turn {k[1]} ran, answering no send of this run")
    tally = rec.all.tally
    ok = not (missing or duplicated or books.failed_feeds or books.bad_duplicates)
    return Audit(acknowledged=len(books.turn_of_key), turns_found=found, missing=missing, duplicated=duplicated,
                 duplicates_sent=tally.duplicates_sent, deduplicated=tally.deduplicated,
                 examples=examples[:MAX_AUDIT_EXAMPLES], ok=ok)


async def run(workload: Workload, text: str, label: str, target: Deployment,
              on_progress: Callable[[Progress], None] | None = None, overrides: Sequence[str] = ()) -> Result:
    r = Run(workload, text, label, target, on_progress, overrides)
    try:
        return await r.run()
    finally:
        await r.close()


__all__ = ["Deployment", "Progress", "Run", "audit", "draw", "level_at", "run"]
