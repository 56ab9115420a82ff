"""A realistic load (issue 20, "A realistic load benchmark"): 10,000 bot sessions in flight over
WebSocket against a model that takes 800 ms (log-normal) and streams 50 tokens/s; LangGraph on the
same workload side by side; and turns/s at N = 1, 2 and 4 workers.

    python benchmarks/bench_realistic.py            # full: 10,000 sessions x 1 turn, N = 1,2,4, 3 repeats
    python benchmarks/bench_realistic.py --quick    # smoke: 400 sessions x 1 turn, N = 1,2, one repeat

sessionloop side, per run: a fresh ``sessionloop serve --workers N --durability sync`` with the mock
model on the clock (``--mock-latency-ms 800 --mock-latency-jitter lognormal --mock-stream-tokens-per-s
50 --mock-seed 1``) and ``--clients`` client processes (``benchmarks/realistic_client.py``), between
them ``--sessions`` sessions of ``sessions / 100`` bot apps (100 each: the app quota is 200 unfinished
turns), 25 sessions per bot connection (the per-connection rate limit is 100 requests/s), and owner
connections subscribed to a tenth of the sessions (50 a connection), decoding and checking every
frame. Every session runs ``--turns`` turns closed-loop: ``loop/send`` an input of ``--answer-chars``
characters, ``loop/waitForTurn``, send the next (the mock echoes it, streamed at 50 tokens/s, about
1 s for 200 characters). All sessions are created and subscribed before the clock starts.

Measured: turns/s over the turn phase; per turn the latency from ``loop/send`` to ``waitForTurn``'s
answer, and the model's own time, taken from the turn's persisted ``llm.completed`` events
(``duration_ms``: the server's clock around the model call, read from the store after the run): the
server adds ``latency - model time`` (p50/p99 over turns). That measure counts as model time any
lateness of the server's own event loop in waking the mock's timers, so the table also prints the
model time the mock was configured to take (the same seeded log-normal draws plus the answer's
length at 50 tokens/s) beside the model time the server measured. CPU ms per turn: the server's
process tree (supervisor, workers, nats-server) and the clients, separately; peak RSS of the
server's tree (sampled every 0.25 s).

LangGraph side: ``benchmarks/compare_langgraph.py``'s graph (``StateGraph`` + ``ToolNode``, SQLite
checkpointer) on its async API, its fake model sleeping the same seeded log-normal latency and
streaming its answer at 50 tokens/s; a tenth of the sessions run with ``astream(stream_mode=
"messages")`` taking every chunk, the rest ``ainvoke``. One process: its CPU is server and client.

Half load: at 10,000 in flight both systems are saturated (the sessions are more than turns/s times
the model's time), so what the server adds there is mostly the queue. Then one more run of each at
half its measured turns/s (closed loop: ``sessions = turns/s x the model's median time / 2``, rounded
to hundreds, ``--half-load-turns`` turns each) shows what each adds when it is not the bottleneck.

Workers: the sessionloop run at N = ``--workers`` (default 1,2,4), interleaved over ``--repeats``
(the order rotates each repeat), medians; cores used = (server + clients CPU) / wall, per-core
efficiency = turns/s / cores used. Prints a table, writes ``benchmarks/results/realistic.json``
(``--results NAME``: ``NAME.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.measure import (  # noqa: E402
    fill_defaults,
    machine_reference_ms,
    now,
    percentile,
    proc_cpu_s,
    proc_rss_mib,
    proc_tree,
    run_job,
    write_results,
)
from benchmarks.realistic_client import app_id, app_token  # noqa: E402
from benchmarks.server_proc import ServerProc  # noqa: E402

OWNER_TOKEN = "realistic-bench-owner-token"
CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "realistic_client.py")
SESSIONS_PER_APP = 100


def model_flags(spec: dict[str, Any]) -> list[str]:
    return ["--mock-latency-ms", str(spec["latency_ms"]), "--mock-latency-jitter", spec["jitter"],
            "--mock-latency-sigma", str(spec["sigma"]), "--mock-stream-tokens-per-s", str(spec["tokens_per_s"]),
            "--mock-seed", str(spec["seed"])]


def configured_model_ms(spec: dict[str, Any], n: int) -> list[float]:
    """What the mock is set to spend on ``n`` calls: its seeded draws (as ``MockProvider.
    draw_latency_ms``) plus the echo's characters at the streaming rate (4 characters a token)."""
    rng = random.Random(spec["seed"])
    answer = len("echo: ") + spec["answer_chars"]
    stream_ms = answer / (spec["tokens_per_s"] * 4) * 1000 if spec["tokens_per_s"] else 0.0
    out = []
    for _ in range(n):
        if spec["jitter"] == "lognormal":
            ms = spec["latency_ms"] * math.exp(spec["sigma"] * rng.normalvariate(0.0, 1.0))
        elif spec["jitter"] == "uniform":
            ms = rng.uniform(0.0, 2.0 * spec["latency_ms"])
        else:
            ms = spec["latency_ms"]
        out.append(ms + stream_ms)
    return out


