"""Soak: SIGKILL a real server under bot load, again and again (SPEC §11, issue "Reliability").

    python benchmarks/soak.py                  # 200 kill -9 cycles
    python benchmarks/soak.py --minutes 30     # as many cycles as fit in 30 minutes
    python benchmarks/soak.py --quick          # 10 cycles (under a minute)

The long version of ``tests/reliability/test_crash.py``, built on its harness
(``tests/reliability/harness.py``): a ``sessionloop serve --durability sync`` process with the
``loadbot`` app, ``--sessions`` sessions, and per cycle ``--bots`` bots sending ``loop/send`` with
idempotency keys (plain, tool and ``!sleep 30`` turns) until the server is killed with SIGKILL at a
random moment (``--kill-min``..``--kill-max`` seconds into the cycle). Then the server is restarted
(a new epoch every time), every input whose receipt never arrived is sent again with its key, every
turn of the cycle is waited for (``loop/waitForTurn``: every session resumes), and the store is
audited (opened read-only beside the running server): every acknowledged input is in the log once,
no input is in the log twice, no turn started twice, every turn started has ended, stream versions
are contiguous, every logged key has its receipt in the idempotency index.

A running summary is printed after every cycle; at the end a table (cycles, inputs tried,
acknowledged, in flight at the kills and how many of those had been committed, lost, duplicated,
restart-to-ready time, server RSS at the first and last kills and after the first and last
restarts, store size) and ``benchmarks/results/soak.json``. Exit status 1 on any loss, duplicate,
unresumed session or failed audit.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.measure import proc_rss_mib, write_results
from sessionloop.actors import events as E
from sessionloop.actors.events import open_store
from tests.e2e.conftest import ServerProcess
from tests.reliability import harness

APP = "loadbot"  # the harness's app (harness.APPS)
TURN_END = (E.TurnCompleted, E.TurnFailed, E.TurnAborted, E.TurnLimitReached)


def dir_mib(path: str) -> float:
    total = 0
    for base, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(base, name))
            except OSError:
                pass
    return total / 2**20


class ServerLog:
    """Drains a harness server's stdout/stderr (so a chatty server never blocks on a full pipe)
    and keeps what looks wrong: tracebacks and ERROR/CRITICAL lines."""

    def __init__(self) -> None:
        self.lines = 0
        self.suspicious: Counter[str] = Counter()
        self.examples: list[str] = []
        self._lock = threading.Lock()

    def attach(self, server: ServerProcess) -> None:
        proc = server.proc
        assert proc is not None
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                threading.Thread(target=self._drain, args=(stream,), daemon=True).start()
        log_file = getattr(server, "log", None)  # the harness sends stderr to a file, not a pipe
        if proc.stderr is None and log_file is not None:
            log_file.flush()
            threading.Thread(target=self._drain, args=(_follow(log_file.name, os.path.getsize(log_file.name), proc),),
                             daemon=True).start()

    def _drain(self, stream: Any) -> None:
        block: list[str] = []
        for line in stream:
            with self._lock:
                self.lines += 1
                text = line.rstrip()
                if text.startswith("Traceback") or block:
                    block.append(text)
                    if text and not text.startswith((" ", "Traceback")):  # the exception line ends it
                        self._keep("traceback: " + text, "\n".join(block[-12:]))
                        block = []
                elif " ERROR " in text or " CRITICAL " in text:
                    self._keep(text.split(": ", 1)[-1][:160], text)

    def _keep(self, key: str, full: str) -> None:
        self.suspicious[key] += 1
        if self.suspicious[key] == 1 and len(self.examples) < 10:
            self.examples.append(full)


def _follow(path: str, offset: int, proc: Any) -> Any:
    """The lines appended to ``path`` from ``offset`` on, until ``proc`` has exited and all are read."""
    with open(path) as f:
        f.seek(offset)
        pending = ""
        while True:
            exited = proc.poll() is not None
            chunk = f.read()
            if chunk:
                pending += chunk
                *lines, pending = pending.split("\n")
                yield from (line + "\n" for line in lines)
            elif exited:
                if pending:
                    yield pending
                return
            else:
                time.sleep(0.2)


def start(data: str, log: ServerLog) -> tuple[ServerProcess, float]:
    """A harness server and its restart-to-ready time (spawn until it listens)."""
    t0 = time.perf_counter()
    server = harness.start(data)
    ready = time.perf_counter() - t0
    log.attach(server)
    return server, ready


def kill_sampling(server: ServerProcess, delay: float, out: dict[str, float]) -> None:
    """``harness.kill_after``, sampling the server's RSS just before the SIGKILL."""
    time.sleep(delay)
    if server.proc is not None and server.proc.poll() is None:
        out["rss_mib"] = proc_rss_mib(server.proc.pid)
    harness.kill_after(server, 0.0)


