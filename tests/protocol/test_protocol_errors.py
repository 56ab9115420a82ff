"""Error codes, the RpcError / ProtocolMisuse leaves of protocol/'s own error tree, and how errors
raised elsewhere are translated (by their ``code`` and ``data``, whatever their class)."""

from __future__ import annotations

from typing import Any

import pytest

from sessionloop.actors.errors import SessionBusy
from sessionloop.eventstore.errors import (
    IdempotencyConflict,
    SessionloopError,
    StorageFull,
    StoreClosed,
    WrongExpectedVersion,
)
from sessionloop.protocol.errors import (
    APPLICATION_ERROR,
    BUSINESS_CODES,
    INTERNAL_ERROR,
    RPC_ERROR_CODES,
    ProtocolError,
    ProtocolMisuse,
    RpcError,
    from_domain_error,
    is_domain_error,
)
from sessionloop.protocol.frames import error_frame


class Stranger(Exception):
    """An error that is no SessionloopError, shaped like one: a string ``code`` and a ``data`` dict."""

    def __init__(self, code: str, message: str, **data: Any) -> None:
        super().__init__(message)
        self.code = code
        self.data = data


def test_the_json_rpc_codes_are_the_seeds() -> None:
    assert RPC_ERROR_CODES == {
        "parseError": -32700,
        "invalidRequest": -32600,
        "methodNotFound": -32601,
        "invalidParams": -32602,
        "internalError": -32603,
        "applicationError": -32000,
    }


def test_the_business_codes_include_every_seed_code() -> None:
    seed = {
        "not-found",
        "forbidden",
        "conflict",
        "approval-settled",
        "hash-mismatch",
        "expected-turn-mismatch",
        "unsupported",
    }
    assert seed <= BUSINESS_CODES


def test_rpc_errors_and_misuse_have_their_own_root_shaped_like_the_domain_errors() -> None:
    """protocol/ imports nothing of ours, so its tree has its own root; it carries ``code`` and
    ``data`` as SessionloopError does, so both read as domain errors."""
    assert issubclass(RpcError, ProtocolError) and issubclass(ProtocolMisuse, ProtocolError)
    assert ProtocolMisuse("x", field="y").data == {"field": "y"} and ProtocolMisuse("x").code == "protocol-misuse"
    assert is_domain_error(RpcError.not_found("x")) and is_domain_error(ProtocolMisuse("x"))
    assert is_domain_error(WrongExpectedVersion("s", 1, 2)) and is_domain_error(SessionBusy("busy"))


def test_an_application_error_carries_its_business_code_in_data() -> None:
    error = RpcError.forbidden("this identity cannot answer approval ap1", approvalId="ap1")
    assert (error.rpc_code, error.code) == (APPLICATION_ERROR, "forbidden")
    assert error.data == {"code": "forbidden", "approvalId": "ap1"}
    assert error.error_object() == {"code": -32000, "message": str(error), "data": error.data}


def test_json_rpc_level_errors_are_named_by_their_code() -> None:
    assert RpcError.invalid_params("params.x: bad").code == "invalidParams"
    assert RpcError.method_not_found("m").data == {}


def test_an_unknown_business_code_is_misuse() -> None:
    with pytest.raises(ProtocolMisuse):
        RpcError.application("teapot", "short and stout")


def test_rejections_carry_retry_after_ms() -> None:
    assert RpcError.rejected("slow down", 250).data == {"code": "rejected", "retryAfterMs": 250}


def test_long_messages_are_clipped() -> None:
    assert len(RpcError.method_not_found("m" * 10_000).message) < 200
    assert len(RpcError.invalid_params("x" * 10_000).message) <= 500


def test_domain_errors_with_business_codes_become_application_errors() -> None:
    error = from_domain_error(WrongExpectedVersion("session-1", 2, 3))
    assert error.rpc_code == APPLICATION_ERROR and error.data["code"] == "conflict"
    assert error.data["stream"] == "session-1" and error.data["expected"] == 2
    assert from_domain_error(IdempotencyConflict("app", "k")).data["code"] == "conflict"


def test_other_domain_errors_become_internal_errors() -> None:
    error = from_domain_error(StoreClosed())
    assert error.rpc_code == INTERNAL_ERROR and error.message == "the event store is closed"


def test_an_rpc_error_is_translated_to_itself() -> None:
    error = RpcError.not_found("x")
    assert from_domain_error(error) is error


def test_an_error_of_any_class_with_a_code_and_data_translates_like_a_domain_error() -> None:
    real = WrongExpectedVersion("session-1", 2, 3)
    stranger = Stranger("conflict", str(real), stream="session-1", expected=2, actual=3)
    assert not isinstance(stranger, SessionloopError) and is_domain_error(stranger)
    assert error_frame(7, from_domain_error(stranger)) == error_frame(7, from_domain_error(real))


def test_a_retry_hint_in_the_data_of_any_error_goes_out_and_private_fields_stay_home() -> None:
    real = StorageFull("disk full", path="/srv/data/store")
    stranger = Stranger("storage-unavailable", "disk full", retryAfterMs=1000, outcome="not-written",
                        reason="full", _path="/srv/data/store")
    frame = error_frame(1, from_domain_error(stranger))
    assert frame == error_frame(1, from_domain_error(real))
    assert frame == ('{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"disk full","data":'
                     '{"code":"storage-unavailable","retryAfterMs":1000,"outcome":"not-written","reason":"full"}}}')


def test_an_error_of_any_class_with_another_code_is_an_internal_error_with_its_message() -> None:
    stranger = Stranger("busy", "a turn is running")
    busy = SessionBusy("a turn is running")
    assert error_frame(2, from_domain_error(stranger)) == error_frame(2, from_domain_error(busy))
    assert from_domain_error(stranger).error_object() == {"code": INTERNAL_ERROR, "message": "a turn is running"}


def test_an_arbitrary_exception_becomes_the_internal_error_naming_its_type() -> None:
    error = from_domain_error(KeyError("item-3"))
    assert error.error_object() == {"code": INTERNAL_ERROR, "message": "KeyError: 'item-3'"}
    assert error_frame(3, error) == error_frame(3, RpcError.internal_error("KeyError: 'item-3'"))


def test_an_exception_with_a_numeric_code_or_no_data_is_not_a_domain_error() -> None:
    assert not is_domain_error(SystemExit(2)) and not is_domain_error(ValueError("x"))
    no_data = Stranger("conflict", "x")
    del no_data.data
    assert not is_domain_error(no_data)
    assert from_domain_error(no_data).rpc_code == INTERNAL_ERROR
