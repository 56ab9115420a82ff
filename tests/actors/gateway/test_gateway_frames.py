"""Every frame the gateway sends comes out of its connections' ``protocol.Connection``: errors are
translated by their ``code`` and ``data`` whatever their class, a push is encoded once for all the
subscribers of its session, and a closed connection gets nothing."""

from __future__ import annotations

from typing import Any

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
