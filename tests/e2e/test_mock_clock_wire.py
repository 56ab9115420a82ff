"""The mock model on the clock over a real ``sessionloop serve``: the ``--mock-*`` flags and a mock's
``[models.NAME]`` table make it wait before the first token and stream at a rate of tokens, the
startup log says so, a seed repeats the delays in another process, and values out of bounds refuse
the start naming the flag or key; ``sessionloop bench`` runs with that clock and records it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import pytest

from sessionloop.actors.model.mock import MockProvider
from tests.conftest import REPO
from tests.e2e.conftest import ServerProcess, initialized, open_client
from tests.e2e.test_models_wire import data_with, log_of, refused

pytestmark = pytest.mark.e2e

#: "echo: " and 394 characters: a 400-character, 100-token answer
TEXT_100_TOKENS = ("the quick brown fox jumps over the lazy dog " * 9)[:394]


async def timed_turns(server: ServerProcess, texts: list[str]) -> list[dict[str, Any]]:
    """Per turn: seconds from the send to its first delta and to its end, and the deltas' text."""
    out = []
    async with open_client(server) as ws:
        c = await initialized(ws)
        sid = (await c.result("session/create", {}))["session"]["id"]
        await c.result("session/subscribe", {"sessionId": sid})
        for text in texts:
            c.pushes.clear()
            sent = time.perf_counter()
            await c.result("turn/send", {"sessionId": sid, "content": text})
            first: float | None = None
            deltas: list[str] = []
            while True:
                push = await c.push(lambda m: m["params"].get("sessionId") == sid and m["method"].startswith("item/"),
                                    30)
                if push["method"] == "item/delta":
                    first = first if first is not None else time.perf_counter() - sent
                    deltas.append(push["params"]["text"])
                elif push["method"] == "item/completed" and push["params"]["item"]["kind"] == "turn":
                    out.append({"first": first, "end": time.perf_counter() - sent, "deltas": deltas,
                                "outcome": push["params"]["item"]["outcome"]})
                    break
    return out


def test_the_mock_flags_make_the_default_model_wait_then_stream_at_the_rate(server_factory):
    server = server_factory("--mock-latency-ms", "300", "--mock-stream-tokens-per-s", "200", "--mock-seed", "4")
    [turn] = asyncio.run(timed_turns(server, [TEXT_100_TOKENS]))
    assert turn["outcome"] == "replied"
    assert "".join(turn["deltas"]) == f"echo: {TEXT_100_TOKENS}" and len(turn["deltas"]) >= 20
    assert 0.3 <= turn["first"] <= 0.45, turn["first"]  # the latency, then the first 6 characters
    assert 0.8 <= turn["end"] <= 1.2, turn["end"]  # 300 ms, then 100 tokens at 200 tokens/s
    [line] = [ln for ln in log_of(server).splitlines() if "sessionloop.models: model default:" in ln]
    assert "provider mock, model id mock, latency 300 ms, 200 tokens/s, seed 4" in line and "(--model-* flags)" in line


def test_a_seeded_mock_in_config_toml_waits_the_delays_its_seed_draws_in_this_process(tmp_path):
    data = data_with(tmp_path, '[models.default]\nprovider = "mock"\nlatency_ms = 250\nlatency_jitter = "uniform"\n'
                               'seed = 11\n')
    reference = MockProvider(latency_ms=250, latency_jitter="uniform", seed=11)
    expected = [reference.draw_latency_ms() / 1000 for _ in range(4)]
    server = ServerProcess(data).start()
    try:
        turns = asyncio.run(timed_turns(server, [f"call {i}" for i in range(4)]))
        assert "model default: provider mock, model id mock, latency 250 ms uniform, seed 11" in log_of(server)
    finally:
        server.stop()
    for want, turn in zip(expected, turns, strict=True):
        assert want - 0.005 <= turn["first"] <= want + 0.15, ([t["first"] for t in turns], expected)


@pytest.mark.parametrize("flags, names", [
    (["--mock-latency-jitter", "gaussian"], ["--mock-latency-jitter", "gaussian"]),
    (["--mock-latency-sigma", "9"], ["--mock-latency-sigma", "9"]),
    (["--mock-stream-tokens-per-s", "-1"], ["--mock-stream-tokens-per-s"]),
    (["--mock-seed", "-2"], ["--mock-seed"]),
])
def test_serve_refuses_a_mock_flag_out_of_bounds_naming_it(tmp_path, flags, names):
    done = refused(str(tmp_path / "data"), *flags)
    assert done.returncode == 2 and done.stdout == "" and f"Invalid value for '{flags[0]}'" in done.stderr, done.stderr
    for name in names:
        assert name in done.stderr, done.stderr


@pytest.mark.parametrize("config_toml, flags, names", [
    (None, ["--mock-latency-jitter", "lognormal"],
     ["--model-* flags [models.default]", "latency_jitter lognormal needs latency_ms > 0"]),
    ('[models.default]\nprovider = "mock"\nlatency_ms = -3\n', [],
     ["config.toml [models.default]", "latency_ms must be a number from 0 to 600000"]),
    (None, ["--model-provider", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model-name", "m",
            "--mock-latency-ms", "5"],
     ["[models.default]", "latency_ms: only the mock provider takes it"]),
])
def test_serve_refuses_a_clock_that_cannot_be_used_with_one_line_naming_the_model_and_key(tmp_path, config_toml,
                                                                                          flags, names):
    data = data_with(tmp_path, config_toml) if config_toml is not None else str(tmp_path / "data")
    done = refused(data, *flags)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    for name in names:
        assert name in lines[0], lines[0]


def bench(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sessionloop", "bench", "--sessions", "4", "--turns", "2",
                           "--durability", "nosync", "--no-progress", *flags],
                          capture_output=True, text=True, timeout=120, cwd=REPO, check=False)


@pytest.mark.parametrize("via", ["inprocess", "ws"])
def test_sessionloop_bench_runs_the_mock_on_its_clock_and_records_it_in_the_json_parameters(via):
    done = bench("--via", via, "--llm-latency", "150", "--latency-jitter", "lognormal", "--latency-sigma", "0.2",
                 "--stream-tokens-per-s", "100", "--seed", "8", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {k: report["params"][k] for k in ("llm_latency_ms", "latency_jitter", "latency_sigma",
                                             "stream_tokens_per_s", "seed")} == \
        {"llm_latency_ms": 150.0, "latency_jitter": "lognormal", "latency_sigma": 0.2, "stream_tokens_per_s": 100.0,
         "seed": 8}
    assert report["check"]["ok"] and report["observers"]["ok"]
    # a plain turn waits ~150 ms, then "echo: hello world" (17 characters) streams for ~40 ms; a tool turn twice
    assert report["p50_ms"] >= 150, report["p50_ms"]


def test_sessionloop_bench_refuses_a_clock_out_of_bounds_naming_the_flag():
    done = bench("--latency-jitter", "uniform")
    assert done.returncode == 2 and "--latency-jitter" in done.stderr and "needs latency_ms > 0" in done.stderr
    done = bench("--llm-latency", "10", "--stream-tokens-per-s", "-3")
    assert done.returncode == 2 and "Invalid value for --stream-tokens-per-s" in done.stderr
    assert "stream_tokens_per_s must be a number from 0 to" in done.stderr
