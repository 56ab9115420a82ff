"""Comparing a re-run's log with the recording: "is the runtime deterministic?".

Like a workflow replayer (Temporal's), a session forked at turn N that re-runs the later inputs
must write the same log as the recording modulo the ids the runtime draws and the times
(:data:`IGNORED_KEYS`): :func:`comparable` picks the events a re-run must reproduce,
:func:`compare_logs` finds the first divergence (:class:`Divergence`: event index, tags, field,
expected and got). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.replay.values import ABSENT, first_difference, plain
from sessionloop.eventstore.records import RecordedEvent

__all__ = ["IGNORED_KEYS", "Divergence", "comparable", "compare_logs", "payload"]

#: Payload keys a re-run may change without being a divergence: ids the runtime draws and times.
#: ``call_id`` is *not* here: call ids come from the model's answer, which a replay reproduces.
IGNORED_KEYS: Final = frozenset({
    "at", "duration_ms", "turn_id", "step_id", "input_id", "input_ids", "notice_id", "approval_id",
    "grant_id", "task_id", "session_id", "idempotency_key", "expires_at", "last_output_at",
})

_TURN_END: Final = (E.TurnCompleted, E.TurnFailed, E.TurnAborted, E.TurnLimitReached)


def comparable(events: Iterable[RecordedEvent], turn_ids: set[str]) -> list[tuple[str, RecordedEvent]]:
    """The events of the turns ``turn_ids`` that a re-run must reproduce, each with its turn id.

    Owner actions are left out (``session.*``, rewinds, dropped inputs, plan clears, grant
    revocations, manual compaction): a re-run does not repeat them; so are a model endpoint's
    retries (``llm.retried``), which a replayed answer never has. An input is moved to just before the turn it
    opened, because a recording may have queued it while the previous turn ran and a re-run sends
    it after that turn ended.
    """
    inputs: dict[str, RecordedEvent] = {}
    out: list[tuple[str, RecordedEvent]] = []
    current: str | None = None
    for rec in events:
        e = rec.event
        tag = E.event_tag(e)
        if tag.startswith("session.") or isinstance(e, (E.TurnRewound, E.InputDropped, E.PlanCleared,
                                                        E.ApprovalGrantRevoked)):
            continue
        if isinstance(e, E.LlmRetried):  # how the endpoint behaved, not what the agent did
            continue
        if isinstance(e, (E.ContextCompacted, E.ContextCompactFailed)) and not e.auto:
            continue
        if isinstance(e, E.InputAccepted):
            if e.turn_id in turn_ids:
                inputs[e.input_id] = rec
            continue
        if isinstance(e, E.TurnStarted) and e.turn_id in turn_ids:
            current = e.turn_id
            out.extend((current, inputs.pop(i)) for i in e.input_ids if i in inputs)
            out.append((current, rec))
            continue
        owner = getattr(e, "turn_id", None) or current
        if owner is None or owner not in turn_ids:
            continue
        out.append((owner, rec))
        if isinstance(e, _TURN_END) and e.turn_id == current:
            current = None
    return out


class Divergence(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    """The first place a re-run's log left the recording (a workflow replayer's non-determinism
    error): the 1-based ``index`` in the compared sequence, both tags, the field and both values."""

    index: int
    expected_tag: str | None = None
    got_tag: str | None = None
    path: str | None = None
    expected: Any = None
    got: Any = None
    expected_version: int | None = None
    got_version: int | None = None
    turn: int | None = None


def payload(event: Any, ignore: frozenset[str] = IGNORED_KEYS) -> Any:
    """What of an event a re-run must reproduce: its plain form without ids and times."""
    return _strip(plain(event), ignore)


def _strip(value: Any, ignore: frozenset[str]) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v, ignore) for k, v in value.items() if k not in ignore}
    if isinstance(value, list):
        return [_strip(v, ignore) for v in value]
    return value


def compare_logs(expected: Sequence[tuple[str, RecordedEvent]], got: Sequence[tuple[str, RecordedEvent]],
                 turn_numbers: dict[str, int], *, loose: dict[int, frozenset[str]] | None = None,
                 ) -> tuple[Divergence | None, list[Divergence]]:
    """Compare two comparable logs event by event, modulo :data:`IGNORED_KEYS`.

    ``loose`` maps 0-based indices of ``expected`` to extra keys not compared there (an
    overridden tool result); differences in those keys are returned in the second list instead of
    counting as the divergence. Returns ``(first divergence or None, loosened differences)``.
    """
    loose = loose or {}
    relaxed: list[Divergence] = []
    for i in range(max(len(expected), len(got))):
        want = expected[i] if i < len(expected) else None
        have = got[i] if i < len(got) else None
        turn = turn_numbers.get((want or have)[0])  # type: ignore[index]
        if want is None or have is None:
            return _divergence(i, want, have, turn, None), relaxed
        extra = loose.get(i, frozenset())
        tags = (E.event_tag(want[1].event), E.event_tag(have[1].event))
        if tags[0] != tags[1]:
            return _divergence(i, want, have, turn, None), relaxed
        found = first_difference(plain(want[1].event), plain(have[1].event), ignore=IGNORED_KEYS | extra)
        if found is not None:
            return _divergence(i, want, have, turn, found), relaxed
        if extra:
            found = first_difference(payload(want[1].event), payload(have[1].event))
            if found is not None:
                relaxed.append(_divergence(i, want, have, turn, found))
    return None, relaxed


def _divergence(i: int, want: tuple[str, RecordedEvent] | None, have: tuple[str, RecordedEvent] | None,
                turn: int | None, found: tuple[str, Any, Any] | None) -> Divergence:
    d = Divergence(index=i + 1, turn=turn)
    if want is not None:
        d.expected_tag, d.expected_version = E.event_tag(want[1].event), want[1].version
    if have is not None:
        d.got_tag, d.got_version = E.event_tag(have[1].event), have[1].version
    if found is not None:
        d.path, d.expected, d.got = found
    else:
        d.expected = payload(want[1].event) if want is not None else ABSENT
        d.got = payload(have[1].event) if have is not None else ABSENT
    return d

