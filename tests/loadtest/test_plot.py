"""The plot of a run: a real PNG of the size drawn, with throughput and in-flight on top, the
percentiles below (logarithmic when they span a wide range), the phases shaded and named, errors
marked, and a clear error naming the extra when matplotlib is missing."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys

import matplotlib.colors
from PIL import Image

from sessionloop.cli.loadtest.plot import DPI, HEIGHT_IN, INSTALL, WIDTH_IN, figure, log_scale, plot
from tests.conftest import REPO
from tests.loadtest.results_factory import PhaseSpec, lognormal_intervals, make_result

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(errors: list[int] | None = None, fast_ms: float = 80.0, missing: int = 0):
    rng = random.Random(7)
    return make_result([
        PhaseSpec("warm", "ramp-up", [lognormal_intervals(rng, 1, k * 10, fast_ms)[0] for k in range(1, 5)]),
        PhaseSpec("steady", "steady", lognormal_intervals(rng, 12, 60, 100.0, spread=8), errors=errors or []),
        PhaseSpec("cool", "ramp-down", [lognormal_intervals(rng, 1, k * 10, fast_ms)[0] for k in range(4, 0, -1)]),
    ], missing=missing)


def _png_size(path: str) -> tuple[int, int]:
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_MAGIC and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_the_plot_is_a_png_of_the_size_drawn_and_not_tiny(tmp_path) -> None:
    path = str(tmp_path / "run.png")
    plot(_run(errors=[0, 0, 3, 0, 1]), path)
    width, height = _png_size(path)
    assert (width, height) == (round(WIDTH_IN * DPI), round(HEIGHT_IN * DPI))
    assert os.path.getsize(path) > 30_000  # curves, shading and text, not an empty canvas
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (width, height)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colours is not None and len(colours) > 50  # anti-aliased lines of several colours


def test_throughput_and_in_flight_share_the_time_axis_with_the_percentiles() -> None:
    result = _run()
    fig = figure(result)
    top, bottom, flight = fig.axes
    assert top.get_shared_x_axes().joined(top, bottom)
    assert [line.get_label() for line in top.get_lines()] == ["turns/s"]
    assert [line.get_label() for line in flight.get_lines()] == ["in flight"]
    assert [line.get_label() for line in bottom.get_lines()] == ["p50", "p95", "p99"]
    rate = top.get_lines()[0]
    assert list(rate.get_xdata()) == [s.t_s for s in result.timeline]
    assert list(rate.get_ydata()) == [s.turns_per_s for s in result.timeline]
    assert list(bottom.get_lines()[2].get_ydata()) == [s.p99_ms for s in result.timeline]
    assert bottom.get_xlabel() == "time (s)" and top.get_ylabel() == "turns/s"


def test_the_latency_axis_is_logarithmic_only_when_the_percentiles_span_more_than_fifty_times() -> None:
    assert not log_scale([2.0, 100.0]) and log_scale([1.0, 51.0]) and not log_scale([])
    assert figure(_run()).axes[1].get_yscale() == "linear"
    assert figure(_run(fast_ms=0.5)).axes[1].get_yscale() == "log"  # 0.5 ms ramps beside a 100 ms steady phase


def test_the_phases_are_shaded_in_alternating_colours_and_named() -> None:
    result = _run()
    top, bottom, _ = figure(result).axes
    for ax in (top, bottom):
        spans = ax.patches
        assert [round(p.get_x(), 6) for p in spans] == [p.start_s for p in result.phases]
        assert [round(p.get_x() + p.get_width(), 6) for p in spans] == [p.end_s for p in result.phases]
        colours = [matplotlib.colors.to_hex(p.get_facecolor()) for p in spans]
        assert colours[0] == colours[2] != colours[1]
    assert [t.get_text() for t in top.texts] == ["warm", "steady", "cool"]


def test_errors_are_red_marks_at_the_samples_that_had_errors() -> None:
    result = _run(errors=[0, 0, 3, 0, 1])
    top, bottom, _ = figure(result).axes
    erring = [s.t_s for s in result.timeline if s.errors > 0]
    assert len(erring) == 2
    for ax in (top, bottom):
        (marks,) = ax.collections
        assert [x for x, _ in marks.get_offsets()] == erring
        assert matplotlib.colors.to_hex(marks.get_edgecolor()[0]) == "#ff0000"
    assert "errors (4)" in [t.get_text() for t in top.get_legend().get_texts()]
    assert len(figure(_run()).axes[0].collections) == 0


def test_the_title_names_the_workload_target_and_date_and_the_footnote_the_figures_and_audit() -> None:
    result = _run(missing=2)
    fig = figure(result)
    assert fig.get_suptitle() == "bots-steady against ws://127.0.0.1:8765/session, 2025-12-03 05:40 UTC"
    (text,) = [t.get_text() for t in fig.texts if t.get_text().startswith("whole run")]
    o = result.overall
    assert text.startswith(f"whole run: {o.counts.turns:,} turns in {result.duration_s:.0f} s, "
                           f"{o.turns_per_s:,.1f} turns/s, p50 {o.latency.p50_ms:,.1f} ms")
    assert "audit FAILED: 2 lost, 0 duplicated" in text
    assert any("; audit ok (" in t.get_text() for t in figure(_run()).texts)


def test_a_run_without_samples_still_plots(tmp_path) -> None:
    empty = make_result([])
    path = str(tmp_path / "empty.png")
    plot(empty, path)
    assert _png_size(path)[0] > 0
    assert "no timeline samples" in [t.get_text() for t in figure(empty).axes[0].texts]


def test_without_matplotlib_the_error_says_how_to_install_the_extra(tmp_path) -> None:
    # a Python where matplotlib cannot be imported (None in sys.modules makes its import fail)
    code = ("import sys\n"
            "sys.modules['matplotlib'] = None\n"
            "from sessionloop.cli.loadtest.plot import PlotUnavailable, plot\n"
            "from tests.loadtest.results_factory import steady_run\n"
            "try:\n"
            f"    plot(steady_run(1), {str(tmp_path / 'x.png')!r})\n"
            "except PlotUnavailable as e:\n"
            "    print('unavailable:', e)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"unavailable: the plot needs matplotlib, an optional extra: {INSTALL}"
    assert INSTALL == "pip install 'sessionloop[bench]'"
    assert not (tmp_path / "x.png").exists()
