"""``bench compare``: a slowed copy of a run is flagged, a rerun is not, the noise band is the
documented one, and the table shows every figure with its ratio and verdict, whole run and per phase."""

from __future__ import annotations

import math
import random
import statistics

import msgspec
import pytest

from sessionloop.cli.loadtest.compare import (
    compare,
    format_comparison,
    histogram_half_width,
    noise_band,
    phase_metrics,
    regressions,
)
from sessionloop.cli.loadtest.results import METRICS, metrics
from tests.loadtest.results_factory import PhaseSpec, latency, lognormal_intervals, make_result, steady_run


def _row(c, metric, phase="all"):
    group = c.overall if phase == "all" else next(g for g in c.phases if g.name == phase)
    return next(r for r in group.rows if r.metric == metric)


def _intervals(counts: list[int], ms: float = 100.0) -> list[list[float]]:
    """Intervals of ``counts`` turns, each turn ``ms`` give or take a little (a real spread)."""
    rng = random.Random(sum(counts))
    return [[ms * rng.uniform(0.95, 1.05) for _ in range(n)] for n in counts]


def test_a_slowed_copy_of_a_run_is_flagged_in_throughput_and_latency() -> None:
    a, slowed = steady_run(1), steady_run(2, slow=1.5)
    c = compare(a, slowed)
    found = regressions(c)
    for metric in ("turns_per_s", "p50_ms", "p95_ms", "p99_ms", "mean_ms"):
        assert _row(c, metric).verdict == "regression"
        assert any(line.startswith(f"{metric} (all): ") for line in found)
        assert any(line.startswith(f"{metric} (steady): ") for line in found)
    row = _row(c, "turns_per_s")
    assert row.ratio == pytest.approx(row.b / row.a) and row.ratio < 0.8
    assert f"turns_per_s (all): {row.a:,.2f} -> {row.b:,.2f} ({row.ratio:.2f}x)" in found


def test_a_rerun_of_the_same_workload_shows_no_regression_over_the_whole_run() -> None:
    a, rerun = steady_run(1, turns=200, n=20), steady_run(2, turns=200, n=20)
    c = compare(a, rerun)
    assert [r.metric for r in c.overall.rows if r.verdict == "regression"] == []
    assert {r.verdict for r in c.overall.rows} <= {"same", "better", "worse"}
    assert c.warnings == []


def test_the_noise_band_is_twice_the_standard_error_of_the_difference_of_the_means() -> None:
    assert noise_band([1, 2, 3], [2, 4, 6]) == pytest.approx(2 * math.sqrt(1 / 3 + 4 / 3))
    assert noise_band([1, 2], [1, 2, 3]) is None and noise_band([1, 2, 3], []) is None
    a, b = steady_run(1), steady_run(2)
    rates = [[s.turns_per_s for s in r.timeline if s.phase == "steady"] for r in (a, b)]
    p99s = [[s.p99_ms for s in r.timeline if s.phase == "steady"] for r in (a, b)]
    expected = [2 * math.sqrt(statistics.variance(x) / len(x) + statistics.variance(y) / len(y))
                for x, y in (rates, p99s)]
    c = compare(a, b)
    assert _row(c, "turns_per_s").noise == pytest.approx(expected[0])
    assert _row(c, "p99_ms").noise == pytest.approx(expected[1])
    assert _row(c, "turns").noise is None and _row(c, "errors").noise is None


def test_a_change_beyond_the_threshold_but_inside_the_noise_is_worse_not_a_regression() -> None:
    a = make_result([PhaseSpec("steady", "steady", _intervals([10, 90, 10, 90, 10, 90]))])
    b = make_result([PhaseSpec("steady", "steady", _intervals([5, 80, 5, 80, 5, 80]))])
    row = _row(compare(a, b), "turns_per_s")
    assert row.b / row.a == pytest.approx(42.5 / 50)
    assert abs(row.b - row.a) < row.noise
    assert row.verdict == "worse"
    quiet_a = make_result([PhaseSpec("steady", "steady", _intervals([48, 52, 50, 48, 52, 50]))])
    quiet_b = make_result([PhaseSpec("steady", "steady", _intervals([40, 45, 40, 45, 40, 45]))])
    assert _row(compare(quiet_a, quiet_b), "turns_per_s").verdict == "regression"  # the same change, quiet runs


def test_with_fewer_than_three_samples_the_threshold_alone_decides() -> None:
    a = make_result([PhaseSpec("steady", "steady", _intervals([100, 100]))])
    close = make_result([PhaseSpec("steady", "steady", _intervals([95, 95]))])
    far = make_result([PhaseSpec("steady", "steady", _intervals([80, 80]))])
    assert _row(compare(a, close), "turns_per_s").noise is None
    assert _row(compare(a, close), "turns_per_s").verdict == "same"
    assert _row(compare(a, far), "turns_per_s").verdict == "regression"
    assert _row(compare(a, far, threshold=0.25), "turns_per_s").verdict == "same"
    assert _row(compare(far, a), "turns_per_s").verdict == "better"


