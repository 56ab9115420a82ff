"""The plan of a re-run, read from the recording: what ``rerun --from-turn N`` sends and expects.

:func:`plan_rerun` checks that the session can be forked at user turn N and collects, from the
original's events, the later turns' inputs, the recorded model answers and provider failures,
automatic summaries, tool results and file before-images, how each approval was settled, and the
session settings at each turn (:class:`RerunPlan`). :meth:`RerunPlan.find_step`,
:meth:`RerunPlan.find_approval` and :func:`parse_model_answer` resolve the what-if overrides (a
tool result, a model answer or an approval given otherwise at one step). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.replay.compare import comparable
from sessionloop.actors.replay.values import fold_events, summarize_args
from sessionloop.actors.session.context import turn_starts
from sessionloop.eventstore.records import RecordedEvent

__all__ = [
    "LaterTurn",
    "ModelAnswer",
    "RecordedApproval",
    "RerunPlan",
    "StepRef",
    "parse_model_answer",
    "plan_rerun",
]


class LaterTurn(msgspec.Struct, kw_only=True):
    """A turn of the recording after the fork point, to be sent again."""

    number: int  # 1-based among the re-run turns
    turn_id: str
    input: E.InputAccepted

    @property
    def is_continue(self) -> bool:
        return self.input.source == "continue"


class RecordedApproval(msgspec.Struct, kw_only=True):
    """How the recording settled one call of the re-run turns that needed an approval.

    ``asked``: an approval was requested (``tool.approval.requested``) and answered later, by
    the owner or by its timers; otherwise the gate settled the call at once (a grant, nobody
    present, the rate limit, permission mode ``deny``). ``number`` is its 1-based place among
    the approvals after the fork point (what ``--override-approval N`` names)."""

    number: int
    turn: int
    call_id: str
    tool: str
    approval_id: str
    asked: bool = False
    settlement: E.Settlement | None = None

    def describe(self) -> str:
        how = "asked" if self.asked else "settled at once"
        s = self.settlement
        settled = f"{s.state} ({s.source})" if s is not None else "never settled"
        return f"{self.approval_id} ({self.tool} call {self.call_id}, re-run turn {self.turn}: {how}, {settled})"



class RerunPlan(msgspec.Struct, kw_only=True):
    """What ``rerun --from-turn N`` sends and what it expects, all from the original's events."""

    session_id: str
    from_turn: int
    user_turns: int
    turns: list[LaterTurn] = []
    answers: list[E.LlmCompleted] = []  # the recorded model answers of the later turns, in order
    model_calls: list[E.Event] = []  # answers and (not aborted) failures, in order: what a replay plays
    summaries: list[E.Event] = []  # automatic compactions (ContextCompacted / ContextCompactFailed)
    tool_results: dict[tuple[int, str], E.ToolFinished] = {}  # (turn number, call id) of calls that ran
    checkpoints: dict[tuple[int, str], list[str]] = {}  # (turn number, call id) -> paths, before-image order
    images: list[tuple[int, str, bool, bytes | None]] = []  # (turn number, path, existed, content), log order
    calls: list[tuple[int, str, str]] = []  # (turn number, call id, tool) of the calls that ran, in order
    #: (turn number, llm step id, 1-based model call within its turn) of the recorded model calls
    #: a replay plays (answers and provider failures), in order
    model_steps: list[tuple[int, str, int]] = []
    max_steps: int | None = None
    expected: list[tuple[str, RecordedEvent]] = []  # comparable events of the later turns
    #: (turn number, call id) -> how the recording settled a call that needed an approval
    approvals: dict[tuple[int, str], RecordedApproval] = {}
    #: turn number -> the session layer of settings ("plugin/key" -> value) when the turn started
    settings: dict[int, dict[str, Any]] = {}

    def turn_number(self, turn_id: str) -> int | None:
        return next((t.number for t in self.turns if t.turn_id == turn_id), None)

    def image_after(self, turn: int, path: str) -> tuple[bool, bytes | None] | None:
        """``(existed, content)`` of ``path`` right after re-run turn ``turn``, from the next later
        turn's before-image; None when no later turn touched it (the file's current state then)."""
        for number, p, existed, content in self.images:
            if p == path and number > turn:
                return existed, content
        return None

    def find_call(self, step: str) -> tuple[int, str, str]:
        """The tool call ``--override-tool STEP`` names: a call id, or the 1-based index of the
        calls that ran after the fork point. Raises ValueError."""
        if step.isdigit():
            index = int(step)
            if not 1 <= index <= len(self.calls):
                raise ValueError(f"tool call {index} does not exist: {len(self.calls)} tool calls ran after turn "
                                 f"{self.from_turn}")
            return self.calls[index - 1]
        for call in self.calls:
            if call[1] == step:
                return call
        raise ValueError(f"tool call {step!r} did not run after turn {self.from_turn}")

    def find_step(self, step: str) -> StepRef:
        """The step ``--override-tool STEP`` names (a what-if: docs/replay.md): a tool call that ran (its
        call id, or its 1-based number among the calls after the fork point) or a recorded model
        call (its llm step id, as ``replay`` shows it, or ``llm:N``, the N-th model call after the
        fork point). Raises ValueError naming what exists."""
        text = step.strip()
        if text.startswith("llm:"):
            number = text[4:]
            if not number.isdigit() or not 1 <= int(number) <= len(self.model_steps):
                raise ValueError(f"model call {text} does not exist: {len(self.model_steps)} model calls were "
                                 f"recorded after turn {self.from_turn} (llm:1 to llm:{len(self.model_steps)})")
            return self._model_ref(self.model_steps[int(number) - 1])
        for found in self.model_steps:
            if found[1] == text:
                return self._model_ref(found)
        if text.isdigit() or any(call[1] == text for call in self.calls):
            turn, call_id, tool = self.find_call(text)
            return StepRef(kind="tool", turn=turn, call_id=call_id, tool=tool)
        raise ValueError(f"step {text!r} is neither a tool call that ran nor a model call recorded after turn "
                         f"{self.from_turn} (tool calls: a call id or 1 to {len(self.calls)}; model calls: an llm "
                         f"step id or llm:1 to llm:{len(self.model_steps)})")

    def find_approval(self, ref: str) -> RecordedApproval:
        """The approval ``--override-approval REF`` names: an approval id (as ``replay`` shows
        it), the call id of a call that needed one (when only one call has it), or the 1-based
        number of the approvals after the fork point. Raises ValueError saying what exists."""
        text = ref.strip()
        found = sorted(self.approvals.values(), key=lambda a: a.number)
        if not found:
            raise ValueError(f"no call needed an approval after turn {self.from_turn}")
        listed = "; ".join(f"{a.number}: {a.describe()}" for a in found[:5]) + (
            f"; and {len(found) - 5} more" if len(found) > 5 else "")
        if text.isdigit():
            if 1 <= int(text) <= len(found):
                return found[int(text) - 1]
            raise ValueError(f"approval {text} does not exist: {len(found)} approvals after turn {self.from_turn} "
                             f"({listed})")
        by_id = [a for a in found if a.approval_id == text]
        by_call = [a for a in found if a.call_id == text]
        if by_id or len(by_call) == 1:
            return (by_id or by_call)[0]
        if by_call:
            raise ValueError(f"call id {text!r} needed an approval in {len(by_call)} turns; name one by its "
                             f"approval id or number ({listed})")
        raise ValueError(f"{text!r} names no approval after turn {self.from_turn} ({listed})")

    def _model_ref(self, found: tuple[int, str, int]) -> StepRef:
        turn, step_id, call = found
        recorded = next((e for e in self.model_calls if getattr(e, "step_id", None) == step_id), None)
        return StepRef(kind="model", turn=turn, step_id=step_id, call=call, recorded=recorded)


