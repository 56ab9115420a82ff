"""benchmarks/bench_turns.py measures turns with their observers, and its run fails if they did not
get every answer streamed whole (a small job in this process: the checks, not speed)."""

from __future__ import annotations

import gc
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def bench_turns():
    spec = importlib.util.spec_from_file_location("bench_turns", os.path.join(ROOT, "benchmarks", "bench_turns.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    thresholds = gc.get_threshold()
    yield module
    gc.unfreeze()  # the job freezes its startup objects and keeps the server's GC settings
    gc.set_threshold(*thresholds)


@pytest.mark.parametrize("observe, pushes", [("subscriber", 5), ("watcher", 5), ("none", 0)])
def test_a_throughput_job_reports_what_its_observers_saw_streamed(bench_turns, observe, pushes):
    out = bench_turns.job_throughput({"sessions": 4, "turns": 2, "llm_latency_ms": 0, "threads": None,
                                      "durability": "nosync", "rate": None, "observe": observe})
    assert out["turns_verified"] == 8
    assert out["observed_pushes_per_turn"] >= pushes
    # "echo: hello world" and "done: 1 tool calls" are 3 deltas of 6 characters each
    assert out["observed_deltas_per_turn"] == (3.0 if observe != "none" else 0.0)