def count_problems(data: str, rec: harness.Recorder) -> dict[str, Any]:
    """The checks of ``harness.audit``, counted instead of asserted (the soak reports them all)."""
    store = open_store(os.path.join(data, "store"), readonly=True)
    lost = dup = unfinished = gaps = no_receipt = 0
    examples: list[str] = []
    keys: dict[str, str] = {}
    turns = 0
    try:
        for sid in rec.sessions:
            events = store.read_stream(f"session-{sid}")
            if [e.version for e in events] != list(range(1, len(events) + 1)):
                gaps += 1
                examples.append(f"session {sid}: stream versions not contiguous")
            started: Counter[str] = Counter()
            ended: set[str] = set()
            for e in events:
                ev = e.event
                if isinstance(ev, E.InputAccepted) and ev.idempotency_key:
                    if ev.idempotency_key in keys:
                        dup += 1
                        examples.append(f"input {ev.idempotency_key} accepted twice")
                    keys[ev.idempotency_key] = ev.turn_id
                    if store.get_receipt(f"app:{APP}:{sid}", ev.idempotency_key) is None:
                        no_receipt += 1
                        examples.append(f"input {ev.idempotency_key}: no receipt in the idempotency index")
                elif isinstance(ev, E.TurnStarted):
                    started[ev.turn_id] += 1
                elif isinstance(ev, TURN_END):
                    ended.add(ev.turn_id)
            for tid, n in started.items():
                if n > 1:
                    dup += 1
                    examples.append(f"session {sid}: turn {tid} started {n}x")
            open_turns = set(started) - ended
            if open_turns:
                unfinished += len(open_turns)
                examples.append(f"session {sid}: turns started but not ended: {sorted(open_turns)[:3]}")
            turns += len(started)
        for op in rec.acknowledged():
            if keys.get(op.key) != op.receipt["turnId"]:  # type: ignore[index]
                lost += 1
                examples.append(f"acknowledged input {op.key} (turn {op.receipt['turnId']}) lost")  # type: ignore[index]
    finally:
        store.close()
    return {"lost": lost, "duplicated": dup, "unfinished": unfinished, "version_gaps": gaps,
            "missing_receipts": no_receipt, "inputs": len(keys), "turns": turns, "examples": examples[:10]}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10 cycles (under a minute)")
    ap.add_argument("--trials", type=int, help="kill -9 cycles (default 200; 10 with --quick)")
    ap.add_argument("--minutes", type=float, help="instead of --trials: cycle until this many minutes have passed")
    ap.add_argument("--sessions", type=int, default=6, help="sessions the bots send to")
    ap.add_argument("--bots", type=int, default=4, help="bot connections per cycle")
    ap.add_argument("--kill-min", type=float, default=0.15, help="earliest kill, seconds into a cycle")
    ap.add_argument("--kill-max", type=float, default=0.8, help="latest kill, seconds into a cycle")
    ap.add_argument("--settle-timeout", type=float, default=30.0, help="seconds to wait for each turn after a restart")
    ap.add_argument("--seed", type=int, default=20261129, help="random seed (kill moments, bot choices)")
    ap.add_argument("--data", help="data directory to use and keep (default: a temporary one, removed)")
    args = ap.parse_args()
    if args.trials is None:
        args.trials = 10 if args.quick else 200
    return args


