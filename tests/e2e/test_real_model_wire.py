"""A real ``sessionloop serve --model openai`` subprocess against a fake OpenAI-compatible server
on 127.0.0.1 (``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` / ``OPENAI_MODEL``): retries, a stream
restarted after a 500, ``turn/abort`` closing the model connection, and no key in any log line."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.e2e.conftest import initialized, open_client
from tests.e2e.test_metrics import scrape
from tests.fake_openai import Exchange, ThreadedFakeServer, chunk

pytestmark = pytest.mark.e2e

KEY = "sk-e2e-secret-key-0123456789abcdef"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture
def fake_model(server_factory):
    """``fake_model(script, *serve args, env) -> (fake server, sessionloop server)``."""
    fakes: list[ThreadedFakeServer] = []

    def make(script: Any, *extra: str, env: dict[str, str] | None = None) -> tuple[ThreadedFakeServer, Any]:
        fake = ThreadedFakeServer(script).__enter__()
        fakes.append(fake)
        server = server_factory("--model", "openai", *extra, env={
            "OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": KEY, "OPENAI_MODEL": "fake-model", **(env or {})})
        return fake, server

    yield make
    for fake in fakes:
        fake.__exit__()


async def turn(server: Any, text: str = "hi", *, abort_when: Any = None) -> tuple[dict[str, Any], list[dict]]:
    """Create a session, subscribe, send ``text``; with ``abort_when(frame)`` abort the turn at the
    first frame it accepts. Returns the turn item and every push of the session, in order."""
    async with open_client(server) as ws:
        c = await initialized(ws)
        sid = (await c.result("session/create", {}))["session"]["id"]
        await c.result("session/subscribe", {"sessionId": sid})
        await c.result("turn/send", {"sessionId": sid, "content": text})
        if abort_when is not None:
            await c.push(abort_when, 20)
            await c.result("turn/abort", {"sessionId": sid})
        done = await c.turn_done(sid, 30)
        pushes = [p for p in c.pushes if p["params"].get("sessionId") == sid]
        return done["params"]["item"], pushes


def agent_frames(pushes: list[dict]) -> list[tuple[str, str, Any]]:
    out = []
    for p in sorted(pushes, key=lambda p: p["params"]["seq"]):
        params = p["params"]
        if p["method"] == "item/delta":
            out.append(("delta", params["itemId"], params["text"]))
        elif p["method"].startswith("item/") and params["item"]["kind"] == "agent-message":
            out.append((p["method"], params["item"]["itemId"], params["item"]))
    return out


def test_a_429_then_success_completes_the_turn_and_metrics_count_the_retry_by_status(fake_model):
    async def script(x: Exchange) -> None:
        if x.number == 1:
            await x.error(429, "Rate limit reached", headers={"retry-after-ms": "50"})
            return
        await x.answer(["Hello ", "there"], usage={"prompt_tokens": 9, "completion_tokens": 2})

    fake, server = fake_model(script)
    item, pushes = run(turn(server))
    assert item["outcome"] == "replied"
    [message] = [f[2] for f in agent_frames(pushes) if f[0] == "item/completed"]
    assert message["text"] == "Hello there"
    assert message["model"]["promptTokens"] == 9 and message["model"]["completionTokens"] == 2
    assert len(fake.exchanges) == 2
    values = scrape(server)
    assert values['sessionloop_model_retries_total{model="fake-model",status="429"}'] == 1
    assert values['sessionloop_model_requests_total{model="fake-model"}'] == 2


def test_a_500_in_the_middle_of_a_stream_restarts_the_streamed_item_for_subscribers(fake_model):
    async def script(x: Exchange) -> None:
        if x.number == 1:
            await x.start_sse()
            await x.event(chunk("Part"))
            await x.event(chunk("ial"))
            await x.event({"error": {"message": "internal error", "type": "server_error", "code": 500}})
            await x.end()
            return
        await x.answer(["Complete ", "answer"])

    _, server = fake_model(script)
    item, pushes = run(turn(server))
    assert item["outcome"] == "replied"
    frames = agent_frames(pushes)
    first, second = frames[0][1], frames[-1][1]
    assert first != second
    assert [(kind, i, d if kind == "delta" else d["text"]) for kind, i, d in frames] == [
        ("item/started", first, ""), ("delta", first, "Part"), ("delta", first, "ial"),
        ("item/completed", first, "Partial"),
        ("item/started", second, ""), ("delta", second, "Complete "), ("delta", second, "answer"),
        ("item/completed", second, "Complete answer"),
    ]
    assert "HTTP 500" in frames[3][2]["undelivered"]["reason"]


def test_turn_abort_closes_the_model_connection_at_once(fake_model):
    async def script(x: Exchange) -> None:
        await x.start_sse()
        await x.event(chunk("streaming forever"))
        await x.wait_closed(60)

    fake, server = fake_model(script)
    item, _ = run(turn(server, abort_when=lambda p: p["method"] == "item/delta"))
    assert item["outcome"] == "aborted"
    fake.run(asyncio.wait_for(fake.exchanges[0].closed.wait(), 10))  # the server hung up on the model


def test_no_log_line_and_no_frame_holds_the_api_key_even_with_the_sdk_logging_at_debug(fake_model):
    async def script(x: Exchange) -> None:
        if x.number == 1:  # a server that echoes the key it was sent
            await x.error(401, f"Incorrect API key provided: {x.headers.get('authorization', '')}")
            return
        if x.number == 2:
            await x.error(429, "slow down", headers={"retry-after-ms": "10"})
            return
        await x.start_sse()
        await x.event("{not json")
        await x.end()

    async def listing() -> Any:
        async with open_client(server) as ws:
            return await (await initialized(ws)).result("sessions/list", {})

    fake, server = fake_model(script, env={"OPENAI_LOG": "debug"})
    first, first_pushes = run(turn(server, "one"))
    second, second_pushes = run(turn(server, "two"))
    assert (first["outcome"], second["outcome"]) == ("error", "error")
    summaries = json.dumps(run(listing()))  # seed 004 lastTurn.reason: the model's error, shown to people
    assert fake.exchanges[0].headers["authorization"] == f"Bearer {KEY}"  # the key was sent to the model
    server.stop()
    with open(server.log.name) as f:
        log = f.read()
    assert "Sending HTTP Request" in log  # the SDK's debug logging was on
    assert KEY not in log
    assert KEY not in json.dumps(first_pushes + second_pushes) and KEY not in summaries
    assert "Incorrect API key provided: Bearer [redacted]" in summaries and "malformed stream" in summaries
