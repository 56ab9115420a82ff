"""Wire schemas: every method and notification of the seed, camelCase, tagged unions, constraints."""

from __future__ import annotations

import base64
import json
from typing import Any

import msgspec
import pytest

from sessionloop.protocol.errors import INVALID_PARAMS, RpcError
from sessionloop.protocol.frames import decode_params
from sessionloop.protocol.registry import METHODS, NOTIFICATIONS
from sessionloop.protocol.schemas import (
    ApprovalSettled,
    HistoryParams,
    ItemPush,
    LoopCreateParams,
    LoopWaitForTurnParams,
    SessionsListParams,
    SubscribeResult,
    TurnSendParams,
)
from sessionloop.protocol.schemas_items import (
    AgentMessageItem,
    NoticeItem,
    PlanEntry,
    PlanItem,
    QueueEntry,
    QueueItem,
    ReasoningItem,
    SessionItem,
    ToolCallItem,
    TurnItem,
    UsageItem,
    UsagePart,
    UserMessageItem,
)
from sessionloop.protocol.schemas_types import (
    Approval,
    ApprovalSettlement,
    BackgroundTask,
    CommandDisplay,
    FileChangeDisplay,
    PlaceLayer,
    PlatformTypeLayer,
    SessionSummary,
    SettingLayer,
    SettingRow,
    Speaker,
    decode_data_url,
)

SEED_METHODS = [
    "initialize",
    "sessions/list",
    "sessions/watch",
    "session/create",
    "session/rename",
    "session/archive",
    "session/unarchive",
    "session/delete",
    "session/batch",
    "session/markSeen",
    "session/config/get",
    "session/config/update",
    "session/config/layers",
    "session/config/layer/get",
    "session/config/layer/update",
    "session/config/overrides",
    "session/subscribe",
    "session/unsubscribe",
    "session/history",
    "turn/send",
    "turn/continue",
    "turn/abort",
    "session/compress",
    "turn/rewind",
    "plan/clear",
    "background/list",
    "background/watch",
    "background/output",
    "background/stop",
    "background/stopAll",
    "presence/update",
    "approval/respond",
]
LOOP_METHODS = ["loop/create", "loop/send", "loop/waitForTurn", "loop/listEvents", "loop/watch"]
GRANT_METHODS = ["approval/grants/list", "approval/grants/revoke"]  # protocol 0.2.1
WEBHOOK_METHODS = ["webhooks/deadLetters/list", "webhooks/deadLetters/replay"]  # docs/webhooks.md
SEED_NOTIFICATIONS = [
    "sessions/changed",
    "session/config/changed",
    "features/changed",
    "item/started",
    "item/completed",
    "item/delta",
    "session/resync",
    "background/changed",
    "approval/requested",
    "approval/settled",
]


def _params(method: str, params: dict[str, Any]) -> Any:
    return decode_params(METHODS[method].decoder, msgspec.Raw(json.dumps(params).encode()))


def _invalid(method: str, params: dict[str, Any]) -> str:
    result = _params(method, params)
    assert isinstance(result, RpcError) and result.rpc_code == INVALID_PARAMS, result
    return result.message


def _summary(**changes: Any) -> SessionSummary:
    base: dict[str, Any] = {
        "id": "s1", "title": "Chat", "child_count": 0, "kind": "owner", "section": "owner", "created_at": 1,
        "updated_at": 2, "running": False, "error": False, "unread": False, "attention": False, "archived": False,
        "background": 0,
    }  # fmt: skip
    return SessionSummary(**{**base, **changes})


# --- registry -------------------------------------------------------------------------------------


def test_every_seed_method_the_loop_methods_the_grant_and_the_webhook_methods_are_registered() -> None:
    assert sorted(METHODS) == sorted(SEED_METHODS + LOOP_METHODS + GRANT_METHODS + WEBHOOK_METHODS)


def test_every_seed_notification_and_loop_event_are_registered() -> None:
    assert sorted(NOTIFICATIONS) == sorted([*SEED_NOTIFICATIONS, "loop/event"])


def test_methods_without_arguments_accept_absent_empty_or_extra_params() -> None:
    for method in ("sessions/watch", "background/list", "session/config/layers", "loop/watch"):
        assert _params(method, {}) == _params(method, {"whatever": 1})


