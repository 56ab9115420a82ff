"""Shared printing for the client commands: tables, JSON, and one-line renderings of wire shapes.

Two rules hold for everything here:

* every fact that reaches the terminal as text goes through :func:`protocol.sanitize.sanitize_for_card`
  first (what a card shows is sanitized): titles, message text, tool arguments and output can carry control, bidi
  and zero-width characters that would make a line read differently from what it is;
* ``--json`` output is the wire data verbatim (camelCase, as :func:`msgspec.to_builtins` gives it),
  but the same characters are written as ``\\uXXXX`` escapes, so the JSON stays exact for a machine
  and harmless on a terminal.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Final

import click
import msgspec

from sessionloop.protocol.sanitize import REMOVED_CODEPOINTS, sanitize_for_card, sanitize_text
from sessionloop.protocol.schemas import (
    AgentMessageItem,
    Approval,
    ApprovalSettled,
    ApprovalSettlement,
    BackgroundTask,
    CommandDisplay,
    FileChangeDisplay,
    NoticeItem,
    PlanItem,
    ReasoningItem,
    SessionSummary,
    ToolCallItem,
    TurnItem,
    UserMessageItem,
    is_unset,
)

__all__ = [
    "TASK_HEADERS",
    "approval_card",
    "args_summary",
    "clean",
    "echo_json",
    "echo_json_line",
    "echo_table",
    "fmt_ago",
    "fmt_time",
    "item_lines",
    "notice_line",
    "session_status",
    "settlement_text",
    "shorten",
    "speaker_name",
    "summary_lines",
    "task_row",
    "task_status",
    "to_plain",
    "tool_card",
]

_JSON_ESCAPES: Final = {cp: f"\\u{cp:04x}" for cp in REMOVED_CODEPOINTS}
ARGS_WIDTH: Final = 80
TITLE_WIDTH: Final = 40
# Why an approval was settled without an answer (settlement.source), in words.
_SOURCES: Final = {
    "absent": "nobody was present",
    "timeout": "nobody answered in time",
    "ineligible": "nobody present may answer it",
    "rate-limit": "too many approvals in a minute",
    "turn-ended": "the turn ended",
    "shutdown": "the server shut down",
}


# --- primitives -----------------------------------------------------------------------------------


def clean(value: Any) -> str:
    """``value`` as display text, sanitized (``None`` is the empty string)."""
    if value is None:
        return ""
    return sanitize_text(value if isinstance(value, str) else str(value))


def shorten(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: max(width - 1, 0)] + "…"


def to_plain(data: Any) -> Any:
    """Structs (and lists/dicts of them) as JSON-ready builtins with the wire's camelCase keys."""
    return msgspec.to_builtins(data)


def _dumps(data: Any, indent: int | None) -> str:
    text = json.dumps(to_plain(data), indent=indent, ensure_ascii=False,
                      separators=None if indent else (",", ":"))
    return text.translate(_JSON_ESCAPES)  # these only ever occur inside JSON strings


def echo_json(data: Any) -> None:
    """Print ``data`` as indented JSON (one document)."""
    click.echo(_dumps(data, 2))


def echo_json_line(data: Any) -> None:
    """Print ``data`` as one compact JSON line (JSON Lines, for streams such as ``watch``)."""
    click.echo(_dumps(data, None))


