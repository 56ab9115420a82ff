"""Prometheus metrics of one host (``/metrics``), in a registry of its own so several hosts (tests,
benchmarks) never collide. Counters move from the commit path; gauges are read when scraped.

The store's histograms (commit duration, group-commit batch size, append latency) are kept by
the store itself (``eventstore.groupcommit.CommitStats``: bucket counts written by the one
thread leading a group commit, no lock) and turned into histogram families at scrape time."""

from __future__ import annotations

import gc
import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)

from sessionloop.actors import events as E
from sessionloop.actors.system.ports import Commit
from sessionloop.eventstore.groupcommit import Observations

_TURN_END = {E.TurnCompleted: "completed", E.TurnFailed: "failed", E.TurnAborted: "aborted",
             E.TurnLimitReached: "tool-limit"}
_TURN_BUCKETS = (.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60)
_MODEL_BUCKETS = (.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60)
_OUTCOMES = tuple(dict.fromkeys(_TURN_END.values()))
_MODEL_OUTCOMES = ("completed", "failed", "aborted")


class _Tally:
    """One thread's counts on the commit path. prometheus-client's counters and histograms take
    a lock per increment; every pool thread bumping the same few locks thousands of times a
    second convoyed them behind whichever thread lost the GIL holding one (measured: ~10% of the
    pool threads' time). Each thread counts into its own tally; a scrape adds them up."""

    __slots__ = ("commits", "turns", "turn_hist", "model_hist")

    def __init__(self) -> None:
        self.commits = 0
        self.turns = dict.fromkeys(_OUTCOMES, 0)
        self.turn_hist = Observations(_TURN_BUCKETS)
        self.model_hist = {outcome: Observations(_MODEL_BUCKETS) for outcome in _MODEL_OUTCOMES}

    def add(self, other: _Tally) -> None:
        self.commits += other.commits
        for k, v in other.turns.items():
            self.turns[k] += v
        self.turn_hist.add(other.turn_hist)
        for k, h in other.model_hist.items():
            self.model_hist[k].add(h)


class _TallyBoard:
    """Every thread's :class:`_Tally`: ``mine()`` is the caller's, made on its first use.

    With a thread per actor (``dispatcher_threads=0``) threads come and go: registering a new
    thread folds the tallies of threads that have ended into one, so they do not pile up.
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._live: list[tuple[threading.Thread, _Tally]] = []
        self._retired = _Tally()

    def mine(self) -> _Tally:
        try:
            return self._local.tally
        except AttributeError:
            return self._register()

    def _register(self) -> _Tally:
        tally = self._local.tally = _Tally()
        with self._lock:
            live = []
            for thread, t in self._live:
                if thread.is_alive():
                    live.append((thread, t))
                else:
                    self._retired.add(t)
            live.append((threading.current_thread(), tally))
            self._live = live
        return tally

    def totals(self) -> _Tally:
        total = _Tally()
        with self._lock:
            parts = [t for _, t in self._live] + [self._retired]
        for t in parts:
            total.add(t)
        return total


class HostMetrics:
    def __init__(self, runtime: Any) -> None:
        self.rt = runtime
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.frames = Counter("sessionloop_frames", "Protocol requests answered, by method and code",
                              ["method", "code"], registry=r)
        self.connections = Gauge("sessionloop_connections", "Open protocol connections", registry=r)
        self.tallies = _TallyBoard()
        #: the store's head when this process opened it: what it appended since is the head's growth
        #: (every stream's events: sessions', approvals', tasks', places')
        self.head_at_open = runtime.store.head_position
        r.register(_Collector(self))

    def committed(self, commit: Commit) -> None:
        """A commit listener (``actors.system.ports``): commits, turn and model-call outcomes."""
        events, state = commit.events, commit.state
        t = self.tallies.mine()
        t.commits += 1
        for event in events:
            outcome = _TURN_END.get(type(event))
            if outcome is not None:
                t.turns[outcome] += 1
                turn = state.turns.get(event.turn_id)  # type: ignore[attr-defined]
                if turn is not None and turn.ended_at is not None:
                    t.turn_hist.observe(max(0, turn.ended_at - turn.started_at) / 1000)
            elif type(event) is E.LlmCompleted:
                t.model_hist["completed"].observe(event.duration_ms / 1000)
            elif type(event) is E.LlmFailed:
                outcome = "aborted" if event.aborted else "failed"
                t.model_hist[outcome].observe(_failed_call_seconds(state, event))

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))


def _failed_call_seconds(state: Any, event: E.LlmFailed) -> float:
    """A failed call's duration: the event's own when it carries one, else from its step's
    start and end (the LlmStarted and LlmFailed times, in ms); failures are rare, so the scan of
    the (recent end of the) step list costs nothing on the common path."""
    if event.duration_ms:
        return event.duration_ms / 1000
    for step in reversed(state.steps):
        if step.step_id == event.step_id:
            if step.ended_at is not None:
                return max(0, int(step.ended_at) - int(step.started_at)) / 1000
            break
    return 0.0


def _buckets(bounds: tuple[float, ...], counts: Any) -> list[tuple[str, int]]:
    """Prometheus' cumulative ``le`` buckets from per-bucket counts (the last one is +Inf)."""
    cumulative, buckets = 0, []
    for bound, c in zip((*(repr(float(b)) for b in bounds), "+Inf"), counts, strict=True):
        cumulative += c
        buckets.append((bound, cumulative))
    return buckets


