"""Prometheus metrics of one host (SPEC §11a), in a registry of its own so several hosts (tests,
benchmarks) never collide. Counters move from the commit path; gauges are read when scraped."""

from __future__ import annotations

import gc
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

from eventstore import events as E

_TURN_END = {E.TurnCompleted: "completed", E.TurnFailed: "failed", E.TurnAborted: "aborted",
             E.TurnLimitReached: "tool-limit"}


class HostMetrics:
    def __init__(self, runtime: Any) -> None:
        self.rt = runtime
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.turns = Counter("sessionloop_turns", "Turns ended, by outcome", ["outcome"], registry=r)
        self.turn_seconds = Histogram("sessionloop_turn_duration_seconds", "Turn duration from start to end",
                                      registry=r, buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60))
        self.model_seconds = Histogram("sessionloop_model_call_duration_seconds", "Model call duration",
                                       registry=r, buckets=(.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60))
        self.events = Counter("sessionloop_events_appended", "Events appended to the store", registry=r)
        self.commits = Counter("sessionloop_session_commits", "Commits made by session actors", registry=r)
        self.frames = Counter("sessionloop_frames", "Protocol requests answered, by method and code",
                              ["method", "code"], registry=r)
        self.connections = Gauge("sessionloop_connections", "Open protocol connections", registry=r)
        r.register(_Collector(self))
        self._outcome = {cls: self.turns.labels(name) for cls, name in _TURN_END.items()}

    def committed(self, actor: Any, events: list[E.Event], result: Any) -> None:
        self.commits.inc()
        self.events.inc(len(events))
        for event in events:
            outcome = self._outcome.get(type(event))
            if outcome is not None:
                outcome.inc()
                turn = actor.state.turns.get(event.turn_id)  # type: ignore[attr-defined]
                if turn is not None and turn.ended_at is not None:
                    self.turn_seconds.observe(max(0, turn.ended_at - turn.started_at) / 1000)
            elif isinstance(event, E.LlmCompleted):
                self.model_seconds.observe(event.duration_ms / 1000)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))


class _Collector:
    """Gauges read at scrape time from the store and the directory."""

    def __init__(self, metrics: HostMetrics) -> None:
        self.m = metrics

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        rt = self.m.rt
        info = rt.store.info()
        store = InfoMetricFamily("sessionloop_store", "Event store settings")
        store.add_metric([], {"durability": info["durability"], "fsync_per_commit": str(info["fsync_per_commit"]).lower(),
                              "shards": str(info["shards"])})
        yield store
        for name, help_text, value in (
            ("sessionloop_epoch", "Epoch of this server start", rt.epoch),
            ("sessionloop_store_position", "Global position of the last committed event", info["last_position"]),
            ("sessionloop_store_commit_batches", "Write transactions committed (group commits)", info["batches"]),
            ("sessionloop_store_commit_requests", "Write requests committed", info["requests"]),
            ("sessionloop_store_commit_seconds", "Time spent in write transactions", info.get("commit_seconds", 0.0)),
            ("sessionloop_store_last_batch_size", "Requests in the last group commit", info.get("last_batch_size", 0)),
            ("sessionloop_store_map_resizes", "LMDB map growths", info["map_resizes"]),
            ("sessionloop_actors_active", "Live session actors", rt.directory.live_count()),
            ("sessionloop_mailbox_depth", "Messages waiting in all live session mailboxes", rt.directory.mailbox_depth()),
            ("sessionloop_approvals_pending", "Approvals pushed and not settled", len(rt.approvals.pending_all())),
            ("sessionloop_background_tasks_running", "Background tasks running", rt.tasks_service.running_total()),
            ("sessionloop_store_mean_batch_size", "Mean requests per group commit",
             info["requests"] / max(1, info["batches"])),
            ("sessionloop_actors_activations", "Session activations", rt.directory.activations),
            ("sessionloop_actors_passivations", "Session passivations", rt.directory.passivations),
            ("sessionloop_gc_frozen_objects", "Objects kept out of the cyclic GC's full passes (frozen at startup)",
             gc.get_freeze_count()),
        ):
            g = GaugeMetricFamily(name, help_text)
            g.add_metric([], float(value))
            yield g
