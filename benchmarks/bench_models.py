"""Sessions on a real model endpoint: the OpenAI provider (official SDK, limiter, retries armed)
driven by 1,000 concurrent sessions against a fake OpenAI-compatible server in another process.

    python benchmarks/bench_models.py           # full run: 1,000 sessions x 5 turns, unpinned and pinned
    python benchmarks/bench_models.py --quick   # smoke run: 100 sessions x 2 turns

Setup. The fake (``benchmarks/fake_openai_server.py``, its own process) answers every request
with a stream of 50 text chunks spread over 500 ms (the last one at 500 ms), then the finish,
usage and ``[DONE]`` chunks, and records how long each answer took by the request's text. The
sessionloop host runs in a child process (real LMDB, ``nosync``, the pooled session actors, the
worker loop, ``OpenAIProvider`` with its default ``max_concurrency`` of 64, or ``--max-concurrency
N``, 0 for one slot per session; retries allowed, counted, none expected); each session sends its turns one after the
other (closed loop) from an asyncio driver in the same process, as ``sessionloop bench`` does.
One warm-up turn per session first (connections opened, code warm), then the measured turns.

Reported per run: turns/s; the host process's CPU ms per turn (user + system over the measured
turns, the in-process driver included, the fake excluded); the time the server adds per turn:
the turn's latency (send -> turn ended) minus the fake's own time for that answer (arrival ->
last byte), p50/p95/p99, which includes the wait for a slot of the model's limit; and the fake's
connection count (new TCP connections in the measured turns: the SDK keeps up to 100 idle
connections per client). Pinned: the host on CPU 0, the fake
on CPU 1 (``taskset``). Every turn's text is checked (50 chunks joined); anything else fails the
run. Prints a table and writes ``benchmarks/results/models.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

from openai.types.chat import ChatCompletionChunk

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.measure import (
    fill_defaults,
    machine_reference_ms,
    percentile,
    run_job,
    write_results,
)
from sessionloop.actors.api.host import Host
from sessionloop.actors.model import OpenAIProvider
from sessionloop.actors.model.limits import ModelLimits, RetryPolicy
from sessionloop.cli.bench_cmd import inprocess_turn

HERE = os.path.dirname(os.path.abspath(__file__))


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=30) as reply:
        return json.loads(reply.read())  # type: ignore[no-any-return]


async def drive(host: Host, ids: list[str], turns: int, tag: str, latencies: dict[str, float],
                texts: dict[str, str]) -> None:
    turn = inprocess_turn(host)

    async def one(i: int) -> None:
        for t in range(turns):
            text = f"{tag} s{i} t{t}"
            started = time.perf_counter()
            outcome = await turn(ids[i], text)
            latencies[text] = (time.perf_counter() - started) * 1000
            texts[text] = outcome.output_text if outcome.state == "completed" else f"{outcome.state}: {outcome.reason}"

    await asyncio.gather(*(one(i) for i in range(len(ids))))


def child(spec: dict[str, Any]) -> dict[str, Any]:
    data = tempfile.mkdtemp(prefix="bench-models-")
    provider = OpenAIProvider(model="fake-model", base_url=f"http://127.0.0.1:{spec['port']}/v1", api_key="sk-bench",
                              limits=ModelLimits(max_concurrency=spec["max_concurrency"]),
                              retry=RetryPolicy(attempts=3))
    host = Host.open(data, durability="nosync", permission_mode="acceptCalls", provider=provider)
    expected = "".join(f"w{i} " for i in range(spec["chunks"]))
    try:
        ids = [host.create().id for _ in range(spec["sessions"])]
        latencies: dict[str, float] = {}
        texts: dict[str, str] = {}
        asyncio.run(drive(host, ids, 1, "warm", latencies, texts))
        before = stats(spec["port"])
        latencies.clear()
        cpu0, wall0 = cpu_s(), time.perf_counter()
        asyncio.run(drive(host, ids, spec["turns"], "run", latencies, texts))
        wall, cpu = time.perf_counter() - wall0, cpu_s() - cpu0
        after = stats(spec["port"])
    finally:
        host.rt.worker.submit(provider.aclose()).result(30)
        host.close()
    wrong = {k: v for k, v in texts.items() if v != expected}
    if wrong:
        raise SystemExit(f"{len(wrong)} turns answered wrongly, e.g. {next(iter(wrong.items()))}")
    fake_ms = after["answers"]
    added = sorted(latencies[k] - fake_ms[k] for k in latencies)
    total = sorted(latencies.values())
    n = len(latencies)
    return {"turns": n, "seconds": round(wall, 2), "turns_per_s": round(n / wall, 1),
            "cpu_ms_per_turn": round(cpu * 1000 / n, 2),
            "added_ms": {"p50": round(percentile(added, .5), 1), "p95": round(percentile(added, .95), 1),
                         "p99": round(percentile(added, .99), 1)},
            "latency_ms": {"p50": round(percentile(total, .5), 1), "p99": round(percentile(total, .99), 1)},
            "fake_answer_ms_p50": round(percentile(sorted(fake_ms.values()), .5), 1),
            "new_connections": after["connections"] - before["connections"],
            "retries": dict(provider.stats.retries)}


def chunk_parse_us(repeats: int = 5, n: int = 2000) -> dict[str, float]:
    """Microseconds to make one text chunk from its JSON: the SDK's typed ``ChatCompletionChunk``
    (its ``construct``, what ``chat.completions.create`` yields) and the plain dict the provider
    folds (``json.loads``), best of ``repeats``; why the provider asks the SDK for dicts."""
    text = json.dumps({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "fake-model",
                       "choices": [{"index": 0, "delta": {"content": "w1 "}, "finish_reason": None}]})
    best = {"typed": float("inf"), "json": float("inf")}
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(n):
            ChatCompletionChunk.construct(**json.loads(text))
        best["typed"] = min(best["typed"], (time.perf_counter() - started) / n * 1e6)
        started = time.perf_counter()
        for _ in range(n):
            json.loads(text)
        best["json"] = min(best["json"], (time.perf_counter() - started) / n * 1e6)
    return {k: round(v, 1) for k, v in best.items()}


def start_fake(latency_ms: float, chunks: int, pinned: bool) -> tuple[subprocess.Popen[str], int]:
    cmd = [sys.executable, os.path.join(HERE, "fake_openai_server.py"), "--latency-ms", str(latency_ms),
           "--chunks", str(chunks)]
    if pinned:
        cmd = ["taskset", "-c", "1", *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("listening "):
        proc.kill()
        raise SystemExit(f"the fake server did not start: {line!r}")
    return proc, int(line.split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sessions", type=int)
    parser.add_argument("--turns", type=int)
    parser.add_argument("--latency-ms", type=float, default=500.0)
    parser.add_argument("--chunks", type=int, default=50)
    parser.add_argument("--max-concurrency", type=int, default=64,
                        help="the model's concurrency limit (default 64, the provider's own default; "
                             "0: one slot per session)")
    parser.add_argument("--only", choices=["unpinned", "pinned"])
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    fill_defaults(args, [("sessions", 1000, 100), ("turns", 5, 2)])
    results: dict[str, Any] = {"setup": {"sessions": args.sessions, "turns": args.turns,
                                         "max_concurrency": args.max_concurrency or args.sessions,
                                         "latency_ms": args.latency_ms, "chunks": args.chunks},
                               "machine_reference_ms_before": round(machine_reference_ms(), 1),
                               "chunk_parse_us": chunk_parse_us()}
    for mode in ("unpinned", "pinned"):
        if args.only and mode != args.only:
            continue
        fake, port = start_fake(args.latency_ms, args.chunks, mode == "pinned")
        try:
            spec = {"port": port, "sessions": args.sessions, "turns": args.turns, "chunks": args.chunks,
                    "max_concurrency": args.max_concurrency or args.sessions}
            results[mode] = run_job(__file__, spec, pinned=mode == "pinned", label=f"bench_models {mode}")
        finally:
            fake.terminate()
            fake.wait(10)
    results["machine_reference_ms_after"] = round(machine_reference_ms(), 1)
    print(f"\n{args.sessions} sessions x {args.turns} turns, "
          f"model concurrency {args.max_concurrency or args.sessions}, "
          f"fake: {args.chunks} chunks over {args.latency_ms:g} ms")
    parse = results["chunk_parse_us"]
    print(f"one chunk from JSON: SDK typed {parse['typed']} us, plain dict {parse['json']} us")
    print(f"{'run':<10}{'turns/s':>9}{'CPU ms/turn':>13}{'added p50':>11}{'p95':>8}{'p99':>8}"
          f"{'latency p99':>13}{'new conns':>11}")
    for mode in ("unpinned", "pinned"):
        r = results.get(mode)
        if r is None:
            continue
        a = r["added_ms"]
        print(f"{mode:<10}{r['turns_per_s']:>9}{r['cpu_ms_per_turn']:>13}{a['p50']:>11}{a['p95']:>8}{a['p99']:>8}"
              f"{r['latency_ms']['p99']:>13}{r['new_connections']:>11}")
    write_results("models", results)


if __name__ == "__main__":
    main()
