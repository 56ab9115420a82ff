"""``sessionloop bench compare A.json B.json``: two runs side by side, each figure of
:data:`~sessionloop.cli.loadtest.results.METRICS` with its ratio B/A and a verdict, over the whole
run and per phase (phases matched by name), and the regressions named.

Theory of operation. For each metric, the change from A to B is in the better or the worse
direction (``METRICS`` says whether more is better). It is *significant* when it is beyond the
relative ``threshold`` (``|B - A| > threshold * |A|``; any change from 0 is beyond it) **and**
beyond the noise band of the two runs. The verdict:

- ``regression``: significant, in the worse direction;
- ``better``: significant, in the better direction;
- ``worse``: in the worse direction beyond the threshold but inside the noise band (the runs' own
  spread can explain it: shown, not a regression);
- ``same``: anything else (within the threshold, or better only within the noise).

The noise rule. A run's timeline has one sample per interval; the noise of a figure comes from
how the per-interval values of that figure spread:

- ``turns_per_s``: the band is twice the standard error of the difference of the two runs' mean
  per-interval turns/s, ``2 * sqrt(sa**2 / na + sb**2 / nb)``, with ``sa``, ``sb`` the sample
  standard deviations and ``na``, ``nb`` the numbers of samples;
- ``p50_ms``, ``p95_ms``, ``p99_ms``: the same formula over the per-interval p50, p95 or p99
  (the intervals where no turn ended have none and are left out);
- the samples are those of the steady phases for the whole run's rows, and those of the phase
  itself for a phase's rows; with fewer than 3 samples on either side there is no band and the
  threshold alone decides;
- the other latency figures have no per-interval series; their band comes from the run's HDR
  histogram (the figure's latency block, ``hdr``) the same way, as the root of the sum of the
  squares of the two runs' 95% half-widths (``2 * SE`` above is exactly that for a mean):
  ``mean_ms`` with ``2 * stddev / sqrt(n)`` of the turns; a quantile ``q`` (``p90_ms``,
  ``p999_ms``, ``first_delta_p50_ms``, ``first_delta_p99_ms``) with the distribution-free
  interval of an order statistic, half the distance between the values at the ranks
  ``n*q -+ 2*sqrt(n*q*(1-q))``; ``max_ms`` as the quantile ``(n-1)/n`` (so about the distance from
  the fourth-largest turn); with fewer than 3 turns on either side, no band;
- ``turns`` has no band: the threshold alone decides;
- the counts of what went wrong (``errors``, ``error_rate``, ``lost``, ``duplicated``): any
  increase from 0 is a regression, whatever the threshold; from a non-zero A, the threshold
  alone decides.

The comparison warns (a line in the table) when the two runs' workloads differ (their
``workload_toml``) or their targets do (the URL, unless both servers were spawned for the run and
so listen on a fresh port each time; whether spawned; the server's version): such a comparison
measures more than one change.
"""

from __future__ import annotations

import math
import statistics
from typing import Literal

import msgspec
from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped, unused-ignore]

from sessionloop.cli.loadtest.results import METRICS, Latency, Phase, Result, Sample, metrics

Verdict = Literal["better", "worse", "same", "regression"]

#: the figures whose increase from 0 is a regression whatever the threshold
FAILURE_COUNTS = frozenset({"errors", "error_rate", "lost", "duplicated"})
#: the figures with a per-interval series in the timeline (their noise band comes from it)
SERIES: dict[str, str] = {"turns_per_s": "turns_per_s", "p50_ms": "p50_ms", "p95_ms": "p95_ms", "p99_ms": "p99_ms"}
#: the latency figures whose band comes from a histogram: (which block, the quantile; None: the mean)
HISTOGRAM_FIGURES: dict[str, tuple[str, float | None]] = {
    "mean_ms": ("latency", None), "p90_ms": ("latency", 0.90), "p999_ms": ("latency", 0.999),
    "max_ms": ("latency", 1.0), "first_delta_p50_ms": ("first_delta", 0.50),
    "first_delta_p99_ms": ("first_delta", 0.99),
}
#: the figures the audit gives for the whole run only (a phase has none)
RUN_ONLY = frozenset({"lost", "duplicated"})
MIN_SAMPLES = 3
MAX_THRESHOLD = 10.0


class Row(msgspec.Struct, frozen=True, kw_only=True):
    """One figure of A and B."""

    metric: str
    a: float
    b: float
    ratio: float | None  # b / a; None when a is 0 and b is not (1.0 when both are 0)
    noise: float | None  # the half-width of the noise band, in the metric's unit; None: no band
    verdict: Verdict


class PhaseRows(msgspec.Struct, frozen=True, kw_only=True):
    name: str  # "all": the whole run
    rows: list[Row]


class Comparison(msgspec.Struct, frozen=True, kw_only=True):
    threshold: float
    a_run: str  # a line naming run A (workload, target, start)
    b_run: str
    overall: PhaseRows
    phases: list[PhaseRows]  # the phases of A that B has too, in A's order
    warnings: list[str]