# --- wire shape -----------------------------------------------------------------------------------


def test_summaries_are_camel_case_and_keep_false_and_zero_fields() -> None:
    wire = json.loads(msgspec.json.encode(_summary(parent_id="p", last_reply_at=5)))
    assert wire["childCount"] == 0 and wire["running"] is False and wire["background"] == 0
    assert wire["parentId"] == "p" and wire["lastReplyAt"] == 5 and wire["createdAt"] == 1


def test_absent_optional_fields_are_omitted_not_null() -> None:
    wire = json.loads(msgspec.json.encode(_summary()))
    assert "parentId" not in wire and "tokens" not in wire and "ancestors" not in wire
    assert None not in wire.values()


ITEMS: list[Any] = [
    UserMessageItem(
        item_id="u1", at=1, turn_id="t1", text="hi", speaker=Speaker(platform="console", owner=True)
    ),
    AgentMessageItem(item_id="a1", at=2, text=""),
    ReasoningItem(item_id="r1", at=3, text="thinking"),
    ToolCallItem(
        item_id="call-1",
        at=4,
        tool="exec",
        status="completed",
        args={"command": "ls"},
        display=CommandDisplay(command="ls", exit_code=0),
        approval_id="ap1",
        settlement=ApprovalSettlement(
            state="approved",
            source="answer",
            at=5,
            by=Speaker(platform="console", user_id="owner", owner=True),
        ),
        task_id="task-1",
    ),
    NoticeItem(
        item_id="n1", at=6, topic="tool-limit", text="limit reached", can_continue=True, facts={"n": 1}
    ),
    PlanItem(item_id="plan", at=7, entries=[PlanEntry(text="step", status="in_progress")]),
    UsageItem(item_id="usage", at=8, parts=[UsagePart(label="history", tokens=10, injectors={"p/x": 3})]),
    TurnItem(item_id="turn-t1", at=9, turn_id="t1", outcome="replied"),
    QueueItem(item_id="queue", at=10, entries=[QueueEntry(text="next", attachments=0)]),
]


@pytest.mark.parametrize("item", ITEMS, ids=lambda item: type(item).__name__)
def test_every_item_kind_round_trips_through_the_tagged_union(item: Any) -> None:
    encoded = msgspec.json.encode(item)
    wire = json.loads(encoded)
    assert wire["itemId"] == item.item_id and wire["at"] == item.at and "kind" in wire
    assert msgspec.json.decode(encoded, type=SessionItem) == item


def test_item_kinds_use_the_seed_tags() -> None:
    kinds = {json.loads(msgspec.json.encode(item))["kind"] for item in ITEMS}
    assert kinds == {
        "user-message",
        "agent-message",
        "reasoning",
        "tool-call",
        "notice",
        "plan",
        "usage",
        "turn",
        "queue",
    }


@pytest.mark.parametrize("status", ["generating", "running", "completed", "failed", "denied", "aborted"])
def test_every_tool_call_status_is_accepted(status: str) -> None:
    raw = {"kind": "tool-call", "itemId": "c", "at": 1, "tool": "exec", "status": status, "notExecuted": True}
    item = msgspec.json.decode(json.dumps(raw), type=SessionItem)
    assert isinstance(item, ToolCallItem) and item.not_executed


def test_an_unknown_tool_call_status_is_refused() -> None:
    raw = {"kind": "tool-call", "itemId": "c", "at": 1, "tool": "exec", "status": "exploded"}
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(json.dumps(raw), type=SessionItem)


def test_file_change_display_is_tagged_on_kind() -> None:
    wire = json.loads(msgspec.json.encode(FileChangeDisplay(path="a.py", removed="x", added="y")))
    assert wire == {"kind": "file-change", "path": "a.py", "removed": "x", "added": "y"}


@pytest.mark.parametrize(("kind", "fixed"), [(PlanItem, "plan"), (UsageItem, "usage"), (QueueItem, "queue")])
def test_singleton_items_must_carry_their_fixed_item_id(kind: Any, fixed: str) -> None:
    field = {"plan": "entries", "usage": "parts", "queue": "entries"}[fixed]
    with pytest.raises(ValueError, match=fixed):
        kind(item_id="other", at=1, **{field: []})
    assert json.loads(msgspec.json.encode(kind(item_id=fixed, at=1, **{field: []})))["itemId"] == fixed


