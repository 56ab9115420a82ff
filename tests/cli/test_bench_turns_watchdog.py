"""benchmarks/bench_turns.py fails a run whose turn does not end in time (one watchdog, no timer per turn)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def bench_turns(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_turns", os.path.join(ROOT, "benchmarks", "bench_turns.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "TURN_TIMEOUT_S", 0.2)
    return module


def test_a_turn_stuck_longer_than_the_timeout_fails_the_run_naming_its_session(bench_turns):
    rec = bench_turns.Record()

    async def stuck() -> None:
        rec.in_flight[object()] = ("s-stuck", time.monotonic())
        await asyncio.sleep(30)

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="a turn of session s-stuck did not end within 0.2 s"):
        asyncio.run(bench_turns.watchdog(rec, stuck()))
    assert time.monotonic() - started < 5


def test_work_that_finishes_in_time_returns_and_its_error_propagates(bench_turns):
    rec = bench_turns.Record()

    async def fine() -> None:
        await asyncio.sleep(0.01)

    async def broken() -> None:
        raise ValueError("bad driver")

    asyncio.run(bench_turns.watchdog(rec, fine()))
    with pytest.raises(ValueError, match="bad driver"):
        asyncio.run(bench_turns.watchdog(rec, broken()))