def phase_metrics(phase: Phase) -> dict[str, float]:
    """The figures of :data:`METRICS` one phase has (all but the audit's ``lost`` and ``duplicated``),
    computed as :func:`~sessionloop.cli.loadtest.results.metrics` computes them for the whole run."""
    sent = max(phase.counts.sent, 1)
    return {
        "turns_per_s": phase.turns_per_s, "turns": float(phase.counts.turns), "mean_ms": phase.latency.mean_ms,
        "p50_ms": phase.latency.p50_ms, "p90_ms": phase.latency.p90_ms, "p95_ms": phase.latency.p95_ms,
        "p99_ms": phase.latency.p99_ms, "p999_ms": phase.latency.p999_ms, "max_ms": phase.latency.max_ms,
        "first_delta_p50_ms": phase.first_delta.p50_ms, "first_delta_p99_ms": phase.first_delta.p99_ms,
        "errors": float(phase.counts.errors), "error_rate": phase.counts.errors / sent,
    }


def noise_band(a: list[float], b: list[float]) -> float | None:
    """``2 * sqrt(sa**2/na + sb**2/nb)`` of two series of per-interval values; None with fewer
    than :data:`MIN_SAMPLES` values on either side."""
    if len(a) < MIN_SAMPLES or len(b) < MIN_SAMPLES:
        return None
    return 2 * math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))


def histogram_half_width(block: Latency, q: float | None) -> float | None:
    """The 95% half-width (ms) of a figure of one latency block, from its histogram: the mean's
    (``q`` None) ``2 * stddev / sqrt(n)``; a quantile's from the ranks ``n*q -+ 2*sqrt(n*q*(1-q))``
    (``q`` 1.0, the max, taken as ``(n-1)/n``); None with fewer than :data:`MIN_SAMPLES` turns."""
    if block.count < MIN_SAMPLES:
        return None
    h = HdrHistogram.decode(block.hdr)
    n = h.get_total_count()
    if n < MIN_SAMPLES:
        return None
    if q is None:
        return float(2 * h.get_stddev() / math.sqrt(n) / 1000)
    q = min(q, (n - 1) / n)
    spread = 2 * math.sqrt(n * q * (1 - q))
    lo, hi = max(1, math.floor(n * q - spread)), min(n, math.ceil(n * q + spread))
    return float(h.get_value_at_percentile(100 * hi / n) - h.get_value_at_percentile(100 * lo / n)) / 2 / 1000


def _histogram_band(metric: str, pa: Phase, pb: Phase) -> float | None:
    block, q = HISTOGRAM_FIGURES[metric]
    wa = histogram_half_width(getattr(pa, block), q)
    wb = histogram_half_width(getattr(pb, block), q)
    return None if wa is None or wb is None else math.hypot(wa, wb)


def _series(samples: list[Sample], metric: str) -> list[float]:
    values = (getattr(s, SERIES[metric]) for s in samples)
    return [float(v) for v in values if v is not None]


def _steady_samples(result: Result) -> list[Sample]:
    steady = {p.name for p in result.phases if p.kind == "steady"}
    return [s for s in result.timeline if s.phase in steady]


def _verdict(metric: str, a: float, b: float, threshold: float, noise: float | None) -> Verdict:
    if a == b:
        return "same"
    worse = (b < a) if METRICS[metric] else (b > a)
    if metric in FAILURE_COUNTS and a == 0:
        return "regression" if worse else "better"
    beyond_threshold = a == 0 or abs(b - a) > threshold * abs(a)
    if not beyond_threshold:
        return "same"
    if noise is not None and abs(b - a) <= noise:
        return "worse" if worse else "same"
    return "regression" if worse else "better"


def _band(metric: str, pa: Phase, pb: Phase, sa: list[Sample], sb: list[Sample]) -> float | None:
    if metric in SERIES:
        return noise_band(_series(sa, metric), _series(sb, metric))
    if metric in HISTOGRAM_FIGURES:
        return _histogram_band(metric, pa, pb)
    return None


def _rows(fa: dict[str, float], fb: dict[str, float], pa: Phase, pb: Phase, sa: list[Sample], sb: list[Sample],
          threshold: float) -> list[Row]:
    rows = []
    for metric in METRICS:
        if metric not in fa:
            continue
        a, b = fa[metric], fb[metric]
        noise = _band(metric, pa, pb, sa, sb)
        ratio = 1.0 if a == b else (b / a if a else None)
        rows.append(Row(metric=metric, a=a, b=b, ratio=ratio, noise=noise,
                        verdict=_verdict(metric, a, b, threshold, noise)))
    return rows


def _describe(result: Result) -> str:
    return f"{result.workload} against {result.target.url}, started {result.started_at} ({result.duration_s:.0f} s)"


