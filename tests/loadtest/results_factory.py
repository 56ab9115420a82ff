"""Results files for the tests of compare, plot and the schema, made from real HdrHistogram
recordings of the latencies a test passes in (never fixed percentile numbers): each interval of
the timeline, each phase and the whole run get the percentiles a histogram of their turns gives,
as the engine's do.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from hdrh.histogram import HdrHistogram

from sessionloop.cli.loadtest.results import (
    Audit,
    Counts,
    Environment,
    ErrorKind,
    Latency,
    Phase,
    PhaseKind,
    Result,
    Sample,
    Target,
)

LOWEST_US, HIGHEST_US, DIGITS = 1, 60_000_000, 3  # the engine's histogram: 1 us to 60 s, 3 digits

WORKLOAD_TOML = """name = "bots-steady"
[[phases]]
name = "steady"
kind = "steady"
duration_s = 10
users = 10
"""


def histogram(values_ms: list[float]) -> HdrHistogram:
    h = HdrHistogram(LOWEST_US, HIGHEST_US, DIGITS)
    for ms in values_ms:
        h.record_value(max(LOWEST_US, round(ms * 1000)))
    return h


def latency(values_ms: list[float]) -> Latency:
    """The latency block of these turns, read from a real histogram of them."""
    h = histogram(values_ms)
    encoded = h.encode().decode("ascii")
    if not values_ms:
        return Latency(count=0, mean_ms=0.0, p50_ms=0.0, p90_ms=0.0, p95_ms=0.0, p99_ms=0.0, p999_ms=0.0,
                       max_ms=0.0, hdr=encoded)

    def at(p: float) -> float:
        return h.get_value_at_percentile(p) / 1000

    return Latency(count=h.get_total_count(), mean_ms=h.get_mean_value() / 1000, p50_ms=at(50), p90_ms=at(90),
                   p95_ms=at(95), p99_ms=at(99), p999_ms=at(99.9), max_ms=h.get_max_value() / 1000, hdr=encoded)


@dataclass
class PhaseSpec:
    """A phase of a made-up run: per interval, the latencies (ms) of the turns that ended in it."""

    name: str
    kind: PhaseKind
    intervals: list[list[float]]
    errors: list[int] = field(default_factory=list)  # per interval; missing ones are 0
    users: int = 10


def lognormal_intervals(rng: random.Random, n: int, turns: int, median_ms: float, sigma: float = 0.4,
                        spread: int = 0) -> list[list[float]]:
    """``n`` intervals of about ``turns`` turns each (give or take ``spread``), latencies lognormal."""
    mu = math.log(median_ms)
    return [[rng.lognormvariate(mu, sigma) for _ in range(turns + rng.randint(-spread, spread))] for _ in range(n)]


def _counts(turns: int, errors: int) -> Counts:
    return Counts(sent=turns + errors, acknowledged=turns, duplicates_sent=0, deduplicated=0, turns=turns,
                  completed=turns, failed=0, approvals=0, rejected=0, errors=errors)


def _phase(name: str, kind: PhaseKind, start_s: float, end_s: float, values: list[float], errors: int) -> Phase:
    # watched sessions (every other turn here) see their first delta at a quarter of the turn
    return Phase(name=name, kind=kind, start_s=start_s, end_s=end_s, counts=_counts(len(values), errors),
                 turns_per_s=len(values) / max(end_s - start_s, 1e-9), latency=latency(values),
                 first_delta=latency([v / 4 for v in values[::2]]))


def _sample(spec: PhaseSpec, i: int, t_s: float, interval_s: float) -> Sample:
    values = spec.intervals[i]
    errors = spec.errors[i] if i < len(spec.errors) else 0
    h = histogram(values)

    def at(p: float) -> float | None:
        return h.get_value_at_percentile(p) / 1000 if values else None

    rate = len(values) / interval_s
    mean_s = sum(values) / len(values) / 1000 if values else 0.0
    return Sample(t_s=t_s, phase=spec.name, turns=len(values), turns_per_s=rate, errors=errors,
                  in_flight=round(rate * mean_s), users=spec.users, p50_ms=at(50), p95_ms=at(95), p99_ms=at(99))


def make_result(phases: list[PhaseSpec], *, interval_s: float = 1.0, workload: str = "bots-steady",
                workload_toml: str = WORKLOAD_TOML, url: str = "ws://127.0.0.1:8765/session",
                spawned: bool = False, server_version: str | None = "0.1.0", missing: int = 0,
                duplicated: int = 0, started_at: str = "2025-12-03T05:40:00Z") -> Result:
    """A whole results file: phases one after the other, each interval ``interval_s`` long."""
    t = 0.0
    built: list[Phase] = []
    timeline: list[Sample] = []
    everything: list[float] = []
    first_error: float | None = None
    for spec in phases:
        start = t
        for i in range(len(spec.intervals)):
            t += interval_s
            sample = _sample(spec, i, t, interval_s)
            timeline.append(sample)
            if sample.errors and first_error is None:
                first_error = t - interval_s
        values = [v for interval in spec.intervals for v in interval]
        everything += values
        built.append(_phase(spec.name, spec.kind, start, t, values, sum(spec.errors)))
    errors = sum(sum(spec.errors) for spec in phases)
    overall = _phase("all", "steady", 0.0, t, everything, errors)
    kinds = [ErrorKind(kind="turn-timeout", count=errors, first_s=first_error or 0.0,
                       example="no turn.ended within 30 s")] if errors else []
    turns = len(everything)
    audit = Audit(acknowledged=turns, turns_found=turns - missing - duplicated, missing=missing,
                  duplicated=duplicated, duplicates_sent=0, deduplicated=0,
                  examples=[f"session s-{i}: key k-{i} has no turn" for i in range(min(missing, 20))],
                  ok=missing == 0 and duplicated == 0)
    return Result(workload=workload, workload_toml=workload_toml, seed=1,
                  target=Target(url=url, spawned=spawned, server_version=server_version, protocol_version="0.2.2"),
                  environment=Environment(python="3.11.2", platform="Linux-x86_64", cpus=2, sessionloop="0.1.0"),
                  started_at=started_at, duration_s=t, interval_s=interval_s, phases=built, overall=overall,
                  timeline=timeline, errors=kinds, audit=audit)


def steady_run(seed: int = 1, *, median_ms: float = 100.0, turns: int = 50, n: int = 10,
               slow: float = 1.0, **kwargs: object) -> Result:
    """A ramp-up, a steady phase of ``n`` intervals and a ramp-down; ``slow`` multiplies every
    latency and divides the turns per interval (a slowed copy of the same run)."""
    rng = random.Random(seed)
    per = max(1, round(turns / slow))
    specs = [
        PhaseSpec("warm", "ramp-up", lognormal_intervals(rng, 3, per // 2, median_ms * slow)),
        PhaseSpec("steady", "steady", lognormal_intervals(rng, n, per, median_ms * slow, spread=max(1, per // 10))),
        PhaseSpec("cool", "ramp-down", lognormal_intervals(rng, 2, per // 3, median_ms * slow)),
    ]
    return make_result(specs, **kwargs)  # type: ignore[arg-type]