def test_setting_layers_are_tagged_on_scope() -> None:
    for layer, wire in [
        (
            PlatformTypeLayer(platform="onebot", type="group"),
            {"scope": "platformType", "platform": "onebot", "type": "group"},
        ),
        (PlaceLayer(key="ws:default"), {"scope": "place", "key": "ws:default"}),
    ]:
        assert json.loads(msgspec.json.encode(layer)) == wire
        assert msgspec.json.decode(json.dumps(wire), type=SettingLayer) == layer
    assert _invalid("session/config/layer/get", {"layer": {"scope": "session"}}).startswith("params.layer")


def test_setting_rows_keep_null_values_distinct_from_absent() -> None:
    row = msgspec.json.decode(
        b'{"plugin":"p","key":"k","field":{},"prominence":"common","value":null}', type=SettingRow
    )
    assert row.value is None and json.loads(msgspec.json.encode(row))["value"] is None
    assert "effective" not in json.loads(msgspec.json.encode(row))


def test_config_update_requires_value_and_accepts_null_to_delete() -> None:
    assert _invalid("session/config/update", {"sessionId": "s", "plugin": "p", "key": "k"}) == (
        "params.value: missing required field"
    )
    assert (
        _params("session/config/update", {"sessionId": "s", "plugin": "p", "key": "k", "value": None}).value
        is None
    )


def test_approvals_and_background_tasks_round_trip() -> None:
    approval = msgspec.json.decode(
        json.dumps({
            "id": "ap1", "sessionId": "s",
            "origin": {"kind": "hand", "participants": [{"platform": "console", "userId": "owner"}]},
            "target": "tool", "tool": "exec", "facts": {"command": "rm -rf x", "params": {"command": "rm -rf x"}},
            "options": ["approve", "deny"], "contentHash": "h", "expiresAt": 9, "state": "pending",
            "chain": [{"id": "root", "title": "Root"}],
        }),
        type=Approval,
    )  # fmt: skip
    assert approval.facts.command == "rm -rf x" and approval.chain and approval.chain[0].id == "root"
    task = BackgroundTask(
        id="t", session_id="s", kind="tool-call", label="exec", status="running", started_at=1
    )
    assert msgspec.json.decode(msgspec.json.encode(task), type=BackgroundTask) == task


def test_approval_settled_has_the_shape_of_the_settlement() -> None:
    settlement = ApprovalSettlement(state="expired", source="timeout", at=3)
    assert json.loads(msgspec.json.encode(ApprovalSettled.of("ap1", settlement))) == {
        "approvalId": "ap1", "state": "expired", "source": "timeout", "at": 3,
    }  # fmt: skip


def test_subscribe_snapshots_and_item_pushes_carry_epoch_and_seq() -> None:
    snapshot = SubscribeResult(epoch=2, seq=40, session=_summary(), items=ITEMS, approvals=[])
    assert msgspec.json.decode(msgspec.json.encode(snapshot), type=SubscribeResult) == snapshot
    push = json.loads(msgspec.json.encode(ItemPush(session_id="s1", epoch=2, seq=41, item=ITEMS[2])))
    assert (push["epoch"], push["seq"], push["item"]["kind"]) == (2, 41, "reasoning")


# --- constraints ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("limit", "ok"), [(0, False), (1, True), (200, True), (201, False), (-5, False)])
def test_list_and_history_limits_are_between_1_and_200(limit: int, ok: bool) -> None:
    for method, params in (("sessions/list", {}), ("session/history", {"sessionId": "s"})):
        result = _params(method, {**params, "limit": limit})
        assert isinstance(result, SessionsListParams | HistoryParams) is ok


@pytest.mark.parametrize(
    ("method", "params", "field"),
    [
        ("sessions/list", {"section": "others"}, "params.section"),
        ("session/batch", {"op": "rename", "ids": []}, "params.op"),
        ("turn/rewind", {"sessionId": "s", "turnId": "t", "scope": "everything"}, "params.scope"),
        ("approval/respond", {"approvalId": "a", "decision": "maybe", "contentHash": "h"}, "params.decision"),
    ],
)
def test_enumerated_fields_refuse_other_values(method: str, params: dict[str, Any], field: str) -> None:
    assert _invalid(method, params).startswith(field + ":")


