"""Traces over a real ``sessionloop serve``: the traceparent param on the wire, and ``--otlp-endpoint``
exporting over real OTLP/HTTP to a small collector in this test (a stdlib HTTP server that decodes
the protobuf requests), whose spans ``sessionloop trace`` then rebuilds from the stored log."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.conftest import REPO
from tests.e2e.conftest import APPS, initialized, open_client

pytestmark = pytest.mark.e2e

BOT = "bot-token-for-the-end-to-end-tests"
PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"


def run(coro):
    return asyncio.run(coro)


class Collector:
    """Receives OTLP/HTTP protobuf span exports on 127.0.0.1 (POST /v1/traces)."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.paths: list[str] = []
        self.changed = threading.Condition()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                with collector.changed:
                    collector.paths.append(self.path)
                    collector.spans += [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
                    collector.changed.notify_all()
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def wait_for(self, predicate: Any, timeout: float = 20) -> list[Any]:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not predicate(self.spans):
                left = deadline - time.monotonic()
                assert left > 0, f"spans seen: {[s.name for s in self.spans]}"
                self.changed.wait(left)
            return list(self.spans)


@pytest.fixture
def collector():
    c = Collector()
    yield c
    c.http.shutdown()


def traced_server(server_factory, tmp_path, collector: Collector):
    data = tmp_path / "data"
    os.makedirs(data, exist_ok=True)
    (data / "apps.toml").write_text(APPS)
    # the SDK's batch delay, 5 s by default: short, so the test waits on the collector, not the clock
    return server_factory(data_dir=str(data), env={"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
                                                   "OTEL_BSP_SCHEDULE_DELAY": "50"})


def ident(span: Any) -> tuple:
    return (span.name, span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex() or None,
            span.start_time_unix_nano, span.end_time_unix_nano)


def otlp_ident(span: dict) -> tuple:
    return (span["name"], span["traceId"], span["spanId"], span.get("parentSpanId"),
            int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"]))


def attribute(span: Any, key: str) -> Any:
    value = next(a.value for a in span.attributes if a.key == key)
    return getattr(value, value.WhichOneof("value"))


@pytest.mark.parametrize("bad", ["not-a-traceparent", TRACEPARENT.upper(), TRACEPARENT + "-01"])
def test_an_invalid_traceparent_is_invalid_params_naming_the_field_on_loop_send_and_turn_send(app_server, bad):
    async def go():
        async with open_client(app_server, BOT) as bot_ws, open_client(app_server) as owner_ws:
            bot, owner = await initialized(bot_ws), await initialized(owner_ws)
            room = (await bot.result("loop/create", {"containerId": "inbox"}))["sessionId"]
            loop_send = await bot.call("loop/send", {"sessionId": room, "text": "hi", "idempotencyKey": "k",
                                                     "traceparent": bad})
            sid = (await owner.result("session/create", {}))["session"]["id"]
            turn_send = await owner.call("turn/send", {"sessionId": sid, "content": "hi", "traceparent": bad})
            events = await bot.result("loop/listEvents", {"sessionId": room})
            return loop_send, turn_send, events

    loop_send, turn_send, events = run(go())
    for reply in (loop_send, turn_send):
        assert reply["error"]["code"] == -32602, reply
        assert reply["error"]["message"].startswith("params.traceparent: Expected `str`"), reply
    assert events["events"] == []  # nothing was accepted


def test_serve_exports_spans_over_otlp_that_sessionloop_trace_rebuilds_from_the_log(server_factory, tmp_path,
                                                                                   collector):
    server = traced_server(server_factory, tmp_path, collector)

    async def go():
        async with open_client(server, BOT) as bot_ws, open_client(server) as owner_ws:
            bot, owner = await initialized(bot_ws), await initialized(owner_ws)
            room = (await bot.result("loop/create", {"containerId": "inbox"}))["sessionId"]
            sent = await bot.result("loop/send", {"sessionId": room, "idempotencyKey": "m1", "traceparent": TRACEPARENT,
                                                  "text": '!tool list_files {"path": "."}\nlook'})
            done = await bot.result("loop/waitForTurn", {"sessionId": room, "turnId": sent["turnId"]})
            sid = (await owner.result("session/create", {}))["session"]["id"]
            await owner.result("session/subscribe", {"sessionId": sid})
            await owner.result("turn/send", {"sessionId": sid, "content": "hello",
                                             "traceparent": f"00-{PARENT_TRACE}-{'1' * 16}-01"})
            await owner.turn_done(sid)
            return room, sent["turnId"], done, sid

    room, turn_id, done, owner_sid = run(go())
    assert done["state"] == "completed"
    spans = collector.wait_for(lambda spans: sum(s.name == "invoke_agent" for s in spans) == 2)
    assert set(collector.paths) == {"/v1/traces"}
    mine = [s for s in spans if attribute(s, "sessionloop.session.id") == room]
    turn = next(s for s in mine if s.name == "invoke_agent")
    assert (turn.trace_id.hex(), turn.parent_span_id.hex()) == (PARENT_TRACE, PARENT_SPAN)
    assert attribute(turn, "sessionloop.turn.id") == turn_id
    assert sorted(s.name for s in mine) == ["chat mock", "chat mock", "execute_tool list_files", "invoke_agent"]
    owners = next(s for s in spans if s.name == "invoke_agent" and attribute(s, "sessionloop.session.id") == owner_sid)
    assert owners.parent_span_id.hex() == "1" * 16  # turn/send's traceparent
    assert server.stop() == 0
    trace = subprocess.run([sys.executable, "-m", "sessionloop", "trace", room, "--data", server.data_dir], cwd=REPO,
                           capture_output=True, text=True, timeout=60, check=False)
    assert trace.returncode == 0, trace.stderr
    rebuilt = [s for rs in json.loads(trace.stdout)["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert sorted(map(otlp_ident, rebuilt)) == sorted(map(ident, mine))
