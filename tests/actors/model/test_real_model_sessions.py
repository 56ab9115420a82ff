"""Sessions on the OpenAI-compatible provider against a fake server on 127.0.0.1: what subscribers
see when a streamed attempt is retried, the ``generating`` card while tool-call arguments stream
(seed 004 tool-call), ``llm.retried`` in the log, the per-model limits under many sessions, and
cancellation while a call waits for a slot. Real host, real LMDB, real HTTP; the gateway through
the in-memory client."""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.model import OpenAIProvider
from sessionloop.actors.model.limits import ModelLimits, RetryPolicy
from tests.actors.approvals.test_approvals import turn_done
from tests.actors.gateway_harness import MemoryClient, wait_until
from tests.fake_openai import Exchange, ThreadedFakeServer, chunk

FAST = RetryPolicy(attempts=3, base_s=0.01, max_wait_s=0.05, total_s=30)


@pytest.fixture
def model(request):
    """``model(opener, script, **provider options) -> (opened, fake server, provider)``: ``opener``
    (the ``open_host`` or ``service`` fixture) opens a host in ``acceptCalls`` mode with the
    provider answering every session."""
    made: list[tuple[ThreadedFakeServer, OpenAIProvider, Any]] = []

    def make(opener: Any, script: Any, **options: Any) -> tuple[Any, ThreadedFakeServer, OpenAIProvider]:
        fake = ThreadedFakeServer(script).__enter__()
        options.setdefault("retry", FAST)
        provider = OpenAIProvider(model="test-model", base_url=fake.base_url, api_key="sk-test-key-1234", **options)
        opened = opener(permission_mode="acceptCalls", provider=provider)
        made.append((fake, provider, opened[0] if isinstance(opened, tuple) else opened))
        return opened, fake, provider

    yield make
    for fake, provider, host in made:
        host.rt.worker.submit(provider.aclose()).result(10)
        fake.__exit__()


def item_frames(client: MemoryClient, sid: str) -> list[tuple[str, str, str, Any]]:
    """``(method, itemId, kind or "", detail)`` of the session's item pushes, in seq order."""
    frames = sorted((f for f in client.frames if f.get("method", "").startswith("item/")
                     and f["params"]["sessionId"] == sid), key=lambda f: f["params"]["seq"])
    out = []
    for f in frames:
        p = f["params"]
        if f["method"] == "item/delta":
            out.append(("item/delta", p["itemId"], "", p["text"]))
        else:
            item = p["item"]
            out.append((f["method"], item["itemId"], item["kind"], item))
    return out


def events_of(host: Any, sid: str, kind: type) -> list[Any]:
    return [r.event for r in host.session(sid).events() if isinstance(r.event, kind)]


def start_turn(client: MemoryClient, text: str = "hi") -> str:
    sid = client.result("session/create", {})["session"]["id"]
    client.result("session/subscribe", {"sessionId": sid})
    client.result("turn/send", {"sessionId": sid, "content": text})
    return sid


# --- a retry after streamed text ------------------------------------------------------------------


