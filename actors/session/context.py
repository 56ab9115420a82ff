"""What the model sees: context trimming and compaction, as pure functions.

Theory of operation. A session keeps its *full* history forever (the UI, ``fork`` and recovery
read it). Before each model call the runtime derives the copy that is sent:

1. :func:`apply_summary`: the latest summary message — a ``system``
   message starting with :data:`SUMMARY_PREFIX` — is merged into the leading system message and
   everything before it is left out;
2. :func:`project_context`: if the result is over ``contextChars``,
   it is cut in three stages, each only as far as needed:

   (1) tool outputs of *old* turns are replaced by ``[tool output omitted … N chars]``, oldest
       first;
   (2) whole old turns are dropped, oldest first, and the end of the system message says how
       many were dropped;
   (3) tool outputs of the *current* turn that the model has already seen are omitted; the latest
       batch of tool results and the current turn itself are always kept.

A *turn* runs from a user message up to the next user message.
A user message that would separate a tool call from its result (an input joined mid-step) does
not start a turn here, so dropping whole turns can never split a ``tool_calls``/``tool`` pair —
providers reject requests with unpaired calls.

Characters are counted as ``len(content)`` plus the length of every tool call's arguments as
JSON (:func:`message_chars`). Nothing here mutates its input: messages are frozen Structs and
every function returns new lists.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from sessionloop.actors.events import Message, ToolCallSpec
from sessionloop.actors.model.attachments import estimated_chars
from sessionloop.actors.model.base import args_json, content_chars

SUMMARY_PREFIX = "[Summary of the earlier conversation]"

#: the summarisation input is at most 200,000 characters in all.
SUMMARY_INPUT_LIMIT = 200_000
#: Each entry of the summarisation input is cut to this many characters.
SUMMARY_ITEM_LIMIT = 4_000

SUMMARY_PROMPT = """\
You maintain the running summary of a conversation between a user and an AI agent that uses tools.
Your summary replaces the conversation below in the agent's context, so it must keep everything
the agent needs to continue the work without re-reading it.

Write the summary under these headings, leaving out any that would be empty:
- Goals: what the user wants to achieve, in their own terms.
- Decisions: what was decided or agreed, and why.
- File changes: files created, modified or deleted, and what changed.
- Command results: commands that were run and what they showed (exit codes, key output).
- Open items: what is unfinished, blocked, or was asked for and not yet done.
- Key facts: names, paths, numbers, constraints and preferences that will matter later.

If a previous summary is given, merge it into the new one and keep its facts that still matter.
Write in the language the user writes in. Answer with the summary only, without a preamble."""


class TrimReport(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`project_context` did; the runtime records it as ``agent.context.trimmed``."""

    chars_before: int
    chars_after: int
    omitted_outputs: int = 0
    dropped_turns: int = 0
    trimmed: bool = False


# --- counting and turns -------------------------------------------------------------------------


def message_chars(message: Message) -> int:
    """Characters of one message: its content, its tool calls' arguments as JSON, and what its
    attachments will be sent as (``actors/model/attachments.py``)."""
    size = len(message.content)
    for call in message.tool_calls:
        size += len(args_json(call.args))
    if message.attachments:
        size += estimated_chars(message.attachments)
    return size


def count_chars(messages: Sequence[Message]) -> int:
    """Characters of a list of messages, as compared with ``contextChars``."""
    return sum(message_chars(m) for m in messages)


def turn_starts(messages: Sequence[Message]) -> list[int]:
    """Indices of the user messages that start a turn.

    A user message between a tool call and that call's result does not start a turn, so a turn
    always holds both halves of every pair it contains.
    """
    blocked = [0] * (len(messages) + 1)
    owner: dict[str, int] = {}
    for j, m in enumerate(messages):
        for call in m.tool_calls:
            owner[call.call_id] = j
        if m.role == "tool" and m.tool_call_id is not None:
            i = owner.get(m.tool_call_id)
            if i is not None and i < j:
                blocked[i + 1] += 1  # boundaries in (i, j] would split the pair
                blocked[j + 1] -= 1
    starts: list[int] = []
    depth = 0
    for j, m in enumerate(messages):
        depth += blocked[j]
        if m.role == "user" and depth == 0:
            starts.append(j)
    return starts


