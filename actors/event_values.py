"""The value objects sessionloop's events carry (:mod:`actors.events`): who spoke, attachments,
tool calls and their displays, usage, approvals' facts, grants and settlements, messages, places.

Frozen msgspec Structs, under the same rules as the events (never rename or retype a stored field;
new fields get a default). :mod:`actors.events` re-exports every one of them, so ``E.Message`` and
the rest are where they always were.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "ApprovalFacts",
    "AttachmentRef",
    "ChainLink",
    "ChatInfo",
    "GrantTerms",
    "Message",
    "OriginInfo",
    "PlaceRef",
    "PlanEntry",
    "Settlement",
    "Speaker",
    "ToolCallRef",
    "ToolCallSpec",
    "ToolDisplay",
    "Usage",
]

class Speaker(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """Who said something (a user message's speaker) or answered an approval (``Settlement.by``)."""

    platform: str
    user_id: str | None = None
    nickname: str | None = None
    owner: bool = False
    app_id: str | None = None


class AttachmentRef(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """An attachment stored as a content-addressed blob in the data directory."""

    name: str
    kind: str  # image | audio | video | file
    mime: str
    size: int
    sha256: str


class ToolCallSpec(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """A tool call as the model produced it."""

    call_id: str
    name: str
    args: Any = None


class Usage(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class GrantTerms(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """What an answer grants beyond its own call (as Codex's ``acceptForSession``, ACP's
    ``allow_always``/``reject_always``): later calls of ``tool`` (of ``exec`` commands starting
    with ``command_prefix``) in this turn or session are settled the same way until ``expires_at``."""

    scope: Literal["turn", "session"]
    tool: str
    command_prefix: str | None = None
    expires_at: int


class Settlement(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """How an approval ended (the protocol's approval settlement). An answer may make a grant
    (``grant``: its id is the approval's); a call settled by a grant names it (``grant_id``)."""

    state: Literal["approved", "denied", "expired", "cancelled"]
    source: Literal["answer", "absent", "timeout", "ineligible", "rate-limit", "turn-ended", "shutdown", "grant"]
    at: int
    by: Speaker | None = None
    note: str | None = None
    grant: GrantTerms | None = None
    grant_id: str | None = None


class ToolDisplay(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """A tool call's display: ``command`` (command, cwd, exitCode) or ``file-change`` (path, removed, added)."""

    kind: Literal["command", "file-change"]
    command: str | None = None
    cwd: str | None = None
    exit_code: int | None = None
    path: str | None = None
    removed: str | None = None
    added: str | None = None
    #: the sandbox policy a command runs under (``workspace-write``...; ``none``: unsandboxed)
    sandbox: str | None = None


class PlanEntry(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    text: str
    status: Literal["pending", "in_progress", "completed"] = "pending"


class Message(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """A model-visible message, as copied into a fork."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    #: a tuple, so the many messages without calls share ``()`` and a session's history holds
    #: no container the cyclic collector must walk (the messages themselves are untracked)
    tool_calls: tuple[ToolCallSpec, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    turn_id: str | None = None
    #: a user message's files (the model is sent them as actors/model/attachments.py says)
    attachments: tuple[AttachmentRef, ...] = ()


class ChatInfo(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    type: str
    multi_party: bool = False


class PlaceRef(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    key: str
    kind: Literal["window", "workspace"]
    name: str


class OriginInfo(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    kind: Literal["hand", "autonomous"]
    participants: list[Speaker] = []


class ApprovalFacts(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    params: dict[str, Any] = {}
    command: str | None = None
    cwd: str | None = None
    diff_path: str | None = None
    diff_patch: str | None = None
    sandbox: str | None = None


class ChainLink(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    id: str
    title: str


class ToolCallRef(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    tool: str
    turn_id: str
    call_id: str


