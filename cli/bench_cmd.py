"""``sessionloop bench``: the turn-throughput load benchmark, driving the real stack.

N sessions each send M turns one after the other (at most ``--concurrency`` turns in flight over
all sessions), through the mock model: plain turns are ``hello world`` -> ``echo: hello world``,
tool turns (``--tool-ratio`` of them, spread evenly) are ``!tool list_files {"path": "."}`` -> one
tool call, then ``done: 1 tool calls``. Every event is persisted (``--durability``).

* ``--via inprocess``: the driver tells each input to the session actor as the protocol layer does
  (a ``Send`` through the directory) and waits for the turn's end (``watch_turn``), on one asyncio
  loop: no thread per session (the approach of ``benchmarks/bench_turns.py``).
* ``--via ws``: an in-process :class:`cli.serve.Server` on 127.0.0.1, port 0, driven by real
  WebSocket clients (``--per-connection`` sessions share one connection): ``session/create``,
  ``session/subscribe``, then ``turn/send`` and the ``item/completed`` push of the ``turn`` item.
  The clients are the sessions' subscribers: they get every answer streamed and check it.

Every answer of the mock model streams, so a run measures the streaming where someone watches:
``--observe`` (in process) says who does (:mod:`cli.bench_observers`): ``subscriber`` (default:
per session a subscribed protocol connection, as an owner's client), ``watcher`` (the sessions
belong to a bot app that watches them with ``on_did_receive_event``) or ``none``. The observers
check that each answer reached them as deltas that make its text; a run where they did not fails.

At the end the event log written during the run is read back and checked: each turn sent was
accepted once, started once, ended once with the expected answer, ran one tool when it was a tool
turn, and its end reached the client once. Any lost or duplicated turn, or an answer the observers
did not get streamed whole, fails the command with one line (exit 1).

This module drives the run and prints the report; the run's configuration, the mock clock's
flags and the turns sent are :mod:`cli.bench_config`, the check of the log :mod:`cli.bench_check`,
the WebSocket client :mod:`cli.bench_ws` and the in-process observers :mod:`cli.bench_observers`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict
from typing import Any

import click
from click.core import ParameterSource
from websockets.asyncio.client import connect

from sessionloop.actors.api.host import Host
from sessionloop.actors.session.commands import NewInput
from sessionloop.actors.session.messages import Send
from sessionloop.actors.system import gc_policy
from sessionloop.actors.system.ids import new_id
from sessionloop.actors.system.pubsub import LoopWaiter, Reply
from sessionloop.cli.bench_check import Record, SessionRecord, check_log, failure_line
from sessionloop.cli.bench_config import (
    PLAIN_TEXT,
    TOOL_TEXT,
    BenchConfig,
    is_tool_turn,
    mock_clock_options,
    sessions_per_connection,
)
from sessionloop.cli.bench_observers import (
    OBSERVE_MODES,
    StreamCheck,
    Subscribers,
    Watcher,
    attach,
    create_sessions,
)
from sessionloop.cli.bench_ws import NotAccepted, WsClient
from sessionloop.cli.loadtest.command import Options, compare_cmd, plot_cmd, run_command
from sessionloop.cli.serve import Server
from sessionloop.eventstore import EventStore, RecordedEvent
from sessionloop.protocol.handshake import SESSION_PROTOCOL_VERSION

BENCH_TOKEN = "sessionloop-bench-token"


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# --- the driver ---------------------------------------------------------------------------------

#: Sends one turn of session ``index`` (tool turn or not) and returns (turn id, state) at its end.
SendTurn = Callable[[int, bool], Awaitable[tuple[str, str]]]


async def drive(cfg: BenchConfig, rec: Record, send_turn: SendTurn) -> float:
    """Every session sends its turns one after another, at most ``concurrency`` in flight; new
    turns stop after ``duration_s``. Returns the wall seconds."""
    gate = asyncio.Semaphore(cfg.concurrency or cfg.sessions)
    t0 = time.perf_counter()
    deadline = t0 + cfg.duration_s if cfg.duration_s is not None else None

    async def session_loop(i: int) -> None:
        srec = rec.sessions[i]
        for j in itertools.count() if cfg.turns is None else range(cfg.turns):
            async with gate:
                if deadline is not None and time.perf_counter() >= deadline:
                    return
                tool = is_tool_turn(cfg.tool_ratio, i, j)
                srec.sent.append(tool)
                rec.in_flight += 1
                started = time.perf_counter()
                try:
                    async with asyncio.timeout(cfg.turn_timeout_s):  # no task per turn, unlike wait_for
                        turn_id, state = await send_turn(i, tool)
                except NotAccepted as e:
                    srec.sent.pop()  # refused, so not a turn: counted as a driver error, not as lost
                    rec.errors.append(f"session {srec.session_id}: turn {j + 1} refused: {e}")
                    return
                except TimeoutError:
                    rec.errors.append(f"session {srec.session_id}: turn {j + 1} did not end within "
                                      f"{cfg.turn_timeout_s:g} s")
                    return  # a later input would queue behind it; this session stops sending
                except Exception as e:  # noqa: BLE001 - reported, and the check fails the run
                    rec.errors.append(f"session {srec.session_id}: turn {j + 1}: {type(e).__name__}: {e}")
                    return
                finally:
                    rec.in_flight -= 1
                rec.latencies.append(time.perf_counter() - started)
                srec.seen.append(turn_id)
                srec.states[turn_id] = state

    await asyncio.gather(*(session_loop(i) for i in range(cfg.sessions)))
    return time.perf_counter() - t0


async def show_progress(cfg: BenchConfig, rec: Record, stream: Any) -> None:
    """A one-line counter on stderr, rewritten in place on a terminal (a line every 5 s otherwise)."""
    tty = stream.isatty()
    total = cfg.sessions * cfg.turns if cfg.turns is not None else None
    t0 = time.perf_counter()
    last_line = 0.0
    width = 30
    try:
        while True:
            await asyncio.sleep(0.2)
            elapsed = time.perf_counter() - t0
            done = rec.done
            if total is not None:
                frac = min(1.0, done / total)
            else:
                frac = min(1.0, elapsed / cfg.duration_s) if cfg.duration_s else 0.0
            bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
            of = f"/{total:,}" if total is not None else ""
            text = (f"[{bar}] {done:,}{of} turns  {done / elapsed if elapsed else 0:,.0f} turns/s  "
                    f"in flight {rec.in_flight:,}  {elapsed:,.1f} s")
            if tty:
                stream.write("\r" + text + "\x1b[K")
                stream.flush()
            elif elapsed - last_line >= 5.0:
                last_line = elapsed
                stream.write(text + "\n")
                stream.flush()
    except asyncio.CancelledError:
        if tty:
            stream.write("\r\x1b[K")
            stream.flush()
        raise


# --- in process -----------------------------------------------------------------------------------


def open_host(data_dir: str, cfg: BenchConfig) -> Host:
    return Host.open(data_dir, durability=cfg.durability, permission_mode="acceptCalls",
                     max_live=cfg.max_live or max(4000, 2 * cfg.sessions),
                     model_options=cfg.model_options())


def inprocess_turn(host: Host) -> Callable[[str, str], Awaitable[Any]]:
    """``turn(session_id, text) -> TurnOutcome``: a ``Send`` told through the directory (as the
    protocol layer does). The driver picks the turn id, so it waits for the turn's end from before
    the send: one wake-up of the driver per turn (a :class:`LoopWaiter` the turn results complete
    directly); the receipt only matters when it is a refusal, which ends the wait with
    :class:`NotAccepted`."""

    results = host.rt.results

    async def turn(session_id: str, text: str) -> Any:
        turn_id = new_id()
        accepted = NewInput(input_id=new_id(), turn_id=turn_id, text=text)
        ended = LoopWaiter()
        results.wait(turn_id, ended.set)

        def refused(receipt: Reply) -> None:
            value, error = receipt.outcome()
            if error is not None:
                ended.fail(NotAccepted(f"{type(error).__name__}: {error}"))
            elif value.turn_id != turn_id:
                ended.fail(NotAccepted(f"accepted as turn {value.turn_id}, not {turn_id}"))

        receipt = Reply()
        receipt.add_callback(refused)
        host.rt.tell(session_id, Send(accepted, None, receipt))
        try:
            return await ended.future
        finally:
            results.cancel_wait(turn_id, ended.set)

    return turn


def inprocess_sender(host: Host, ids: list[str]) -> SendTurn:
    turn = inprocess_turn(host)

    async def send(i: int, tool: bool) -> tuple[str, str]:
        outcome = await turn(ids[i], TOOL_TEXT if tool else PLAIN_TEXT)
        return outcome.turn_id, outcome.state

    return send


async def run_inprocess(cfg: BenchConfig, data_dir: str) -> dict[str, Any]:
    gc_policy.apply()  # this process hosts the sessions: the server's GC settings, as ``serve``
    host = open_host(data_dir, cfg)
    gc_policy.freeze_startup()  # as ``serve`` does once it is up
    observers = None
    try:
        ids = await asyncio.to_thread(create_sessions, host, cfg.sessions, cfg.observe)
        observers = await attach(host, cfg.observe, ids, sessions_per_connection(cfg))
        rec = Record([SessionRecord(s) for s in ids])
        return await measure(cfg, host, rec, inprocess_sender(host, ids), observers=observers)
    finally:
        if observers is not None:
            observers.close()
        host.close()


# --- over WebSocket -------------------------------------------------------------------------------


async def run_ws(cfg: BenchConfig, data_dir: str) -> dict[str, Any]:

    server = Server(data_dir, port=0, token=BENCH_TOKEN, durability=cfg.durability, permission_mode="acceptCalls",
                    max_live=cfg.max_live or max(4000, 2 * cfg.sessions),
                    model_options=cfg.model_options())
    clients: list[WsClient] = []
    try:
        port = await server.start()
        per_conn = sessions_per_connection(cfg)
        n_conn = -(-cfg.sessions // per_conn)
        for _ in range(n_conn):
            ws = await connect(f"ws://127.0.0.1:{port}/session", max_size=None, compression=None,
                               additional_headers={"Authorization": f"Bearer {BENCH_TOKEN}"})
            client = WsClient(ws)
            clients.append(client)
            await client.call("initialize", {"protocolVersion": SESSION_PROTOCOL_VERSION,
                                             "client": {"name": "sessionloop-bench", "version": "1"}})

        async def create(i: int) -> str:
            client = clients[i // per_conn]
            sid = (await client.call("session/create", {"name": f"bench {i}"}))["session"]["id"]
            await client.call("session/subscribe", {"sessionId": sid})
            return str(sid)

        ids = []
        for start in range(0, cfg.sessions, 200):  # in waves: the setup is not measured
            ids += await asyncio.gather(*(create(i) for i in range(start, min(cfg.sessions, start + 200))))
        rec = Record([SessionRecord(s) for s in ids])

        async def send(i: int, tool: bool) -> tuple[str, str]:
            return await clients[i // per_conn].turn(ids[i], TOOL_TEXT if tool else PLAIN_TEXT)

        out = await measure(cfg, server.host, rec, send, clients=clients)
        out["connections"] = n_conn
        out["sessions_per_connection"] = per_conn
        out["rejected_and_retried"] = sum(c.rejected for c in clients)
        return out
    finally:
        for client in clients:
            try:
                await client.close()
            except Exception:  # noqa: BLE001,S110 - closing after a failure
                pass
        await server.stop()


# --- measuring and checking -----------------------------------------------------------------------


async def measure(cfg: BenchConfig, host: Host, rec: Record, send: SendTurn, *, clients: list[WsClient] | None = None,
                  observers: Subscribers | Watcher | None = None) -> dict[str, Any]:
    store = host.store
    head0, info0 = store.head_position, store.info()
    cpu0 = time.process_time()
    progress = asyncio.ensure_future(show_progress(cfg, rec, sys.stderr)) if cfg.progress else None
    try:
        wall = await drive(cfg, rec, send)
    finally:
        if progress is not None:
            progress.cancel()
            try:
                await progress
            except asyncio.CancelledError:
                pass
    cpu = time.process_time() - cpu0
    if clients:
        await asyncio.sleep(0.05)  # a stray (duplicate) push would arrive now
        for c in clients:
            rec.errors += c.unexpected
    if observers is not None:
        await observers.settle()
    events = store.head_position - head0
    info = store.info()
    check = check_log(rec, iter_log(store, head0))
    turns = rec.done
    lat = sorted(rec.latencies)
    return {
        "turns": turns,
        "tool_turns": sum(sum(s.sent) for s in rec.sessions),
        "seconds": wall,
        "turns_per_s": turns / wall if wall else 0.0,
        "events": events,
        "events_per_s": events / wall if wall else 0.0,
        "events_per_turn": events / turns if turns else 0.0,
        "write_txns_per_turn": (info["batches"] - info0["batches"]) / turns if turns else 0.0,
        "p50_ms": percentile(lat, 0.50) * 1000,
        "p95_ms": percentile(lat, 0.95) * 1000,
        "p99_ms": percentile(lat, 0.99) * 1000,
        "max_ms": (lat[-1] if lat else 0.0) * 1000,
        "cpu_ms_per_turn": cpu / turns * 1000 if turns else 0.0,
        "peak_rss_mib": peak_rss_mib(),
        "check": check,
        "observers": observer_report(cfg, turns, clients, observers),
    }


def observer_report(cfg: BenchConfig, turns: int, clients: list[WsClient] | None,
                    observers: Subscribers | Watcher | None) -> dict[str, Any]:
    """What the run's observers saw of the streaming (``cli.bench_observers``)."""
    if clients:
        total = StreamCheck()
        for c in clients:
            for name in ("frames", "deltas", "answers", "broken"):
                setattr(total, name, getattr(total, name) + getattr(c.stream, name))
            total.problems += c.stream.problems[:10 - len(total.problems)]
        return total.report("subscriber (WebSocket)", turns, len(clients))
    if observers is not None:
        return observers.report(turns)
    return {"mode": "none", "ok": True, "frames": 0, "deltas": 0, "answers_streamed": 0}