def turns_of(messages: Sequence[Message]) -> list[tuple[int, int]]:
    """``(start, end)`` index ranges of the turns; messages before the first turn are the preamble."""
    starts = turn_starts(messages)
    ends = starts[1:] + [len(messages)]
    return list(zip(starts, ends, strict=True))


def keep_turns(messages: Sequence[Message], turns: int) -> list[Message]:
    """The first ``turns`` turns with the preamble (``fork``: 0 keeps only the system part)."""
    if turns < 0:
        raise ValueError(f"turns must be >= 0, got {turns}")
    starts = turn_starts(messages)
    end = starts[turns] if turns < len(starts) else len(messages)
    return list(messages[:end])


def unanswered_tool_calls(messages: Sequence[Message]) -> list[ToolCallSpec]:
    """Tool calls with no tool result after them (they get a "not executed" result
    before the next run, so the provider does not refuse the request)."""
    answered = {m.tool_call_id for m in messages if m.role == "tool"}
    return [c for m in messages for c in m.tool_calls if c.call_id not in answered]


# --- trimming -----------------------------------------------------------------------------------


def omitted_placeholder(chars: int) -> str:
    """The text that replaces an omitted tool output."""
    return f"[tool output omitted … {chars} chars]"


def dropped_note(turns: int) -> str:
    """The note appended to the system message when whole turns were dropped."""
    noun = "turn" if turns == 1 else "turns"
    return f"[{turns} earlier {noun} of this conversation were omitted to fit the context budget]"


class _Trim:
    """The running state of one :func:`project_context` call (indices into the input list)."""

    def __init__(self, messages: list[Message], budget: int) -> None:
        self.messages = messages
        self.budget = budget
        self.sizes = [message_chars(m) for m in messages]
        self.total = sum(self.sizes)
        self.turns = turns_of(messages)
        self.old = self.turns[:-1]
        self.omitted: dict[int, str] = {}
        self.dropped = 0
        # A leading system message always precedes the first turn (turns start at user messages).
        self.has_system = bool(messages) and messages[0].role == "system"

    def over(self) -> bool:
        return self.total > self.budget

    def note_chars(self, dropped: int) -> int:
        if dropped == 0:
            return 0
        return len(dropped_note(dropped)) + (2 if self.has_system and self.messages[0].content else 0)

    def omit(self, index: int) -> None:
        placeholder = omitted_placeholder(self.sizes[index])
        if index in self.omitted or len(placeholder) >= self.sizes[index]:
            return  # omitting would not make the request smaller
        self.omitted[index] = placeholder
        self.total += len(placeholder) - self.sizes[index]

    def kept_size(self, index: int) -> int:
        placeholder = self.omitted.get(index)
        return self.sizes[index] if placeholder is None else len(placeholder)

    def stage_old_outputs(self) -> None:
        for start, end in self.old:
            for i in range(start, end):
                if not self.over():
                    return
                if self.messages[i].role == "tool":
                    self.omit(i)

    def stage_drop_turns(self) -> None:
        while self.over() and self.dropped < len(self.old):
            start, end = self.old[self.dropped]
            self.total -= sum(self.kept_size(i) for i in range(start, end))
            self.total += self.note_chars(self.dropped + 1) - self.note_chars(self.dropped)
            self.dropped += 1

    def stage_seen_outputs(self) -> None:
        if not self.turns or not self.over():
            return
        start, end = self.turns[-1]
        last_call = max((i for i in range(start, end) if self.messages[i].tool_calls), default=start)
        # Results before the last assistant call were seen by the model; the ones after it are
        # the latest batch and stay: the latest batch of tool results and the current turn are always kept.
        for i in range(start, last_call):
            if not self.over():
                return
            if self.messages[i].role == "tool":
                self.omit(i)

    def result(self) -> list[Message]:
        dropped_end = self.old[self.dropped - 1][1] if self.dropped else 0
        first_turn = self.turns[0][0] if self.turns else len(self.messages)
        out: list[Message] = []
        for i, m in enumerate(self.messages):
            if first_turn <= i < dropped_end:
                continue
            placeholder = self.omitted.get(i)
            out.append(m if placeholder is None else msgspec.structs.replace(m, content=placeholder))
        if self.dropped:
            note = dropped_note(self.dropped)
            if self.has_system:
                head = out[0]
                content = f"{head.content}\n\n{note}" if head.content else note
                out[0] = msgspec.structs.replace(head, content=content)
            else:
                out.insert(0, Message(role="system", content=note))
        return out

    def kept_omissions(self) -> int:
        dropped_end = self.old[self.dropped - 1][1] if self.dropped else 0
        first_turn = self.turns[0][0] if self.turns else 0
        return sum(1 for i in self.omitted if not first_turn <= i < dropped_end)