def test_any_error_or_lost_turn_where_there_was_none_is_a_regression_whatever_the_threshold() -> None:
    intervals = _intervals([100, 100, 100, 100])
    a = make_result([PhaseSpec("steady", "steady", intervals)])
    b = make_result([PhaseSpec("steady", "steady", intervals, errors=[0, 1, 0, 0])], missing=1)
    c = compare(a, b, threshold=10)
    for metric in ("errors", "error_rate", "lost"):
        assert _row(c, metric).verdict == "regression" and _row(c, metric).ratio is None
    assert _row(c, "duplicated").verdict == "same" and _row(c, "duplicated").ratio == 1.0
    assert _row(c, "errors", phase="steady").verdict == "regression"
    assert "errors (all): 0 -> 1 (new)" in regressions(c)
    some = make_result([PhaseSpec("steady", "steady", intervals, errors=[20, 20, 30, 30])])
    a_few_more = make_result([PhaseSpec("steady", "steady", intervals, errors=[20, 25, 30, 30])])
    fewer = make_result([PhaseSpec("steady", "steady", intervals, errors=[10, 10, 10, 10])])
    assert _row(compare(some, a_few_more), "errors").verdict == "same"  # 105 / 100: within 10%
    assert _row(compare(some, fewer), "errors").verdict == "better"


def test_the_histogram_band_of_a_quantile_and_of_the_mean_comes_from_the_recorded_turns() -> None:
    block = latency([float(v) for v in range(1, 1001)])  # 1..1000 ms, one turn each
    # the median of 1000: ranks 500 -+ 2*sqrt(250), about 469 and 532 -> half of 63 ms
    assert histogram_half_width(block, 0.5) == pytest.approx(31.5, abs=1.0)
    # the mean: 2 * stddev / sqrt(n), stddev of 1..1000 is about 288.7
    assert histogram_half_width(block, None) == pytest.approx(2 * 288.7 / math.sqrt(1000), rel=0.01)
    assert histogram_half_width(latency([5.0, 6.0]), 0.5) is None
    c = compare(steady_run(1), steady_run(2))
    assert _row(c, "p999_ms").noise is not None and _row(c, "first_delta_p99_ms").noise is not None


def test_phases_are_matched_by_name_and_those_only_in_one_run_are_named() -> None:
    a = steady_run(1)
    b = msgspec.structs.replace(steady_run(2), phases=[
        p if p.name != "cool" else msgspec.structs.replace(p, name="drain") for p in steady_run(2).phases])
    c = compare(a, b)
    assert [g.name for g in c.phases] == ["warm", "steady"]
    assert "phase 'cool' is only in A" in c.warnings and "phase 'drain' is only in B" in c.warnings
    assert {r.metric for r in c.phases[0].rows} == set(METRICS) - {"lost", "duplicated"}


def test_different_workloads_or_targets_are_warned_about_in_the_table() -> None:
    a = steady_run(1)
    other_workload = steady_run(2, workload="burst", workload_toml='name = "burst"\n')
    other_target = steady_run(2, url="ws://10.0.0.5:8765/session")
    text = format_comparison(compare(a, other_workload))
    assert "warning: the workloads differ (workload_toml of 'bots-steady' and 'burst')" in text
    assert "warning: the targets differ: A ws://127.0.0.1:8765/session" in format_comparison(compare(a, other_target))
    spawned = [steady_run(seed, spawned=True, url=f"ws://127.0.0.1:{port}/session")
               for seed, port in ((1, 40001), (2, 40002))]
    assert compare(*spawned).warnings == []  # a spawned server listens on a fresh port each run
    newer = steady_run(2, spawned=True, url="ws://127.0.0.1:40002/session", server_version="0.2.0")
    assert any(w.startswith("the targets differ") for w in compare(spawned[0], newer).warnings)


def test_the_table_has_every_metric_with_both_values_the_ratio_and_the_verdict_whole_run_and_per_phase() -> None:
    c = compare(steady_run(1), steady_run(2, slow=1.5))
    text = format_comparison(c)
    sections = text.split("\n\n")
    whole = next(s for s in sections if s.startswith("whole run"))
    lines = whole.splitlines()
    assert lines[1].split() == ["metric", "A", "B", "B/A", "noise", "verdict"]
    assert [line.split()[0] for line in lines[3:]] == list(METRICS)
    row = _row(c, "p50_ms")
    p50 = next(line for line in lines if line.startswith("p50_ms "))
    assert p50.split() == ["p50_ms", f"{row.a:,.1f}", f"{row.b:,.1f}", f"{row.ratio:.2f}x", f"±{row.noise:,.2f}",
                           "regression", "<<"]
    assert [s.splitlines()[0] for s in sections if s.startswith("phase ")] == ["phase warm", "phase steady",
                                                                               "phase cool"]
    assert text.startswith("A: bots-steady against ws://127.0.0.1:8765/session, started 2025-12-03T05:40:00Z")
    assert f"{len(regressions(c))} regression(s):" in text


def test_the_whole_run_figures_are_those_fail_if_sees() -> None:
    result = steady_run(1, missing=2)
    figures = phase_metrics(result.overall)
    assert {**figures, "lost": 2.0, "duplicated": 0.0} == metrics(result)
    assert {r.metric: r.a for r in compare(result, steady_run(2)).overall.rows} == metrics(result)


@pytest.mark.parametrize("threshold", [-0.1, float("nan"), 11.0])
def test_a_threshold_out_of_bounds_is_refused_with_its_value(threshold: float) -> None:
    run = steady_run(1)
    with pytest.raises(ValueError, match=r"threshold .* is not between 0 and 10"):
        compare(run, run, threshold=threshold)


def test_a_run_compared_with_itself_is_the_same_everywhere() -> None:
    run = steady_run(3)
    c = compare(run, run)
    assert {r.verdict for g in (c.overall, *c.phases) for r in g.rows} == {"same"}
    assert regressions(c) == [] and format_comparison(c).endswith("0 regression(s)\n")


def test_lognormal_intervals_make_the_turns_asked_for() -> None:
    intervals = lognormal_intervals(random.Random(1), 4, 30, 100.0, spread=3)
    assert len(intervals) == 4 and all(27 <= len(i) <= 33 for i in intervals)
