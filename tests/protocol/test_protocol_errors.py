"""Error codes and the RpcError / ProtocolMisuse leaves of the exception tree."""

from __future__ import annotations

import pytest

from sessionloop.eventstore.errors import IdempotencyConflict, SessionloopError, StoreClosed, WrongExpectedVersion
from sessionloop.protocol.errors import (
    APPLICATION_ERROR,
    BUSINESS_CODES,
    INTERNAL_ERROR,
    RPC_ERROR_CODES,
    ProtocolMisuse,
    RpcError,
    from_domain_error,
)


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


def test_rpc_errors_and_misuse_belong_to_the_one_tree() -> None:
    assert issubclass(RpcError, SessionloopError) and issubclass(ProtocolMisuse, SessionloopError)


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