def project_context(
    messages: Sequence[Message], budget_chars: int | None
) -> tuple[list[Message], TrimReport]:
    """The copy of ``messages`` to send to the model within ``budget_chars``.

    Promises: the input is not changed; ``budget_chars`` None (or a history within budget)
    returns an equal copy with ``trimmed`` False; whole-turn dropping never separates a tool
    call from its result; the current turn and the latest batch of tool results are always
    sent; the result is within budget whenever the most the three stages can cut gets it there
    (otherwise it is that most-trimmed form, still over budget).
    """
    msgs = list(messages)
    before = count_chars(msgs)
    if budget_chars is None or before <= budget_chars:
        return msgs, TrimReport(chars_before=before, chars_after=before)
    trim = _Trim(msgs, budget_chars)
    trim.stage_old_outputs()
    trim.stage_drop_turns()
    trim.stage_seen_outputs()
    out = trim.result()
    after = count_chars(out)
    report = TrimReport(
        chars_before=before,
        chars_after=after,
        omitted_outputs=trim.kept_omissions(),
        dropped_turns=trim.dropped,
        trimmed=bool(trim.omitted or trim.dropped),
    )
    return out, report


# --- compaction ---------------------------------------------------------------------------------


def is_summary(message: Message) -> bool:
    """Whether ``message`` is a summary inserted by compaction."""
    return message.role == "system" and message.content.startswith(SUMMARY_PREFIX)


def summary_message(text: str) -> Message:
    """The system message that holds a summary; ``text`` may already carry the prefix."""
    text = text.strip()
    if text.startswith(SUMMARY_PREFIX):
        return Message(role="system", content=text)
    return Message(role="system", content=f"{SUMMARY_PREFIX}\n{text}")


def summary_text(message: Message) -> str:
    """The summary without its prefix."""
    return message.content[len(SUMMARY_PREFIX) :].strip() if is_summary(message) else message.content


def latest_summary_index(messages: Sequence[Message]) -> int | None:
    """Index of the latest summary message, or None."""
    for i in range(len(messages) - 1, -1, -1):
        if is_summary(messages[i]):
            return i
    return None


def apply_summary(messages: Sequence[Message]) -> list[Message]:
    """Merge the latest summary into the leading system message and leave out what it replaced.

    The latest summary is merged into the leading system message; the messages before it are
    no longer sent.
    Without a summary the result equals the input.
    """
    s = latest_summary_index(messages)
    if s is None:
        return list(messages)
    summary = messages[s]
    head = messages[0]
    if s == 0 or head.role != "system" or is_summary(head):
        return list(messages[s:])
    content = f"{head.content}\n\n{summary.content}" if head.content else summary.content
    return [msgspec.structs.replace(head, content=content), *messages[s + 1 :]]


