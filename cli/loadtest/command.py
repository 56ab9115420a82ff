"""``sessionloop bench --workload`` / ``--url`` / ``--spawn``: load the workload, aim it at a
deployment (or at a server started for the run), show live progress, then print the table, write
the results file, and exit non-zero on a failed audit or a ``--fail-if`` condition."""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import click
import msgspec
from rich.console import Console
from rich.live import Live

from sessionloop.cli.loadtest import engine, gate, results
from sessionloop.cli.loadtest.compare import compare, format_comparison, regressions
from sessionloop.cli.loadtest.engine import Deployment, Progress
from sessionloop.cli.loadtest.plot import PlotUnavailable, check_available, plot
from sessionloop.cli.loadtest.report import format_result, progress_line
from sessionloop.cli.loadtest.spawn import Spawned, SpawnFailed
from sessionloop.cli.loadtest.workload import Workload, WorkloadError, load
from sessionloop.client import ClientError

#: --spawn: sessions of one app in flight at most (its quota is 200 unfinished turns)
USERS_PER_APP = 150


@dataclass(frozen=True)
class Options:
    workload: str
    sets: tuple[str, ...]
    url: str | None
    token: str | None
    app_tokens: tuple[str, ...]
    spawn: bool
    apps: int | None
    durability: str
    out: str | None
    plot: str | None
    fail_if: str | None
    as_json: bool
    progress: bool


def apps_for(w: Workload) -> int:
    """--spawn: enough bot apps that no app's quota (200 turns) bounds the run."""
    if w.open_loop:
        return 1
    return max(1, math.ceil(max(p.users or 0 for p in w.phases) / USERS_PER_APP))


def live_view() -> tuple[Callable[[Progress], None], Callable[[], None]]:
    """The progress callback and what ends it: a rich live line on a terminal, else a line every 10 s."""
    if sys.stderr.isatty():
        live = Live(console=Console(stderr=True), refresh_per_second=4, transient=True)
        live.start()
        return (lambda p: live.update(progress_line(p))), live.stop
    last = [0.0]

    def plain(p: Progress) -> None:
        if p.t_s - last[0] >= 10:
            last[0] = p.t_s
            click.echo(progress_line(p), err=True)

    return plain, lambda: None


def run_command(o: Options) -> None:
    try:
        workload, text = load(o.workload, o.sets)
        conditions = gate.parse(o.fail_if) if o.fail_if else []
    except (WorkloadError, gate.GateError) as e:
        raise click.UsageError(str(e)) from None
    if o.spawn == (o.url is not None):
        raise click.UsageError("give --url (a running deployment) or --spawn (a server started for the run)")
    if o.url is not None and not o.app_tokens:
        raise click.UsageError("--url needs --app-token (a bot app's token; repeat it for several apps)")
    if o.spawn and (o.app_tokens or o.token):
        raise click.UsageError("--spawn makes its own tokens: --token and --app-token go with --url")
    if o.plot is not None:
        try:
            check_available()
        except PlotUnavailable as e:
            raise click.UsageError(str(e)) from None
    on_progress, stop = live_view() if o.progress and not o.as_json else (None, lambda: None)
    try:
        if o.spawn:
            with Spawned(workload, o.apps or apps_for(workload), o.durability) as target:
                result = asyncio.run(engine.run(workload, text, o.workload, target, on_progress, o.sets))
        else:
            assert o.url is not None
            target = Deployment(url=o.url, app_tokens=list(o.app_tokens), owner_token=o.token)
            result = asyncio.run(engine.run(workload, text, o.workload, target, on_progress, o.sets))
    except (ClientError, SpawnFailed) as e:
        raise click.ClickException(str(e)) from None
    finally:
        stop()
    finish(result, o, conditions)


def finish(result: results.Result, o: Options, conditions: list[gate.Condition]) -> None:
    if o.out is not None:
        results.dump(result, o.out)
    if o.plot is not None:
        plot(result, o.plot)
    if o.as_json:
        click.echo(msgspec.json.format(msgspec.json.encode(result), indent=2).decode())
    else:
        click.echo(format_result(result))
        for path, what in ((o.out, "results"), (o.plot, "plot")):
            if path is not None:
                click.echo(f"{what}: {path}")
    failed = gate.failures(conditions, results.metrics(result))
    if not result.audit.ok:
        raise click.ClickException(f"audit FAILED: {result.audit.missing} lost, {result.audit.duplicated} "
                                   "duplicated (see the lines above)")
    if failed:
        raise click.ClickException(f"--fail-if: {'; '.join(failed)}")


def read_result(path: str) -> results.Result:
    try:
        return results.load(path)
    except OSError as e:
        raise click.ClickException(f"{path}: {e.strerror}") from None
    except msgspec.DecodeError as e:  # ValidationError included: it names the field
        raise click.ClickException(f"{path}: not a results file of sessionloop bench: {e}") from None


@click.command("compare")
@click.argument("a", metavar="A.json")
@click.argument("b", metavar="B.json")
@click.option("--threshold", default=0.10, show_default=True, type=click.FloatRange(0, 10),
              help="Relative change below which nothing is a regression (0.10: 10%).")
@click.option("--fail-on-regression", is_flag=True, help="Exit 1 when B regressed from A.")
def compare_cmd(a: str, b: str, threshold: float, fail_on_regression: bool) -> None:
    """Two runs side by side: per metric A, B, B/A and a verdict, over the whole run and per
    phase. A regression is worse than the threshold and beyond the noise of the two runs
    (docs/bench-results.md)."""
    c = compare(read_result(a), read_result(b), threshold)
    click.echo(format_comparison(c))
    found = regressions(c)
    if found and fail_on_regression:
        raise click.ClickException(f"{len(found)} regressions: {'; '.join(found[:5])}")


@click.command("plot")
@click.argument("result", metavar="RESULT.json")
@click.option("-o", "--output", required=True, metavar="FILE.png", help="Where to write the PNG.")
def plot_cmd(result: str, output: str) -> None:
    """Draw a results file: throughput and p50/p95/p99 over time, phases shaded, errors marked."""
    try:
        plot(read_result(result), output)
    except PlotUnavailable as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:
        raise click.ClickException(f"{output}: {e.strerror}") from None
    click.echo(f"plot: {output}")


__all__ = ["Options", "apps_for", "compare_cmd", "plot_cmd", "read_result", "run_command"]