def test_a_retry_after_streamed_text_closes_the_partial_item_as_discarded_and_streams_the_answer_as_a_new_item(
        service, model):
    async def script(x: Exchange) -> None:
        if x.number == 1:
            await x.start_sse()
            await x.event(chunk("Half "))
            await x.event(chunk("an answ"))
            await x.event({"error": {"message": "internal error", "type": "server_error", "code": 500}})
            await x.end()
            return
        await x.answer(["The whole ", "answer"], usage={"prompt_tokens": 5, "completion_tokens": 3})

    (host, svc), _, _ = model(service, script)
    c = MemoryClient(svc)
    sid = start_turn(c)
    turn_done(c, sid)
    messages = [(m, i, d if m == "item/delta" else d.get("text")) for m, i, k, d in item_frames(c, sid)
                if k in ("agent-message", "")]
    step = messages[0][1]
    retried = f"{step}.a2"
    assert messages == [
        ("item/started", step, ""), ("item/delta", step, "Half "), ("item/delta", step, "an answ"),
        ("item/completed", step, "Half an answ"),
        ("item/started", retried, ""), ("item/delta", retried, "The whole "), ("item/delta", retried, "answer"),
        ("item/completed", retried, "The whole answer"),
    ]
    completed = [d for m, i, k, d in item_frames(c, sid) if m == "item/completed" and k == "agent-message"]
    assert completed[0]["undelivered"]["reason"] == "discarded: the model call was tried again after HTTP 500"
    assert "undelivered" not in completed[1] or completed[1]["undelivered"] is None
    # the log: the retry as a fact of the step, and the successful attempt's text only
    [retry] = events_of(host, sid, E.LlmRetried)
    assert (retry.step_id, retry.attempt, retry.status, retry.cause, retry.next_item_id) == \
        (step, 1, 500, "stream", retried)
    assert "internal error" in retry.error
    [answer] = events_of(host, sid, E.LlmCompleted)
    assert answer.text == "The whole answer" and answer.usage == E.Usage(prompt_tokens=5, completion_tokens=3)
    # a later snapshot (and the history behind it) holds the answer under the streamed item's id
    snap = MemoryClient(svc).result("session/subscribe", {"sessionId": sid})
    assert [(i["itemId"], i["text"]) for i in snap["items"] if i["kind"] == "agent-message"] == \
        [(retried, "The whole answer")]
    assert host.session(sid).snapshot().messages[-1].content == "The whole answer"


def test_a_429_before_any_output_is_recorded_and_keeps_the_item_id(service, model):
    async def script(x: Exchange) -> None:
        if x.number == 1:
            await x.error(429, "slow down", headers={"retry-after-ms": "20"})
            return
        await x.answer(["fine"])

    (host, svc), _, _ = model(service, script)
    c = MemoryClient(svc)
    sid = start_turn(c)
    turn_done(c, sid)
    [retry] = events_of(host, sid, E.LlmRetried)
    assert (retry.attempt, retry.status, retry.cause, retry.wait_ms, retry.next_item_id) == (1, 429, "http", 20, "")
    [answer] = events_of(host, sid, E.LlmCompleted)
    frames = [(m, i) for m, i, k, _ in item_frames(c, sid) if k == "agent-message"]
    assert frames == [("item/started", answer.step_id), ("item/completed", answer.step_id)]
    assert "sessionloop_model_retries_total{model=\"test-model\",status=\"429\"} 1.0" in \
        host.rt.metrics.render().decode()


# --- the generating card (seed 004 tool-call) -------------------------------------------------------


