"""Event shapes to wire shapes: the session's stored facts as the session protocol shows them.

Pure conversions, no state: a speaker, an attachment, a tool card's display, an approval's
settlement and terms, a grant as ``approval/grants/list`` shows it, and the items of a message a
fork copied (docs/protocol.md, "Item kinds"). :mod:`actors.views.items` (the items projection)
builds its items with them; the approval and task actors send their settlements and displays
through them, so every copy of one fact on the wire has the same shape.
"""

from __future__ import annotations

from typing import Any, Final, Literal, cast

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.approvals.grants import Grant
from sessionloop.actors.session.context import is_summary, summary_text
from sessionloop.actors.settings.texts import Text
from sessionloop.protocol.schemas_items import AgentMessageItem, NoticeItem, SessionItem, ToolCallItem, UserMessageItem
from sessionloop.protocol.schemas_types import (
    ApprovalGrant,
    ApprovalSettlement,
    CommandDisplay,
    FileChangeDisplay,
    GrantTerms,
    ItemAttachment,
    Speaker,
    ToolDisplay,
)

__all__ = [
    "failed_result",
    "imported_items",
    "wire_attachment",
    "wire_display",
    "wire_grant",
    "wire_settlement",
    "wire_speaker",
    "wire_terms",
]

#: the notice a fork's copied summary becomes (rendered in the server's language when sent)
TEXT_SUMMARY_MARKER: Final = Text("notice.summary-marker")
_ATTACHMENT_KINDS: Final = frozenset({"image", "audio", "video", "file"})


def wire_speaker(speaker: E.Speaker | None, source: str | None = None) -> Speaker | None:
    """The wire speaker; ``source`` is the input's injection source (a person's own message has none)."""
    if speaker is None:
        return None
    return Speaker(
        platform=speaker.platform,
        owner=speaker.owner,
        user_id=speaker.user_id,
        nickname=speaker.nickname,
        source=source,
    )


def wire_attachment(ref: E.AttachmentRef) -> ItemAttachment:
    """``src`` is ``blob:<sha256>``, an internal reference the gateway replaces by a signed,
    epoch-bound download handle before anything leaves the server (docs/protocol.md, "Transport")."""
    kind = ref.kind if ref.kind in _ATTACHMENT_KINDS else "file"
    return ItemAttachment(kind=cast(Literal["image", "audio", "video", "file"], kind), name=ref.name,
                          src=f"blob:{ref.sha256}")


def wire_display(display: E.ToolDisplay | None, exit_code: int | None = None) -> ToolDisplay | None:
    """A tool card's display: none when the command or path is not a string; the exit code only
    once the call ended (``exit_code`` comes from the finished call)."""
    if display is None:
        return None
    if display.kind == "command":
        if not isinstance(display.command, str):
            return None
        return CommandDisplay(command=display.command, cwd=display.cwd, exit_code=exit_code, sandbox=display.sandbox)
    if not isinstance(display.path, str):
        return None
    return FileChangeDisplay(path=display.path, removed=display.removed, added=display.added)


def wire_settlement(s: E.Settlement) -> ApprovalSettlement:
    """The wire settlement (the tool card's, ``approval/settled``'s), with a grant it made or used."""
    grant = wire_terms(s.grant) if s.grant is not None else None
    return ApprovalSettlement(state=s.state, source=s.source, at=s.at, by=wire_speaker(s.by), grant=grant,
                              grant_id=s.grant_id)


def wire_terms(terms: E.GrantTerms) -> GrantTerms:
    return GrantTerms(scope=terms.scope, tool=terms.tool, command_prefix=terms.command_prefix,
                      expires_at=terms.expires_at)


def wire_grant(session_id: str, g: Grant) -> ApprovalGrant:
    """A grant as ``approval/grants/list`` shows it."""
    return ApprovalGrant(id=g.id, session_id=session_id, decision=g.decision, terms=wire_terms(g.terms),
                         turn_id=g.turn_id, at=g.at, by=wire_speaker(g.by))


def failed_result(output: Any, exit_code: int | None) -> bool:
    """A finished call is ``failed`` when its result is a JSON object with ``error``, or its exit code is not 0."""
    return (isinstance(output, dict) and "error" in output) or (exit_code is not None and exit_code != 0)


def _decoded_result(content: str) -> Any:
    """A stored tool message's content back to JSON when it is JSON (the fold encodes non-strings)."""
    if content[:1] in ("{", "["):
        try:
            return msgspec.json.decode(content)
        except msgspec.DecodeError:
            return content
    return content



def imported_items(
    item_id: str, message: E.Message, results: dict[str, E.Message], at: int
) -> list[SessionItem]:
    """The items of one copied message; system prompts and tool results give none of their own."""
    turn_id = message.turn_id
    if message.role == "user":
        return [UserMessageItem(item_id=item_id, at=at, turn_id=turn_id, text=message.content)]
    if message.role == "system" and is_summary(message):
        return [NoticeItem(item_id=item_id, at=at, topic="event-marker", text=TEXT_SUMMARY_MARKER,
                           facts={"summary": summary_text(message)})]
    if message.role != "assistant":
        return []
    items: list[SessionItem] = []
    if message.content:
        items.append(AgentMessageItem(item_id=item_id, at=at, turn_id=turn_id, text=message.content))
    items.extend(_imported_call(c, turn_id, results.get(c.call_id), at) for c in message.tool_calls)
    return items


def _imported_call(
    call: E.ToolCallSpec, turn_id: str | None, result: E.Message | None, at: int
) -> ToolCallItem:
    """A forked call's card: completed/failed from its copied result, ``aborted`` without one."""
    if result is None:
        return ToolCallItem(item_id=call.call_id, at=at, turn_id=turn_id, tool=call.name, status="aborted",
                            args=call.args)
    output = _decoded_result(result.content)
    status: Literal["completed", "failed"] = "failed" if failed_result(output, None) else "completed"
    return ToolCallItem(item_id=call.call_id, at=at, turn_id=turn_id, tool=call.name, status=status,
                        args=call.args, result=output)