def echo_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """A plain left-aligned table, two spaces between columns; the last column is not padded."""
    cells = [list(headers)] + [[clean(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        padded = [c.ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True)] + [row[-1]]
        click.echo("  ".join(padded).rstrip())


def fmt_time(ms: int | None) -> str:
    """Epoch milliseconds as local ``YYYY-MM-DD HH:MM:SS`` (empty for None)."""
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


def fmt_clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).strftime("%H:%M:%S")


def fmt_ago(ms: int | None, now_ms: int | None = None) -> str:
    """``just now``, ``5m ago``, ``3h ago``, ``2d ago``, then the date."""
    if ms is None:
        return ""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    seconds = max(0, (now_ms - ms) // 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago" if seconds < 30 * 86400 else fmt_time(ms)[:10]
    return "just now"


# --- sessions -------------------------------------------------------------------------------------


def session_status(s: SessionSummary) -> str:
    """The summary's state flags, most urgent first (``idle`` when none is set)."""
    flags = [name for name, on in (("attention", s.attention), ("running", s.running), ("error", s.error),
                                   ("unread", s.unread), ("archived", s.archived)) if on]
    if s.background:
        flags.append(f"background {s.background}")
    return ", ".join(flags) or "idle"


def session_row(s: SessionSummary) -> list[str]:
    """One ``sessions ls`` row: id, title, status, last turn, updated."""
    last = s.last_turn.outcome if s.last_turn else ""
    return [s.id, shorten(clean(s.title), TITLE_WIDTH), session_status(s), last, fmt_ago(s.updated_at)]


SESSION_HEADERS: Final = ("ID", "TITLE", "STATUS", "LAST TURN", "UPDATED")


def summary_lines(s: SessionSummary) -> list[str]:
    """A summary as ``key  value`` lines (``sessions show``)."""
    rows: list[tuple[str, str]] = [
        ("status", session_status(s)),
        ("kind", f"{s.kind} (section {s.section})"),
        ("created", fmt_time(s.created_at)),
        ("updated", fmt_time(s.updated_at)),
    ]
    if s.last_turn:
        rows.append(("last turn", f"{s.last_turn.outcome} at {fmt_time(s.last_turn.ended_at)}"))
    if s.reason:
        rows.append(("reason", s.reason))
    if s.tokens:
        rows.append(("tokens", f"{s.tokens.input} in / {s.tokens.output} out"))
    if s.ancestors:
        rows.append(("parents", " › ".join(f"{a.title} ({a.id})" for a in s.ancestors)))
    if s.child_count:
        rows.append(("children", str(s.child_count)))
    if s.platform:
        rows.append(("platform", " ".join(filter(None, [s.platform, s.instance, s.account]))))
    if s.place:
        rows.append(("place", f"{s.place.name} ({s.place.kind})"))
    head = f"{s.id}  {clean(s.title)}"
    return [head] + [f"  {k:<10} {clean(v)}" for k, v in rows]


# --- items ----------------------------------------------------------------------------------------


def _value(v: Any) -> str:
    return v if isinstance(v, str) and v and " " not in v and '"' not in v else json.dumps(v, ensure_ascii=False)


def args_summary(args: Any, width: int = ARGS_WIDTH) -> str:
    """Tool arguments on one short line: ``key=value`` pairs for an object, JSON otherwise."""
    if is_unset(args) or args is None:
        return ""
    args = sanitize_for_card(args)
    if isinstance(args, dict):
        text = " ".join(f"{k}={_value(v)}" for k, v in args.items())
    else:
        text = json.dumps(args, ensure_ascii=False)
    return shorten(text, width)


def _result_error(result: Any) -> str | None:
    if isinstance(result, dict) and result.get("error") not in (None, False, ""):
        error = result["error"]
        return error if isinstance(error, str) else json.dumps(error, ensure_ascii=False)
    return None


def _result_output(result: Any) -> str:
    """The ``output`` text of a tool result (exec's ``{exitCode, output}``), if it has one."""
    if isinstance(result, dict) and isinstance(result.get("output"), str):
        return str(result["output"])
    return ""


def tool_card(item: ToolCallItem, *, label: bool = True) -> str:
    """A tool call on one line: tool, what it was asked (command, path or arguments), how it ended.

    ``label`` puts the tool name in a ``[tool NAME]`` tag (chat); without it the name leads (timeline).
    """
    display = item.display
    if isinstance(display, CommandDisplay):
        what = "$ " + shorten(clean(display.command), ARGS_WIDTH)
        if display.cwd:
            what += f"  (in {shorten(clean(display.cwd), 40)})"
    elif isinstance(display, FileChangeDisplay):
        what = shorten(clean(display.path), ARGS_WIDTH)
    else:
        what = args_summary(item.args)
    status = item.status + (" (not executed)" if item.not_executed else "")
    facts = [status]
    if isinstance(display, CommandDisplay) and display.exit_code is not None:
        facts.append(f"exit {display.exit_code}")
    if item.duration_ms is not None:
        facts.append(f"{item.duration_ms} ms")
    if item.settlement is not None:
        why = _SOURCES.get(item.settlement.source)
        facts.append(f"approval {item.settlement.state}" + (f" ({why})" if why else ""))
    if item.task_id:
        facts.append(f"background task {clean(item.task_id)}")
    error = _result_error(item.result) if not is_unset(item.result) else None
    if error:
        facts.append(shorten(clean(error), 60))
    elif item.output or _result_output(item.result):
        last = [line for line in clean(item.output or _result_output(item.result)).splitlines() if line.strip()]
        if last:
            facts.append("… " + shorten(last[-1], 60))
    head = (f"[tool {clean(item.tool)}]" if label else clean(item.tool)) + (f" {what}" if what else "")
    return f"{head} -> {', '.join(facts)}"


def turn_line(item: TurnItem) -> str:
    """How a turn that did not reply ends in a transcript: ``[turn error] <reason> (step <id>)``
    for a failure, marked so it cannot be mistaken for the agent's words."""
    if item.outcome != "error":
        return f"[turn {item.outcome}]"
    reason = clean(item.reason) if item.reason else "no reason recorded"
    step = f" (step {clean(item.step_id)})" if item.step_id else ""
    return f"[turn error] {reason}{step}"


def notice_line(item: NoticeItem, *, label: bool = True) -> str:
    """A notice: its topic and text (its facts when it has no text)."""
    text = clean(item.text)
    if not text and not is_unset(item.facts):
        text = shorten(json.dumps(sanitize_for_card(item.facts), ensure_ascii=False), ARGS_WIDTH)
    head = f"[notice {clean(item.topic)}]" if label else f"{clean(item.topic)}:"
    return f"{head} {text}".rstrip()


def approval_line(a: Approval) -> str:
    what = clean(a.facts.command) if a.facts.command else args_summary(a.facts.params)
    return f"[approval {a.state}] {clean(a.tool)}: {shorten(what, ARGS_WIDTH)} (id {a.id})"


CARD_INDENT: Final = "  "


def _card_field(label: str, text: str) -> list[str]:
    """``label: text``; the lines of a multi-line ``text`` are indented under its first line, so a
    newline in a fact can never start a line that looks like the card's own."""
    head = f"{CARD_INDENT}{label + ':':<8} "
    lines = text.split("\n") or [""]
    return [head + lines[0]] + [" " * len(head) + line for line in lines[1:]]


def approval_card(a: Approval, now_ms: int | None = None) -> list[str]:
    """An approval request as card lines: tool, command and cwd, the file and its diff, the params.

    Every fact goes through :func:`sanitize_for_card` first (what a card shows is sanitized): the facts are the
    tool's arguments verbatim. Nothing is shortened: the owner approves what the card shows.
    """
    facts = sanitize_for_card(to_plain(a.facts))
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    left = max(0, (a.expires_at - now_ms) // 1000)
    where = f"session {clean(a.session_id)}"
    if a.chain:
        where += " (" + " › ".join(clean(c.title) for c in a.chain) + ")"
    lines = [f"[approval requested] {clean(a.tool)} in {where}, expires {fmt_clock(a.expires_at)} (in {left} s)"]
    if facts.get("command") is not None:
        lines += _card_field("command", facts["command"])
    if facts.get("cwd") is not None:
        lines += _card_field("cwd", facts["cwd"])
    diff = facts.get("diff")
    if isinstance(diff, dict):
        lines += _card_field("file", str(diff.get("path", "")))
        patch = str(diff.get("patch", "")).rstrip("\n")
        lines.append(f"{CARD_INDENT}diff:")
        lines += [f"{CARD_INDENT}  {line}" for line in patch.split("\n")] if patch else []
    lines += _card_field("params", json.dumps(facts.get("params", {}), ensure_ascii=False))
    return lines




def settlement_text(s: ApprovalSettled | ApprovalSettlement, *, ours: bool | None = None) -> str:
    """How an approval ended, in words: ``approved by owner``, ``denied (nobody was present)``...

    ``ours`` says whether this client's answer decided it (False: another client answered first).
    """
    if s.source == "answer":
        who = clean(s.by.nickname or s.by.user_id or s.by.platform) if s.by else "someone"
        text = f"{s.state} by {who}"
        if ours is False:
            text += " on another client"
    else:
        text = f"{s.state} ({_SOURCES.get(s.source, clean(s.source))})"
    return text


# --- background tasks -----------------------------------------------------------------------------


TASK_HEADERS: Final = ("ID", "STATUS", "STARTED", "TASK", "LAST LINE")


def task_status(t: BackgroundTask) -> str:
    """``running``, ``completed (exit 0)``, ``failed (exit 2: why)``..."""
    extra = [f"exit {t.exit_code}"] if t.exit_code is not None else []
    if t.reason and t.status in ("failed", "aborted"):
        extra.append(shorten(clean(t.reason), 40))
    return t.status + (f" ({', '.join(extra)})" if extra else "")


def task_what(t: BackgroundTask) -> str:
    """The task's label and what it runs (``exec: $ sleep 30``)."""
    display = t.display
    if isinstance(display, CommandDisplay):
        return f"{clean(t.label)}: $ {shorten(clean(display.command), ARGS_WIDTH)}"
    if isinstance(display, FileChangeDisplay):
        return f"{clean(t.label)}: {shorten(clean(display.path), ARGS_WIDTH)}"
    return clean(t.label)


def task_row(t: BackgroundTask) -> list[str]:
    """One ``tasks ls`` row."""
    return [t.id, task_status(t), fmt_ago(t.started_at), task_what(t), shorten(clean(t.last_line), 60)]


def speaker_name(item: UserMessageItem) -> str:
    """Who wrote a user message: nickname, user id or platform."""
    s = item.speaker
    if s is None:
        return "user"
    return clean(s.nickname or s.user_id or s.platform) or "user"


def _attachments(item: UserMessageItem | AgentMessageItem) -> str:
    return " ".join(f"[{a.kind}: {clean(a.name)}]" for a in item.attachments)


def item_lines(item: Any) -> list[tuple[str, str]]:
    """A timeline item as ``(who, text)`` pairs (``sessions show``, chat history); [] when it is
    not on the timeline (usage, queue, a turn still running)."""
    if isinstance(item, UserMessageItem):
        return [(speaker_name(item), " ".join(filter(None, [clean(item.text), _attachments(item)])))]
    if isinstance(item, AgentMessageItem):
        text = " ".join(filter(None, [clean(item.text), _attachments(item)]))
        if item.undelivered:
            text += f"  (undelivered: {clean(item.undelivered.reason)})"
        return [("agent", text)]
    if isinstance(item, ReasoningItem):
        return [("thinking", shorten(clean(item.text), 200))]
    if isinstance(item, ToolCallItem):
        return [("tool", tool_card(item, label=False))]
    if isinstance(item, NoticeItem):
        return [("notice", notice_line(item, label=False))]
    if isinstance(item, PlanItem):
        return [("plan", f"[{e.status}] {clean(e.text)}") for e in item.entries]
    if isinstance(item, TurnItem) and item.outcome is not None:
        return [("turn", f"{item.outcome}" + (f" (from {clean(item.source)})" if item.source else ""))]
    return []


def timeline(items: Iterable[Any]) -> list[str]:
    """Items as aligned ``HH:MM:SS  who  text`` lines, continuation lines indented under the text."""
    out: list[str] = []
    for item in items:
        for who, text in item_lines(item):
            lines = text.splitlines() or [""]
            prefix = f"{fmt_clock(item.at)}  {who:<8} "
            out.append(prefix + lines[0])
            out.extend(" " * len(prefix) + line for line in lines[1:])
    return out
