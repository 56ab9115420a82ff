"""sessionloop vs a LangGraph agent with its SQLite checkpointer, same workload, one run (SPEC §10).

    pip install -e '.[bench]'                          # langgraph, langgraph-checkpoint-sqlite
    python benchmarks/compare_langgraph.py             # full: 1000 sessions x 10 turns
    python benchmarks/compare_langgraph.py --quick     # smoke: 100 sessions x 4 turns

Workload, the same on both sides: N sessions (LangGraph: one thread id per session), each sends M
turns one after the other, at most ``--concurrency`` turns in flight (default: one per session).
A share ``--tool-ratio`` of the turns (spread evenly, the rule of ``sessionloop bench``) is
``!tool list_files {"path": "."}``: the model asks for one ``list_files`` call (a directory listing),
then answers ``done: 1 tool calls``; the other turns are ``hello world`` -> ``echo: hello world``.

* **LangGraph**: a ``StateGraph(MessagesState)`` with an ``agent`` node (the fake model) and a
  ``ToolNode`` joined by ``tools_condition`` (the topology of ``create_react_agent``, which is
  deprecated in LangGraph 1.x in favour of ``langchain.agents``), compiled with the SQLite
  checkpointer on a file (``journal_mode=WAL``, SQLite's default ``synchronous=FULL``: durable), and
  LangGraph's default durability mode (``async``: a checkpoint per step, all written before the
  call returns). The fake model is a ``BaseChatModel`` that answers exactly like sessionloop's mock
  model (:class:`MockChatModel`). Driven with asyncio (``ainvoke``, ``AsyncSqliteSaver``) by
  default, or a thread pool (``invoke``, ``SqliteSaver``) with ``--lg-driver threads``.
* **sessionloop**: ``sessionloop bench --via inprocess`` (:func:`cli.bench_cmd.run_bench`) with
  ``durability sync`` (fsync before every acknowledgement, like-for-like with SQLite's FULL) and
  ``nosync``; every event persisted, mock model, ``acceptCalls``. Every mock answer streams
  (SPEC §4); ``--observe`` (default ``subscriber,none``, each measured) says who watches it
  stream: ``subscriber``, per session a subscribed protocol connection that checks every answer
  arrived as deltas making its text, or ``none`` (see :mod:`cli.bench_observers`). LangGraph's
  ``ainvoke`` streams nothing to anyone: the fake model answers whole, as the mock does.

Each run is a fresh child process (so peak RSS is that run's), unpinned and pinned to one CPU
(``taskset -c 0``); runs are interleaved across ``--repeats`` and medians reported. Both sides check
their result: sessionloop from its event log (``bench``'s lost/duplicated check), LangGraph from
each thread's final checkpoint (every turn's human message once, with the expected answer, and the
expected number of tool messages). Prints one table per pinning and the ratios; writes
``benchmarks/results/compare_langgraph.json``.

:func:`lg_realistic` is the LangGraph side of ``benchmarks/bench_realistic.py`` (the fake model on
sessionloop's mock clock: seeded log-normal latency, answers streamed at a token rate).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import math
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.measure import fill_defaults, rss_peak_mib, run_job, write_results
from sessionloop.cli.bench_cmd import percentile, run_bench
from sessionloop.cli.bench_config import EXPECTED, PLAIN_TEXT, TOOL_TEXT, BenchConfig, is_tool_turn
from sessionloop.cli.bench_observers import OBSERVE_MODES

# --- LangGraph side -------------------------------------------------------------------------------


#: per turn of :func:`lg_realistic`, the model calls' own times (ms), appended by the fake model
TURN_MODEL_MS: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar("turn_model_ms", default=None)


def draw_latency_ms(clock: dict[str, Any], rng: random.Random) -> float:
    """The fake model's delay before its first token, drawn as sessionloop's mock draws it
    (``MockProvider.draw_latency_ms``: median ``latency_ms``, log-normal with ``sigma``)."""
    if clock["jitter"] == "lognormal":
        return float(clock["latency_ms"] * math.exp(clock["sigma"] * rng.normalvariate(0.0, 1.0)))
    if clock["jitter"] == "uniform":
        return rng.uniform(0.0, 2.0 * clock["latency_ms"])
    return float(clock["latency_ms"])


def langgraph_agent(checkpointer: Any, workspace: str, latency_ms: float, clock: dict[str, Any] | None = None) -> Any:
    """The graph: agent (fake model) -> tools_condition -> ToolNode -> agent.

    ``clock`` (``latency_ms``, ``jitter``, ``sigma``, ``tokens_per_s``, ``seed``) puts the fake
    model on sessionloop's mock clock: a seeded delay, then the answer in pieces of 6 characters
    at ``tokens_per_s`` (4 characters a token), streamed (``_astream``) when the caller streams,
    else slept through the same way (``_agenerate``)."""
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import (
        AIMessage,
        AIMessageChunk,
        BaseMessage,
        HumanMessage,
        ToolMessage,
    )
    from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
    from langchain_core.runnables import RunnableLambda
    from langchain_core.tools import StructuredTool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    class MockChatModel(BaseChatModel):
        """sessionloop's mock model grammar, the part the workload uses: the latest human message's
        ``!tool NAME {json}`` lines become tool calls while no tool result follows it, then
        ``done: N tool calls``; a message without directives gets ``echo: <text>``."""

        latency_ms: float = 0.0

        @property
        def _llm_type(self) -> str:
            return "sessionloop-mock"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _answer(self, messages: list[BaseMessage]) -> AIMessage:
            last = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
            text = str(messages[last].content)
            results = sum(isinstance(m, ToolMessage) for m in messages[last + 1:])
            lines = text.splitlines()
            tools = [ln[len("!tool "):] for ln in lines if ln.startswith("!tool ")]
            chars = sum(len(str(m.content)) for m in messages)
            if tools and not results:
                n = sum(len(m.tool_calls) for m in messages if isinstance(m, AIMessage))
                calls = []
                for k, spec in enumerate(tools):
                    name, _, raw = spec.partition(" ")
                    calls.append({"name": name, "args": json.loads(raw or "{}"), "id": f"call_{n + k}",
                                  "type": "tool_call"})
                out = AIMessage(content="", tool_calls=calls)
            elif tools:
                out = AIMessage(content=f"done: {results} tool calls")
            else:
                plain = "\n".join(ln for ln in lines if not ln.startswith("!")).strip()
                out = AIMessage(content=f"echo: {plain}")
            out.usage_metadata = {"input_tokens": chars // 4, "output_tokens": len(str(out.content)) // 4,
                                  "total_tokens": chars // 4 + len(str(out.content)) // 4}
            return out

        def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                      **kwargs: Any) -> ChatResult:
            if self.latency_ms:
                time.sleep(self.latency_ms / 1000)
            return ChatResult(generations=[ChatGeneration(message=self._answer(messages))])

        async def _agenerate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                             **kwargs: Any) -> ChatResult:
            if clock is not None:
                async for _ in self._astream(messages):
                    pass
                return ChatResult(generations=[ChatGeneration(message=self._answer(messages))])
            if self.latency_ms:
                await asyncio.sleep(self.latency_ms / 1000)
            return ChatResult(generations=[ChatGeneration(message=self._answer(messages))])

        async def _astream(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                           **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
            if clock is None:  # not on the clock: the whole answer in one piece, as _agenerate gives it
                yield ChatGenerationChunk(message=AIMessageChunk(**(await self._agenerate(messages)).generations[0]
                                                                 .message.model_dump(exclude={"type"})))
                return
            started = time.perf_counter()
            await asyncio.sleep(draw_latency_ms(clock, rng) / 1000)
            answer = self._answer(messages)
            text = str(answer.content)
            chars_per_s = clock["tokens_per_s"] * 4
            t0 = asyncio.get_running_loop().time()
            for k in range(0, len(text), 6):
                if chars_per_s:
                    delay = t0 + min(len(text), k + 6) / chars_per_s - asyncio.get_running_loop().time()
                    await asyncio.sleep(max(0.0, delay))
                yield ChatGenerationChunk(message=AIMessageChunk(content=text[k:k + 6]))
            last = AIMessageChunk(content="", usage_metadata=answer.usage_metadata,
                                  tool_call_chunks=[{"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"],
                                                     "index": i} for i, c in enumerate(answer.tool_calls)])
            yield ChatGenerationChunk(message=last)
            times = TURN_MODEL_MS.get()
            if times is not None:
                times.append((time.perf_counter() - started) * 1000)

    def list_files(path: str = ".") -> dict[str, Any]:
        """The entries of a directory, sorted, directories with a trailing '/'."""
        real = os.path.realpath(os.path.join(workspace, path))
        with os.scandir(real) as scan:
            entries = sorted((e.name + "/" if e.is_dir() else e.name) for e in scan)
        return {"path": path, "entries": entries[:1000], "truncated": len(entries) > 1000}

    async def alist_files(path: str = ".") -> dict[str, Any]:
        return list_files(path)

    tool = StructuredTool.from_function(func=list_files, coroutine=alist_files, name="list_files")
    rng = random.Random(clock["seed"] if clock is not None else 0)
    model = MockChatModel(latency_ms=latency_ms)

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    async def acall_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", RunnableLambda(call_model, afunc=acall_model, name="agent"))
    builder.add_node("tools", ToolNode([tool]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


def turn_input(text: str) -> dict[str, Any]:
    from langchain_core.messages import HumanMessage

    return {"messages": [HumanMessage(content=text)]}


def check_threads(states: dict[str, Any], sent: dict[str, list[bool]]) -> dict[str, Any]:
    """Each thread's final checkpoint holds every turn once: its human message, then (for a tool
    turn) one tool call and one tool result, then the expected answer."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    lost = dup = wrong = 0
    problems: list[str] = []
    for tid, tools in sent.items():
        messages = states[tid].values.get("messages", []) if states.get(tid) is not None else []
        humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
        if len(humans) != len(tools):
            lost += max(0, len(tools) - len(humans))
            dup += max(0, len(humans) - len(tools))
            problems.append(f"thread {tid}: {len(tools)} turns sent, {len(humans)} in the checkpoint")
        for k, start in enumerate(humans[:len(tools)]):
            end = humans[k + 1] if k + 1 < len(humans) else len(messages)
            text = TOOL_TEXT if tools[k] else PLAIN_TEXT
            turn = messages[start:end]
            answer = turn[-1].content if turn and isinstance(turn[-1], AIMessage) else None
            n_tools = sum(isinstance(m, ToolMessage) for m in turn)
            if turn[0].content != text or answer != EXPECTED[text] or n_tools != int(tools[k]):
                wrong += 1
                problems.append(f"thread {tid} turn {k + 1}: {turn[0].content!r} -> {answer!r}, {n_tools} tools")
    return {"ok": not (lost or dup or wrong), "turns_verified": sum(len(t) for t in sent.values()),
            "lost": lost, "duplicated": dup, "wrong": wrong, "problems": problems[:10]}


