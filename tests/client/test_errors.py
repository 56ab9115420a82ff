"""The client's errors: every error code of the protocol has its own exception class, carrying the
frame's codes and retry hint as attributes."""

from __future__ import annotations

from sessionloop.client import Rejected, RpcFailed, StorageUnavailable
from sessionloop.client.errors import error_from_frame
from sessionloop.protocol.errors import APPLICATION_ERROR, BUSINESS_CODES, RPC_ERROR_CODES


def test_every_application_code_and_every_json_rpc_code_has_a_class_of_its_own():
    generic = [code for code in BUSINESS_CODES
               if type(error_from_frame("m", APPLICATION_ERROR, "x", {"code": code})) is RpcFailed]
    generic += [name for name, number in RPC_ERROR_CODES.items() if number != APPLICATION_ERROR
                and type(error_from_frame("m", number, "x", None)) is RpcFailed]
    assert generic == []


def test_an_error_frame_carries_its_codes_and_its_retry_hint():
    refused = error_from_frame("loop/send", APPLICATION_ERROR, "too many requests on this connection",
                               {"code": "rejected", "retryAfterMs": 250})
    stored = error_from_frame("loop/send", APPLICATION_ERROR, "disk full",
                              {"code": "storage-unavailable", "retryAfterMs": 1000, "outcome": "unknown"})
    odd = error_from_frame("session/x", -32099, "what", ["not", "an", "object"])
    assert isinstance(refused, Rejected) and (refused.code, refused.rpc_code, refused.retry_after_ms) == (
        "rejected", APPLICATION_ERROR, 250)
    assert str(refused) == "loop/send: too many requests on this connection (rejected)"
    assert isinstance(stored, StorageUnavailable) and stored.outcome == "unknown" and stored.data["code"] == (
        "storage-unavailable")
    assert type(odd) is RpcFailed and odd.code == "rpc" and odd.data == {"value": ["not", "an", "object"]}
