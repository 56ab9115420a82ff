"""Which stored events a webhook announces, and the message that announces one (pure).

A message follows the Standard Webhooks format (https://www.standardwebhooks.com/): the body is
``{"type", "timestamp", "data"}``; ``webhook-id`` is ``msg_<session>_<version>``, the same for
every attempt at the same event, so a receiver drops repeats by it; ``webhook-signature`` is
``v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`` under the key of the app's ``whsec_``
secret, ``webhook-timestamp`` the attempt's time in seconds.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
from collections.abc import Sequence
from typing import Any

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.settings.apps import AppManifest
from sessionloop.eventstore import OutboxMark, RecordedEvent

__all__ = ["Message", "message_for", "outbox_mark", "sign", "webhook_type"]

_json = msgspec.json.Encoder()


def webhook_type(event: Any) -> str | None:
    """The webhook event type of a stored session event, or None if no webhook announces it."""
    kind = type(event)
    if kind is E.TurnCompleted or kind is E.TurnLimitReached:
        return "turn.completed"
    if kind is E.TurnFailed or kind is E.TurnAborted:
        return "turn.failed"
    if kind is E.ToolApprovalRequested:
        return "approval.requested"
    if kind is E.TurnStarted:
        return "turn.started"
    if kind is E.LlmCompleted:
        return "assistant.message" if event.text else None
    if kind is E.ToolStarted:
        return "tool.started"
    if kind is E.ToolFinished:
        return "tool.finished"
    return None


def outbox_mark(manifest: AppManifest | None, events: Sequence[Any]) -> OutboxMark | None:
    """What a commit of ``manifest``'s session owes its webhook: one flag per event (None when
    the app has no webhook or none of the events is of a type it asked for)."""
    if manifest is None or manifest.webhook is None:
        return None
    wanted = manifest.webhook.events
    flags = [webhook_type(e) in wanted for e in events]
    return OutboxMark(manifest.id, flags) if any(flags) else None


def _data(event: Any) -> dict[str, Any]:
    if isinstance(event, E.TurnCompleted):
        return {"outputText": event.output_text, "outcome": event.outcome}
    if isinstance(event, E.TurnLimitReached):
        return {"outputText": "", "outcome": "silent", "code": "tool-limit"}
    if isinstance(event, E.TurnFailed):
        return {"code": event.code, "reason": event.reason}
    if isinstance(event, E.TurnAborted):
        return {"code": "aborted", "reason": event.reason}
    if isinstance(event, E.ToolApprovalRequested):
        return {"approvalId": event.approval_id, "callId": event.call_id}
    if isinstance(event, E.TurnStarted):
        return {"source": event.source}
    if isinstance(event, E.LlmCompleted):
        return {"text": event.text, "model": event.model}
    if isinstance(event, E.ToolStarted):
        return {"callId": event.call_id, "tool": event.tool}
    if isinstance(event, E.ToolFinished):
        return {"callId": event.call_id, "status": event.status, "exitCode": event.exit_code}
    return {}


class Message(msgspec.Struct, frozen=True):
    """One webhook message: its stable id, its type and its body (the bytes that are signed)."""

    id: str
    type: str
    body: bytes


def message_for(app_id: str, recorded: RecordedEvent) -> Message | None:
    """The message announcing ``recorded`` (a session's event) to ``app_id``, or None if no
    webhook announces events of its type."""
    kind = webhook_type(recorded.event)
    if kind is None or not recorded.stream.startswith("session-"):
        return None
    session_id = recorded.stream[len("session-"):]
    at = datetime.datetime.fromtimestamp(recorded.at / 1000, tz=datetime.UTC)
    data = {"app": app_id, "sessionId": session_id, "sequence": recorded.version, "cursor": recorded.position,
            "turnId": getattr(recorded.event, "turn_id", None), **_data(recorded.event)}
    body = _json.encode({"type": kind, "timestamp": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                         "data": data})
    return Message(f"msg_{session_id}_{recorded.version}", kind, body)


def sign(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header: ``v1,`` and the base64 HMAC-SHA256 of ``id.timestamp.body``."""
    digest = hmac.new(key, f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()
