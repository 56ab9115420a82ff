"""Every frame the gateway sends comes out of its connections' ``protocol.Connection``: errors are
translated by their ``code`` and ``data`` whatever their class, a push is encoded once for all the
subscribers of its session, and a closed connection gets nothing."""

from __future__ import annotations

import json
import threading
from typing import Any

from sessionloop.protocol.schemas import SessionsListResult
from tests.actors.approvals.test_approvals import turn_done
from tests.actors.gateway_harness import MemoryClient


class RawClient(MemoryClient):
    """A MemoryClient that also keeps each frame as the very text object the gateway handed over."""

    def __init__(self, service: Any) -> None:
        self.texts: list[str] = []
        super().__init__(service)

    def _send(self, text: str) -> None:
        self.texts.append(text)
        super()._send(text)

    def item_pushes(self, sid: str) -> list[str]:
        return [t for t in self.texts if t.startswith('{"jsonrpc":"2.0","method":"item/') and sid in t]


class Stranger(Exception):
    """No SessionloopError, shaped like one: a string ``code`` and a ``data`` dict."""

    def __init__(self, code: str, message: str, **data: Any) -> None:
        super().__init__(message)
        self.code = code
        self.data = data


def failing_with(error: BaseException) -> Any:
    def handler(conn: Any, request_id: Any, params: Any) -> None:
        raise error
    return handler


def test_an_error_of_any_class_with_a_business_code_answers_as_that_application_error(service) -> None:
    _, svc = service()
    c = MemoryClient(svc)
    svc.handlers["sessions/list"] = failing_with(Stranger("conflict", "someone else wrote first", stream="s"))
    reply = c.call("sessions/list", {})
    assert reply["error"] == {"code": -32000, "message": "someone else wrote first",
                              "data": {"code": "conflict", "stream": "s"}}


def test_a_bug_in_a_handler_is_still_the_internal_error_naming_it(service) -> None:
    _, svc = service()
    c = MemoryClient(svc)
    svc.handlers["sessions/list"] = failing_with(KeyError("row-3"))
    assert c.call("sessions/list", {})["error"] == {"code": -32603, "message": "KeyError: 'row-3'"}
    assert "result" in c.call("session/create", {})  # the gateway lives on


def test_a_push_is_encoded_once_for_all_subscribers_and_a_closed_connection_gets_none(service) -> None:
    _, svc = service()
    a, b, gone = RawClient(svc), RawClient(svc), RawClient(svc)
    sid = a.result("session/create", {})["session"]["id"]
    for client in (a, b, gone):
        client.result("session/subscribe", {"sessionId": sid})
    gone.close()
    a.result("turn/send", {"sessionId": sid, "content": "hello"})
    turn_done(a, sid)
    turn_done(b, sid)
    pushes_a, pushes_b = a.item_pushes(sid), b.item_pushes(sid)
    assert pushes_a and pushes_a == pushes_b
    assert all(x is y for x, y in zip(pushes_a, pushes_b, strict=True))  # one text object per push
    assert gone.item_pushes(sid) == []


def handled_on(seen: list[tuple[str, str | None]]) -> Any:
    """A ``sessions/list`` handler that notes the thread it ran on and the query it was given."""
    def handler(conn: Any, request_id: Any, params: Any) -> None:
        seen.append((threading.current_thread().name, params.query))
        conn.result(request_id, SessionsListResult(sessions=[], groups=[]))
    return handler


def test_with_a_dispatcher_the_gateway_runs_on_its_pool_threads_and_keeps_each_connections_order(service) -> None:
    _, svc = service()
    seen: list[tuple[str, str | None]] = []
    svc.handlers["sessions/list"] = handled_on(seen)
    c = MemoryClient(svc)
    for n in range(150):  # sent at once (within the burst of 200): handled one at a time, in order
        c.conn.receive(json.dumps({"jsonrpc": "2.0", "id": 1000 + n, "method": "sessions/list",
                                   "params": {"query": str(n)}}))
    for n in range(150):
        assert "result" in c.wait(lambda f, rid=1000 + n: f.get("id") == rid, remove=True)
    assert [query for _, query in seen] == [str(n) for n in range(150)]
    assert {name.rsplit("-", 1)[0] for name, _ in seen} == {"sessionloop-pool"}


def test_without_a_dispatcher_the_gateway_has_a_thread_of_its_own(service) -> None:
    _, svc = service(dispatcher_threads=0)
    seen: list[tuple[str, str | None]] = []
    svc.handlers["sessions/list"] = handled_on(seen)
    assert "result" in MemoryClient(svc).call("sessions/list", {"query": "q"})
    assert len(seen) == 1 and seen[0][0].startswith("GatewayActor-") and seen[0][1] == "q", seen
