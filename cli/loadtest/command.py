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
from sessionloop.cli.loadtest.engine import Deployment, Progress
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
    on_progress, stop = live_view() if o.progress and not o.as_json else (None, lambda: None)
    try:
        if o.spawn:
            with Spawned(workload, o.apps or apps_for(workload), o.durability) as target:
                result = asyncio.run(engine.run(workload, text, o.workload, target, on_progress))
        else:
            assert o.url is not None
            target = Deployment(url=o.url, app_tokens=list(o.app_tokens), owner_token=o.token)
            result = asyncio.run(engine.run(workload, text, o.workload, target, on_progress))
    except (ClientError, SpawnFailed) as e:
        raise click.ClickException(str(e)) from None
    finally:
        stop()
    finish(result, o, conditions)


def finish(result: results.Result, o: Options, conditions: list[gate.Condition]) -> None:
    if o.out is not None:
        results.dump(result, o.out)
    if o.as_json:
        click.echo(msgspec.json.format(msgspec.json.encode(result), indent=2).decode())
    else:
        click.echo(format_result(result))
        if o.out is not None:
            click.echo(f"results: {o.out}")
    failed = gate.failures(conditions, results.metrics(result))
    if not result.audit.ok:
        raise click.ClickException(f"audit FAILED: {result.audit.missing} lost, {result.audit.duplicated} "
                                   "duplicated (see the lines above)")
    if failed:
        raise click.ClickException(f"--fail-if: {'; '.join(failed)}")


__all__ = ["Options", "apps_for", "run_command"]
