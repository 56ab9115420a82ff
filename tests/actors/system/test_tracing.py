"""OpenTelemetry spans of turns, model calls and tool calls (actors/views/traces.py, actors/system/trace_export.py):
a real host on real LMDB, the SDK's BatchSpanProcessor and InMemorySpanExporter, no collector."""

from __future__ import annotations

import json
import threading

import msgspec
import pytest
from click.testing import CliRunner
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from sessionloop.actors import events as E
from sessionloop.actors.api.host import Host
from sessionloop.actors.errors import InvalidCommand
from sessionloop.actors.events import decode_event
from sessionloop.actors.system.trace_export import LiveTraces, batch_processor
from sessionloop.actors.views.traces import build_spans
from sessionloop.cli.main import main
from tests.actors.session.test_crash_recovery import run_and_kill

PARENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"
TOOL_TURN = '!tool list_files {"path": "."}\nlook around'


@pytest.fixture
def traced(data_dir):
    """``make(**host options) -> (host, exporter, traces)``: a host whose commits are traced live."""
    opened: list[tuple[Host, LiveTraces]] = []

    def make(**options):
        options.setdefault("durability", "nosync")
        options.setdefault("permission_mode", "acceptCalls")
        exporter = InMemorySpanExporter()
        traces = LiveTraces(batch_processor(exporter))
        host = Host.open(data_dir, listeners=[traces.committed], **options)
        opened.append((host, traces))
        return host, exporter, traces

    yield make
    for host, traces in opened:
        host.close()
        traces.close()


def finished(exporter, traces) -> list:
    assert traces.flush()
    return list(exporter.get_finished_spans())


def by_name(spans) -> dict:
    return {s.name: s for s in spans}


def ident(span) -> tuple:
    """What must agree between the live export and the rebuild: name, ids, parentage, times."""
    parent = format(span.parent.span_id, "016x") if span.parent is not None else None
    return (span.name, format(span.context.trace_id, "032x"), format(span.context.span_id, "016x"), parent,
            span.start_time, span.end_time)


