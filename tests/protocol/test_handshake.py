"""Handshake and version rules (seed 004, 握手 / 版本)."""

from __future__ import annotations

import pytest
from protocol_helpers import ALL_FEATURES, OWNER, Peer, error_of, hello, make_connection, request

from sessionloop.protocol.connection import CLOSE_UNSUPPORTED_VERSION, State
from sessionloop.protocol.errors import APPLICATION_ERROR, INVALID_PARAMS, INVALID_REQUEST, RpcError
from sessionloop.protocol.handshake import SESSION_PROTOCOL_VERSION, compatibility_key, negotiate, parse_version
from sessionloop.protocol.schemas_types import Features

# --- the pure rule --------------------------------------------------------------------------------


def test_the_protocol_version_is_0_2_2_cursors_rate_limits_and_dead_letters_added_to_0_2_1() -> None:
    assert SESSION_PROTOCOL_VERSION == "0.2.2"


@pytest.mark.parametrize("client", ["0.2.0", "0.2.9", "0.2.123", "0.2"])
def test_below_1_0_versions_agreeing_in_the_first_two_parts_are_accepted(client: str) -> None:
    assert negotiate(client) == "0.2.2"


@pytest.mark.parametrize("client", ["0.3.0", "0.1.9", "0.1", "0.3", "1.2.0", "2.0"])
def test_below_1_0_a_different_second_part_is_unsupported(client: str) -> None:
    with pytest.raises(RpcError) as info:
        negotiate(client)
    assert info.value.rpc_code == APPLICATION_ERROR and info.value.data["code"] == "unsupported"


def test_the_two_part_1_0_of_the_0_20_generation_is_unsupported_not_invalid_params() -> None:
    with pytest.raises(RpcError) as info:
        negotiate("1.0")
    assert info.value.rpc_code == APPLICATION_ERROR and info.value.data["code"] == "unsupported"


@pytest.mark.parametrize(
    ("client", "ok"), [("1.0", True), ("1.9", True), ("1.4.2", True), ("2.0.0", False), ("0.9", False)]
)
def test_from_1_0_only_the_first_part_is_compared(client: str, ok: bool) -> None:
    if ok:
        assert negotiate(client, "1.3.0") == "1.3.0"
    else:
        with pytest.raises(RpcError, match="not supported"):
            negotiate(client, "1.3.0")


def test_the_refusal_names_both_versions() -> None:
    with pytest.raises(RpcError) as info:
        negotiate("0.7.1")
    assert "0.7.1" in info.value.message and "0.2.2" in info.value.message
    assert info.value.data == {"code": "unsupported", "clientVersion": "0.7.1", "serverVersion": "0.2.2"}


@pytest.mark.parametrize(
    "client",
    [
        "",
        "1",
        "0",
        "1.2.3.4",
        "a.b",
        "1.x",
        "1.-2",
        "v0.2.0",
        "0..2",
        " 0.2.0",
        "0.2.0\n",
        "٠.٢",
        "0.2.",
        "1e3.0",
        "9" * 40 + ".0",
    ],
)
def test_a_string_that_is_not_a_version_is_invalid_params(client: str) -> None:
    with pytest.raises(RpcError) as info:
        negotiate(client)
    assert info.value.rpc_code == INVALID_PARAMS and "protocolVersion" in info.value.message


def test_compatibility_key_is_two_parts_below_1_and_one_part_from_1() -> None:
    assert compatibility_key(parse_version("0.2.5")) == (0, 2)
    assert compatibility_key(parse_version("3.1")) == (3,)


# --- initialize on a connection -------------------------------------------------------------------


def test_initialize_answers_with_version_identity_surface_features_app_name_and_rate_limits(fresh: Peer) -> None:
    (reply,) = fresh.feed(hello("0.2.7", "h1"))
    assert reply == {
        "jsonrpc": "2.0",
        "id": "h1",
        "result": {
            "protocolVersion": "0.2.2",
            "experimental": True,
            "server": {"name": "sessionloop"},
            "identity": {"platform": OWNER.platform, "userId": OWNER.user_id},
            "surface": "cli",
            "features": {"send": True, "rewind": True, "compress": True, "settings": True},
            "appName": "Aalis",
            "rateLimits": {"requestsPerSecond": 100.0, "burst": 200, "maxInFlight": 256},
        },
    }
    assert fresh.conn.state is State.OPEN and fresh.conn.client is not None


def test_features_and_app_name_are_read_on_every_handshake() -> None:
    calls: list[str] = []
    names = iter(["Aalis", "Renamed"])

    def describe() -> tuple[Features, str]:
        calls.append("x")
        return ALL_FEATURES, next(names)

    first, second = Peer(make_connection(describe=describe)), Peer(make_connection(describe=describe))
    assert first.feed(hello())[0]["result"]["appName"] == "Aalis"
    assert second.feed(hello())[0]["result"]["appName"] == "Renamed"
    assert len(calls) == 2


def test_an_unsupported_version_is_answered_then_the_connection_closes(fresh: Peer) -> None:
    (reply,) = fresh.feed(hello("1.0", 5))
    _, code, message = error_of(reply)
    assert (reply["id"], code, reply["error"]["data"]["code"]) == (5, APPLICATION_ERROR, "unsupported")
    assert "1.0" in message and "0.2.2" in message
    assert fresh.closed is not None and fresh.closed.code == CLOSE_UNSUPPORTED_VERSION
    assert "1.0" in fresh.closed.reason
    assert fresh.conn.state is State.CLOSED


def test_after_an_unsupported_version_nothing_more_is_produced(fresh: Peer) -> None:
    fresh.feed(hello("0.9"))
    assert fresh.conn.receive(hello()) == []
    assert fresh.conn.receive("garbage") == []


def test_a_malformed_version_is_invalid_params_and_the_client_may_retry(fresh: Peer) -> None:
    (reply,) = fresh.feed(hello("zero.two", 1))
    assert error_of(reply)[:2] == (1, INVALID_PARAMS)
    assert fresh.conn.state is State.AWAITING_INIT and fresh.closed is None
    assert "result" in fresh.feed(hello("0.2.0", 2))[0]


def test_initialize_without_client_info_is_invalid_params(fresh: Peer) -> None:
    (reply,) = fresh.feed(request("initialize", {"protocolVersion": "0.2.0"}, 1))
    assert error_of(reply) == (1, INVALID_PARAMS, "params.client: missing required field")


def test_a_second_initialize_is_invalid_request(peer: Peer) -> None:
    (reply,) = peer.feed(hello("0.2.0", "again"))
    assert error_of(reply)[:2] == ("again", INVALID_REQUEST)
    assert peer.conn.state is State.OPEN


def test_a_second_initialize_with_a_bad_version_is_still_just_invalid_request(peer: Peer) -> None:
    (reply,) = peer.feed(hello("9.9", "again"))
    assert error_of(reply)[:2] == ("again", INVALID_REQUEST)
    assert peer.conn.state is State.OPEN and peer.closed is None
