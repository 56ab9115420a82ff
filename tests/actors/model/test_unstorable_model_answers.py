"""A model's answer the store cannot hold (issue "Safe to put in front of strangers": a real model
can be talked into any tool call). Every provider's answer becomes the ``llm.completed`` event in
one place (``actors/session/actor.py`` ``_llm_completed``, through ``actors/model/storable.py``): a call
whose arguments cannot be stored fails with a sentence for the model, the turn goes on, and what
is stored is storable. Real hosts on real LMDB, reopened where the issue asks."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec
import pytest

from sessionloop.actors import events as E
from sessionloop.actors.model import ModelResponse, OpenAIProvider
from sessionloop.actors.model.openai import response_from_chunks
from sessionloop.actors.model.scripted import ScriptedProvider
from sessionloop.actors.model.storable import (
    MAX_ARGS_BYTES,
    MAX_ARGS_DEPTH,
    UNSTORABLE_KEY,
    storable_response,
)
from sessionloop.actors.tools.registry import ToolError, ToolRegistry, ToolSpec
from sessionloop.protocol.limits import MAX_INT, MAX_NESTING
from tests.actors.gateway_harness import MemoryClient

HUGE = int("9" * 310)
SPAWN_HUGE = '!tool spawn_session {"task":"x","timeoutMs":' + "9" * 310 + "}"
#: the mock answers in place without ``!sleep``; with it, the answer comes back as a ModelDone
#: message from the worker loop (the path that failed three times and parked the session)
PATHS = pytest.mark.parametrize("prefix", ["", "!sleep 1\n"], ids=["answered-in-place", "through-the-worker-loop"])


def events_of(session: Any, kind: type) -> list[Any]:
    return [r.event for r in session.events() if isinstance(r.event, kind)]


def the_failed_call(session: Any) -> E.ToolFinished:
    [finished] = events_of(session, E.ToolFinished)
    assert finished.status == "failed"
    assert not events_of(session, E.ToolStarted)  # refused before it ran
    return finished


def scripted(*answers: Any) -> ScriptedProvider:
    return ScriptedProvider([*answers, *["fine"] * 8])


def call(args: Any, call_id: str = "c1", name: str = "spawn_session") -> ModelResponse:
    return ModelResponse(tool_calls=[E.ToolCallSpec(call_id=call_id, name=name, args=args)])


# --- the issue's repro: the mock model ------------------------------------------------------------


@PATHS
def test_a_mock_call_with_a_310_digit_integer_fails_naming_the_argument_and_the_session_goes_on(open_host, prefix):
    host = open_host(permission_mode="acceptCalls")
    s = host.create()
    result = s.run(prefix + SPAWN_HUGE, timeout=30)
    assert (result.state, result.output_text) == ("completed", "done: 1 tool calls")
    error = the_failed_call(s).output["error"]
    assert error.startswith("argument 'timeoutMs': integer out of range")
    [completed, _] = events_of(s, E.LlmCompleted)
    assert completed.tool_calls[0].name == "spawn_session"
    assert completed.tool_calls[0].args == {UNSTORABLE_KEY: error}
    assert len(events_of(s, E.LlmStarted)) == 2  # no failed commit, no re-issued model call
    assert s.run("next", timeout=30).output_text == "echo: next"


@PATHS
def test_after_a_reopen_the_session_with_the_refused_call_loads_and_keeps_working(open_host, prefix):
    host = open_host(permission_mode="acceptCalls")
    s = host.create()
    s.run(prefix + SPAWN_HUGE, timeout=30)
    sid = s.id
    host.close()
    again = open_host(permission_mode="acceptCalls")
    s = again.session(sid)
    assert s.snapshot().parked is None
    assert "integer out of range" in the_failed_call(s).output["error"]
    assert s.run("after the reopen", timeout=30).output_text == "echo: after the reopen"


# msgspec's own nesting limit is the interpreter's (~1,000 levels on 3.11, 1,500 on 3.12, 10,000 on
# 3.13); the bound is ours, MAX_NESTING, the same on every Python.
TOO_DEEP = [MAX_NESTING + 1, 5000, 9000]


@pytest.mark.parametrize("levels", TOO_DEEP)
def test_a_mock_tool_line_nested_too_deeply_fails_the_turn_with_a_model_error_not_the_session(host, levels):
    s = host.create()
    result = s.run("!tool list_files " + "[" * levels + "]" * levels, timeout=30)
    assert (result.state, result.code) == ("failed", "model-error")
    assert f"nest too deeply (more than {MAX_NESTING} levels)" in result.reason
    assert s.run("still here", timeout=30).output_text == "echo: still here"


# --- the scripted provider (through generate and ModelDone) --------------------------------------


def test_a_scripted_call_with_a_310_digit_integer_fails_naming_the_argument_and_survives_a_reopen(open_host):
    host = open_host(permission_mode="acceptCalls", provider=scripted(call({"task": "x", "timeoutMs": HUGE})))
    s = host.create()
    result = s.run("go", timeout=30)
    assert (result.state, result.output_text) == ("completed", "fine")
    assert the_failed_call(s).output["error"].startswith("argument 'timeoutMs': integer out of range")
    assert s.run("again", timeout=30).output_text == "fine"
    sid = s.id
    host.close()
    again = open_host(permission_mode="acceptCalls", provider=scripted())
    s = again.session(sid)
    assert s.run("after the reopen", timeout=30).output_text == "fine"
    assert len(events_of(s, E.TurnCompleted)) == 3


@pytest.mark.parametrize(("args", "why"), [
    ({"task": "x", "timeoutMs": -HUGE}, "argument 'timeoutMs': integer out of range"),
    ({"task": "x", "opts": {"n": [1, 2**64]}}, "argument 'opts.n[1]': integer out of range"),
    ({"task": "x", "ratio": float("nan")}, "argument 'ratio': nan is not a JSON number"),
    ({"task": "x", "ratio": float("-inf")}, "argument 'ratio': -inf is not a JSON number"),
    ({"task": json.loads("[" * 40 + "]" * 40)}, f"nests deeper than {MAX_ARGS_DEPTH} levels"),
    ({"task": "x" * (MAX_ARGS_BYTES + 1)}, f"bytes of JSON; at most {MAX_ARGS_BYTES}"),
    ({"task": "\ud800"}, "argument 'task': a string that is not UTF-8"),
    ({"task": b"x"}, "argument 'task': bytes is not a JSON type"),
    ({"task": "x", 7: "seven"}, "the key 7 is not a string"),
], ids=["negative", "nested", "nan", "infinity", "too-deep", "too-large", "surrogate", "bytes", "int-key"])
def test_arguments_the_store_cannot_hold_fail_the_call_with_a_sentence_saying_why(open_host, args, why):
    host = open_host(permission_mode="acceptCalls", provider=scripted(call(args)))
    s = host.create()
    assert s.run("go", timeout=30).output_text == "fine"
    assert why in the_failed_call(s).output["error"]
    [completed, _] = events_of(s, E.LlmCompleted)
    assert msgspec.json.decode(msgspec.json.encode(completed.tool_calls[0].args)) == completed.tool_calls[0].args


def test_token_counts_beyond_int64_are_clamped_and_the_answer_is_kept(open_host):
    huge = ModelResponse(text="counted", usage=E.Usage(prompt_tokens=HUGE, completion_tokens=-5))
    host = open_host(permission_mode="acceptCalls", provider=scripted(huge))
    s = host.create()
    assert s.run("go", timeout=30).output_text == "counted"
    [completed] = events_of(s, E.LlmCompleted)
    assert completed.usage == E.Usage(prompt_tokens=MAX_INT, completion_tokens=0)
    assert len(events_of(s, E.LlmStarted)) == 1  # answered once: no failed commit, no re-issued call


def test_two_calls_of_one_answer_with_the_same_id_each_get_their_own_result(open_host):
    twice = ModelResponse(tool_calls=[E.ToolCallSpec(call_id="same", name="list_files", args={"path": "."}),
                                      E.ToolCallSpec(call_id="same", name="list_files", args={"path": "."})])
    provider = scripted(twice)
    host = open_host(permission_mode="acceptCalls", provider=provider)
    s = host.create()
    assert s.run("go", timeout=30).output_text == "fine"
    finished = events_of(s, E.ToolFinished)
    assert [f.call_id for f in finished] == ["same", "call_2"]
    assert all(f.status == "completed" for f in finished)
    results = [m.tool_call_id for m in provider.requests[1].messages if m.role == "tool"]
    assert results == ["same", "call_2"]


def test_a_call_id_too_long_for_an_approval_stream_is_replaced_and_the_approval_is_requested(service):
    host, svc = service(provider=scripted(call({"command": "echo approved"}, call_id="c" * 600, name="exec")))
    client = MemoryClient(svc)
    client.result("presence/update", {"active": True})
    sid = client.result("session/create", {})["session"]["id"]
    client.result("session/subscribe", {"sessionId": sid})
    client.result("turn/send", {"sessionId": sid, "content": "go"})
    approval = client.wait(lambda f: f.get("method") == "approval/requested", 15)["params"]["approval"]
    assert approval["tool"] == "exec" and len(approval["id"]) < 100
    client.result("approval/respond", {"approvalId": approval["id"], "decision": "approve",
                                       "contentHash": approval["contentHash"]})
    client.wait(lambda f: f.get("method") == "item/completed" and f["params"]["item"]["kind"] == "turn", 15)
    [finished] = events_of(host.session(sid), E.ToolFinished)
    assert (finished.call_id, finished.status) == ("call_1", "completed")
    svc.close()


# --- the OpenAI-compatible provider, against a real HTTP server on 127.0.0.1 ---------------------


#: the SSE bodies the fake server answers with, in order (then plain "fine" answers)
ANSWERS: list[str] = []


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = ANSWERS.pop(0).encode() if ANSWERS else _sse({"content": "fine"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _sse(delta: dict[str, Any], usage: str = '{"prompt_tokens": 3, "completion_tokens": 2}') -> str:
    chunk = json.dumps({"model": "fake", "choices": [{"index": 0, "delta": delta, "finish_reason": "stop"}]})
    return f"data: {chunk}\n\ndata: {{\"choices\": [], \"usage\": {usage}}}\n\ndata: [DONE]\n\n"


@pytest.fixture
def openai_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, ANSWERS
    ANSWERS.clear()
    server.shutdown()
    server.server_close()


def test_an_openai_answer_with_a_huge_integer_argument_and_huge_token_counts_goes_on_with_the_call_failed(
        open_host, openai_server):
    server, answers = openai_server
    arguments = '{"task": "x", "timeoutMs": ' + "9" * 310 + "}"
    tool_call = {"index": 0, "id": "call_x", "function": {"name": "spawn_session", "arguments": arguments}}
    answers.append(_sse({"tool_calls": [tool_call]}, usage='{"prompt_tokens": ' + "9" * 40 + "}"))
    provider = OpenAIProvider(model="fake", base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key="k")
    host = open_host(permission_mode="acceptCalls", provider=provider)
    s = host.create()
    try:
        assert s.run("go", timeout=30).output_text == "fine"
    finally:
        host.rt.worker.submit(provider.aclose()).result(10)
    assert the_failed_call(s).output["error"].startswith("argument 'timeoutMs': integer out of range")
    first = events_of(s, E.LlmCompleted)[0]
    assert first.usage.prompt_tokens == MAX_INT


@pytest.mark.parametrize("levels", TOO_DEEP)
def test_openai_arguments_nested_too_deeply_for_the_decoder_are_kept_as_text_and_refused_by_the_registry(levels):
    deep = "[" * levels + "]" * levels
    line = {"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "c", "function": {"name": "list_files", "arguments": deep}}]}, "finish_reason": "stop"}]}
    response = response_from_chunks([line])
    assert response.tool_calls[0].args == deep
    with pytest.raises(ToolError, match=rf"nest too deeply \(more than {MAX_NESTING} levels\)"):
        _registry().validate("list_files", deep)


# --- the pieces -----------------------------------------------------------------------------------


def _registry() -> ToolRegistry:
    async def handler(args: dict[str, Any], ctx: Any) -> Any:
        return args

    params = {"type": "object", "properties": {"n": {"type": "integer"}, "x": {"type": "number"},
                                                 "any": {}}}
    return ToolRegistry([ToolSpec("count", "counts", params, handler),
                         ToolSpec("list_files", "lists", {"type": "object"}, handler)])


@pytest.mark.parametrize("field", ["n", "x"])
def test_the_registry_refuses_an_integer_outside_int64_naming_the_field(field):
    registry = _registry()
    assert registry.validate("count", {field: MAX_INT}) == {field: MAX_INT}
    for value in (MAX_INT + 1, -MAX_INT - 2, HUGE):
        with pytest.raises(ToolError, match=rf"field '{field}' must be an integer from -2\*\*63 to 2\*\*63-1"):
            registry.validate("count", {field: value})


def test_the_registry_refuses_json_text_arguments_holding_an_integer_outside_int64_in_an_untyped_field():
    with pytest.raises(ToolError, match="argument 'any': integer out of range"):
        _registry().validate("count", '{"any": ' + "9" * 310 + "}")


def test_the_registry_refuses_arguments_that_were_replaced_because_they_could_not_be_stored():
    with pytest.raises(ToolError, match="^argument 'n': integer out of range"):
        _registry().validate("count", storable_response(call({"n": HUGE}, name="count")).tool_calls[0].args)


def test_a_storable_answer_is_passed_through_unchanged():
    answer = ModelResponse(text="t", tool_calls=[E.ToolCallSpec(call_id="a", name="exec", args={"n": MAX_INT})],
                           usage=E.Usage(prompt_tokens=1))
    assert storable_response(answer) is answer