def sqlite_counts(path: str) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        return {"checkpoints": conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0],
                "writes": conn.execute("SELECT count(*) FROM writes").fetchone()[0]}


def job_langgraph(spec: dict[str, Any]) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="bench-langgraph-")
    try:
        workspace = os.path.join(work, "workspace")
        os.makedirs(workspace)
        db = os.path.join(work, "checkpoints.sqlite")
        run = lg_threads if spec["lg_driver"] == "threads" else lg_asyncio
        out = run(spec, db, workspace)
        counts = sqlite_counts(db)
        out["checkpoint_rows"] = counts["checkpoints"]
        out["checkpoint_rows_per_s"] = counts["checkpoints"] / out["seconds"]
        out["writes_rows_per_s"] = counts["writes"] / out["seconds"]
        out["checkpoint_rows_per_turn"] = counts["checkpoints"] / out["turns"]
        out["db_mib"] = sum(os.path.getsize(os.path.join(work, f)) for f in os.listdir(work)
                            if f.startswith("checkpoints")) / 2**20
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def summarize(spec: dict[str, Any], latencies: list[float], wall: float, cpu: float) -> dict[str, Any]:
    lat = sorted(latencies)
    return {"turns": len(lat), "seconds": wall, "turns_per_s": len(lat) / wall,
            "p50_ms": percentile(lat, 0.50) * 1000, "p95_ms": percentile(lat, 0.95) * 1000,
            "p99_ms": percentile(lat, 0.99) * 1000, "cpu_ms_per_turn": cpu / len(lat) * 1000,
            "peak_rss_mib": rss_peak_mib()}