def _warnings(a: Result, b: Result) -> list[str]:
    out = []
    if a.workload_toml != b.workload_toml:
        out.append(f"the workloads differ (workload_toml of {a.workload!r} and {b.workload!r}): "
                   "the comparison measures the workload change too")
    if a.overrides != b.overrides:
        out.append(f"the workloads were changed differently (--set): A {' '.join(a.overrides) or 'none'}, "
                   f"B {' '.join(b.overrides) or 'none'}: the comparison measures the change too")
    ta, tb = a.target, b.target
    if (ta.url != tb.url and not (ta.spawned and tb.spawned)) or ta.spawned != tb.spawned \
            or ta.server_version != tb.server_version:
        out.append(f"the targets differ: A {ta.url} (server {ta.server_version}, spawned {ta.spawned}), "
                   f"B {tb.url} (server {tb.server_version}, spawned {tb.spawned})")
    names_a, names_b = [p.name for p in a.phases], [p.name for p in b.phases]
    out += [f"phase {n!r} is only in A" for n in names_a if n not in names_b]
    out += [f"phase {n!r} is only in B" for n in names_b if n not in names_a]
    return out


def compare(a: Result, b: Result, threshold: float = 0.10) -> Comparison:
    """A against B, whole run and phase by phase. Raises ValueError when ``threshold`` is not a
    number between 0 and :data:`MAX_THRESHOLD` (a relative change: 0.10 is 10%)."""
    if not (0 <= threshold <= MAX_THRESHOLD):  # also refuses nan
        raise ValueError(f"threshold {threshold!r} is not between 0 and {MAX_THRESHOLD:g} (0.10 is 10%)")
    overall = PhaseRows(name="all", rows=_rows(metrics(a), metrics(b), a.overall, b.overall, _steady_samples(a),
                                               _steady_samples(b), threshold))
    phases_b = {p.name: p for p in b.phases}
    phases = []
    for pa in a.phases:
        pb = phases_b.get(pa.name)
        if pb is None:
            continue
        sa = [s for s in a.timeline if s.phase == pa.name]
        sb = [s for s in b.timeline if s.phase == pb.name]
        phases.append(PhaseRows(name=pa.name, rows=_rows(phase_metrics(pa), phase_metrics(pb), pa, pb, sa, sb,
                                                                  threshold)))
    return Comparison(threshold=threshold, a_run=_describe(a), b_run=_describe(b), overall=overall, phases=phases,
                      warnings=_warnings(a, b))


def regressions(c: Comparison) -> list[str]:
    """Each regression as one line: ``p99_ms (all): 120 -> 180 (1.50x)``; empty: none."""
    out = []
    for group in (c.overall, *c.phases):
        for row in group.rows:
            if row.verdict == "regression":
                out.append(f"{row.metric} ({group.name}): {_value(row.metric, row.a)} -> {_value(row.metric, row.b)}"
                           f" ({_ratio(row.ratio)})")
    return out


def _value(metric: str, v: float) -> str:
    if metric == "error_rate":
        return f"{v:.2%}"
    if metric in ("turns", "errors", "lost", "duplicated"):
        return f"{v:,.0f}"
    return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.1f}"


def _ratio(ratio: float | None) -> str:
    return "new" if ratio is None else f"{ratio:.2f}x"


def _table(group: PhaseRows, title: str) -> list[str]:
    head = f"{'metric':<20} {'A':>12} {'B':>12} {'B/A':>7} {'noise':>10}  verdict"
    lines = [title, head, "-" * len(head)]
    for r in group.rows:
        noise = "-" if r.noise is None else "±" + _value(r.metric, r.noise)
        mark = "  <<" if r.verdict == "regression" else ""
        lines.append(f"{r.metric:<20} {_value(r.metric, r.a):>12} {_value(r.metric, r.b):>12} {_ratio(r.ratio):>7} "
                     f"{noise:>10}  {r.verdict}{mark}")
    return lines


def format_comparison(c: Comparison) -> str:
    """The side-by-side table: the two runs, the warnings, the whole run, each phase, the verdict."""
    lines = [f"A: {c.a_run}", f"B: {c.b_run}"]
    lines += [f"warning: {w}" for w in c.warnings]
    lines.append(f"threshold {c.threshold * 100:g}%; a regression is worse beyond the threshold and the noise band")
    lines += ["", *_table(c.overall, "whole run")]
    for group in c.phases:
        lines += ["", *_table(group, f"phase {group.name}")]
    found = regressions(c)
    lines += ["", f"{len(found)} regression(s)" + (":" if found else "")]
    lines += [f"  {line}" for line in found]
    return "\n".join(lines) + "\n"


__all__ = ["FAILURE_COUNTS", "HISTOGRAM_FIGURES", "MIN_SAMPLES", "SERIES", "Comparison", "PhaseRows", "Row",
           "Verdict", "compare", "format_comparison", "histogram_half_width", "noise_band", "phase_metrics",
           "regressions"]