def test_a_streamed_tool_call_shows_its_generating_card_when_the_name_is_known_then_running_on_the_same_item(
        service, model):
    card_seen = threading.Event()

    async def script(x: Exchange) -> None:
        if x.number == 1:
            await x.start_sse()
            await x.event(chunk(tool_calls=[{"index": 0, "id": "call_x", "type": "function",
                                             "function": {"name": "list_files", "arguments": ""}}]))
            # the rest of the arguments only once the client holds the card
            await asyncio.get_running_loop().run_in_executor(None, card_seen.wait, 10)
            await x.event(chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"path": '}}]))
            await x.event(chunk(tool_calls=[{"index": 0, "function": {"arguments": '"."}'}}], finish="tool_calls"))
            await x.event("[DONE]")
            await x.end()
            return
        await x.answer(["listed"])

    (host, svc), _, _ = model(service, script)
    c = MemoryClient(svc)
    sid = start_turn(c)
    card = c.wait(lambda f: f.get("method") == "item/started" and f["params"]["item"].get("itemId") == "call_x")
    assert card["params"]["item"]["status"] == "generating" and card["params"]["item"]["tool"] == "list_files"
    assert "args" not in card["params"]["item"]  # seed: 只有工具名、args 为空
    card_seen.set()
    turn_done(c, sid)
    statuses = [(m, d["status"]) for m, i, k, d in item_frames(c, sid) if i == "call_x"]
    assert statuses[0] == ("item/started", "generating")
    assert ("item/started", "running") in statuses and statuses[-1] == ("item/completed", "completed")
    running = next(d for m, i, k, d in item_frames(c, sid) if i == "call_x" and d["status"] == "running")
    assert running["args"] == {"path": "."}


def test_a_card_announced_by_an_attempt_that_fails_is_closed_failed_and_not_executed(service, model):
    async def script(x: Exchange) -> None:
        if x.number == 1:
            await x.start_sse()
            await x.event(chunk(tool_calls=[{"index": 0, "id": "call_lost", "type": "function",
                                             "function": {"name": "list_files", "arguments": '{"pa'}}]))
            await x.event({"error": {"message": "overloaded", "type": "server_error"}})
            await x.end()
            return
        await x.answer(["no tools after all"])

    (host, svc), _, _ = model(service, script)
    c = MemoryClient(svc)
    sid = start_turn(c)
    turn_done(c, sid)
    card = [(m, d["status"], d.get("notExecuted")) for m, i, k, d in item_frames(c, sid) if i == "call_lost"]
    assert card == [("item/started", "generating", None), ("item/completed", "failed", True)]
    snap = MemoryClient(svc).result("session/subscribe", {"sessionId": sid})
    assert not [i for i in snap["items"] if i["itemId"] == "call_lost"]
    assert events_of(host, sid, E.LlmCompleted)[0].tool_calls == []


def test_a_stopped_turn_closes_the_announced_card_as_aborted_and_the_model_connection(service, model):
    async def script(x: Exchange) -> None:
        await x.start_sse()
        await x.event(chunk(tool_calls=[{"index": 0, "id": "call_stop", "type": "function",
                                         "function": {"name": "list_files", "arguments": ""}}]))
        await x.wait_closed(30)

    (host, svc), fake, _ = model(service, script)
    c = MemoryClient(svc)
    sid = start_turn(c)
    c.wait(lambda f: f.get("method") == "item/started" and f["params"]["item"].get("itemId") == "call_stop")
    c.result("turn/abort", {"sessionId": sid})
    turn_done(c, sid)
    wait_until(lambda: fake.exchanges[0].closed.is_set(), 10, "the model connection to close")
    card = [(m, d["status"]) for m, i, k, d in item_frames(c, sid) if i == "call_stop"]
    assert card == [("item/started", "generating"), ("item/completed", "aborted")]


# --- limits -------------------------------------------------------------------------------------


def test_a_turn_stopped_while_its_model_call_waits_for_a_slot_ends_and_never_reaches_the_server(service, model):
    release = threading.Event()

    async def script(x: Exchange) -> None:
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 20)
        await x.answer(["first"])

    (host, svc), fake, provider = model(service, script, limits=ModelLimits(max_concurrency=1))
    c = MemoryClient(svc)
    first = start_turn(c, "one")
    wait_until(lambda: len(fake.exchanges) == 1, 10, "the first request")
    second = start_turn(c, "two")
    wait_until(lambda: provider.stats.waiting == 1, 10, "the second call to wait for a slot")
    c.result("turn/abort", {"sessionId": second})
    assert turn_done(c, second)["outcome"] == "aborted"
    wait_until(lambda: provider.stats.waiting == 0, 10, "the wait to end")
    release.set()
    assert turn_done(c, first)["outcome"] == "replied"
    assert len(fake.exchanges) == 1


def test_200_sessions_never_hold_more_requests_open_than_the_model_concurrency_limit(open_host, model):
    async def script(x: Exchange) -> None:
        await x.answer([f"answer {x.body['messages'][-1]['content']}"], gap_s=0.005)

    host, fake, provider = model(open_host, script, limits=ModelLimits(max_concurrency=8))
    sessions = [host.create() for _ in range(200)]
    receipts = [s.send(f"n{i}") for i, s in enumerate(sessions)]
    results = [s.wait(r.turn_id, timeout=120) for s, r in zip(sessions, receipts, strict=True)]
    assert [r.output_text for r in results] == [f"answer n{i}" for i in range(200)]
    assert fake.fake.max_open == 8  # reached, never passed
    assert provider.stats.delayed > 0 and provider.stats.waiting == 0
    metrics = host.rt.metrics.render().decode()
    assert re.search(r'sessionloop_model_limiter_delayed_total\{model="test-model"\} [1-9]', metrics)
    assert 'sessionloop_model_requests_total{model="test-model"} 200.0' in metrics
    assert 'sessionloop_model_limiter_wait_seconds_count{model="test-model"} 200.0' in metrics