def lg_asyncio(spec: dict[str, Any], db: str, workspace: str) -> dict[str, Any]:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    n, m = spec["sessions"], spec["turns"]
    sent: dict[str, list[bool]] = {f"thread-{i}": [] for i in range(n)}
    latencies: list[float] = []

    async def main() -> tuple[float, float, dict[str, Any]]:
        async with AsyncSqliteSaver.from_conn_string(db) as saver:
            await saver.setup()
            graph = langgraph_agent(saver, workspace, spec["llm_latency_ms"])
            gate = asyncio.Semaphore(spec["concurrency"] or n)

            async def session(i: int) -> None:
                tid = f"thread-{i}"
                config = {"configurable": {"thread_id": tid}}
                for j in range(m):
                    tool = is_tool_turn(spec["tool_ratio"], i, j)
                    async with gate:
                        sent[tid].append(tool)
                        t0 = time.perf_counter()
                        await graph.ainvoke(turn_input(TOOL_TEXT if tool else PLAIN_TEXT), config)
                        latencies.append(time.perf_counter() - t0)

            cpu0, t0 = time.process_time(), time.perf_counter()
            await asyncio.gather(*(session(i) for i in range(n)))
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            states = {tid: await graph.aget_state({"configurable": {"thread_id": tid}}) for tid in sent}
            return wall, cpu, states

    wall, cpu, states = asyncio.run(main())
    return {**summarize(spec, latencies, wall, cpu), "check": check_threads(states, sent)}