def _commit_families(total: _Tally, events_appended: int) -> Any:
    """The commit-path counters and histograms, from every thread's tally summed at scrape time."""
    turns = CounterMetricFamily("sessionloop_turns", "Turns ended, by outcome", labels=["outcome"])
    for outcome in _OUTCOMES:
        turns.add_metric([outcome], total.turns[outcome])
    yield turns
    yield CounterMetricFamily("sessionloop_events_appended", "Events appended to the store", value=events_appended)
    yield CounterMetricFamily("sessionloop_session_commits", "Commits made by session actors", value=total.commits)
    h = total.turn_hist
    yield HistogramMetricFamily("sessionloop_turn_duration_seconds", "Turn duration from start to end",
                                buckets=_buckets(h.bounds, h.counts), sum_value=h.sum)
    model = HistogramMetricFamily("sessionloop_model_call_duration_seconds",
                                  "Model call duration, by outcome (completed, failed, aborted)", labels=["outcome"])
    for outcome, h in total.model_hist.items():
        model.add_metric([outcome], _buckets(h.bounds, h.counts), h.sum)
    yield model


def _model_families(providers: list[Any]) -> Any:
    """Each real model's calls (``actors/model/limits.py`` ``CallStats``), labelled by the model:
    requests waiting for a slot and open now, the waits for a slot, retries by status."""
    stats = [(str(getattr(p, "label", p.name)), p.stats) for p in providers if getattr(p, "stats", None) is not None]
    if not stats:
        return
    waiting = GaugeMetricFamily("sessionloop_model_requests_waiting",
                                "Model requests waiting for a slot of their model's limits", labels=["model"])
    open_now = GaugeMetricFamily("sessionloop_model_requests_in_flight", "Model requests open now", labels=["model"])
    started = CounterMetricFamily("sessionloop_model_requests", "Model requests started (each attempt counts)",
                                  labels=["model"])
    delayed = CounterMetricFamily("sessionloop_model_limiter_delayed",
                                  "Model requests that waited for a slot (concurrency, RPM or TPM)", labels=["model"])
    waits = HistogramMetricFamily("sessionloop_model_limiter_wait_seconds",
                                  "Wait for a slot of the model's limits, per request", labels=["model"])
    retries = CounterMetricFamily("sessionloop_model_retries",
                                  "Model call attempts that failed and were tried again, by HTTP status or cause",
                                  labels=["model", "status"])
    for label, st in stats:
        waiting.add_metric([label], st.waiting)
        open_now.add_metric([label], st.in_flight)
        started.add_metric([label], st.requests)
        delayed.add_metric([label], st.delayed)
        waits.add_metric([label], _buckets(st.waits.bounds, list(st.waits.counts)), st.waits.sum)
        for status, count in sorted(dict(st.retries).items()):
            retries.add_metric([label, status], count)
    yield from (waiting, open_now, started, delayed, waits, retries)


def _store_families(stats: dict[str, Any]) -> Any:
    """The store's own observations (``EventStore.commit_stats``) as histograms."""
    for key, name, help_text in (
        ("commit_seconds", "sessionloop_store_commit_duration_seconds",
         "Write transaction (group commit) duration, from its start to its durable commit"),
        ("batch_size", "sessionloop_store_commit_batch_size", "Write requests per write transaction (group commit)"),
        ("append_seconds", "sessionloop_store_append_latency_seconds",
         "Append latency, from submission to durable acknowledgement (its group committed)"),
    ):
        h = stats[key]
        yield HistogramMetricFamily(name, help_text, buckets=_buckets(h.bounds, h.counts), sum_value=h.sum)


class _Collector:
    """What is read at scrape time: the commit-path tallies, the store, the directory."""

    def __init__(self, metrics: HostMetrics) -> None:
        self.m = metrics

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        m = self.m
        yield from _commit_families(m.tallies.totals(), m.rt.store.head_position - m.head_at_open)
        rt = self.m.rt
        yield from _store_families(rt.store.commit_stats())
        yield from _model_families(rt.model_providers())
        info = rt.store.info()
        store = InfoMetricFamily("sessionloop_store", "Event store settings")
        store.add_metric([], {"durability": info["durability"],
                              "fsync_per_commit": str(info["fsync_per_commit"]).lower(),
                              "shards": str(info["shards"])})
        yield store
        for name, help_text, value in (
            ("sessionloop_epoch", "Epoch of this server start", rt.epoch),
            ("sessionloop_store_position", "Global position of the last committed event", info["last_position"]),
            ("sessionloop_store_commit_batches", "Write transactions committed (group commits)", info["batches"]),
            ("sessionloop_store_commit_requests", "Write requests committed", info["requests"]),
            ("sessionloop_store_last_batch_size", "Requests in the last group commit", info.get("last_batch_size", 0)),
            ("sessionloop_store_map_resizes", "LMDB map growths", info["map_resizes"]),
            ("sessionloop_actors_active", "Live session actors", rt.directory.live_count()),
            ("sessionloop_mailbox_depth", "Messages waiting in all live session mailboxes",
             rt.directory.mailbox_depth()),
            ("sessionloop_approvals_pending", "Approvals pushed and not settled", len(rt.approvals.pending_all())),
            ("sessionloop_background_tasks_running", "Background tasks running", rt.tasks_service.running_total()),
            ("sessionloop_actors_activations", "Session activations", rt.directory.activations),
            ("sessionloop_actors_passivations", "Session passivations", rt.directory.passivations),
            ("sessionloop_gc_frozen_objects", "Objects kept out of the cyclic GC's full passes (frozen at startup)",
             gc.get_freeze_count()),
            ("sessionloop_gc_young_threshold",
             "Tracked allocations between young GC passes (sessionloop.actors.system.gc_policy)",
             gc.get_threshold()[0]),
        ):
            g = GaugeMetricFamily(name, help_text)
            g.add_metric([], float(value))
            yield g
