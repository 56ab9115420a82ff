"""What a workload run records as it goes: per phase and over the whole run the counts and HDR
histograms of turn latency and first-delta latency, per interval the timeline, and the errors by
kind; :meth:`Recorder.phases`, :meth:`Recorder.overall` and :meth:`Recorder.timeline` turn them into
the Structs of :mod:`sessionloop.cli.loadtest.results`.

Latencies are recorded in microseconds into histograms of 1 µs to 1 hour at 3 significant digits
(HdrHistogram), so a percentile is within 0.1% of the value measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from hdrh.histogram import HdrHistogram

from sessionloop.cli.loadtest.results import Counts, ErrorKind, Latency, Phase, PhaseKind, Sample

LOWEST_US, HIGHEST_US, DIGITS = 1, 3_600_000_000, 3
MAX_ERROR_KINDS = 100


def histogram() -> HdrHistogram:
    return HdrHistogram(LOWEST_US, HIGHEST_US, DIGITS)


def record(h: HdrHistogram, seconds: float) -> None:
    h.record_value(min(HIGHEST_US, max(LOWEST_US, round(seconds * 1e6))))


def latency_of(h: HdrHistogram) -> Latency:
    n = h.get_total_count()
    if n == 0:
        return Latency(count=0, mean_ms=0.0, p50_ms=0.0, p90_ms=0.0, p95_ms=0.0, p99_ms=0.0, p999_ms=0.0,
                       max_ms=0.0, hdr="")

    def at(p: float) -> float:
        return float(h.get_value_at_percentile(p)) / 1000

    return Latency(count=n, mean_ms=h.get_mean_value() / 1000, p50_ms=at(50), p90_ms=at(90), p95_ms=at(95),
                   p99_ms=at(99), p999_ms=at(99.9), max_ms=h.get_max_value() / 1000, hdr=h.encode().decode())


@dataclass
class Tally:
    """The counts of :class:`~sessionloop.cli.loadtest.results.Counts`, mutable."""

    sent: int = 0
    acknowledged: int = 0
    duplicates_sent: int = 0
    deduplicated: int = 0
    turns: int = 0
    completed: int = 0
    failed: int = 0
    approvals: int = 0
    rejected: int = 0
    errors: int = 0

    def counts(self) -> Counts:
        return Counts(**{f.name: getattr(self, f.name) for f in fields(self)})


@dataclass
class PhaseRecord:
    name: str
    kind: PhaseKind
    start_s: float
    end_s: float
    tally: Tally = field(default_factory=Tally)
    latency: HdrHistogram = field(default_factory=histogram)
    first_delta: HdrHistogram = field(default_factory=histogram)

    def struct(self, end_s: float | None = None) -> Phase:
        end = self.end_s if end_s is None else end_s
        length = max(end - self.start_s, 1e-9)
        return Phase(name=self.name, kind=self.kind, start_s=self.start_s, end_s=end, counts=self.tally.counts(),
                     turns_per_s=self.tally.turns / length, latency=latency_of(self.latency),
                     first_delta=latency_of(self.first_delta))


@dataclass
class Interval:
    turns: int = 0
    errors: int = 0
    latency: HdrHistogram = field(default_factory=histogram)


class Recorder:
    """Everything counted, by the phase a moment falls in (a turn by the moment it ended, a send by
    the moment it was made); after the last phase, the drain counts in the last one."""

    def __init__(self, phases: list[tuple[str, PhaseKind, float]], interval_s: float) -> None:
        self.records: list[PhaseRecord] = []
        start = 0.0
        for name, kind, seconds in phases:
            self.records.append(PhaseRecord(name, kind, start, start + seconds))
            start += seconds
        self.all = PhaseRecord("all", "steady", 0.0, start)
        self.interval_s = interval_s
        self.interval = Interval()
        self.samples: list[Sample] = []
        self.errors: dict[str, ErrorKind] = {}
        self.in_flight = 0

    def phase_at(self, t: float) -> PhaseRecord:
        for p in self.records:
            if t < p.end_s:
                return p
        return self.records[-1]

    def count(self, t: float, name: str, n: int = 1) -> None:
        for tally in (self.phase_at(t).tally, self.all.tally):
            setattr(tally, name, getattr(tally, name) + n)

    def turn_ended(self, t: float, seconds: float, failed: bool) -> None:
        self.count(t, "failed" if failed else "completed")
        self.count(t, "turns")
        for h in (self.phase_at(t).latency, self.all.latency, self.interval.latency):
            record(h, seconds)
        self.interval.turns += 1

    def first_delta(self, t: float, seconds: float) -> None:
        for h in (self.phase_at(t).first_delta, self.all.first_delta):
            record(h, seconds)

    def error(self, t: float, kind: str, message: str, n: int = 1) -> None:
        self.count(t, "errors", n)
        self.interval.errors += n
        known = self.errors.get(kind)
        if known is not None:
            known.count += n
        elif len(self.errors) < MAX_ERROR_KINDS:
            self.errors[kind] = ErrorKind(kind=kind, count=n, first_s=round(t, 3), example=message[:300])

    def sample(self, t: float, users: float) -> Sample:
        """End the current interval at ``t`` (its timeline sample, kept and returned)."""
        iv, self.interval = self.interval, Interval()
        length = self.interval_s if not self.samples else t - self.samples[-1].t_s
        has = iv.latency.get_total_count() > 0

        def at(p: float) -> float | None:
            return float(iv.latency.get_value_at_percentile(p)) / 1000 if has else None

        s = Sample(t_s=round(t, 3), phase=self.phase_at(max(0.0, t - 1e-9)).name, turns=iv.turns,
                   turns_per_s=iv.turns / max(length, 1e-9), errors=iv.errors, in_flight=self.in_flight,
                   users=round(users), p50_ms=at(50), p95_ms=at(95), p99_ms=at(99))
        self.samples.append(s)
        return s

    def phases(self) -> list[Phase]:
        return [p.struct() for p in self.records]

    def overall(self, end_s: float) -> Phase:
        return self.all.struct(end_s)


__all__ = ["Interval", "PhaseRecord", "Recorder", "Tally", "histogram", "latency_of", "record"]