def otlp_ident(span: dict) -> tuple:
    return (span["name"], span["traceId"], span["spanId"], span.get("parentSpanId"),
            int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"]))


def otlp_spans(body: dict) -> list[dict]:
    return [s for rs in body["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]


def test_a_turn_with_a_tool_call_gives_a_turn_span_over_chat_execute_tool_and_chat_spans(traced):
    host, exporter, traces = traced()
    session = host.create(title="traced")
    result = session.run(TOOL_TURN)
    assert result.state == "completed"
    spans = finished(exporter, traces)
    assert sorted(s.name for s in spans) == ["chat mock", "chat mock", "execute_tool list_files", "invoke_agent"]
    turn = by_name(spans)["invoke_agent"]
    chats = sorted((s for s in spans if s.name == "chat mock"), key=lambda s: s.start_time)
    tool = by_name(spans)["execute_tool list_files"]
    assert turn.parent is None and turn.kind is SpanKind.INTERNAL
    for child in (*chats, tool):
        assert child.context.trace_id == turn.context.trace_id and child.parent.span_id == turn.context.span_id
        assert child.attributes["sessionloop.session.id"] == session.id
        assert child.attributes["sessionloop.turn.id"] == result.turn_id
    # the model answered with the tool call first, then the text; the tool ran in between
    assert chats[0].end_time <= tool.start_time <= tool.end_time <= chats[1].start_time <= turn.end_time
    assert chats[0].kind is SpanKind.CLIENT and tool.kind is SpanKind.INTERNAL
    assert chats[0].attributes["gen_ai.operation.name"] == "chat"
    assert chats[0].attributes["gen_ai.request.model"] == "mock"
    assert chats[0].attributes["gen_ai.provider.name"] == "mock"
    assert chats[0].attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert chats[1].attributes["gen_ai.response.finish_reasons"] == ("stop",)
    llm = [e.event for e in session.events() if isinstance(e.event, E.LlmCompleted)]
    for chat, completed in zip(chats, llm, strict=True):
        assert chat.attributes["gen_ai.usage.input_tokens"] == completed.usage.prompt_tokens > 0
        assert chat.attributes["gen_ai.usage.output_tokens"] == completed.usage.completion_tokens > 0
    assert turn.attributes["gen_ai.usage.input_tokens"] == sum(c.usage.prompt_tokens for c in llm)
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert (tool.attributes["gen_ai.tool.name"], tool.attributes["gen_ai.tool.call.id"]) == (
        "list_files", next(e.event.call_id for e in session.events() if isinstance(e.event, E.ToolStarted)))
    assert tool.attributes["sessionloop.tool.status"] == "completed"
    assert turn.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert turn.attributes["sessionloop.turn.outcome"] == "completed"
    assert all(s.status.status_code is StatusCode.UNSET for s in spans)


def test_an_exec_call_span_names_its_exit_code_and_sandbox_policy(traced):
    host, exporter, traces = traced()
    result = host.create().run('!tool exec {"command": "exit 3"}\nrun it')
    assert result.state == "completed"
    tool = by_name(finished(exporter, traces))["execute_tool exec"]
    assert tool.attributes["sessionloop.tool.exit_code"] == 3
    assert tool.attributes["sessionloop.tool.sandbox"] == "workspace-write"


def test_a_failed_model_call_span_has_error_status_and_so_has_its_turn(traced):
    host, exporter, traces = traced()
    result = host.create().run("!error the provider is down")
    assert result.state == "failed"
    spans = by_name(finished(exporter, traces))
    chat, turn = spans["chat"], spans["invoke_agent"]
    assert chat.status.status_code is StatusCode.ERROR and chat.status.description == "the provider is down"
    assert chat.attributes["error.type"] == "model_error"
    assert turn.status.status_code is StatusCode.ERROR and turn.attributes["error.type"] == "model-error"
    assert turn.attributes["sessionloop.turn.outcome"] == "failed"


def test_a_traceparent_on_loop_send_makes_the_turn_span_a_child_of_that_span(traced):
    host, exporter, traces = traced()
    host.register_app("mybot", platform="telegram", containers=["inbox"])
    bot = host.sessions(app="mybot")
    room = bot.create(container_id="inbox")
    receipt = bot.send(room.session_id, "hello", idempotency_key="m1", traceparent=TRACEPARENT)
    assert bot.wait_for_turn(room.session_id, receipt.turn_id).state == "completed"
    spans = finished(exporter, traces)
    turn = by_name(spans)["invoke_agent"]
    assert format(turn.context.trace_id, "032x") == PARENT_TRACE
    assert format(turn.parent.span_id, "016x") == PARENT_SPAN and turn.parent.is_remote
    assert {format(s.context.trace_id, "032x") for s in spans} == {PARENT_TRACE}
    stored = next(e.event for e in host.session(room.session_id).events() if isinstance(e.event, E.InputAccepted))
    assert stored.traceparent == TRACEPARENT  # replay rebuilds the same parentage


def test_a_retried_send_with_another_traceparent_is_a_duplicate_that_keeps_the_first_trace(traced):
    host, exporter, traces = traced()
    host.register_app("mybot", platform="telegram", containers=["inbox"])
    bot = host.sessions(app="mybot")
    room = bot.create(container_id="inbox")
    first = bot.send(room.session_id, "hello", idempotency_key="m1", traceparent=TRACEPARENT)
    retry = bot.send(room.session_id, "hello", idempotency_key="m1",
                     traceparent=f"00-{'1' * 32}-{'2' * 16}-01")
    assert retry.state == "duplicate" and retry.turn_id == first.turn_id
    bot.wait_for_turn(room.session_id, first.turn_id)
    turns = [s for s in finished(exporter, traces) if s.name == "invoke_agent"]
    assert [format(t.context.trace_id, "032x") for t in turns] == [PARENT_TRACE]


def test_an_unsampled_traceparent_is_followed_and_its_turn_is_not_exported(traced):
    host, exporter, traces = traced()
    host.register_app("mybot", platform="telegram", containers=["inbox"])
    bot = host.sessions(app="mybot")
    room = bot.create(container_id="inbox")
    quiet = bot.send(room.session_id, "hello", idempotency_key="m1", traceparent=f"00-{PARENT_TRACE}-{PARENT_SPAN}-00")
    loud = bot.send(room.session_id, "again", idempotency_key="m2")
    bot.wait_for_turn(room.session_id, quiet.turn_id)
    bot.wait_for_turn(room.session_id, loud.turn_id)
    spans = finished(exporter, traces)
    assert {s.attributes["sessionloop.turn.id"] for s in spans} == {loud.turn_id}


@pytest.mark.parametrize("bad", ["junk", TRACEPARENT.upper(), f"00-{'0' * 32}-{PARENT_SPAN}-01",
                                 f"ff-{PARENT_TRACE}-{PARENT_SPAN}-01", TRACEPARENT + "-00", 55])
def test_a_traceparent_not_of_the_w3c_format_is_refused_by_the_python_api_naming_the_field(traced, bad):
    host, _, _ = traced()
    host.register_app("mybot", platform="telegram", containers=["inbox"])
    bot = host.sessions(app="mybot")
    room = bot.create(container_id="inbox")
    with pytest.raises(InvalidCommand, match="^traceparent "):
        bot.send(room.session_id, "hello", idempotency_key="m1", traceparent=bad)
    assert not any(isinstance(e.event, E.InputAccepted) for e in host.session(room.session_id).events())


def test_turns_without_a_traceparent_get_trace_ids_derived_from_the_session_and_turn(traced):
    host, exporter, traces = traced()
    session = host.create()
    first, second = session.run("one"), session.run("two")
    turns = {s.attributes["sessionloop.turn.id"]: s for s in finished(exporter, traces) if s.name == "invoke_agent"}
    assert turns[first.turn_id].context.trace_id != turns[second.turn_id].context.trace_id
    spans = build_spans(session.id, [e.event for e in session.events()])
    rebuilt = {s.attributes["sessionloop.turn.id"]: s for s in spans if s.name == "invoke_agent"}
    assert {t: s.trace_id for t, s in rebuilt.items()} == {t: s.context.trace_id for t, s in turns.items()}


def test_sessionloop_trace_writes_the_spans_the_live_exporter_exported(traced, data_dir, tmp_path):
    host, exporter, traces = traced()
    host.register_app("mybot", platform="telegram", containers=["inbox"])
    bot = host.sessions(app="mybot")
    room = bot.create(container_id="inbox")
    for i, (text, parent) in enumerate([(TOOL_TURN, TRACEPARENT), ("!error no", None), ("plain", None)]):
        receipt = bot.send(room.session_id, text, idempotency_key=f"m{i}", traceparent=parent)
        bot.wait_for_turn(room.session_id, receipt.turn_id)
    live = finished(exporter, traces)
    other = host.create().run("not this session")  # another session's spans are not in its trace
    assert other.state == "completed"
    host.close()
    out = tmp_path / "trace.json"
    run = CliRunner().invoke(main, ["trace", room.session_id, "--data", data_dir, "-o", str(out)])
    assert run.exit_code == 0, run.output
    body = json.loads(out.read_text())
    spans = otlp_spans(body)
    assert len(live) == 8
    assert sorted(otlp_ident(s) for s in spans) == sorted(ident(s) for s in live if
                                                         s.attributes["sessionloop.session.id"] == room.session_id)
    # OTLP/JSON: hex ids, integer enums (client 3, internal 1; error 2), the service named
    kinds = {s["name"]: s["kind"] for s in spans}
    assert kinds["chat mock"] == 3 and kinds["invoke_agent"] == 1 and kinds["execute_tool list_files"] == 1
    assert any(s.get("status", {}).get("code") == 2 for s in spans if s["name"] == "chat")
    assert {"key": "service.name", "value": {"stringValue": "sessionloop"}} in body["resourceSpans"][0]["resource"][
        "attributes"]
    stdout = CliRunner().invoke(main, ["trace", room.session_id, "--data", data_dir])
    assert stdout.exit_code == 0 and sorted(map(otlp_ident, otlp_spans(json.loads(stdout.output)))) == sorted(
        map(otlp_ident, spans))


def test_the_live_exporter_traces_a_turn_that_began_before_a_sigkill_from_its_log(data_dir):
    session_id, turns = run_and_kill(data_dir, "!sleep 1500\nfirst", "second")
    exporter = InMemorySpanExporter()
    traces = LiveTraces(batch_processor(exporter))
    with Host.open(data_dir, durability="nosync", permission_mode="acceptCalls", listeners=[traces.committed]) as host:
        s = host.session(session_id)
        assert [s.wait(t, 15).state for t in turns] == ["completed", "completed"]
        events = [e.event for e in s.events()]
        live = finished(exporter, traces)
    traces.close()
    started = next(e for e in events if isinstance(e, E.TurnStarted) and e.turn_id == turns[0])
    first = next(x for x in live if x.name == "invoke_agent" and x.attributes["sessionloop.turn.id"] == turns[0])
    assert first.start_time == started.at * 1_000_000  # committed by the process that was killed
    interrupted = [x for x in live if x.name == "chat" and x.attributes["sessionloop.turn.id"] == turns[0]]
    assert len(interrupted) == 1 and interrupted[0].attributes["error.type"] == "cancelled"
    assert sorted(map(ident, live)) == sorted(
        (x.name, format(x.trace_id, "032x"), format(x.span_id, "016x"),
         format(x.parent_id, "016x") if x.parent_id is not None else None, x.start_ns, x.end_ns)
        for x in build_spans(session_id, events))


class _Stalled(SpanExporter):
    """An exporter that holds the SDK's export until released: a collector that hangs."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.spans: list = []

    def export(self, spans):
        self.entered.set()
        self.release.wait(30)
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


def test_a_hanging_collector_never_holds_up_a_turn(data_dir):
    exporter = _Stalled()
    traces = LiveTraces(batch_processor(exporter))
    try:
        with Host.open(data_dir, durability="nosync", listeners=[traces.committed]) as host:
            session = host.create()
            assert session.run("first").state == "completed"
            flushing = threading.Thread(target=traces.flush, daemon=True)
            flushing.start()
            assert exporter.entered.wait(10)  # the export of the first turn's spans now hangs
            results = [session.run(f"turn {i}", timeout=10) for i in range(20)]
            assert {r.state for r in results} == {"completed"}
            exporter.release.set()
            flushing.join(10)
            assert traces.flush()
    finally:
        traces.close()
    assert sum(1 for s in exporter.spans if s.name == "invoke_agent") == 21


class _HoldFirst(SpanProcessor):
    """Holds the tracing thread in its first ``on_end`` until released, then passes spans on."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.entered, self.release = threading.Event(), threading.Event()

    def on_end(self, span) -> None:
        if not self.entered.is_set():
            self.entered.set()
            self.release.wait(30)
        self.inner.on_end(span)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.release.set()
        self.inner.shutdown()


def test_commits_the_full_tracing_queue_dropped_are_traced_from_the_log_at_the_next_commit(data_dir):
    exporter = InMemorySpanExporter()
    processor = _HoldFirst(batch_processor(exporter))
    traces = LiveTraces(processor, backlog=1)
    with Host.open(data_dir, durability="nosync", permission_mode="acceptCalls", listeners=[traces.committed]) as host:
        session = host.create()
        assert session.run("one").state == "completed"
        assert processor.entered.wait(10)  # the tracing thread is held: one commit fits in the queue
        assert session.run(TOOL_TURN).state == "completed"  # its commits: one queued, the rest dropped
        assert traces.dropped >= 1
        processor.release.set()
        assert traces.flush()  # the queue is empty again: the next commit fits
        assert session.run("three").state == "completed"  # its one commit brings the dropped ones back
        assert traces.flush()
        events = [e.event for e in session.events()]
    traces.close()
    live = list(exporter.get_finished_spans())
    assert len(live) == 8  # each span once: none lost, none twice
    assert sorted(map(ident, live)) == sorted(
        (x.name, format(x.trace_id, "032x"), format(x.span_id, "016x"),
         format(x.parent_id, "016x") if x.parent_id is not None else None, x.start_ns, x.end_ns)
        for x in build_spans(session.id, events))


def test_an_input_stored_before_traceparent_existed_decodes_without_one_and_starts_its_own_trace():
    old = msgspec.msgpack.encode({"type": "input.accepted", "at": 1, "input_id": "i1", "turn_id": "t1", "text": "hi"})
    accepted = decode_event(old)
    assert isinstance(accepted, E.InputAccepted) and accepted.traceparent is None
    spans = build_spans("s1", [accepted, E.TurnStarted(at=2, turn_id="t1", input_ids=["i1"]),
                               E.TurnCompleted(at=5, turn_id="t1", output_text="x")])
    assert [(s.name, s.parent_id, s.start_ns, s.end_ns) for s in spans] == [
        ("invoke_agent", None, 2_000_000, 5_000_000)]
