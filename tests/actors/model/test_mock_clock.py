"""The mock model on the clock: latency before the first token (fixed, log-normal or uniform, from a
seeded generator) and answers paced at a rate of tokens, on a real host in a temporary directory.
The waiting happens on the worker loop: the session actor's thread stays free to answer."""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
from typing import Any

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.events import Message
from sessionloop.actors.model.base import ModelError, ModelRequest
from sessionloop.actors.model.mock import TOKEN_CHARS, MockProvider
from sessionloop.actors.model.registry import ModelConfigError, load_model_configs, make_provider
from tests.actors.gateway_harness import MemoryClient

#: a 100-token answer: "echo: " and 394 characters make 400 characters, 4 a token
TEXT_100_TOKENS = ("the quick brown fox jumps over the lazy dog " * 9)[:394]
ANSWER = f"echo: {TEXT_100_TOKENS}"


def user(text: str) -> Message:
    return Message(role="user", content=text)


class TimedClient(MemoryClient):
    """A gateway client that notes when each frame arrived (``perf_counter``)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        self.arrived: list[tuple[float, dict[str, Any]]] = []
        super().__init__(*args, **kw)

    def _send(self, text: str) -> None:
        self.arrived.append((time.perf_counter(), json.loads(text)))
        super()._send(text)

    def deltas(self, sid: str) -> list[tuple[float, str]]:
        return [(t, f["params"]["text"]) for t, f in list(self.arrived)
                if f.get("method") == "item/delta" and f["params"]["sessionId"] == sid]

    def turn_end(self, sid: str, timeout: float = 15) -> dict[str, Any]:
        return self.wait(lambda f: f.get("method") == "item/completed" and f["params"]["sessionId"] == sid
                         and f["params"]["item"]["kind"] == "turn", timeout, remove=True)["params"]["item"]


def subscribed(svc: Any) -> tuple[TimedClient, str]:
    c = TimedClient(svc)
    sid = c.result("session/create", {})["session"]["id"]
    c.result("session/subscribe", {"sessionId": sid})
    return c, sid


def draws(n: int, **clock: Any) -> list[float]:
    provider = MockProvider(**clock)
    return [provider.draw_latency_ms() for _ in range(n)]


# --- the jitter -------------------------------------------------------------------------------


@pytest.mark.parametrize("jitter", ["lognormal", "uniform"])
def test_the_median_of_2000_seeded_draws_is_within_a_tenth_of_latency_ms(jitter):
    delays = draws(2000, latency_ms=800, latency_jitter=jitter, seed=20)
    assert abs(statistics.median(delays) - 800) <= 80, statistics.median(delays)
    assert len(set(delays)) == 2000  # a draw per call, not one delay for all
    if jitter == "uniform":
        assert 0 <= min(delays) and max(delays) <= 1600 and min(delays) < 100 and max(delays) > 1500


def test_without_a_jitter_every_call_waits_exactly_latency_ms():
    assert set(draws(50, latency_ms=250, seed=1)) == {250.0}


def test_the_lognormal_spread_grows_with_sigma_and_matches_it():
    def spread(sigma: float) -> float:
        q = statistics.quantiles(draws(2000, latency_ms=500, latency_jitter="lognormal", latency_sigma=sigma,
                                       seed=7), n=4)
        return q[2] / q[0]  # p75 / p25 of a log-normal is exp(2 * 0.674 * sigma)

    spreads = [spread(s) for s in (0.1, 0.5, 1.0, 2.0)]
    assert spreads == sorted(spreads) and spreads[-1] > 10 * spreads[0], spreads
    assert 1.7 < spreads[1] < 2.2  # exp(0.674) = 1.96 at the default sigma 0.5


def test_the_same_seed_draws_the_same_delays_and_another_seed_others():
    one = draws(100, latency_ms=300, latency_jitter="lognormal", seed=42)
    assert one == draws(100, latency_ms=300, latency_jitter="lognormal", seed=42)
    assert one != draws(100, latency_ms=300, latency_jitter="lognormal", seed=43)
    assert draws(100, latency_ms=300, latency_jitter="uniform", seed=42) == \
        draws(100, latency_ms=300, latency_jitter="uniform", seed=42)


def test_a_seeded_mock_on_a_host_waits_the_delays_its_seed_draws_before_the_first_token(service):
    clock = {"latency_ms": 200, "latency_jitter": "uniform", "seed": 9}
    expected = draws(4, **clock)
    host, svc = service(permission_mode="acceptCalls", model_options=clock)
    c, sid = subscribed(svc)
    waited = []
    for i in range(4):
        sent = time.perf_counter()
        c.result("turn/send", {"sessionId": sid, "content": f"call {i}"})
        c.turn_end(sid)
        first_delta = c.deltas(sid)[-len(chunked(f"echo: call {i}")):][0][0]
        waited.append((first_delta - sent) * 1000)
    durations = [e.event.duration_ms for e in host.session(sid).events() if isinstance(e.event, E.LlmCompleted)]
    for want, took, first in zip(expected, durations, waited, strict=True):
        assert want - 2 <= took <= want + 60, (expected, durations)
        assert want - 2 <= first <= want + 100, (expected, waited)


def chunked(text: str) -> list[str]:
    return [text[i:i + 6] for i in range(0, len(text), 6)]


# --- pacing -----------------------------------------------------------------------------------


def test_a_100_token_answer_at_200_tokens_per_s_streams_over_half_a_second_in_many_deltas(service):
    host, svc = service(permission_mode="acceptCalls", model_options={"stream_tokens_per_s": 200})
    c, sid = subscribed(svc)
    assert len(ANSWER) == 100 * TOKEN_CHARS
    sent = time.perf_counter()
    c.result("turn/send", {"sessionId": sid, "content": TEXT_100_TOKENS})
    turn = c.turn_end(sid)
    took = time.perf_counter() - sent
    assert turn["outcome"] == "replied"
    assert 0.45 <= took <= 0.8, took
    deltas = c.deltas(sid)
    assert len(deltas) >= 20 and "".join(t for _, t in deltas) == ANSWER
    # paced, not bunched: they arrive evenly over the half second
    times = [t - sent for t, _ in deltas]
    assert times[0] < 0.1 and times[-1] > 0.4, (times[0], times[-1])
    assert times[len(times) // 2] == pytest.approx(0.25, abs=0.1)
    [llm] = [e.event for e in host.session(sid).events() if isinstance(e.event, E.LlmCompleted)]
    assert 450 <= llm.duration_ms <= 800


def test_while_an_answer_streams_the_session_answers_a_status_query_within_100_ms(service, paused_gc):
    host, svc = service(permission_mode="acceptCalls", model_options={"stream_tokens_per_s": 200})
    c, sid = subscribed(svc)
    c.result("turn/send", {"sessionId": sid, "content": TEXT_100_TOKENS})
    c.wait(lambda f: f.get("method") == "item/delta", 5)  # streaming has begun
    session = host.session(sid)
    took = []
    for _ in range(5):
        started = time.perf_counter()
        assert session.state == "running"
        took.append(time.perf_counter() - started)
        time.sleep(0.05)
    assert max(took) < 0.1, took
    assert len(c.deltas(sid)) < 60  # asked while it streamed, not after
    assert c.turn_end(sid)["outcome"] == "replied"


def test_turn_abort_during_a_paced_answer_answers_within_100_ms_and_stops_the_stream(service, paused_gc):
    host, svc = service(permission_mode="acceptCalls", model_options={"stream_tokens_per_s": 200})
    c, sid = subscribed(svc)
    c.result("turn/send", {"sessionId": sid, "content": TEXT_100_TOKENS})
    c.wait(lambda f: f.get("method") == "item/delta", 5)
    time.sleep(0.1)
    started = time.perf_counter()
    c.result("turn/abort", {"sessionId": sid})
    took = time.perf_counter() - started
    assert took < 0.1, took
    turn = c.turn_end(sid)
    assert turn["outcome"] == "aborted", turn
    count = len(c.deltas(sid))
    time.sleep(0.3)  # the rest of the answer would have streamed by now
    assert len(c.deltas(sid)) == count < 60


def test_latency_and_pacing_add_up_and_the_tool_calls_arguments_take_their_time():
    provider = MockProvider(latency_ms=100, stream_tokens_per_s=100)
    args = {"path": "x" * 380}  # 393 characters of JSON: about a second at 400 characters/s
    started = time.perf_counter()
    response = run_generate(provider, f"!tool read_file {json.dumps(args)}")
    assert response.tool_calls and 1.05 <= time.perf_counter() - started <= 1.4


def run_generate(provider: MockProvider, text: str) -> Any:
    return asyncio.run(provider.generate(ModelRequest(messages=[user(text)]), lambda kind, piece: None))


def test_a_sleep_directive_replaces_the_pacing_of_its_call():
    provider = MockProvider(stream_tokens_per_s=1)  # 4 characters a second: "echo: x" would take 1.75 s
    started = time.perf_counter()
    assert run_generate(provider, "!sleep 100\nx").text == "echo: x"
    assert time.perf_counter() - started < 0.5


# --- the fast path ------------------------------------------------------------------------------


@pytest.mark.parametrize("clock, in_place", [
    ({}, True),
    ({"seed": 3, "latency_sigma": 1.5}, True),  # a seed or a sigma alone spends no time
    ({"latency_ms": 1}, False),
    ({"stream_tokens_per_s": 1000}, False),
])
def test_only_a_mock_that_spends_time_leaves_the_in_place_answer(clock, in_place):
    deltas: list[str] = []
    answered = MockProvider(**clock).answer_now(ModelRequest(messages=[user("hi")]), lambda k, t: deltas.append(t))
    assert (answered is not None) is in_place
    assert ("".join(deltas) == "echo: hi") if in_place else deltas == []


# --- bounds -------------------------------------------------------------------------------------


@pytest.mark.parametrize("options, option", [
    ({"latency_ms": -1}, "latency_ms"),
    ({"latency_ms": 600_001}, "latency_ms"),
    ({"latency_ms": float("nan")}, "latency_ms"),
    ({"latency_ms": "800"}, "latency_ms"),
    ({"latency_ms": 100, "latency_jitter": "gaussian"}, "latency_jitter"),
    ({"latency_jitter": "lognormal"}, "latency_jitter"),  # a jitter needs a median
    ({"latency_ms": 100, "latency_sigma": -0.1}, "latency_sigma"),
    ({"latency_ms": 100, "latency_sigma": 3.5}, "latency_sigma"),
    ({"stream_tokens_per_s": -5}, "stream_tokens_per_s"),
    ({"stream_tokens_per_s": 10**7}, "stream_tokens_per_s"),
    ({"seed": -1}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"seed": True}, "seed"),
    ({"delta_chars": 0}, "delta_chars"),
])
def test_an_option_out_of_bounds_is_refused_naming_it(options, option, open_host):
    with pytest.raises(ModelError, match=f"^mock: {option} "):
        make_provider("mock", **options)
    with pytest.raises(ModelError, match=f"mock: {option} "):
        open_host(model_options=options)


def test_a_mock_table_in_config_toml_takes_the_clock_and_refuses_a_bad_value_naming_model_and_key(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[models.slow]\nprovider = "mock"\nlatency_ms = 800\nlatency_jitter = "lognormal"\n'
                    'latency_sigma = 0.25\nstream_tokens_per_s = 50\nseed = 1\n')
    [cfg] = load_model_configs(str(path))
    assert cfg.clock is not None and (cfg.clock.latency_ms, cfg.clock.seed) == (800, 1)
    assert "latency 800 ms lognormal (sigma 0.25), 50 tokens/s, seed 1" in cfg.describe()
    path.write_text('[models.slow]\nprovider = "mock"\nstream_tokens_per_s = "fast"\n')
    with pytest.raises(ModelConfigError, match=r"\[models.slow\]: mock: stream_tokens_per_s must be a number"):
        load_model_configs(str(path))
    path.write_text('[models.real]\nprovider = "openai"\nmodel = "m"\nbase_url = "http://127.0.0.1:9/v1"\n'
                    'latency_ms = 5\n')
    with pytest.raises(ModelConfigError, match=r"\[models.real\]: latency_ms: only the mock provider takes it"):
        load_model_configs(str(path))


def test_many_answers_waiting_and_streaming_at_once_hold_no_thread_each(service):
    """Slow answers wait and stream on the worker loop: no thread per waiting call."""
    clock = {"latency_ms": 300, "latency_jitter": "lognormal", "latency_sigma": 0.2, "stream_tokens_per_s": 20,
             "seed": 5}
    host, svc = service(permission_mode="acceptCalls", model_options=clock)
    before = threading.active_count()
    sessions = [host.create() for _ in range(30)]
    receipts = [s.send("x") for s in sessions]
    time.sleep(0.15)
    during = threading.active_count()
    assert [s.wait(r.turn_id, 10).output_text for s, r in zip(sessions, receipts, strict=True)] == ["echo: x"] * 30
    assert during - before < 30, (before, during)
