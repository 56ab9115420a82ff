"""An approval decided purely (``actors/approvals/model.py``): no actor, no store.

``run(log, command)`` decides ``command`` on the log's state, round-trips the events through the
store's codec, folds them in, and checks that the fold of the whole log from nothing is that state
(what the actor holds after its commits is what a reload of its stream reads).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.approvals import model as M
from sessionloop.actors.errors import InvalidCommand
from sessionloop.actors.session.state import evolve as evolve_session
from sessionloop.actors.session.state import new_state
from sessionloop.protocol.errors import RpcError
from sessionloop.protocol.schemas import GrantRequest
from sessionloop.protocol.schemas_types import AncestorRef, Approval, ApprovalFacts, ApprovalOrigin
from tests.actors.testkit import round_trip

NOW = 1_700_000_000_000
OWNER = E.Speaker(platform="console", user_id="owner", owner=True)


@dataclass
class Log:
    """An approval as its stream: every event so far and the state they fold to."""

    state: M.ApprovalState = field(default_factory=M.ApprovalState)
    events: list[E.Event] = field(default_factory=list)


def run(log: Log, command: M.Command, now: int = NOW) -> list[E.Event]:
    events = M.decide(log.state, command, now)
    decoded = round_trip(events)
    for event in decoded:
        log.state = M.evolve(log.state, event)
    log.events += decoded
    assert M.fold(log.events) == log.state
    return events


def approval(tool: str = "exec", **facts) -> Approval:
    f = ApprovalFacts(params={"command": "ls -l"}, command="ls -l", cwd="/w", **facts)
    return Approval(id="s1.t1.c1", session_id="s1", turn_id="t1", call_id="c1", tool=tool, target="tool",
                    origin=ApprovalOrigin(kind="hand", participants=[]), facts=f, options=["approve", "deny"],
                    content_hash=M.content_hash(f), expires_at=NOW + 300_000, state="pending",
                    chain=[AncestorRef(id="s0", title="parent")])


def requested(tool: str = "exec") -> tuple[Log, Approval]:
    log, a = Log(), approval(tool)
    run(log, M.Request(approval=a), NOW - 1000)
    return log, a


def answer(a: Approval, decision: str = "approve", **fields) -> M.Answer:
    fields.setdefault("content", a.content_hash)
    fields.setdefault("eligible", True)
    return M.Answer(decision=decision, note=fields.pop("note", None), by=OWNER, **fields)


def test_a_request_records_the_approvals_facts_and_is_recorded_once() -> None:
    log, a = Log(), approval()
    assert run(log, M.Request(approval=a)) == [E.ApprovalRequested(
        at=NOW, approval_id="s1.t1.c1", session_id="s1", turn_id="t1", call_id="c1",
        origin=E.OriginInfo(kind="hand"), tool="exec",
        facts=E.ApprovalFacts(params={"command": "ls -l"}, command="ls -l", cwd="/w"),
        content_hash=a.content_hash, expires_at=NOW + 300_000, chain=[E.ChainLink(id="s0", title="parent")])]
    assert log.state.pending
    assert run(log, M.Request(approval=a), NOW + 1) == []


def test_the_first_answer_settles_the_approval_and_a_second_is_refused_approval_settled() -> None:
    log, a = requested()
    settled = run(log, answer(a, note="fine"))
    assert settled == [E.ApprovalSettled(at=NOW, approval_id=a.id, settlement=E.Settlement(
        state="approved", source="answer", at=NOW, by=OWNER, note="fine"))]
    assert not log.state.pending and log.state.settlement == settled[0].settlement
    with pytest.raises(RpcError) as refused:
        run(log, answer(a, "deny"), NOW + 1)
    assert refused.value.code == "approval-settled"
    assert len(log.events) == 2


def test_a_deny_is_recorded_denied_by_its_answerer() -> None:
    log, a = requested()
    [event] = run(log, answer(a, "deny", note="not now"))
    assert isinstance(event, E.ApprovalSettled)
    assert (event.settlement.state, event.settlement.source, event.settlement.note) == ("denied", "answer", "not now")


def test_an_identity_that_may_not_answer_is_forbidden_before_its_hash_is_checked() -> None:
    log, a = requested()
    with pytest.raises(RpcError) as refused:
        run(log, answer(a, eligible=False, content="wrong"))
    assert refused.value.code == "forbidden"
    assert log.state.pending


def test_an_answer_with_another_content_hash_is_refused_and_settles_nothing() -> None:
    log, a = requested()
    with pytest.raises(RpcError) as refused:
        run(log, answer(a, content="sha256:other"))
    assert refused.value.code == "hash-mismatch"
    assert log.state.pending and len(log.events) == 1


def test_an_answer_with_a_grant_records_its_terms_and_one_that_does_not_fit_is_invalid_params() -> None:
    log, a = requested("exec")
    [event] = run(log, answer(a, grant=GrantRequest(scope="session", command_prefix="git status")))
    assert isinstance(event, E.ApprovalSettled)
    assert event.settlement.grant == E.GrantTerms(scope="session", tool="exec", command_prefix="git status",
                                                  expires_at=NOW + 24 * 3600 * 1000)
    log, a = requested("write_file")
    with pytest.raises(RpcError) as refused:  # a command prefix narrows only an exec grant
        run(log, answer(a, grant=GrantRequest(scope="turn", command_prefix="git")))
    assert refused.value.code == "invalidParams" and "write_file" in str(refused.value)
    assert log.state.pending


def test_settling_without_an_answer_records_how_and_happens_only_once() -> None:
    log, a = requested()
    assert run(log, M.Settle(state="expired", source="timeout")) == [E.ApprovalSettled(
        at=NOW, approval_id=a.id, settlement=E.Settlement(state="expired", source="timeout", at=NOW))]
    assert run(log, M.Settle(state="cancelled", source="shutdown"), NOW + 1) == []
    assert log.state.settlement is not None and log.state.settlement.state == "expired"


def test_nothing_is_answered_or_settled_before_the_request_is_recorded() -> None:
    a = approval()
    for command in (answer(a), M.Settle(state="denied", source="absent")):
        with pytest.raises(InvalidCommand, match="never requested"):
            run(Log(), command)


def test_a_stream_left_pending_by_a_crash_folds_to_a_pending_state_that_settles_shutdown() -> None:
    a = approval()
    stream = M.decide_request(M.ApprovalState(), M.Request(approval=a), NOW - 5000)
    state = M.fold(stream)
    assert state.pending and state.requested == stream[0]
    [settled] = M.decide_settle(state, M.Settle(state="cancelled", source="shutdown"), NOW)
    assert isinstance(settled, E.ApprovalSettled) and settled.approval_id == a.id


def test_evolve_leaves_the_state_as_it_is_for_an_event_of_another_kind() -> None:
    log, _ = requested()
    assert M.evolve(log.state, E.SessionSeen(at=NOW)) == log.state


def test_a_value_that_is_not_an_approval_command_is_a_type_error() -> None:
    log, _ = requested()
    with pytest.raises(TypeError, match="not an approval command"):
        M.decide(log.state, "approve", NOW)  # type: ignore[arg-type]


def test_the_approval_of_a_write_file_call_carries_its_diff_owner_and_expiry() -> None:
    session = new_state("s1")
    for event in (E.SessionCreated(at=1, session_id="s1", activity="background", created_by=OWNER),
                  E.TurnStarted(at=2, turn_id="t1"),
                  E.ToolStarted(at=2, turn_id="t1", call_id="c1", tool="write_file",
                                args={"path": "a.txt", "content": "new\n"},
                                display=E.ToolDisplay(kind="file-change", path="a.txt", removed="old\n"))):
        evolve_session(session, event)
    built = M.build_approval(session, session.tool_calls["c1"], "s1.t1.c1", 300.0, [], NOW)
    assert built.facts.diff is not None and built.facts.diff.path == "a.txt"
    assert "-old\n" in built.facts.diff.patch and "+new\n" in built.facts.diff.patch
    assert built.content_hash == M.content_hash(built.facts)
    assert (built.origin.kind, [p.user_id for p in built.origin.participants]) == ("autonomous", ["owner"])
    assert (built.expires_at, built.chain, built.state) == (NOW + 300_000, None, "pending")
    log = Log()
    [event] = run(log, M.Request(approval=built))
    assert isinstance(event, E.ApprovalRequested)
    assert (event.facts.diff_path, event.facts.diff_patch) == ("a.txt", built.facts.diff.patch)