def model_view(messages: Sequence[Message], budget_chars: int | None) -> tuple[list[Message], TrimReport]:
    """What one model call is sent: :func:`apply_summary`, then :func:`project_context`."""
    return project_context(apply_summary(messages), budget_chars)


def estimated_context_tokens(messages: Sequence[Message], budget_chars: int | None) -> int:
    """The prompt tokens of a model call sent ``messages`` (system part first), estimated as
    the mock model counts them (characters / 4): what the usage item shows before a
    model has reported any (after a compaction; a forked or imported session)."""
    view, _ = model_view(messages, budget_chars)
    return content_chars(view) // 4


class CompactionInput(msgspec.Struct, frozen=True, kw_only=True):
    """The part of a history a compaction summarises (see :func:`compaction_input`)."""

    messages: list[Message]
    previous_summary: str | None
    turns: int


def compaction_input(messages: Sequence[Message], *, include_current: bool) -> CompactionInput:
    """The turns to summarise: after the latest summary, and before the current turn unless
    ``include_current`` (automatic compaction summarises the turns before the
    current one and inserts the summary before the current user message; ``compact()`` summarises
    every turn so far and appends it). ``turns`` 0 means there is nothing to compact."""
    s = latest_summary_index(messages)
    start = 0 if s is None else s + 1
    starts = [i for i in turn_starts(messages) if i >= start]
    end = len(messages)
    if not include_current and starts:
        end = starts[-1]
        starts = starts[:-1]
    previous = summary_text(messages[s]) if s is not None else None
    first = starts[0] if starts else end  # the system prompt is not part of what is summarised
    return CompactionInput(messages=list(messages[first:end]), previous_summary=previous, turns=len(starts))


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]} […{len(text) - limit} more chars]"


def _transcript_items(messages: Sequence[Message]) -> list[str]:
    names = {c.call_id: c.name for m in messages for c in m.tool_calls}
    items: list[str] = []
    for m in messages:
        if m.role == "user":
            files = "".join(f" [{a.kind}: {a.name}]" for a in m.attachments)
            items.append("User: " + _clip(m.content, SUMMARY_ITEM_LIMIT) + files)
        elif m.role == "assistant":
            if m.content:
                items.append("Assistant: " + _clip(m.content, SUMMARY_ITEM_LIMIT))
            for call in m.tool_calls:
                items.append(f"Tool call {call.name} {_clip(args_json(call.args), SUMMARY_ITEM_LIMIT)}")
        elif m.role == "tool":
            name = m.name or names.get(m.tool_call_id or "", "tool")
            items.append(f"Tool result ({name}): " + _clip(m.content, SUMMARY_ITEM_LIMIT))
    return items


def build_summary_request(messages: Sequence[Message], previous_summary: str | None) -> list[Message]:
    """The messages of the model call that writes a summary.

    The user message holds the previous summary and a transcript of user messages, model
    replies, tool calls and tool results, each cut to :data:`SUMMARY_ITEM_LIMIT` characters; its
    content is at most :data:`SUMMARY_INPUT_LIMIT` characters — the oldest entries are left out
    first (the previous summary covers what came before them). System messages are not included.
    """
    head = ""
    if previous_summary:
        head = (
            "<previous-summary>\n"
            + _clip(previous_summary, SUMMARY_INPUT_LIMIT // 4)
            + "\n</previous-summary>\n\n"
        )
    items = _transcript_items(messages)
    frame = len(head) + len("<conversation>\n\n</conversation>")
    room = SUMMARY_INPUT_LIMIT - frame - 100  # 100: the "entries left out" line
    size = sum(len(item) + 2 for item in items)
    skipped = 0
    while skipped < len(items) and size > room:  # the oldest entries go first
        size -= len(items[skipped]) + 2
        skipped += 1
    kept = items[skipped:]
    if skipped:
        kept.insert(0, f"[{skipped} earlier entries left out]")
    body = f"{head}<conversation>\n" + "\n\n".join(kept) + "\n</conversation>"
    return [Message(role="system", content=SUMMARY_PROMPT), Message(role="user", content=body)]