def test_background_filter_only_takes_true() -> None:
    assert _params("sessions/list", {"background": True}).background is True
    assert _invalid("sessions/list", {"background": False}).startswith("params.background")


def test_background_with_archived_is_invalid_params() -> None:
    assert "background" in _invalid("sessions/list", {"background": True, "archived": False})


def test_instance_with_platform_is_invalid_params() -> None:
    assert "instance" in _invalid("sessions/list", {"instance": "onebot-1", "platform": "onebot"})


def test_turn_send_refuses_blank_text_without_attachments() -> None:
    assert "content" in _invalid("turn/send", {"sessionId": "s", "content": " \n\t "})


def test_turn_send_accepts_attachments_without_text_and_strips_text() -> None:
    image = {"data": "data:image/png;base64," + base64.b64encode(b"\x89PNG").decode(), "name": "a.png"}
    params = _params("turn/send", {"sessionId": "s", "content": "  ", "attachments": [image]})
    assert isinstance(params, TurnSendParams) and params.text == ""
    assert _params("turn/send", {"sessionId": "s", "content": "  hi \n"}).text == "hi"


@pytest.mark.parametrize(
    "data", ["https://example.com/a.png", "file:///etc/passwd", "data:image/png,rawtext", "AAAA"]
)
def test_outgoing_attachments_must_be_base64_data_urls(data: str) -> None:
    message = _invalid(
        "turn/send", {"sessionId": "s", "content": "x", "attachments": [{"data": data, "name": "a"}]}
    )
    assert message.startswith("params.attachments[0].data:")


def test_decode_data_url_returns_the_payload_or_none() -> None:
    decoded = decode_data_url("data:text/plain;charset=utf-8;base64,aGVsbG8=")
    assert decoded is not None and decoded.payload == b"hello" and decoded.mime == "text/plain"
    assert decode_data_url("data:;base64,aGVsbG8") is not None  # missing padding is tolerated
    for bad in ("data:text/plain;base64,!!!", "data:text/plain,hello", "nope", "data:a;base64,a"):
        assert decode_data_url(bad) is None


# --- Session Loop API -----------------------------------------------------------------------------


def test_loop_create_refuses_container_and_space_together() -> None:
    assert "containerId" in _invalid("loop/create", {"containerId": "inbox", "space": {"spaceId": "sp"}})


def test_loop_create_defaults_permission_mode_by_activity() -> None:
    assert LoopCreateParams().effective_permission_mode == "ask"
    assert LoopCreateParams(activity="background").effective_permission_mode == "acceptCalls"
    assert LoopCreateParams(activity="background", permission_mode="deny").effective_permission_mode == "deny"


def test_loop_send_limits_key_text_and_attachments() -> None:
    ok = {"sessionId": "s", "text": "hi", "idempotencyKey": "k" * 512}
    assert not isinstance(_params("loop/send", ok), RpcError)
    assert _invalid("loop/send", {**ok, "idempotencyKey": "k" * 513}).startswith("params.idempotencyKey")
    assert _invalid("loop/send", {**ok, "idempotencyKey": ""}).startswith("params.idempotencyKey")
    assert _invalid("loop/send", {**ok, "text": "x" * 100_001}).startswith("params.text")
    attachment = {"data": "data:text/plain;base64,eA==", "name": "x.txt"}
    assert _invalid("loop/send", {**ok, "attachments": [attachment] * 11}).startswith("params.attachments")
    assert (
        _invalid("loop/send", {"sessionId": "s", "text": "hi"})
        == "params.idempotencyKey: missing required field"
    )


@pytest.mark.parametrize(
    ("timeout", "clamped"), [(None, 60_000), (0, 1_000), (-5, 1_000), (5_000, 5_000), (10**9, 600_000)]
)
def test_wait_for_turn_timeouts_are_clamped_not_refused(timeout: int | None, clamped: int) -> None:
    assert (
        LoopWaitForTurnParams(session_id="s", turn_id="t", timeout_ms=timeout).clamped_timeout_ms == clamped
    )