def iter_log(store: EventStore, after: int) -> Iterator[RecordedEvent]:
    """The events written during the run (a seam for tests)."""
    return store.iter_all(after)


# --- running and printing -------------------------------------------------------------------------


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Run one benchmark and return its report (``check.ok`` false on any lost/duplicated turn)."""
    cfg.validate()
    data_dir = cfg.data_dir or tempfile.mkdtemp(prefix="sessionloop-bench-")
    try:
        runner = run_ws if cfg.via == "ws" else run_inprocess
        result = asyncio.run(runner(cfg, data_dir))
    finally:
        if cfg.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)
    params = {k: v for k, v in asdict(cfg).items() if k not in ("data_dir", "progress")}
    return {"params": {**params, "data_dir": cfg.data_dir, "cpus": len(os.sched_getaffinity(0))}, **result}


ROWS = [("turns", "turns", ",.0f"), ("seconds", "seconds", ",.2f"), ("turns_per_s", "turns/s", ",.0f"),
        ("events_per_s", "events/s", ",.0f"), ("p50_ms", "p50 turn latency (ms)", ",.1f"),
        ("p95_ms", "p95 turn latency (ms)", ",.1f"), ("p99_ms", "p99 turn latency (ms)", ",.1f"),
        ("events_per_turn", "events per turn", ".2f"), ("write_txns_per_turn", "write transactions per turn", ".2f"),
        ("cpu_ms_per_turn", "CPU ms per turn", ".3f"), ("peak_rss_mib", "peak RSS (MiB)", ",.0f")]


def format_table(report: dict[str, Any]) -> str:
    p = report["params"]
    turns = f"{p['turns']} turns" if p["turns"] is not None else "turns"
    limit = f" for {p['duration_s']:g} s" if p["duration_s"] is not None else ""
    lines = [(f"sessionloop bench: {p['sessions']} sessions x {turns}{limit}, concurrency "
              f"{p['concurrency'] or p['sessions']}, tool ratio {p['tool_ratio']:g}, via {p['via']}, "
              f"durability {p['durability']}, llm latency {p['llm_latency_ms']:g} ms{clock_words(p)}"),
             f"{'measure':<30}{'value':>14}", "-" * 44]
    lines += [f"{name:<30}{format(report[key], fmt):>14}" for key, name, fmt in ROWS]
    if "connections" in report:
        lines += [f"{'WebSocket connections':<30}{report['connections']:>14,}",
                  f"{'sends refused (rate), retried':<30}{report['rejected_and_retried']:>14,}"]
    obs = report["observers"]
    if obs["mode"] != "none":
        lines += [f"{'observers':<30}{obs['mode']:>14}",
                  f"{'pushes or events seen per turn':<30}{obs['frames_per_turn']:>14.2f}",
                  f"{'deltas seen per turn':<30}{obs['deltas_per_turn']:>14.2f}"]
    else:
        lines.append(f"{'observers':<30}{'none':>14}")
    check = report["check"]
    verdict = (f"ok: {check['turns_verified']:,} turns, none lost or duplicated" if check["ok"]
               else failure_line(check))
    lines.append(f"{'check (event log)':<30}  {verdict}")
    if obs["mode"] != "none":
        seen = (f"ok: {obs['answers_streamed']:,} answers streamed whole" if obs["ok"]
                else observer_failure_line(obs))
        lines.append(f"{'check (observers)':<30}  {seen}")
    return "\n".join(lines)


def clock_words(p: dict[str, Any]) -> str:
    """The rest of the mock's clock for the table's title ("" when it is the default)."""
    words = ""
    if p.get("latency_jitter", "none") != "none":
        sigma = f" sigma {p['latency_sigma']:g}" if p["latency_jitter"] == "lognormal" else ""
        words += f" {p['latency_jitter']}{sigma}"
    if p.get("stream_tokens_per_s"):
        words += f", streamed at {p['stream_tokens_per_s']:g} tokens/s"
    if p.get("seed") is not None:
        words += f", seed {p['seed']}"
    return words


def observer_failure_line(obs: dict[str, Any]) -> str:
    first = obs["problems"][0] if obs["problems"] else "?"
    return f"stream check FAILED: {obs['broken']} problems seen by the observers (first: {first})"


LEGACY = ("sessions", "turns", "concurrency", "tool_ratio", "via", "llm_latency_ms", "latency_jitter", "latency_sigma",
          "stream_tokens_per_s", "seed", "duration_s", "data_dir", "per_connection", "turn_timeout_s", "observe")


@click.group("bench", invoke_without_command=True)
@click.option("--workload", default=None, metavar="NAME|FILE",
              help="Run a workload (TOML; shipped: bots-steady, burst, long-sessions, approvals) against --url or "
                   "--spawn [default with --url or --spawn: bots-steady]. See docs/bench.md.")
@click.option("--url", default=None, metavar="URL", help="A running deployment, e.g. ws://HOST:8765/session.")
@click.option("--token", default=None, metavar="T", envvar="SESSIONLOOP_TOKEN",
              help="With --url: the owner token (approvals and watched sessions need it) [env SESSIONLOOP_TOKEN].")
@click.option("--app-token", "app_tokens", multiple=True, metavar="T",
              help="With --url: a bot app's token (repeat for several apps; users are spread over them).")
@click.option("--spawn", is_flag=True, help="Start a server for the run (127.0.0.1, port 0, temporary data).")
@click.option("--apps", default=None, type=click.IntRange(1, 1000),
              help="With --spawn: bot apps to declare [default: one per 150 users].")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Change one key of the workload, e.g. --set sessions.turns=5 --set phases.1.seconds=30.")
@click.option("--out", default=None, metavar="FILE.json", help="Write the results file (docs/bench-results.md).")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png",
              help="Draw throughput and latency over time (needs matplotlib: sessionloop[bench]).")
@click.option("--fail-if", default=None, metavar="CONDITIONS",
              help='Exit 1 when a condition holds, e.g. "p99_ms>200,errors>0" (docs/bench-results.md).')
@click.option("--sessions", default=100, show_default=True, type=int, help="Concurrent sessions.")
@click.option("--turns", default=None, type=int,
              help="Turns per session, one after the other [default: 10; with --duration: until it ends].")
@click.option("--concurrency", default=None, type=int, help="Turns in flight at most [default: one per session].")
@click.option("--tool-ratio", default=0.5, show_default=True, type=float,
              help="Share of turns (0..1) that make one list_files tool call.")
@click.option("--via", type=click.Choice(["inprocess", "ws"]), default="inprocess", show_default=True,
              help="inprocess: tell the session actors directly; ws: a server on port 0 and WebSocket clients.")
@click.option("--durability", type=click.Choice(["sync", "nosync"]), default="sync", show_default=True,
              help="sync: fsync before every acknowledgement; nosync: no fsync.")
@mock_clock_options
@click.option("--duration", "duration_s", default=None, type=float, help="Stop sending new turns after S seconds.")
@click.option("--data", "data_dir", default=None, help="Data directory [default: a temporary one, removed after].")
@click.option("--per-connection", default=None, type=int,
              help="With --via ws: sessions sharing one WebSocket connection [default: sessions/20, "
                   "between 1 and 50; the server allows 100 requests/s per connection].")
@click.option("--turn-timeout", "turn_timeout_s", default=60.0, show_default=True, type=float,
              help="A turn not ended after this long counts as lost.")
@click.option("--observe", type=click.Choice(OBSERVE_MODES), default="subscriber", show_default=True,
              help="In process, who watches the turns stream: per session a subscribed protocol connection, "
                   "a bot app's event watcher, or nobody. With --via ws the WebSocket clients subscribe.")
@click.option("--no-progress", is_flag=True, help="No live progress line on stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def bench(ctx: click.Context, workload: str | None, url: str | None, token: str | None, app_tokens: tuple[str, ...],
          spawn: bool, apps: int | None, sets: tuple[str, ...], out: str | None, plot_path: str | None,
          fail_if: str | None, sessions: int, turns: int | None, concurrency: int | None, tool_ratio: float, via: str,
          durability: str, llm_latency_ms: float, latency_jitter: str, latency_sigma: float,
          stream_tokens_per_s: float, seed: int | None, duration_s: float | None, data_dir: str | None,
          per_connection: int | None, turn_timeout_s: float, observe: str, no_progress: bool, as_json: bool) -> None:
    """Load benchmark: drive sessions through the real stack with the mock model.

    With --workload, --url or --spawn it is a load generator: it runs a workload (closed or open
    loop, phases, a message mix) against a deployment or a server it starts, through the Session
    Loop API, shows live progress, prints the figures per phase and an audit of the event feed,
    and writes the results (--out) and a plot (--plot). `bench compare` and `bench plot` read
    results files. Without them it runs the built-in shape below (--sessions, --turns, ...).

    Prints turns/s, events/s, p50/p95/p99 turn latency and peak RSS; then checks the event log
    and exits 1 on any lost or duplicated turn, or on an answer the observers (--observe: by
    default a subscribed connection per session) did not get streamed whole.

    \b
    Example:
      sessionloop bench --sessions 1000 --turns 10 --durability sync
      sessionloop bench --via ws --sessions 200 --duration 30 --llm-latency 50 --json
      sessionloop bench --via ws --sessions 1000 --duration 60 --llm-latency 800 \
          --latency-jitter lognormal --stream-tokens-per-s 50 --seed 1
    """
    if ctx.invoked_subcommand is not None:
        return
    if workload is not None or url is not None or spawn:
        given = [f"--{name.replace('_', '-')}" for name in LEGACY
                 if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE]
        if given:
            raise click.UsageError(f"{', '.join(given)}: options of the built-in benchmark, not of a workload run "
                                   "(change the workload with --set)")
        run_command(Options(workload=workload or "bots-steady", sets=sets, url=url, token=token,
                            app_tokens=app_tokens, spawn=spawn, apps=apps, durability=durability, out=out,
                            plot=plot_path, fail_if=fail_if, as_json=as_json, progress=not no_progress))
        return
    stray = [flag for flag, value in (("--token", token), ("--app-token", app_tokens), ("--apps", apps),
                                      ("--set", sets), ("--out", out), ("--plot", plot_path),
                                      ("--fail-if", fail_if))
             if value]
    if stray:
        raise click.UsageError(f"{', '.join(stray)}: options of a workload run (give --url or --spawn)")
    if turns is None and duration_s is None:
        turns = 10
    cfg = BenchConfig(sessions=sessions, turns=turns, concurrency=concurrency, tool_ratio=tool_ratio, via=via,
                      durability=durability, llm_latency_ms=llm_latency_ms, latency_jitter=latency_jitter,
                      latency_sigma=latency_sigma, stream_tokens_per_s=stream_tokens_per_s, seed=seed,
                      duration_s=duration_s,
                      data_dir=data_dir, per_connection=per_connection, turn_timeout_s=turn_timeout_s,
                      progress=not no_progress, observe=observe)
    report = run_bench(cfg)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(format_table(report))
    if not report["check"]["ok"]:
        raise click.ClickException(failure_line(report["check"]))
    if not report["observers"]["ok"]:
        raise click.ClickException(observer_failure_line(report["observers"]))


bench.add_command(compare_cmd)
bench.add_command(plot_cmd)