def main() -> int:
    args = parse_args()
    work = None
    if args.data:
        data = os.path.abspath(args.data)
    else:
        work = tempfile.mkdtemp(prefix="sessionloop-soak-")
        data = os.path.join(work, "data")
    harness.prepare(data)
    rng = random.Random(args.seed)
    rec = harness.Recorder()
    log = ServerLog()
    budget = f"{args.minutes:g} minutes" if args.minutes else f"{args.trials} cycles"
    print(f"soak: kill -9 under bot load, {budget}, {args.sessions} sessions, {args.bots} bots, kill at "
          f"{args.kill_min:g}-{args.kill_max:g} s, durability sync, data {data}", flush=True)
    t_start = time.perf_counter()
    server, ready = start(data, log)
    asyncio.run(harness.create_sessions(server, rec, args.sessions))
    epochs = [server.epoch]
    readies = [ready]
    rss_kill: list[float] = []
    rss_settled: list[float] = [proc_rss_mib(server.proc.pid)]  # type: ignore[union-attr]
    settle_s: list[float] = []
    in_flight = committed = 0
    failures: list[str] = []
    counts: dict[str, Any] = {}
    trial = 0
    try:
        while True:
            elapsed = time.perf_counter() - t_start
            if (args.minutes and elapsed >= args.minutes * 60) or (not args.minutes and trial >= args.trials):
                break
            since = len(rec.ops)
            sample: dict[str, float] = {}
            killer = threading.Thread(target=kill_sampling,
                                      args=(server, rng.uniform(args.kill_min, args.kill_max), sample))
            killer.start()
            asyncio.run(harness.load(server, rec, rng, trial, bots=args.bots))
            killer.join()
            server.proc.wait(10)  # type: ignore[union-attr]
            rss_kill.append(sample.get("rss_mib", float("nan")))
            unknown = len(rec.unknown())
            in_flight += unknown
            try:
                server, ready = start(data, log)
            except Exception as e:  # noqa: BLE001 - the store did not reopen: stop, report
                failures.append(f"cycle {trial + 1}: restart failed: {type(e).__name__}: {e}")
                trial += 1
                break
            readies.append(ready)
            if server.epoch <= epochs[-1]:
                failures.append(f"cycle {trial + 1}: epoch {server.epoch} after {epochs[-1]} (must grow)")
            epochs.append(server.epoch)
            t0 = time.perf_counter()
            try:
                resent = asyncio.run(harness.settle(server, rec, since, timeout=args.settle_timeout))
            except Exception as e:  # noqa: BLE001 - an unresumed session or a wrong answer: stop, report
                failures.append(f"cycle {trial + 1}: settle failed: {type(e).__name__}: {e}")
                traceback.print_exc()
                trial += 1
                break
            settle_s.append(time.perf_counter() - t0)
            committed += resent["duplicate"]
            rss_settled.append(proc_rss_mib(server.proc.pid))  # type: ignore[union-attr]
            counts = count_problems(data, rec)
            try:
                harness.audit(data, rec)
            except AssertionError as e:
                failures.append(f"cycle {trial + 1}: harness audit: {e}")
            trial += 1
            bad = counts["lost"] + counts["duplicated"] + counts["unfinished"] + counts["version_gaps"] + \
                counts["missing_receipts"]
            print(f"cycle {trial:>4}  {time.perf_counter() - t_start:7.1f} s  inputs {len(rec.ops):>6}  "
                  f"acked {len(rec.acknowledged()):>6}  in flight {unknown:>2} (committed {resent['duplicate']})  "
                  f"ready {ready * 1000:6.0f} ms  settle {settle_s[-1] * 1000:6.0f} ms  "
                  f"rss@kill {rss_kill[-1]:5.0f} MiB  lost {counts['lost']}  dup {counts['duplicated']}"
                  + ("  PROBLEM" if bad or failures else ""), flush=True)
            if bad:
                failures.append(f"cycle {trial}: {counts['examples'][:3]}")
                break
    finally:
        if server.proc is not None and server.proc.poll() is None:
            rss_end = proc_rss_mib(server.proc.pid)
            server.stop()
        else:
            rss_end = float("nan")
    final = count_problems(data, rec)
    try:
        harness.audit(data, rec)
    except AssertionError as e:
        failures.append(f"final harness audit: {e}")
    wall = time.perf_counter() - t_start
    acked = len(rec.acknowledged())
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"), "params": {k: v for k, v in vars(args).items()},
        "cycles": trial, "seconds": wall, "sessions": args.sessions, "inputs_tried": len(rec.ops),
        "acknowledged": acked,
        "rejected_by_quota": sum(1 for op in rec.ops if (op.receipt or {}).get("state") == "rejected"),
        "errors": sum(1 for op in rec.ops if op.error is not None),
        "in_flight_at_kills": in_flight, "in_flight_committed": committed,
        "lost": final["lost"], "duplicated": final["duplicated"], "unfinished_turns": final["unfinished"],
        "version_gaps": final["version_gaps"], "missing_receipts": final["missing_receipts"],
        "inputs_in_log": final["inputs"], "turns_in_log": final["turns"],
        "restart_to_ready_ms_max": max(readies[1:], default=float("nan")) * 1000,
        "restart_to_ready_ms_p50": (statistics.median(readies[1:]) if readies[1:] else float("nan")) * 1000,
        "first_start_ms": readies[0] * 1000,
        "settle_ms_max": max(settle_s, default=float("nan")) * 1000,
        "rss_first_kill_mib": rss_kill[0] if rss_kill else float("nan"),
        "rss_last_kill_mib": rss_kill[-1] if rss_kill else float("nan"),
        "rss_max_kill_mib": max((r for r in rss_kill if not math.isnan(r)), default=float("nan")),
        "rss_after_first_start_mib": rss_settled[0], "rss_after_last_restart_mib": rss_settled[-1],
        "rss_at_end_mib": rss_end, "store_mib": dir_mib(os.path.join(data, "store")),
        "epochs_strictly_growing": all(b > a for a, b in itertools.pairwise(epochs)),
        "server_log_lines": log.lines, "server_log_suspicious": dict(log.suspicious),
        "server_log_examples": log.examples, "failures": failures, "problem_examples": final["examples"],
    }
    result["ok"] = not (failures or final["lost"] or final["duplicated"] or final["unfinished"]
                        or final["version_gaps"] or final["missing_receipts"])
    rows = [("cycles (kill -9)", "cycles", ",.0f"), ("seconds", "seconds", ",.1f"),
            ("inputs tried", "inputs_tried", ",.0f"), ("acknowledged", "acknowledged", ",.0f"),
            ("rejected receipts (quota, not stored)", "rejected_by_quota", ",.0f"),
            ("error answers", "errors", ",.0f"),
            ("in flight at the kills", "in_flight_at_kills", ",.0f"),
            ("  of them committed (duplicate on resend)", "in_flight_committed", ",.0f"),
            ("inputs in the log", "inputs_in_log", ",.0f"), ("turns in the log", "turns_in_log", ",.0f"),
            ("lost", "lost", ",.0f"), ("duplicated", "duplicated", ",.0f"),
            ("turns left unfinished", "unfinished_turns", ",.0f"),
            ("restart-to-ready max (ms)", "restart_to_ready_ms_max", ",.0f"),
            ("restart-to-ready p50 (ms)", "restart_to_ready_ms_p50", ",.0f"),
            ("resend + wait all turns max (ms)", "settle_ms_max", ",.0f"),
            ("server RSS at first kill (MiB)", "rss_first_kill_mib", ",.1f"),
            ("server RSS at last kill (MiB)", "rss_last_kill_mib", ",.1f"),
            ("server RSS max at a kill (MiB)", "rss_max_kill_mib", ",.1f"),
            ("server RSS after first start (MiB)", "rss_after_first_start_mib", ",.1f"),
            ("server RSS after last restart (MiB)", "rss_after_last_restart_mib", ",.1f"),
            ("store size (MiB)", "store_mib", ",.1f")]
    print(f"\nsoak summary (durability sync, {args.sessions} sessions, {args.bots} bots)")
    print(f"{'measure':<42}{'value':>14}")
    print("-" * 56)
    for name, key, fmt in rows:
        v = result[key]
        print(f"{name:<42}{format(v, fmt) if isinstance(v, (int, float)) else v:>14}")
    print(f"{'epochs strictly growing':<42}{'yes' if result['epochs_strictly_growing'] else 'NO':>14}")
    if log.suspicious:
        print(f"server log: {sum(log.suspicious.values())} suspicious lines: {dict(log.suspicious.most_common(5))}")
    write_results("soak", result)
    if work is not None:
        shutil.rmtree(work, ignore_errors=True)
    if not result["ok"]:
        print("SOAK FAILED: " + "; ".join(failures[:5] + final["examples"][:5]), file=sys.stderr)
        return 1
    print(f"ok: {trial} kill -9 cycles, {acked:,} acknowledged inputs, 0 lost, 0 duplicated, every session resumed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
