"""The picture of one run (``sessionloop bench --plot FILE.png``): a PNG of two stacked axes over
the run's time (s). On top, the throughput of each timeline sample (turns/s) and, on a twin axis,
the turns in flight; below, the p50, p95 and p99 latency of each sample (ms; a log scale when the
largest is more than 50 times the smallest). The phases are shaded in alternating light colours
and named; samples with errors get a red mark at the foot of both axes. The title names the
workload, the target and the date; a footnote gives the whole run's figures and the audit.

matplotlib is an optional extra (``sessionloop[bench]``), imported only here when a plot is
drawn, with its Agg backend on a Figure of its own (no pyplot: no global state, no display);
without it :class:`PlotUnavailable` says how to install it.
"""

from __future__ import annotations

import importlib.util
import math
from typing import TYPE_CHECKING

from sessionloop.cli.loadtest.results import Result, Sample

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INSTALL = "pip install 'sessionloop[bench]'"
LOG_SCALE_RATIO = 50.0  # max/min of the plotted latencies above which the latency axis is logarithmic
PHASE_COLOURS = ("#e8f0fe", "#fef3e0")  # light blue, light orange: alternate phases
PERCENTILES = (("p50_ms", "p50", "#2e7d32"), ("p95_ms", "p95", "#f9a825"), ("p99_ms", "p99", "#c62828"))
WIDTH_IN, HEIGHT_IN, DPI = 11.0, 7.0, 100


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed: the message says how to install the extra."""


def log_scale(values: list[float]) -> bool:
    """Whether latencies spanning ``values`` (ms) are drawn on a log axis: max/min above 50."""
    positive = [v for v in values if v > 0]
    return bool(positive) and max(positive) / min(positive) > LOG_SCALE_RATIO


def title(result: Result) -> str:
    return f"{result.workload} against {result.target.url}, {result.started_at[:16].replace('T', ' ')} UTC"


def footnote(result: Result) -> str:
    o = result.overall
    a = result.audit
    audit = "audit ok" if a.ok else f"audit FAILED: {a.missing} lost, {a.duplicated} duplicated"
    return (f"whole run: {o.counts.turns:,} turns in {result.duration_s:.0f} s, {o.turns_per_s:,.1f} turns/s, "
            f"p50 {o.latency.p50_ms:,.1f} ms, p95 {o.latency.p95_ms:,.1f} ms, p99 {o.latency.p99_ms:,.1f} ms, "
            f"{o.counts.errors:,} errors; {audit} ({a.acknowledged:,} acknowledged sends)")


def _ms(samples: list[Sample], field: str) -> list[float]:
    return [math.nan if getattr(s, field) is None else float(getattr(s, field)) for s in samples]


def _shade_phases(result: Result, axes: list[Axes]) -> None:
    for i, phase in enumerate(result.phases):
        for ax in axes:
            ax.axvspan(phase.start_s, phase.end_s, color=PHASE_COLOURS[i % 2], zorder=0, linewidth=0)
        axes[0].text((phase.start_s + phase.end_s) / 2, 1.01, phase.name, transform=axes[0].get_xaxis_transform(),
                     ha="center", va="bottom", fontsize=9, color="#444444")


def _mark_errors(samples: list[Sample], axes: list[Axes]) -> None:
    times = [s.t_s for s in samples if s.errors > 0]
    if not times:
        return
    total = sum(s.errors for s in samples)
    for i, ax in enumerate(axes):
        ax.scatter(times, [0.02] * len(times), transform=ax.get_xaxis_transform(), marker="|", s=200,
                   color="red", zorder=5, label=f"errors ({total:,})" if i == 0 else None)


def _throughput(ax: Axes, samples: list[Sample]) -> Axes:
    t = [s.t_s for s in samples]
    ax.plot(t, [s.turns_per_s for s in samples], color="#1565c0", linewidth=1.5, label="turns/s")
    ax.set_ylabel("turns/s")
    ax.set_ylim(bottom=0)
    flight = ax.twinx()
    flight.plot(t, [s.in_flight for s in samples], color="#757575", linewidth=1, linestyle="--", label="in flight")
    flight.set_ylabel("in flight")
    flight.set_ylim(bottom=0)
    return flight


def _latency(ax: Axes, samples: list[Sample]) -> None:
    t = [s.t_s for s in samples]
    plotted: list[float] = []
    for field, label, colour in PERCENTILES:
        values = _ms(samples, field)
        plotted += [v for v in values if not math.isnan(v)]
        ax.plot(t, values, color=colour, linewidth=1.2, label=label)
    if log_scale(plotted):
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.set_ylabel("latency (ms)")
    ax.set_xlabel("time (s)")


def figure(result: Result) -> Figure:
    """The Figure of the run (not yet written): :func:`plot` saves it. Raises PlotUnavailable
    without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415 - the optional extra
        from matplotlib.figure import Figure  # noqa: PLC0415 - the optional extra
    except ImportError as e:
        raise PlotUnavailable(f"the plot needs matplotlib, an optional extra: {INSTALL}") from e
    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1, 1]})
    samples = result.timeline
    flight = _throughput(top, samples)
    _latency(bottom, samples)
    _shade_phases(result, [top, bottom])
    _mark_errors(samples, [top, bottom])
    if not samples:
        top.text(0.5, 0.5, "no timeline samples", transform=top.transAxes, ha="center", va="center")
    handles, labels = top.get_legend_handles_labels()
    more, more_labels = flight.get_legend_handles_labels()
    top.legend(handles + more, labels + more_labels, loc="upper right", fontsize=8)
    bottom.legend(loc="upper right", fontsize=8)
    bottom.set_xlim(0, max(result.duration_s, samples[-1].t_s if samples else 0.0, 1e-9))
    fig.suptitle(title(result), fontsize=11)
    fig.text(0.01, 0.01, footnote(result), fontsize=8, color="#333333")
    fig.subplots_adjust(left=0.07, right=0.93, top=0.9, bottom=0.12, hspace=0.08)
    return fig


def check_available() -> None:
    """Raise PlotUnavailable now (before a run) when matplotlib is not installed."""
    if importlib.util.find_spec("matplotlib") is None:
        raise PlotUnavailable(f"the plot needs matplotlib, an optional extra: {INSTALL}")


def plot(result: Result, path: str) -> None:
    """Write the PNG of ``result`` to ``path``. Raises PlotUnavailable without matplotlib, and
    OSError when the file cannot be written."""
    fig = figure(result)
    fig.savefig(path, format="png")


__all__ = ["INSTALL", "LOG_SCALE_RATIO", "PlotUnavailable", "check_available", "figure", "footnote", "log_scale",
           "plot", "title"]