class Sampler:
    """Peak RSS of a process tree, sampled."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.stop = pid, 0.0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.25):
            rss = sum(r for r in (proc_rss_mib(p) for p in proc_tree(self.pid)) if r == r)
            self.peak = max(self.peak, rss)

    def close(self) -> float:
        self.stop.set()
        self.thread.join()
        return self.peak


def tree_cpu(pid: int) -> dict[int, float]:
    return {p: proc_cpu_s(p) for p in proc_tree(pid)}


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def summarize_latency(latency_s: list[float], model_ms: list[float]) -> dict[str, Any]:
    lat = sorted(x * 1000 for x in latency_s)
    pairs = [(x * 1000, m) for x, m in zip(latency_s, model_ms, strict=True) if m == m]
    added = sorted(x - m for x, m in pairs)
    model = sorted(m for _, m in pairs)
    return {"p50_ms": percentile(lat, 0.5), "p99_ms": percentile(lat, 0.99),
            "model_p50_ms": percentile(model, 0.5), "model_p99_ms": percentile(model, 0.99),
            "added_p50_ms": percentile(added, 0.5), "added_p99_ms": percentile(added, 0.99),
            "turns_with_model_time": len(pairs)}


def model_durations(store_dir: str) -> dict[tuple[str, str], float]:
    """Per (session, turn), the model's own time: the sum of the turn's ``llm.completed``
    ``duration_ms`` (the server's clock around each model call), from the stopped server's store."""
    from sessionloop.actors import events as E
    from sessionloop.actors.events import open_store

    out: dict[tuple[str, str], float] = {}
    store = open_store(store_dir, readonly=True)
    try:
        for recorded in store.iter_all(0):
            ev = recorded.event
            if isinstance(ev, E.LlmCompleted):
                key = (recorded.stream[len("session-"):], ev.turn_id)
                out[key] = out.get(key, 0.0) + ev.duration_ms
    finally:
        store.close()
    return out


def job_sessionloop(spec: dict[str, Any]) -> dict[str, Any]:
    apps = spec["sessions"] // SESSIONS_PER_APP
    data_dir = tempfile.mkdtemp(prefix="bench-realistic-")
    with open(os.path.join(data_dir, "apps.toml"), "w") as f:
        f.writelines(f'[apps.{app_id(a)}]\ntoken = "{app_token(a)}"\nplatform = "bench"\ncontainers = ["inbox"]\n\n'
                     for a in range(apps))
    # every session in flight stays live (one process would otherwise passivate and reload beyond
    # the default 4,000, which no deployment that size would leave so)
    live = str(max(4000, spec["sessions"] + 1000))
    server = ServerProc(data_dir, OWNER_TOKEN, ["--durability", spec["durability"], "--workers",
                                                str(spec["workers"]), "--max-live", live, *model_flags(spec)], None)
    clients: list[subprocess.Popen[str]] = []
    try:
        for c in range(spec["clients"]):
            cspec = {**spec, "port": server.port, "owner_token": OWNER_TOKEN,
                     "apps": list(range(c, apps, spec["clients"])), "sessions_per_app": SESSIONS_PER_APP}
            clients.append(subprocess.Popen([sys.executable, CLIENT, json.dumps(cspec)], cwd=ROOT, text=True,
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE))
        for c in clients:
            got = c.stdout.readline().strip()  # type: ignore[union-attr]
            if got != "READY":
                raise RuntimeError(f"client did not get ready: {got!r}; server: {server.tail[-5:]}")
        sampler = Sampler(server.pid)
        cpu0, t0 = tree_cpu(server.pid), now()
        for c in clients:
            c.stdin.write("GO\n")  # type: ignore[union-attr]
            c.stdin.flush()  # type: ignore[union-attr]
        for c in clients:
            got = c.stdout.readline().strip()  # type: ignore[union-attr]
            if got != "DONE":
                raise RuntimeError(f"client failed: {got!r}; server: {server.tail[-5:]}")
        wall, cpu1 = now() - t0, tree_cpu(server.pid)
        names = {p: cmdline(p) for p in cpu1}  # read while they run
        peak_rss = sampler.close()
        results = []
        for c in clients:
            c.stdin.close()  # type: ignore[union-attr]
            out = c.stdout.read()  # type: ignore[union-attr]  (not communicate: readline's buffer is in there)
            if c.wait(60) != 0:
                raise RuntimeError(f"client exited {c.returncode}")
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for c in clients:
            if c.poll() is None:
                c.kill()
        server_exit = server.stop()
    try:
        durations = model_durations(os.path.join(data_dir, "store"))
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    used = {p: cpu1.get(p, float("nan")) - cpu0.get(p, 0.0) for p in cpu1}
    nats = sum(v for p, v in used.items() if "nats-server" in names[p] and v == v)
    workers_cpu = sum(v for p, v in used.items() if v == v and p != server.pid and "nats-server" not in names[p])
    if spec["workers"] == 1:
        workers_cpu = used.get(server.pid, float("nan"))
    server_cpu = sum(v for v in used.values() if v == v)
    latency = [x[2] for r in results for x in r["turns"]]
    model = [durations.get((x[0], x[1]), float("nan")) for r in results for x in r["turns"]]
    turns = len(latency)
    # the turn phase of the run: from the first client's start to the last client's end
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    client_cpu = sum(r["cpu_s"] for r in results)
    out = {"workers": spec["workers"], "sessions": sum(r["sessions"] for r in results), "turns": turns,
           "failed_turns": sum(r["failed_turns"] for r in results), "seconds": span, "parent_wall_s": wall,
           "turns_per_s": turns / span, **summarize_latency(latency, model),
           "server_cpu_ms_per_turn": server_cpu / turns * 1000, "workers_cpu_ms_per_turn": workers_cpu / turns * 1000,
           "per_worker_cpu_ms_per_turn": workers_cpu / turns * 1000,
           "nats_cpu_ms_per_turn": nats / turns * 1000, "client_cpu_ms_per_turn": client_cpu / turns * 1000,
           "cores_used": (server_cpu + client_cpu) / span, "server_cores": server_cpu / span,
           "peak_rss_mib": peak_rss, "server_processes": len(cpu1), "client_processes": len(results),
           "connections": sum(r["connections"] for r in results),
           "watched_sessions": sum(r["watched"] for r in results),
           "owner_frames_per_watched_turn": sum(r["owner_frames"] for r in results)
           / max(1, sum(r["watched"] for r in results) * spec["turns"]),
           "owner_answers_streamed": sum(r["owner_answers"] for r in results),
           "owner_broken": sum(r["owner_broken"] for r in results), "server_exit": server_exit,
           "problems": [p for r in results for p in r["problems"]][:10]}
    out["turns_per_s_per_core"] = out["turns_per_s"] / out["cores_used"]
    return out


def job_langgraph(spec: dict[str, Any]) -> dict[str, Any]:
    from benchmarks.compare_langgraph import lg_realistic

    out = lg_realistic(spec)
    lat = summarize_latency(out.pop("latency_s"), out.pop("model_ms"))
    out.update(lat)
    out["turns_per_s_per_core"] = out["turns_per_s"] / out["cores_used"]
    return out


JOBS = {"sessionloop": job_sessionloop, "langgraph": job_langgraph}

ROWS = [("sessions", "sessions in flight", ",.0f"), ("turns", "turns", ",.0f"), ("turns_per_s", "turns/s", ",.0f"),
        ("p50_ms", "send -> completed p50 (ms)", ",.0f"), ("p99_ms", "send -> completed p99 (ms)", ",.0f"),
        ("model_p50_ms", "model's own time p50 (ms, measured)", ",.0f"),
        ("model_p99_ms", "model's own time p99 (ms, measured)", ",.0f"),
        ("configured_p50_ms", "model time as configured p50 (ms)", ",.0f"),
        ("configured_p99_ms", "model time as configured p99 (ms)", ",.0f"),
        ("added_p50_ms", "server adds p50 (ms)", ",.1f"), ("added_p99_ms", "server adds p99 (ms)", ",.1f"),
        ("server_cpu_ms_per_turn", "server CPU ms/turn (tree)", ".3f"),
        ("workers_cpu_ms_per_turn", "  workers only", ".3f"), ("nats_cpu_ms_per_turn", "  nats-server", ".3f"),
        ("client_cpu_ms_per_turn", "client CPU ms/turn", ".3f"), ("cores_used", "cores used (server+clients)", ".2f"),
        ("turns_per_s_per_core", "turns/s per core used", ",.0f"), ("peak_rss_mib", "peak RSS server (MiB)", ",.0f"),
        ("owner_frames_per_watched_turn", "owner frames per watched turn", ".1f"),
        ("failed_turns", "failed/wrong turns", ",.0f")]


def print_table(title: str, cols: dict[str, dict[str, Any]]) -> None:
    if not cols:
        return
    w = max(16, *(len(c) + 2 for c in cols))
    print(f"\n{title}")
    print(f"{'measure':<38}" + "".join(f"{c:>{w}}" for c in cols))
    print("-" * (38 + w * len(cols)))
    for key, name, fmt in ROWS:
        cells = [format(col[key], fmt) if isinstance(col.get(key), (int, float)) else "-" for col in cols.values()]
        print(f"{name:<38}" + "".join(f"{c:>{w}}" for c in cells))


def median_of(samples: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: statistics.median(s[k] for s in samples) for k in samples[0]
                           if isinstance(samples[0][k], (int, float)) and not isinstance(samples[0][k], bool)}
    out["samples"] = samples
    return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 400 sessions, N = 1,2, one repeat")
    ap.add_argument("--sessions", type=int, help="sessions in flight (a multiple of 100; default 10,000; 400 quick)")
    ap.add_argument("--turns", type=int, default=1, help="turns per session, closed loop (default 1)")
    ap.add_argument("--answer-chars", type=int, default=200, help="characters of each input (the mock echoes them)")
    ap.add_argument("--clients", type=int, default=4, help="client processes")
    ap.add_argument("--sessions-per-conn", type=int, default=25, help="sessions sharing one bot connection")
    ap.add_argument("--subscribed", type=float, default=0.1, help="share of sessions subscribed by owner connections")
    ap.add_argument("--subs-per-owner-conn", type=int, default=50, help="subscriptions per owner connection")
    ap.add_argument("--latency-ms", type=float, default=800.0, help="model latency before the first token (median)")
    ap.add_argument("--jitter", choices=["none", "lognormal", "uniform"], default="lognormal")
    ap.add_argument("--sigma", type=float, default=0.5, help="sigma of the log-normal jitter")
    ap.add_argument("--tokens-per-s", type=float, default=50.0, help="streaming rate of the answers")
    ap.add_argument("--seed", type=int, default=1, help="seed of the latency draws (both systems)")
    ap.add_argument("--durability", choices=["sync", "nosync"], default="sync")
    ap.add_argument("--workers", help="comma-separated worker counts (default 1,2,4; 1,2 quick)")
    ap.add_argument("--repeats", type=int, help="runs per worker count, interleaved (default 3; 1 quick)")
    ap.add_argument("--langgraph-sessions", type=int, help="LangGraph's sessions (default: --sessions)")
    ap.add_argument("--no-langgraph", action="store_true", help="skip the LangGraph run")
    ap.add_argument("--no-half-load", action="store_true", help="skip the runs at half the measured turns/s")
    ap.add_argument("--half-load-turns", type=int, default=3, help="turns per session at half load")
    ap.add_argument("--results", default="realistic", help="name of the JSON file in benchmarks/results/")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    fill_defaults(args, [("sessions", 10_000, 400), ("workers", "1,2,4", "1,2"), ("repeats", 3, 1)])
    if args.sessions % SESSIONS_PER_APP or args.sessions <= 0:
        ap.error(f"--sessions: a positive multiple of {SESSIONS_PER_APP}")
    return args


def main() -> None:
    args = parse_args()
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(JOBS[spec["system"]](spec)))
        return
    base = {"sessions": args.sessions, "turns": args.turns, "answer_chars": args.answer_chars, "clients": args.clients,
            "sessions_per_conn": args.sessions_per_conn, "subscribed": args.subscribed,
            "subs_per_owner_conn": args.subs_per_owner_conn, "latency_ms": args.latency_ms, "jitter": args.jitter,
            "sigma": args.sigma, "tokens_per_s": args.tokens_per_s, "seed": args.seed, "durability": args.durability}
    counts = [int(n) for n in args.workers.split(",")]
    print(f"realistic: {args.sessions:,} sessions x {args.turns} turns closed-loop over WebSocket, "
          f"{args.clients} client processes, {args.subscribed:.0%} subscribed by owner connections; mock "
          f"{args.latency_ms:g} ms {args.jitter} (sigma {args.sigma:g}), {args.tokens_per_s:g} tokens/s, answers of "
          f"{args.answer_chars + 6} chars; durability {args.durability}; workers {counts}; "
          f"{len(os.sched_getaffinity(0))} CPUs shared by server and clients",
          flush=True)
    ref0 = machine_reference_ms()
    samples: dict[str, list[dict[str, Any]]] = {}
    for r in range(args.repeats):
        order = counts[r % len(counts):] + counts[:r % len(counts)]
        jobs: list[tuple[str, dict[str, Any]]] = [
            (f"sessionloop N={n}", {**base, "system": "sessionloop", "workers": n}) for n in order]
        if r == 0 and not args.no_langgraph:
            jobs.insert(1, ("langgraph", {**base, "system": "langgraph",
                                          "sessions": args.langgraph_sessions or args.sessions}))
        for label, spec in jobs:
            t = time.time()
            res = run_job(__file__, spec, cwd=ROOT, label=label)
            samples.setdefault(label, []).append(res)
            print(f"  run {r + 1}/{args.repeats} {label}: {res['turns_per_s']:,.0f} turns/s, server adds p50 "
                  f"{res['added_p50_ms']:,.0f} / p99 {res['added_p99_ms']:,.0f} ms, {res['cores_used']:.2f} cores, "
                  f"{res['failed_turns']} failed ({time.time() - t:.0f} s)", flush=True)
    cols = {k: median_of(v) for k, v in samples.items()}
    half: dict[str, Any] = {}
    if not args.no_half_load:
        # at 10,000 in flight both systems are saturated and the added latency is the queue; at half
        # of the measured turns/s (closed loop: sessions = rate x model time) it is the overhead
        model_s = statistics.median(configured_model_ms(base, 1001)) / 1000
        for label in ("sessionloop N=1", "langgraph"):
            if label not in cols:
                continue
            n = max(SESSIONS_PER_APP, round(cols[label]["turns_per_s"] * model_s / 2 / SESSIONS_PER_APP)
                    * SESSIONS_PER_APP)
            spec = {**base, "system": label.split()[0], "workers": 1, "sessions": n, "turns": args.half_load_turns}
            res = run_job(__file__, spec, cwd=ROOT, label=f"{label} half load")
            half[f"{label}, half load"] = res
            print(f"  {label} at half load ({n:,} sessions x {args.half_load_turns} turns): "
                  f"{res['turns_per_s']:,.0f} turns/s, server adds p50 {res['added_p50_ms']:,.1f} / p99 "
                  f"{res['added_p99_ms']:,.1f} ms", flush=True)
    ref1 = machine_reference_ms()
    n_model = max(int(c["turns"]) for c in cols.values())
    configured = sorted(configured_model_ms(base, n_model))
    for c in cols.values():
        c["configured_p50_ms"], c["configured_p99_ms"] = percentile(configured, 0.5), percentile(configured, 0.99)
    main_cols = {k: cols[k] for k in ("sessionloop N=1", "langgraph") if k in cols}
    main_cols.update(half)
    print_table(f"{args.sessions:,} sessions in flight, model {args.latency_ms:g} ms {args.jitter} + "
                f"{args.tokens_per_s:g} tokens/s (medians of {args.repeats}; LangGraph one run)", main_cols)
    sl = {k: v for k, v in cols.items() if k.startswith("sessionloop")}
    print_table("sessionloop by workers (clients included on this machine)", sl)
    one = cols.get("sessionloop N=1")
    scaling: dict[str, Any] = {}
    if one:
        print(f"\n{'workers':<10}{'turns/s':>10}{'x N=1':>8}{'cores':>8}{'turns/s/core':>14}{'worker CPU/turn':>17}"
              f"{'x N=1':>8}")
        for k, v in sl.items():
            scaling[k] = {"speedup": v["turns_per_s"] / one["turns_per_s"],
                          "cpu_per_turn_ratio": v["workers_cpu_ms_per_turn"] / one["workers_cpu_ms_per_turn"],
                          "server_cpu_per_turn_ratio": v["server_cpu_ms_per_turn"] / one["server_cpu_ms_per_turn"]}
            print(f"{k.split('=')[1]:<10}{v['turns_per_s']:>10,.0f}{scaling[k]['speedup']:>8.2f}{v['cores_used']:>8.2f}"
                  f"{v['turns_per_s_per_core']:>14,.0f}{v['workers_cpu_ms_per_turn']:>15.3f}ms"
                  f"{scaling[k]['cpu_per_turn_ratio']:>8.2f}")
        two = scaling.get("sessionloop N=2")
        if two:
            print(f"targets: N=2 >= 1.5x N=1: {two['speedup']:.2f}x ({'met' if two['speedup'] >= 1.5 else 'NOT met'}); "
                  f"worker CPU per turn at N=2 within 1.15x of N=1: {two['cpu_per_turn_ratio']:.2f}x "
                  f"({'met' if two['cpu_per_turn_ratio'] <= 1.15 else 'NOT met'})")
    print(f"machine reference: {ref0:.1f} ms before, {ref1:.1f} ms after")
    failed = sum(int(c["failed_turns"]) for c in cols.values())
    write_results(args.results, {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": args.quick, "params": base,
                                "workers": counts, "repeats": args.repeats, "cpus": len(os.sched_getaffinity(0)),
                                "machine_reference_ms": [ref0, ref1], "results": cols, "half_load": half,
                                "scaling": scaling,
                                "command": " ".join(sys.argv)})
    if failed:
        raise SystemExit(f"{failed} turns failed or answered wrong")


if __name__ == "__main__":
    main()
