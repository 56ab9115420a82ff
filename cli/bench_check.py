"""The check at the end of a ``sessionloop bench`` run (``cli/bench_cmd.py``): what the driver sent
and saw (:class:`Record`), compared with the event log written during the run (:func:`check_log`):
every turn sent was accepted once, started once, ended once with the expected answer, ran one tool
when it was a tool turn, and its end reached the client once.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sessionloop.actors import events as E
from sessionloop.cli.bench_config import EXPECTED, PLAIN_TEXT, TOOL_TEXT
from sessionloop.eventstore import RecordedEvent

TURN_END = (E.TurnCompleted, E.TurnFailed, E.TurnAborted, E.TurnLimitReached)


@dataclass
class SessionRecord:
    session_id: str
    sent: list[bool] = field(default_factory=list)  # tool turn?, in the order sent
    seen: list[str] = field(default_factory=list)  # turn ids whose end reached the client
    states: dict[str, str] = field(default_factory=dict)  # turn id -> state the client saw


@dataclass
class Record:
    sessions: list[SessionRecord]
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    in_flight: int = 0

    @property
    def done(self) -> int:
        return len(self.latencies)

    @property
    def sent(self) -> int:
        return sum(len(s.sent) for s in self.sessions)


@dataclass
class _Log:
    inputs: list[tuple[str, str]] = field(default_factory=list)  # (turn id, text)
    started: Counter[str] = field(default_factory=Counter)
    ended: Counter[str] = field(default_factory=Counter)
    answers: dict[str, str | None] = field(default_factory=dict)  # turn id -> output text (None: not completed)
    tools: Counter[str] = field(default_factory=Counter)


def check_log(rec: Record, events: Iterable[RecordedEvent]) -> dict[str, Any]:
    """Compare what the driver sent and saw with the event log: lost, duplicated and wrong turns.

    * lost: a turn sent with no input accepted, no ``turn.started`` or no turn end in the log, or
      whose end never reached the client (or the driver gave up waiting for it);
    * duplicated: more inputs accepted than sent, a turn started or ended more than once, or its
      end reported to the client more than once;
    * wrong: a turn that ended otherwise than completed with the expected answer, or ran a number
      of tools other than its script's.
    """
    logs = _fold(events)
    found = _Found()
    verified = 0
    for srec in rec.sessions:
        verified += _check_session(srec, logs.pop(srec.session_id, _Log()), found)
    for sid, log in logs.items():
        if log.inputs or log.started:
            found.dup.append(f"session {sid}: turns in the log of a session the benchmark did not drive")
    lost, dup, wrong = found.lost, found.dup, found.wrong
    lost_or_dup = [*rec.errors]
    return {"ok": not (lost or dup or wrong or rec.errors), "turns_verified": verified, "lost": len(lost),
            "duplicated": len(dup), "wrong": len(wrong), "errors": len(rec.errors),
            "problems": [*lost_or_dup, *lost, *dup, *wrong][:20]}


@dataclass
class _Found:
    lost: list[str] = field(default_factory=list)
    dup: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)


def _fold(events: Iterable[RecordedEvent]) -> dict[str, _Log]:
    """Per session id, what its log says of the turns."""
    logs: dict[str, _Log] = defaultdict(_Log)
    for recorded in events:
        if not recorded.stream.startswith("session-"):
            continue
        log = logs[recorded.stream[len("session-"):]]
        ev = recorded.event
        if isinstance(ev, E.InputAccepted):
            log.inputs.append((ev.turn_id, ev.text))
        elif isinstance(ev, E.TurnStarted):
            log.started[ev.turn_id] += 1
        elif isinstance(ev, TURN_END):
            log.ended[ev.turn_id] += 1
            log.answers[ev.turn_id] = ev.output_text if isinstance(ev, E.TurnCompleted) else None
        elif isinstance(ev, E.ToolStarted):
            log.tools[ev.turn_id] += 1
    return logs


def _check_session(srec: SessionRecord, log: _Log, found: _Found) -> int:
    """Check one session's turns against its log (problems into ``found``); the turns verified."""
    lost, dup, wrong = found.lost, found.dup, found.wrong
    sid = srec.session_id
    verified = 0
    accepted = [t for t, _ in log.inputs]
    if len(log.inputs) < len(srec.sent):
        lost += [f"session {sid}: {len(srec.sent)} turns sent, {len(log.inputs)} inputs accepted"]
    elif len(log.inputs) > len(srec.sent):
        dup += [f"session {sid}: {len(srec.sent)} turns sent, {len(log.inputs)} inputs accepted"]
    texts = [TOOL_TEXT if tool else PLAIN_TEXT for tool in srec.sent]
    if [text for _, text in log.inputs[:len(texts)]] != texts[:len(log.inputs)]:
        wrong.append(f"session {sid}: inputs in the log differ from the turns sent")
    seen = Counter(srec.seen)
    for turn_id, text in log.inputs:
        where = f"session {sid} turn {turn_id}"
        for name, counts in (("turn.started", log.started), ("turn end", log.ended)):
            if counts[turn_id] == 0:
                lost.append(f"{where}: no {name} in the log")
            elif counts[turn_id] > 1:
                dup.append(f"{where}: {counts[turn_id]}x {name} in the log")
        if seen[turn_id] == 0:
            lost.append(f"{where}: its end never reached the client")
        elif seen[turn_id] > 1:
            dup.append(f"{where}: its end reached the client {seen[turn_id]}x")
        if log.ended[turn_id] and log.answers.get(turn_id) != EXPECTED.get(text):
            wrong.append(f"{where}: ended with {log.answers.get(turn_id)!r}, expected {EXPECTED.get(text)!r}")
        elif srec.states.get(turn_id, "completed") != "completed":
            wrong.append(f"{where}: the client saw it end {srec.states[turn_id]!r}")
        want_tools = 1 if text == TOOL_TEXT else 0
        if log.tools[turn_id] != want_tools:
            wrong.append(f"{where}: {log.tools[turn_id]} tool calls, expected {want_tools}")
        verified += 1
    for turn_id in set(log.started) | set(log.ended) | set(seen):
        if turn_id not in accepted:
            dup.append(f"session {sid} turn {turn_id}: started, ended or reported without an input sent")
    return verified


def failure_line(check: dict[str, Any]) -> str:
    first = check["problems"][0] if check["problems"] else "?"
    return (f"event log check FAILED: {check['lost']} lost, {check['duplicated']} duplicated, {check['wrong']} "
            f"wrong, {check['errors']} driver errors (first: {first})")


__all__ = ["TURN_END", "Record", "SessionRecord", "check_log", "failure_line"]