def lg_threads(spec: dict[str, Any], db: str, workspace: str) -> dict[str, Any]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    n, m = spec["sessions"], spec["turns"]
    sent: dict[str, list[bool]] = {f"thread-{i}": [] for i in range(n)}
    latencies: list[float] = []
    conn = sqlite3.connect(db, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    graph = langgraph_agent(saver, workspace, spec["llm_latency_ms"])
    workers = min(spec["concurrency"] or n, spec["lg_workers"])

    def session(i: int) -> None:
        tid = f"thread-{i}"
        config = {"configurable": {"thread_id": tid}}
        for j in range(m):
            tool = is_tool_turn(spec["tool_ratio"], i, j)
            sent[tid].append(tool)
            t0 = time.perf_counter()
            graph.invoke(turn_input(TOOL_TEXT if tool else PLAIN_TEXT), config)
            latencies.append(time.perf_counter() - t0)

    cpu0, t0 = time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(session, range(n)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    states = {tid: graph.get_state({"configurable": {"thread_id": tid}}) for tid in sent}
    conn.close()
    return {**summarize(spec, latencies, wall, cpu), "workers": workers, "check": check_threads(states, sent)}


def lg_realistic(spec: dict[str, Any]) -> dict[str, Any]:
    """``benchmarks/bench_realistic.py``'s workload on LangGraph's async API: every session at once,
    ``turns`` turns closed-loop each (the same inputs as its bots send), the fake model on the same
    clock; a share ``subscribed`` of the sessions run with ``astream(stream_mode="messages")``
    taking every chunk, the others ``ainvoke``. Per turn: the latency and the model's own time."""
    from langchain_core.messages import AIMessage
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from benchmarks.realistic_client import turn_text

    work = tempfile.mkdtemp(prefix="bench-langgraph-realistic-")
    workspace = os.path.join(work, "workspace")
    os.makedirs(workspace)
    db = os.path.join(work, "checkpoints.sqlite")
    n, m = spec["sessions"], spec["turns"]
    every = max(1, round(1 / spec["subscribed"])) if spec["subscribed"] > 0 else 0
    latency_s: list[float] = []
    model_ms: list[float] = []
    chunks = [0]
    problems: list[str] = []

    async def main() -> tuple[float, float, int]:
        async with AsyncSqliteSaver.from_conn_string(db) as saver:
            await saver.setup()
            graph = langgraph_agent(saver, workspace, 0.0, clock=spec)

            async def session(i: int) -> None:
                config = {"configurable": {"thread_id": f"thread-{i}"}}
                streamed = bool(every) and i % every == 0
                for t in range(m):
                    text = turn_text(spec, i // 100, i % 100, t)
                    times: list[float] = []
                    TURN_MODEL_MS.set(times)
                    t0 = time.perf_counter()
                    if streamed:
                        parts = []
                        async for chunk, _meta in graph.astream(turn_input(text), config, stream_mode="messages"):
                            chunks[0] += 1
                            if isinstance(chunk, AIMessage):
                                parts.append(str(chunk.content))
                        answer = "".join(parts)
                    else:
                        answer = str((await graph.ainvoke(turn_input(text), config))["messages"][-1].content)
                    latency_s.append(time.perf_counter() - t0)
                    model_ms.append(sum(times) if times else float("nan"))
                    if answer != f"echo: {text}" and len(problems) < 10:
                        problems.append(f"thread-{i} turn {t}: {answer[:60]!r}")

            cpu0, t0 = time.process_time(), time.perf_counter()
            await asyncio.gather(*(session(i) for i in range(n)))
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            sample = [await graph.aget_state({"configurable": {"thread_id": f"thread-{i}"}}) for i in range(0, n, 97)]
            short = sum(1 for st in sample if len(st.values.get("messages", [])) != 2 * m)
            return wall, cpu, short

    try:
        wall, cpu, short = asyncio.run(main())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    turns = len(latency_s)
    if short:
        problems.append(f"{short} sampled threads' checkpoints do not hold 2 x {m} messages")
    return {"workers": 1, "sessions": n, "turns": turns, "failed_turns": n * m - turns + len(problems),
            "seconds": wall, "turns_per_s": turns / wall, "latency_s": latency_s, "model_ms": model_ms,
            "server_cpu_ms_per_turn": cpu / turns * 1000, "client_cpu_ms_per_turn": float("nan"),
            "cores_used": cpu / wall, "peak_rss_mib": rss_peak_mib(), "watched_sessions": (n + every - 1) // every
            if every else 0, "owner_frames_per_watched_turn": chunks[0] / max(1, ((n + every - 1) // every) * m)
            if every else 0.0, "problems": problems}


# --- sessionloop side -----------------------------------------------------------------------------


def job_sessionloop(spec: dict[str, Any]) -> dict[str, Any]:
    cfg = BenchConfig(sessions=spec["sessions"], turns=spec["turns"], concurrency=spec["concurrency"],
                      tool_ratio=spec["tool_ratio"], via="inprocess", durability=spec["durability"],
                      llm_latency_ms=spec["llm_latency_ms"], progress=False, observe=spec["observe"])
    report = run_bench(cfg)
    report.pop("params")
    observers = report.pop("observers")
    if not observers["ok"]:
        report["check"] = {**report["check"], "ok": False, "observers": observers}
    report["observed_deltas_per_turn"] = observers.get("deltas_per_turn", 0.0)
    return report


JOBS = {"langgraph": job_langgraph, "sessionloop": job_sessionloop}


# --- the parent -----------------------------------------------------------------------------------


def run_child(spec: dict[str, Any], pinned: bool) -> dict[str, Any]:
    out = run_job(__file__, spec, pinned=pinned, cwd=REPO)
    if not out["check"]["ok"]:
        raise SystemExit(f"{spec['system']}: result check FAILED: {out['check']}")
    return out

def median_of(samples: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: statistics.median(s[k] for s in samples) for k in samples[0]
                           if isinstance(samples[0][k], (int, float)) and not isinstance(samples[0][k], bool)}
    out["check"] = samples[-1]["check"]
    out["samples"] = samples
    return out


def systems(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    drivers = ["asyncio", "threads"] if args.lg_driver == "both" else [args.lg_driver]
    out = [(f"langgraph {d}", {"system": "langgraph", "lg_driver": d, "lg_workers": args.lg_workers})
           for d in drivers]
    out += [(f"sessionloop {d}/{o}", {"system": "sessionloop", "durability": d, "observe": o})
            for o in args.observe for d in ("sync", "nosync")]
    return out


ROWS = [("turns_per_s", "turns/s", ",.0f"), ("p50_ms", "p50 turn latency (ms)", ",.1f"),
        ("p95_ms", "p95 turn latency (ms)", ",.1f"), ("p99_ms", "p99 turn latency (ms)", ",.1f"),
        ("cpu_ms_per_turn", "CPU ms per turn", ".3f"), ("events_per_s", "events/s (sessionloop)", ",.0f"),
        ("checkpoint_rows_per_s", "checkpoints/s (langgraph)", ",.0f"),
        ("observed_deltas_per_turn", "deltas observed per turn", ".2f"), ("peak_rss_mib", "peak RSS (MiB)", ",.0f"),
        ("seconds", "seconds", ",.1f")]


def print_table(title: str, results: dict[str, dict[str, Any]]) -> None:
    names = list(results)
    w = max(22, *(len(n) + 2 for n in names))
    print(f"\n{title}")
    print(f"{'measure':<30}" + "".join(f"{n:>{w}}" for n in names))
    print("-" * (30 + w * len(names)))
    for key, label, fmt in ROWS:
        cells = [format(results[n][key], fmt) if key in results[n] else "-" for n in names]
        print(f"{label:<30}" + "".join(f"{c:>{w}}" for c in cells))
    base = [n for n in names if n.startswith("langgraph")]
    best = max(base, key=lambda n: results[n]["turns_per_s"])
    cells = [f"{results[n]['turns_per_s'] / results[best]['turns_per_s']:.1f}x" for n in names]
    print(f"{'ratio vs ' + best + ' (turns/s)':<30}" + "".join(f"{c:>{w}}" for c in cells))


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 100 sessions x 4 turns")
    ap.add_argument("--sessions", type=int, help="sessions / LangGraph threads (default 1000; 100 with --quick)")
    ap.add_argument("--turns", type=int, help="turns per session (default 10; 4 with --quick)")
    ap.add_argument("--concurrency", type=int, default=None, help="turns in flight at most (default: all)")
    ap.add_argument("--tool-ratio", type=float, default=0.5, help="share of turns with one list_files call")
    ap.add_argument("--llm-latency", type=float, default=0.0, help="fake model delay per call (ms), both sides")
    ap.add_argument("--lg-driver", choices=["asyncio", "threads", "both"], default="asyncio",
                    help="LangGraph concurrency: asyncio (ainvoke) or a thread pool (invoke)")
    ap.add_argument("--lg-workers", type=int, default=32, help="thread pool size for --lg-driver threads")
    ap.add_argument("--repeats", type=int, default=1, help="runs per figure; the median is reported")
    ap.add_argument("--no-pinned", action="store_true", help="skip the runs pinned to CPU 0")
    ap.add_argument("--observe", default="subscriber,none",
                    help="sessionloop: who watches the turns stream, comma-separated, each measured: "
                         f"{', '.join(OBSERVE_MODES)} (cli/bench_observers.py)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    fill_defaults(args, [("sessions", 1000, 100), ("turns", 10, 4)])
    args.observe = [m.strip() for m in args.observe.split(",") if m.strip()]
    wrong = [m for m in args.observe if m not in OBSERVE_MODES]
    if wrong or not args.observe:
        ap.error(f"--observe: one or more of {', '.join(OBSERVE_MODES)}, got {wrong or 'nothing'}")
    return args


def main() -> None:
    args = parse_args()
    if args.child:
        spec = json.loads(args.child)
        from sessionloop.actors.system import gc_policy

        gc_policy.apply()  # both systems' children get the GC settings sessionloop's server uses
        print(json.dumps(JOBS[spec["system"]](spec)))
        return
    base = {"sessions": args.sessions, "turns": args.turns, "concurrency": args.concurrency,
            "tool_ratio": args.tool_ratio, "llm_latency_ms": args.llm_latency}
    pinnings = [("unpinned", False)]
    if not args.no_pinned and shutil.which("taskset"):
        pinnings.append(("pinned_cpu0", True))
    samples: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(args.repeats):
        for label, pinned in pinnings:
            for name, extra in systems(args):
                print(f"running {name} ({label}) ...", file=sys.stderr, flush=True)
                samples.setdefault((label, name), []).append(run_child({**base, **extra}, pinned))
    results: dict[str, Any] = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": args.quick,
                               "params": {**base, "repeats": args.repeats, "lg_driver": args.lg_driver,
                                          "observe": args.observe},
                               "runs": {}}
    for label, _ in pinnings:
        table = {name: median_of(samples[(label, name)]) for name, _ in systems(args)}
        results["runs"][label] = table
        lg = max((n for n in table if n.startswith("langgraph")), key=lambda n: table[n]["turns_per_s"])
        results["runs"][label]["ratios"] = {n: table[n]["turns_per_s"] / table[lg]["turns_per_s"]
                                            for n in table if n.startswith("sessionloop")}
        print_table(f"{args.sessions} sessions x {args.turns} turns, tool ratio {args.tool_ratio:g}, "
                    f"llm latency {args.llm_latency:g} ms, {label} (medians of {args.repeats})",
                    {n: r for n, r in table.items() if n != "ratios"})
    print("\ntarget (SPEC §10): sessionloop >= 20x LangGraph, same run")
    for label, _ in pinnings:
        ratios = results["runs"][label]["ratios"]
        print(f"  {label}: " + ", ".join(f"{n} {r:.1f}x" for n, r in ratios.items()))
    write_results("compare_langgraph", results)


if __name__ == "__main__":
    main()