class StepRef(msgspec.Struct, kw_only=True):
    """A step of the re-run turns that ``--override-tool STEP`` names.

    ``kind`` is ``tool`` (``call_id``, ``tool``) or ``model`` (``step_id``: the recorded llm
    step; ``call``: the 1-based model call within its turn; ``recorded``: the recorded
    ``llm.completed`` or ``llm.failed``). ``turn`` is the 1-based re-run turn.
    """

    kind: str
    turn: int
    call_id: str = ""
    tool: str = ""
    step_id: str = ""
    call: int = 0
    recorded: Any = None


class OverrideToolCall(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    name: str
    args: Any = None
    call_id: str | None = None


class ModelAnswer(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="camel", omit_defaults=True):
    """A model answer given on the command line instead of a recorded one: ``text`` and
    ``toolCalls`` (each ``{"name", "args", "callId"?}``, ids default to ``override_N``), an
    optional ``reasoning``; or ``error`` alone, for a call that fails with that message."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[OverrideToolCall] = []
    error: str | None = None

    def tool_call_specs(self) -> list[E.ToolCallSpec]:
        return [E.ToolCallSpec(call_id=c.call_id or f"override_{i}", name=c.name, args=c.args)
                for i, c in enumerate(self.tool_calls, start=1)]


MODEL_ANSWER_SHAPE: Final = '{"text": "...", "toolCalls": [{"name": "...", "args": {...}}]} or {"error": "..."}'


def parse_model_answer(value: Any) -> ModelAnswer:
    """The model answer a ``--override-tool`` JSON value for a model step stands for. Raises
    ValueError saying what is wrong and which shape is expected."""
    if not isinstance(value, dict):
        raise ValueError(f"a model answer must be a JSON object {MODEL_ANSWER_SHAPE}, got {summarize_args(value)}")
    if not value:
        raise ValueError(f"the model answer is empty: give {MODEL_ANSWER_SHAPE}")
    try:
        answer = msgspec.convert(value, ModelAnswer)
    except msgspec.ValidationError as e:
        raise ValueError(f"not a model answer ({e}); expected {MODEL_ANSWER_SHAPE}") from e
    if answer.error is not None and (answer.text or answer.reasoning or answer.tool_calls):
        raise ValueError("a model answer has either error (the call fails) or text/toolCalls, not both")
    if any(not c.name for c in answer.tool_calls):
        raise ValueError("every tool call of the model answer needs a name")
    ids = [c.call_id for c in answer.tool_call_specs()]
    if len(set(ids)) != len(ids):
        raise ValueError(f"the model answer repeats a tool call id: {ids}")
    return answer


def plan_rerun(session_id: str, events: Sequence[RecordedEvent], from_turn: int) -> RerunPlan:
    """The plan to re-run ``events`` from user turn ``from_turn`` (0-based count of user turns
    kept, as ``Host.fork(turns=N)`` counts them). Raises ValueError when that cannot be done."""
    state = fold_events(session_id, events)
    if state.created is None:
        raise ValueError(f"session {session_id} has no session.created event")
    if state.deleted:
        raise ValueError(f"session {session_id} was deleted; rerun needs a live session (replay still shows its log)")
    if state.current_turn is not None or state.queue:
        raise ValueError(f"session {session_id} has a turn in progress or queued inputs; rerun needs it at rest")
    starts = turn_starts(state.messages)
    if not starts:
        raise ValueError(f"session {session_id} has no user turns to re-run")
    if not 0 <= from_turn < len(starts):
        raise ValueError(f"--from-turn must be between 0 and {len(starts) - 1}: the session has {len(starts)} user "
                         f"turns and --from-turn {len(starts)} would keep them all, leaving nothing to re-run")
    plan = RerunPlan(session_id=session_id, from_turn=from_turn, user_turns=len(starts))
    first = state.messages[starts[from_turn]].turn_id
    if first not in state.turn_order:
        own = [i for i, s in enumerate(starts) if state.messages[s].turn_id in state.turn_order]
        least = own[0] if own else len(starts)
        raise ValueError(f"user turn {from_turn} came with the history this session was forked from; "
                         f"--from-turn must be at least {least}")
    inputs = {r.event.input_id: r.event for r in events if isinstance(r.event, E.InputAccepted)}
    started = {r.event.turn_id: r.event for r in events if isinstance(r.event, E.TurnStarted)}
    for turn_id in state.turn_order[state.turn_order.index(first):]:
        ids = started[turn_id].input_ids
        if not ids or ids[0] not in inputs:
            raise ValueError(f"turn {turn_id} has no recorded input to send again")
        plan.turns.append(LaterTurn(number=len(plan.turns) + 1, turn_id=turn_id, input=inputs[ids[0]]))
    plan.max_steps = started[first].max_steps
    _collect_recordings(plan, events)
    return plan


def _collect_recordings(plan: RerunPlan, events: Sequence[RecordedEvent]) -> None:
    numbers = {t.turn_id: t.number for t in plan.turns}
    ran: set[tuple[int, str]] = set()
    tools: dict[tuple[int, str], str] = {}  # (turn number, call id) -> the tool the model asked for
    settings: dict[str, Any] = {}
    for rec in events:
        e = rec.event
        if isinstance(e, E.SessionSettingChanged):
            _fold_setting(settings, e)
            continue
        number = numbers.get(getattr(e, "turn_id", None) or "")
        if number is None:
            continue
        if isinstance(e, E.TurnStarted):
            plan.settings[number] = dict(settings)
        elif isinstance(e, E.LlmCompleted):
            plan.answers.append(e)
            plan.model_calls.append(e)
            _model_step(plan, number, e.step_id)
            tools.update(((number, c.call_id), c.name) for c in e.tool_calls)
        elif isinstance(e, (E.ToolApprovalRequested, E.ToolApprovalSettled)) or (
                isinstance(e, E.ToolFinished) and e.settlement is not None):
            _approval_fact(plan, number, e, tools)
        if isinstance(e, E.LlmFailed) and not e.aborted:
            plan.model_calls.append(e)  # a provider error is part of the recording too
            _model_step(plan, number, e.step_id)
        elif isinstance(e, (E.ContextCompacted, E.ContextCompactFailed)) and e.auto:
            plan.summaries.append(e)
        elif isinstance(e, E.ToolStarted):
            ran.add((number, e.call_id))
            plan.calls.append((number, e.call_id, e.tool))
        elif isinstance(e, E.ToolFinished) and (number, e.call_id) in ran:
            plan.tool_results[(number, e.call_id)] = e
        elif isinstance(e, E.CheckpointRecorded):
            plan.checkpoints.setdefault((number, e.call_id), []).append(e.path)
            plan.images.append((number, e.path, e.existed, e.content))
    plan.expected = comparable(events, set(numbers))


def _fold_setting(settings: dict[str, Any], e: E.SessionSettingChanged) -> None:
    key = f"{e.plugin}/{e.key}"
    if e.deleted:
        settings.pop(key, None)
    else:
        settings[key] = e.value


def _approval_fact(plan: RerunPlan, turn: int, e: Any, tools: dict[tuple[int, str], str]) -> None:
    """Fold one approval fact of a re-run turn into ``plan.approvals``: a request, a settlement,
    or a call denied at once (its ``tool.finished`` carries the settlement, no approval event)."""
    key = (turn, e.call_id)
    found = plan.approvals.get(key)
    if found is None:
        if isinstance(e, E.ToolFinished) and e.approval_id is None:
            return
        found = plan.approvals[key] = RecordedApproval(
            number=len(plan.approvals) + 1, turn=turn, call_id=e.call_id, tool=tools.get(key, "?"),
            approval_id=e.approval_id or "")
    if isinstance(e, E.ToolApprovalRequested):
        found.asked = True
    elif found.settlement is None:  # the approval's own settlement; a denial's tool.finished repeats it
        found.settlement = e.settlement


def _model_step(plan: RerunPlan, turn: int, step_id: str) -> None:
    within = sum(1 for t, _, _ in plan.model_steps if t == turn)
    plan.model_steps.append((turn, step_id, within + 1))


