"""Turn throughput, latency and memory of the session actors with the mock model (SPEC §10).

    python benchmarks/bench_turns.py             # full run: 1000 sessions x 10 turns, 100,000 stored
    python benchmarks/bench_turns.py --quick     # smoke run: 100 x 4, 2,000 stored (under a minute)

Workload (every event persisted, mock model, permission mode ``acceptCalls``):

* **throughput** (closed loop): N concurrent sessions (default 1,000), each sends M turns
  (default 10) one after the other; every other turn is ``!tool list_files {"path": "."}`` (one
  tool call, then ``done: 1 tool calls``), the others are plain text (``echo: ...``). Run for
  ``nosync`` and ``sync``, unpinned and pinned to one CPU (``taskset -c 0``), each run in a fresh
  child process (so peak RSS belongs to that run). Reported: turns/s, p50/p95/p99 turn latency
  (send -> turn ended), events/s (store head position delta), appends and write transactions per
  turn (store ``info()``: ``requests`` / ``batches``), peak RSS, CPU seconds per turn.
  Targets: >= 5,000 turns/s ``nosync``, >= 3,000 turns/s ``sync``.
* **observers** (``--observe``, default ``subscriber,none``: both, interleaved): every mock answer
  streams (SPEC §4), and a run measures the streaming where someone watches. ``subscriber``: per
  session a subscribed protocol connection (a real gateway connection, its frames through the
  transport's outbox to a writer that checks them instead of writing a socket; 50 sessions per
  connection), as an owner's client watches; ``watcher``: the sessions are a bot app's rooms and
  the bot watches them with ``on_did_receive_event``; ``none``: nobody watches (the mock still
  produces its deltas; no frame is built for nobody). See :mod:`cli.bench_observers`. The
  observers check every answer reached them as deltas making its text; anything else fails the
  run. Throughput and half load are measured for each mode; the memory run has no observers (a
  subscribed session is never passivated, which is what that run measures).
* **half load** (open loop): turns arrive at a fixed rate, 50% of the turns/s measured above for
  the same durability and pinning, spread round-robin over the N sessions; latency is counted from
  each turn's scheduled time. Target: p99 < 50 ms.
* **memory**: S stored sessions with one turn each (default 100,000; built once with
  ``host.create(initial_input=...)`` and cached under ``benchmarks/results/.cache/``), the host
  reopened with ``max_live`` capped (default 2,000), then 10,000 random sessions touched with one
  turn each. Reported: open time (empty store vs the stored one: must not grow with S), touch
  time (target: within a minute), RSS after, live actors. Targets: RSS < 1 GiB, live actors capped.

Every run checks from the event log that each turn it sent has exactly one ``turn.started`` and
one turn-end event, ended ``completed`` with the expected answer, and that each tool turn ran
one tool; anything else fails the benchmark loudly.

Actor messages per turn are not counted at run time; they follow from the design (see
:func:`messages_per_turn`). Commits per turn are measured.

Before and after the turn runs the parent times a fixed pure-Python workload
(:func:`benchmarks.measure.machine_reference_ms`): the machine is shared and its speed drifts, so
runs compare directly only when their references are close.

Prints tables and writes ``benchmarks/results/turns.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.measure import (
    RESULTS,
    fill_defaults,
    machine_reference_ms,
    percentile,
    proc_rss_mib,
    rss_peak_mib,
    run_job,
    write_results,
)
from sessionloop.actors import events as E
from sessionloop.actors.api.host import Host
from sessionloop.actors.model.base import ModelError
from sessionloop.actors.model.mock import DEFAULT_SIGMA, JITTERS, MockClock
from sessionloop.actors.system import gc_policy
from sessionloop.cli.bench_cmd import inprocess_turn
from sessionloop.cli.bench_config import BenchConfig, is_tool_turn, sessions_per_connection
from sessionloop.cli.bench_observers import OBSERVE_MODES, attach
from sessionloop.cli.bench_observers import create_sessions as create_observed_sessions

CACHE = os.path.join(RESULTS, ".cache")
PLAIN_TEXT, PLAIN_ANSWER = "hello world", "echo: hello world"
TOOL_TEXT, TOOL_ANSWER = '!tool list_files {"path": "."}', "done: 1 tool calls"
TURN_END = (E.TurnCompleted, E.TurnFailed, E.TurnAborted, E.TurnLimitReached)
TURN_TIMEOUT_S = 120.0
TOOL_RATIO = 0.5  # half the turns make one tool call, spread evenly (cli.bench_config.is_tool_turn)


def messages_per_turn(llm_latency_ms: float, stream_tokens_per_s: float = 0.0) -> dict[str, float]:
    """Actor messages per turn, from the design (not counted at run time).

    Without model latency the mock answers inline (``answer_now``) inside the commit (its deltas
    go out after it, with the commit's pushes: no message), so a plain
    turn is one ``Send`` (input, turn start, model step and turn end in one commit) and a tool
    turn adds one ``ToolDone`` (second commit: tool result, second model step, turn end). The
    driver's ``session.watch_turn`` also tells the actor an ``Ask`` when the turn has not ended
    by the time the receipt arrives: never for a plain turn, always for a tool turn. With model
    latency or pacing (``stream_tokens_per_s``) every model step is a round trip through the worker
    loop: one ``ModelDone`` each.
    """
    plain, tool = 1.0, 3.0  # Send | Send + Ask + ToolDone
    if llm_latency_ms or stream_tokens_per_s:
        plain, tool = plain + 2, tool + 2  # + Ask + ModelDone | + ModelDone x2
    return {"plain": plain, "tool": tool, "mixed": (plain + tool) / 2}


# --- measuring ----------------------------------------------------------------------------------


class Record:
    """What the driver sent and saw: turn id -> (tool turn?, outcome), and latencies."""

    def __init__(self) -> None:
        self.sent: dict[str, bool] = {}
        self.outcomes: dict[str, Any] = {}
        self.latencies: list[float] = []
        self.in_flight: dict[object, tuple[str, float]] = {}  # turn -> (session, monotonic start)

    def summary(self) -> dict[str, float]:
        lat = sorted(self.latencies)
        return {"p50_ms": percentile(lat, 0.50) * 1000, "p95_ms": percentile(lat, 0.95) * 1000,
                "p99_ms": percentile(lat, 0.99) * 1000, "max_ms": (lat[-1] if lat else 0) * 1000}


async def one_turn(turn: Any, session_id: str, tool: bool, started: float, rec: Record) -> None:
    """One turn the way ``sessionloop bench`` drives it in process (:func:`cli.bench_cmd.inprocess_turn`:
    a ``Send`` told through the directory, the turn's end awaited; no thread per session).
    A turn that does not end in time fails the run through :func:`watchdog`."""
    key = object()
    rec.in_flight[key] = (session_id, time.monotonic())
    try:
        outcome = await turn(session_id, TOOL_TEXT if tool else PLAIN_TEXT)
    finally:
        del rec.in_flight[key]
    rec.latencies.append(time.perf_counter() - started)
    rec.sent[outcome.turn_id] = tool
    rec.outcomes[outcome.turn_id] = outcome


async def watchdog(rec: Record, work: Any) -> None:
    """Run ``work``; fail if any turn is in flight longer than TURN_TIMEOUT_S. One check a second
    instead of an ``asyncio.timeout`` per turn (a timer each: ~7 µs, 3% of a turn at these rates)."""
    task = asyncio.ensure_future(work)
    while not task.done():
        await asyncio.wait([task], timeout=1.0)
        now = time.monotonic()
        for session_id, since in list(rec.in_flight.values()):
            if now - since > TURN_TIMEOUT_S:
                task.cancel()
                raise RuntimeError(f"a turn of session {session_id} did not end within {TURN_TIMEOUT_S:g} s")
    task.result()


async def closed_loop(host: Host, ids: list[str], turns_each: int, rec: Record) -> None:
    turn = inprocess_turn(host)

    async def session_loop(k: int, session_id: str) -> None:
        for j in range(turns_each):
            await one_turn(turn, session_id, is_tool_turn(TOOL_RATIO, k, j), time.perf_counter(), rec)

    await asyncio.gather(*(session_loop(k, s) for k, s in enumerate(ids)))


async def open_loop(host: Host, ids: list[str], total: int, rate: float, rec: Record) -> None:
    """``total`` turns at ``rate`` turns/s, round-robin over ``ids``; latency from schedule."""
    turn, tasks = inprocess_turn(host), []
    t0 = time.perf_counter()
    for i in range(total):
        due = t0 + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tool = is_tool_turn(TOOL_RATIO, i % len(ids), i // len(ids))
        tasks.append(asyncio.ensure_future(one_turn(turn, ids[i % len(ids)], tool, due, rec)))
    await asyncio.gather(*tasks)


async def bounded(host: Host, ids: list[str], concurrency: int, rec: Record) -> None:
    """One turn per session in ``ids``, at most ``concurrency`` in flight."""
    gate, turn = asyncio.Semaphore(concurrency), inprocess_turn(host)

    async def touch(i: int, session_id: str) -> None:
        async with gate:
            await one_turn(turn, session_id, is_tool_turn(TOOL_RATIO, i, 0), time.perf_counter(), rec)

    await asyncio.gather(*(touch(i, s) for i, s in enumerate(ids)))


def verify(host: Host, after: int, rec: Record) -> dict[str, int]:
    """Check from the event log that no turn was lost or duplicated; raise loudly otherwise."""
    started: Counter[str] = Counter()
    ended: Counter[str] = Counter()
    tools = 0
    for recorded in host.store.iter_all(after):
        ev = recorded.event
        if isinstance(ev, E.TurnStarted):
            started[ev.turn_id] += 1
        elif isinstance(ev, TURN_END):
            ended[ev.turn_id] += 1
        elif isinstance(ev, E.ToolStarted):
            tools += 1
    problems = []
    for name, seen in (("turn.started", started), ("turn end", ended)):
        wrong = {t: seen[t] for t in set(seen) | set(rec.sent) if seen[t] != 1 or t not in rec.sent}
        if wrong:
            problems.append(f"{len(wrong)} turns without exactly one {name} (e.g. {list(wrong.items())[:5]})")
    bad = [(t, o) for t, o in rec.outcomes.items()
           if o.state != "completed" or o.output_text != (TOOL_ANSWER if rec.sent[t] else PLAIN_ANSWER)]
    if bad or len(rec.outcomes) != len(rec.sent):
        problems.append(f"{len(bad)} bad outcomes of {len(rec.sent)} sent, {len(rec.outcomes)} seen: {bad[:3]}")
    if tools != sum(rec.sent.values()):
        problems.append(f"{tools} tool calls started for {sum(rec.sent.values())} tool turns")
    if problems:
        raise RuntimeError("event log check FAILED: " + "; ".join(problems))
    return {"turns_verified": len(rec.sent), "tool_calls_verified": tools}


# --- jobs (each runs in its own child process) ----------------------------------------------------


def mock_options(spec: dict[str, Any]) -> dict[str, Any]:
    """The mock's clock of a run (``--llm-latency``, ``--latency-jitter``, ``--stream-tokens-per-s``,
    ``--seed``; actors/model/mock.py); a spec without them (other scripts') is the instant mock."""
    return {"latency_ms": spec["llm_latency_ms"], "latency_jitter": spec.get("latency_jitter", "none"),
            "latency_sigma": spec.get("latency_sigma", DEFAULT_SIGMA),
            "stream_tokens_per_s": spec.get("stream_tokens_per_s", 0.0), "seed": spec.get("seed")}


def open_host(data_dir: str, spec: dict[str, Any], max_live: int) -> Host:
    threads = {} if spec.get("threads") is None else {"dispatcher_threads": spec["threads"]}
    host = Host.open(data_dir, durability=spec["durability"], permission_mode="acceptCalls",
                     max_live=max_live, model_options=mock_options(spec), **threads)
    gc_policy.freeze_startup()  # as ``sessionloop serve`` does once it is up
    return host


def create_sessions(host: Host, n: int, initial_input: str | None = None) -> list[str]:
    def make(i: int) -> str:
        return host.create(title=f"bench {i}", initial_input=initial_input).id

    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(make, range(n), chunksize=64))


def job_throughput(spec: dict[str, Any]) -> dict[str, Any]:
    """Closed loop (``rate`` is None) or open loop at ``rate`` turns/s on a fresh store, with the
    observers of ``spec["observe"]``."""
    data_dir = tempfile.mkdtemp(prefix="bench-turns-")
    try:
        host = open_host(data_dir, spec, max(4000, 2 * spec["sessions"]))
        ids = create_observed_sessions(host, spec["sessions"], spec["observe"])
        out = asyncio.run(measure(host, spec, ids))
        host.close()
        return out
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


async def measure(host: Host, spec: dict[str, Any], ids: list[str]) -> dict[str, Any]:
    rec = Record()
    observers = await attach(host, spec["observe"], ids, sessions_per_connection(BenchConfig(sessions=len(ids))))
    try:
        head0, info0 = host.store.head_position, host.store.info()
        cpu0, t0 = time.process_time(), time.perf_counter()
        if spec["rate"] is None:
            await watchdog(rec, closed_loop(host, ids, spec["turns"], rec))
        else:
            total = len(ids) * spec["turns"] // 2
            await watchdog(rec, open_loop(host, ids, total, spec["rate"], rec))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        seen = None
        if observers is not None:
            await observers.settle()
            seen = observers.report(len(rec.sent))
    finally:
        if observers is not None:
            observers.close()
    info, turns = host.store.info(), len(rec.sent)
    checked = verify(host, head0, rec)
    if seen is not None and not seen["ok"]:
        raise RuntimeError(f"stream check FAILED ({seen['mode']}): {seen['broken']} problems, "
                           f"e.g. {seen['problems'][:3]}")
    return {"turns": turns, "seconds": wall, "turns_per_s": turns / wall, **rec.summary(),
            "events_per_s": (host.store.head_position - head0) / wall,
            "events_per_turn": (host.store.head_position - head0) / turns,
            "appends_per_turn": (info["requests"] - info0["requests"]) / turns,
            "write_txns_per_turn": (info["batches"] - info0["batches"]) / turns,
            "cpu_ms_per_turn": cpu / turns * 1000, "peak_rss_mib": rss_peak_mib(),
            "observed_pushes_per_turn": seen["frames_per_turn"] if seen else 0.0,
            "observed_deltas_per_turn": seen["deltas_per_turn"] if seen else 0.0, **checked}


def job_build_stored(spec: dict[str, Any]) -> dict[str, Any]:
    """Create ``stored`` sessions with one finished turn each, into ``path`` (the cache)."""
    tmp = spec["path"] + ".building"
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.perf_counter()
    host = open_host(os.path.join(tmp, "data"), spec, spec["max_live"])
    ids = create_sessions(host, spec["stored"], initial_input=PLAIN_TEXT)
    host.close()
    with open(os.path.join(tmp, "ids.json"), "w") as f:
        json.dump(ids, f)
    os.replace(tmp, spec["path"])
    return {"built_sessions": len(ids), "build_s": time.perf_counter() - t0}


def timed_open(data_dir: str, spec: dict[str, Any]) -> tuple[Host, float]:
    """The host and the milliseconds ``Host.open`` took."""
    t0 = time.perf_counter()
    host = open_host(data_dir, spec, spec["max_live"])
    return host, (time.perf_counter() - t0) * 1000


def job_memory(spec: dict[str, Any]) -> dict[str, Any]:
    """Reopen a copy of the cached store with ``max_live`` capped and touch ``touch`` sessions."""
    work = tempfile.mkdtemp(prefix="bench-turns-mem-")
    try:
        empty, open_empty_ms = timed_open(os.path.join(work, "empty"), spec)
        empty.close()
        shutil.copytree(os.path.join(spec["path"], "data"), os.path.join(work, "data"))
        with open(os.path.join(spec["path"], "ids.json")) as f:
            ids = json.load(f)
        host, open_ms = timed_open(os.path.join(work, "data"), spec)
        out = {"stored_sessions": len(ids), "open_empty_ms": open_empty_ms, "open_stored_ms": open_ms,
               "rss_after_open_mib": proc_rss_mib(os.getpid()), **touch(host, ids, spec)}
        host.close()
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def touch(host: Host, ids: list[str], spec: dict[str, Any]) -> dict[str, Any]:
    chosen = random.Random(42).sample(ids, min(spec["touch"], len(ids)))
    rec, head0 = Record(), host.store.head_position
    t0 = time.perf_counter()
    asyncio.run(watchdog(rec, bounded(host, chosen, spec["concurrency"], rec)))
    touch_s = time.perf_counter() - t0
    live = host.rt.directory.live_count()
    rss = proc_rss_mib(os.getpid())
    time.sleep(2.0)
    return {"touched": len(chosen), "touch_s": touch_s, "touched_within_a_minute": touch_s < 60,
            "touch_turns_per_s": len(chosen) / touch_s, **{f"touch_{k}": v for k, v in rec.summary().items()},
            "rss_after_touch_mib": rss, "peak_rss_mib": max(rss, rss_peak_mib()), "max_live": spec["max_live"],
            "live_actors_after_touch": live, "live_actors_2s_later": host.rt.directory.live_count(),
            "activations": host.rt.directory.activations, "passivations": host.rt.directory.passivations,
            **verify(host, head0, rec)}


JOBS = {"throughput": job_throughput, "build_stored": job_build_stored, "memory": job_memory}


# --- the parent: children, medians, tables ------------------------------------------------------


def run_child(spec: dict[str, Any], pinned: bool) -> dict[str, Any]:
    """Run one job in a fresh process (under ``taskset -c 0`` when pinned); fail loudly."""
    return run_job(__file__, spec, pinned=pinned)

def median_of(samples: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: statistics.median(s[k] for s in samples) for k in samples[0]
                           if isinstance(samples[0][k], (int, float)) and not isinstance(samples[0][k], bool)}
    out["samples"] = samples
    return out


def pinnings(args: argparse.Namespace) -> list[tuple[str, bool]]:
    modes = [("unpinned", False)]
    if not args.no_pinned and shutil.which("taskset"):
        modes.append(("pinned_cpu0", True))
    return modes


def throughput_runs(args: argparse.Namespace, base: dict[str, Any],
                    rates: dict[str, dict[str, dict[str, float]]] | None) -> dict[str, Any]:
    """Medians over ``repeats`` of every (observers, durability, pinning), interleaved side by
    side: ``out[observe][durability][pinning]``."""
    samples: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for _ in range(args.repeats):
        for observe in args.observe:
            for durability in ("nosync", "sync"):
                for label, pinned in pinnings(args):
                    rate = None if rates is None else rates[observe][durability][label] / 2
                    spec = {**base, "job": "throughput", "durability": durability, "rate": rate, "observe": observe}
                    samples.setdefault((observe, durability, label), []).append(run_child(spec, pinned))
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (observe, durability, label), runs in samples.items():
        out.setdefault(observe, {}).setdefault(durability, {})[label] = median_of(runs)
    return out


def memory_run(args: argparse.Namespace, base: dict[str, Any]) -> dict[str, Any]:
    path = os.path.join(CACHE, f"stored-{args.stored}")
    spec = {**base, "job": "memory", "durability": "nosync", "path": path, "max_live": args.max_live,
            "stored": args.stored, "touch": args.touch, "concurrency": args.touch_concurrency}
    built = {}
    if not os.path.exists(os.path.join(path, "ids.json")):
        print(f"building the stored-session store ({args.stored:,} sessions, cached in {path}) ...", flush=True)
        os.makedirs(CACHE, exist_ok=True)
        built = run_child({**spec, "job": "build_stored", "max_live": 2000}, pinned=False)
    return {**run_child(spec, pinned=False), **built}


ROWS = [("turns_per_s", "turns/s", ",.0f"), ("p50_ms", "p50 turn latency (ms)", ",.1f"),
        ("p95_ms", "p95 turn latency (ms)", ",.1f"), ("p99_ms", "p99 turn latency (ms)", ",.1f"),
        ("events_per_s", "events/s", ",.0f"), ("events_per_turn", "events per turn", ".2f"),
        ("appends_per_turn", "commits (appends) per turn", ".2f"),
        ("write_txns_per_turn", "write transactions per turn", ".2f"),
        ("cpu_ms_per_turn", "CPU ms per turn", ".3f"), ("peak_rss_mib", "peak RSS (MiB)", ",.0f"),
        ("observed_pushes_per_turn", "pushes/events observed per turn", ".2f"),
        ("observed_deltas_per_turn", "deltas observed per turn", ".2f")]


def print_throughput(title: str, result: dict[str, dict[str, Any]], rows: list[tuple[str, str, str]]) -> None:
    cols = [(d, p) for d in ("nosync", "sync") for p in result[d]]
    print(f"\n{title}")
    print(f"{'measure':<32}" + "".join(f"{d + ' ' + p:>22}" for d, p in cols))
    print("-" * (32 + 22 * len(cols)))
    for key, name, fmt in rows:
        print(f"{name:<32}" + "".join(f"{format(result[d][p][key], fmt):>22}" for d, p in cols))


def print_memory(mem: dict[str, Any]) -> None:
    print("\nmemory with stored sessions (unpinned, nosync)")
    print(f"{'measure':<40} {'value':>14}")
    print("-" * 55)
    for k, v in mem.items():
        print(f"{k:<40} {v:>14,.2f}" if isinstance(v, float) else f"{k:<40} {v!s:>14}")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 100 sessions x 4 turns, 2,000 stored")
    ap.add_argument("--sessions", type=int, help="concurrent sessions (default 1000; 100 with --quick)")
    ap.add_argument("--turns", type=int, help="turns per session (default 10; 4 with --quick)")
    ap.add_argument("--stored", type=int, help="stored sessions (default 100000; 2000 with --quick)")
    ap.add_argument("--touch", type=int, default=10_000, help="stored sessions touched (one turn each)")
    ap.add_argument("--touch-concurrency", type=int, default=500, help="touches in flight")
    ap.add_argument("--max-live", type=int, default=2000, help="live actor cap for the memory run")
    ap.add_argument("--llm-latency", type=float, default=0.0,
                    help="mock model latency per call before the first token (ms; the median with a jitter)")
    ap.add_argument("--latency-jitter", choices=JITTERS, default="none",
                    help="how the latency varies: none, lognormal (median --llm-latency, sigma --latency-sigma) "
                         "or uniform (0 to twice --llm-latency)")
    ap.add_argument("--latency-sigma", type=float, default=DEFAULT_SIGMA, help="sigma of the lognormal jitter")
    ap.add_argument("--stream-tokens-per-s", type=float, default=0.0,
                    help="stream each answer at N tokens/s (a token is 4 characters); 0: as fast as they come")
    ap.add_argument("--seed", type=int, help="seed of the jitter's random generator (repeatable runs)")
    ap.add_argument("--threads", type=int, help="pool threads for session actors (HostOptions.dispatcher_threads; "
                                                "0: a thread per actor; default: the host's default)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per figure; the median is reported")
    ap.add_argument("--observe", default="subscriber,none",
                    help="who watches the turns stream, comma-separated, each measured (interleaved): "
                         f"{', '.join(OBSERVE_MODES)} (see cli/bench_observers.py)")
    ap.add_argument("--no-pinned", action="store_true", help="skip the runs pinned to CPU 0")
    ap.add_argument("--no-memory", action="store_true", help="skip the stored-sessions memory run")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    fill_defaults(args, [("sessions", 1000, 100), ("turns", 10, 4), ("stored", 100_000, 2000)])
    try:
        MockClock(latency_ms=args.llm_latency, latency_jitter=args.latency_jitter, latency_sigma=args.latency_sigma,
                  stream_tokens_per_s=args.stream_tokens_per_s, seed=args.seed)
    except ModelError as e:
        ap.error(str(e))
    args.observe = [m.strip() for m in args.observe.split(",") if m.strip()]
    wrong = [m for m in args.observe if m not in OBSERVE_MODES]
    if wrong or not args.observe:
        ap.error(f"--observe: one or more of {', '.join(OBSERVE_MODES)}, got {wrong or 'nothing'}")
    return args


def main() -> None:
    args = parse_args()
    if args.child:
        spec = json.loads(args.child)
        gc_policy.apply()  # the child hosts the sessions: the server's GC settings (actors/system/gc_policy.py)
        print(json.dumps(JOBS[spec["job"]](spec)))
        return
    base = {"sessions": args.sessions, "turns": args.turns, "llm_latency_ms": args.llm_latency,
            "latency_jitter": args.latency_jitter, "latency_sigma": args.latency_sigma,
            "stream_tokens_per_s": args.stream_tokens_per_s, "seed": args.seed, "threads": args.threads}
    results: dict[str, Any] = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": args.quick,
                               "params": {**base, "repeats": args.repeats},
                               "messages_per_turn_by_design": messages_per_turn(args.llm_latency,
                                                                                args.stream_tokens_per_s)}
    reference_before = machine_reference_ms()
    results["params"]["observe"] = args.observe
    results["throughput"] = tp = throughput_runs(args, base, None)
    for observe in args.observe:
        print_throughput(f"throughput: {args.sessions} sessions x {args.turns} turns, half with a tool call, "
                         f"observers: {observe} (medians of {args.repeats})", tp[observe], ROWS)
    rates = {o: {d: {p: tp[o][d][p]["turns_per_s"] for p in tp[o][d]} for d in tp[o]} for o in tp}
    results["half_load"] = hl = throughput_runs(args, base, rates)
    for observe in args.observe:
        print_throughput(f"open loop at 50% of the measured turns/s (same observers, durability and pinning), "
                         f"observers: {observe}", hl[observe], ROWS[:4])
    mpt = results["messages_per_turn_by_design"]
    print(f"\nactor messages per turn (by design): plain {mpt['plain']:g}, tool {mpt['tool']:g}, "
          f"this mix {mpt['mixed']:g}; commits per turn: measured above")
    results["machine_reference_ms"] = ref = {"before": reference_before, "after": machine_reference_ms()}
    print(f"machine reference (measure.reference_work, best of 7): {ref['before']:.2f} ms before the "
          f"turn runs, {ref['after']:.2f} ms after: compare runs whose references are close")
    if not args.no_memory:
        results["memory"] = memory_run(args, base)
        print_memory(results["memory"])
    write_results("turns", results)


if __name__ == "__main__":
    main()
