"""The pure part of replay-based debugging (SPEC §9): timeline, verify, re-run plan and comparison.

Logs come from real hosts on real LMDB (``host`` / ``open_host`` fixtures) or, for facts a mock
turn cannot produce (approvals, compaction, unknown events), are written out by hand. Verification
against a live host goes through the real gateway (``SessionProtocolService``) of that host.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec
import pytest

from sessionloop.actors import events as E
from sessionloop.actors.events import open_store
from sessionloop.actors.replay.compare import comparable, compare_logs
from sessionloop.actors.replay.live import serve_live_view
from sessionloop.actors.replay.plan import RecordedApproval, parse_model_answer, plan_rerun
from sessionloop.actors.replay.rerun import RERUN_OWNER, replayed_settlement, rerun_gate
from sessionloop.actors.replay.timeline import build_timeline, until_version
from sessionloop.actors.replay.values import ABSENT, first_difference, fold_events
from sessionloop.actors.replay.verify import verify
from sessionloop.actors.session.state import encode_state, evolve, new_state
from sessionloop.actors.views.summary import encode_summary_record, summary_record
from sessionloop.eventstore.records import RecordedEvent, Snapshot


def recorded(*events: E.Event | E.UnknownEvent, start: int = 1) -> list[RecordedEvent]:
    """Events as if each had been committed on its own, one millisecond apart."""
    return [RecordedEvent("session-s1", start + i, start + i, 1000 + i, e) for i, e in enumerate(events)]


def run_turns(host: Any, *texts: str) -> tuple[Any, list[RecordedEvent]]:
    session = host.create(title="demo")
    run_turns_on(session, *texts)
    return session, host.store.read_stream(f"session-{session.id}")


def stored(host: Any, session: Any) -> tuple[Snapshot | None, bytes | None]:
    stream = f"session-{session.id}"
    return host.store.load_snapshot(stream), host.store.stream_meta(stream)


# --- differences ---------------------------------------------------------------------------------


def test_first_difference_names_the_nested_path_and_both_values() -> None:
    assert first_difference({"a": {"b": [1, 2]}}, {"a": {"b": [1, 3]}}) == ("a.b[1]", 2, 3)


def test_first_difference_shows_a_missing_key_or_element_as_absent() -> None:
    assert first_difference({"a": 1, "b": 2}, {"a": 1}) == ("b", 2, ABSENT)
    assert first_difference([1], [1, 2]) == ("[1]", ABSENT, 2)


def test_first_difference_skips_ignored_keys_at_every_depth() -> None:
    assert first_difference({"at": 1, "x": {"at": 2}}, {"at": 9, "x": {"at": 8}}, ignore=frozenset({"at"})) is None


def test_first_difference_tells_a_string_from_a_number() -> None:
    assert first_difference({"a": 1}, {"a": "1"}) == ("a", 1, "1")


# --- timeline --------------------------------------------------------------------------------------


def test_timeline_has_one_summary_per_turn_with_outcome_tokens_and_counts(host) -> None:
    session, events = run_turns(host, "hi", '!tool list_files {"path": "."}', "!error nope")
    tl = build_timeline(session.id, events)
    assert [(t.number, t.status, t.outcome) for t in tl.turns] == [
        (1, "completed", "replied"), (2, "completed", "replied"), (3, "failed", "error")]
    assert tl.turns[1].model_calls == 2 and tl.turns[1].tool_calls == 1
    assert tl.turns[1].prompt_tokens > 0 and tl.turns[2].reason == "nope"
    assert tl.events == len(events) and tl.status == "failed" and tl.title == "demo"


def test_timeline_pairs_a_tool_call_start_with_its_result(host) -> None:
    session, events = run_turns(host, '!tool write_file {"path": "a.txt", "content": "x"}')
    tl = build_timeline(session.id, events)
    tool = next(e for e in tl.entries if e.kind == "tool")
    assert tool.facts["tool"] == "write_file" and tool.facts["args"] == '{"path":"a.txt","content":"x"}'
    assert tool.status == "completed" and tool.end_version is not None and tool.end_version > tool.version
    assert tool.facts["display"] == "file-change"
    checkpoint = next(e for e in tl.entries if e.kind == "checkpoint")
    assert checkpoint.facts == {"callId": tool.facts["callId"], "path": "a.txt", "existed": False}


def test_timeline_shows_a_call_denied_for_want_of_an_approver_with_its_args(open_host) -> None:
    host = open_host()  # interactive sessions ask; nobody is present to answer
    session, events = run_turns(host, '!tool write_file {"path": "a.txt", "content": "x"}')
    tl = build_timeline(session.id, events)
    tool = next(e for e in tl.entries if e.kind == "tool")
    assert (tool.status, tool.facts["tool"], tool.facts["approval"]) == ("denied", "write_file", "denied (absent)")
    assert tool.facts["args"] == '{"path":"a.txt","content":"x"}' and tl.turns[0].tool_calls == 1


def test_timeline_shows_approvals_with_their_settlement_and_repairs() -> None:
    by = E.Speaker(platform="console", user_id="owner")
    events = recorded(
        E.SessionCreated(at=1, session_id="s1"),
        E.InputAccepted(at=2, input_id="i1", turn_id="t1", text="write it"),
        E.TurnStarted(at=2, turn_id="t1", input_ids=["i1"]),
        E.LlmStarted(at=3, turn_id="t1", step_id="t1.1"),
        E.LlmCompleted(at=5, turn_id="t1", step_id="t1.1", provider="p", model="m", usage=E.Usage(prompt_tokens=7),
                       tool_calls=[E.ToolCallSpec(call_id="c1", name="exec", args={"command": "ls"}),
                                   E.ToolCallSpec(call_id="c2", name="exec", args={"command": "rm"})]),
        E.ToolApprovalRequested(at=6, turn_id="t1", call_id="c1", approval_id="a1"),
        E.ToolApprovalSettled(at=9, turn_id="t1", call_id="c1", approval_id="a1",
                              settlement=E.Settlement(state="approved", source="answer", at=9, by=by)),
        E.ToolStarted(at=10, turn_id="t1", call_id="c1", tool="exec", args={"command": "ls"}),
        E.ToolFinished(at=12, turn_id="t1", call_id="c1", status="failed", exit_code=2, output="boom"),
        E.ToolFinished(at=13, turn_id="t1", call_id="c2", status="aborted", repair="cancel", not_executed=True),
        E.TurnAborted(at=13, turn_id="t1", reason="stopped"),
    )
    tl = build_timeline("s1", events)
    approval = next(e for e in tl.entries if e.kind == "approval")
    assert (approval.status, approval.duration_ms, approval.facts["by"]) == ("approved", 3, "owner")
    first, second = [e for e in tl.entries if e.kind == "tool"]
    assert (first.status, first.facts["exitCode"], first.duration_ms) == ("failed", 2, 2)
    assert first.facts["approval"] == "approved (answer)"
    assert (second.facts["tool"], second.facts["repair"], second.facts["notExecuted"]) == ("exec", "cancel", True)
    assert tl.turns[0].status == "aborted" and tl.turns[0].reason == "stopped"
    model = next(e for e in tl.entries if e.kind == "model")
    assert (model.facts["provider"], model.facts["model"], model.facts["promptTokens"], model.duration_ms) == (
        "p", "m", 7, 2)


def test_timeline_shows_notices_context_events_rewinds_and_unknown_events() -> None:
    events = recorded(
        E.SessionCreated(at=1, session_id="s1"),
        E.InputAccepted(at=2, input_id="i1", turn_id="t1", text="go"),
        E.TurnStarted(at=2, turn_id="t1", input_ids=["i1"], max_steps=1),
        E.ContextTrimmed(at=3, turn_id="t1", step_id="t1.1", chars_before=900, chars_after=300, omitted_outputs=2),
        E.ContextCompacted(at=3, summary="[Summary of the earlier conversation] x", turns=4, chars=40, auto=True,
                           turn_id="t1"),
        E.TurnLimitReached(at=4, turn_id="t1", max_steps=1),
        E.NoticePosted(at=4, notice_id="t1.limit", topic="tool-limit", turn_id="t1", text="Stopped", can_continue=True),
        E.TurnRewound(at=5, turn_id="t1", scope="code-and-chat", restored=["a"], chat_deleted=True, deleted_messages=3),
        E.UnknownEvent(type="future.thing", raw=b"\x80"),
    )
    tl = build_timeline("s1", events)
    kinds = [(e.kind, e.what) for e in tl.entries]
    assert ("context", "trimmed") in kinds and ("context", "compacted") in kinds
    assert ("notice", "tool-limit") in kinds and ("rewind", "code-and-chat") in kinds
    assert kinds[-1] == ("unknown", "future.thing")
    assert tl.turns[0].status == "limit" and tl.turns[0].code == "tool-limit"


def test_timeline_until_a_version_keeps_only_events_up_to_it(host) -> None:
    session, events = run_turns(host, "one", "two")
    tl = build_timeline(session.id, events, until=4)
    assert tl.events == 4 and tl.last_version == 4
    assert tl.turns[0].status == "running" and len(tl.turns) == 1


def test_until_takes_a_version_a_turn_id_or_a_unique_prefix_of_one(host) -> None:
    _, events = run_turns(host, "one", "two")
    first, second = [r.event.turn_id for r in events if isinstance(r.event, E.TurnStarted)]
    assert until_version(events, "3") == 3
    last_of_first = max(r.version for r in events if getattr(r.event, "turn_id", None) == first)
    assert until_version(events, first) == last_of_first
    assert until_version(events, second[:-1]) == events[-1].version
    with pytest.raises(ValueError, match="turn zzz not found"):
        until_version(events, "zzz")


# --- verify ----------------------------------------------------------------------------------------


def test_verify_passes_for_a_session_with_snapshots_tools_and_failures(open_host) -> None:
    host = open_host(permission_mode="acceptCalls", snapshot_every=3)
    session, events = run_turns(host, "hi", '!tool write_file {"path": "a.txt", "content": "x"}', "!error e",
                                "!reason r\nthere")
    snapshot, meta = stored(host, session)
    assert snapshot is not None
    report = verify(session.id, events, snapshot, meta)
    assert report.difference is None, report.difference
    assert report.snapshot_version == snapshot.version and report.listing_version is not None
    assert report.history_items > 0


def test_verify_passes_after_a_rewind_that_deleted_chat(host) -> None:
    session, _ = run_turns(host, "hi", '!tool write_file {"path": "a.txt", "content": "x"}', "later")
    state = session.snapshot()
    session.rewind(state.turn_order[1], scope="code-and-chat")
    events = host.store.read_stream(f"session-{session.id}")
    report = verify(session.id, events, *stored(host, session))
    assert report.difference is None, report.difference


def test_verify_passes_for_a_fork_with_imported_messages(host) -> None:
    session, _ = run_turns(host, "hi", '!tool list_files {"path": "."}')
    fork = host.fork(session.id, turns=1)
    fork.run("more", timeout=10)
    events = host.store.read_stream(f"session-{fork.id}")
    assert verify(fork.id, events, *stored(host, fork)).difference is None


def test_verify_reports_the_first_snapshot_field_that_differs(host) -> None:
    session, events = run_turns(host, "hi", "there")
    state = fold_events(session.id, events[:5])
    state.tokens_out += 100
    snapshot = Snapshot(f"session-{session.id}", 5, encode_state(state))
    d = verify(session.id, events, snapshot, stored(host, session)[1]).difference
    assert d is not None and (d.check, d.path, d.version) == ("snapshot", "state.tokens_out", 5)
    assert d.got == d.expected + 100


def test_verify_reports_a_snapshot_beyond_the_last_event(host) -> None:
    session, events = run_turns(host, "hi")
    state = fold_events(session.id, events)
    snapshot = Snapshot(f"session-{session.id}", len(events) + 3, encode_state(state))
    d = verify(session.id, events, snapshot, stored(host, session)[1]).difference
    assert d is not None and (d.check, d.path, d.got) == ("snapshot", "version", len(events) + 3)


def test_verify_ignores_a_snapshot_in_another_format_and_says_so(host) -> None:
    session, events = run_turns(host, "hi")
    snapshot = Snapshot(f"session-{session.id}", 2, msgspec.msgpack.encode((999, {})))
    report = verify(session.id, events, snapshot, stored(host, session)[1])
    assert report.difference is None and report.snapshot_note is not None


def test_verify_reports_a_listing_record_with_a_wrong_status(host) -> None:
    session, events = run_turns(host, "hi")
    wrong = msgspec.structs.replace(summary_record(fold_events(session.id, events)), status="running", running=True)
    d = verify(session.id, events, None, encode_summary_record(wrong)).difference
    assert d is not None and d.check == "listing record" and d.path == "record.running"
    assert (d.expected, d.got) == (False, True)


def test_verify_reports_a_missing_listing_record(host) -> None:
    session, events = run_turns(host, "hi")
    d = verify(session.id, events, None, None).difference
    assert d is not None and (d.check, d.got) == ("listing record", ABSENT)


def test_verify_accepts_a_listing_record_that_includes_the_rest_of_its_commit() -> None:
    # one commit (same time, consecutive positions): turn.started rewrites the record, and the
    # record is computed after the whole commit, so it counts the tokens of the answer after it
    events = [RecordedEvent("session-s1", 1, 1, 10, E.SessionCreated(at=10, session_id="s1")),
              RecordedEvent("session-s1", 2, 2, 20, E.InputAccepted(at=20, input_id="i", turn_id="t", text="x")),
              RecordedEvent("session-s1", 3, 3, 20, E.TurnStarted(at=20, turn_id="t", input_ids=["i"])),
              RecordedEvent("session-s1", 4, 4, 20, E.LlmStarted(at=20, turn_id="t", step_id="t.1")),
              RecordedEvent("session-s1", 5, 5, 20, E.LlmCompleted(at=20, turn_id="t", step_id="t.1",
                                                                   usage=E.Usage(prompt_tokens=5)))]
    meta = encode_summary_record(summary_record(fold_events("s1", events)))
    report = verify("s1", events, None, meta)
    assert report.difference is None and report.listing_version == 5
    # two commits in one millisecond: turn.started's, then one that rewrote nothing (a model call starting)
    started = events[:4]
    early = encode_summary_record(summary_record(fold_events("s1", started[:3])))
    assert verify("s1", started, None, early).difference is None
    # llm.completed rewrites the record (seed 004: token 记账 pushes): one from before it is stale
    assert verify("s1", events, None, early).difference.path == "record.tokens_in"


# --- rerun plan and comparison ---------------------------------------------------------------------


def test_plan_counts_user_turns_as_fork_does_and_keeps_continue_turns(open_host) -> None:
    host = open_host(permission_mode="acceptCalls", max_steps=1)
    session, _ = run_turns(host, "one", '!tool list_files {"path": "."}')
    receipt = session.continue_turn()
    session.wait(receipt.turn_id, 10)
    session.run("three", timeout=10)
    events = host.store.read_stream(f"session-{session.id}")
    plan = plan_rerun(session.id, events, 1)
    assert plan.user_turns == 3 and plan.max_steps == 1
    assert [t.is_continue for t in plan.turns] == [False, True, False]
    assert [t.input.text for t in plan.turns][::2] == ['!tool list_files {"path": "."}', "three"]
    assert len(plan.calls) == 1 and plan.find_call("1") == plan.find_call(plan.calls[0][1])


def test_plan_refuses_a_from_turn_out_of_range(host) -> None:
    session, events = run_turns(host, "one", "two")
    with pytest.raises(ValueError, match="between 0 and 1"):
        plan_rerun(session.id, events, 2)


def test_plan_refuses_a_deleted_session() -> None:
    events = recorded(E.SessionCreated(at=1, session_id="s1"),
                      E.InputAccepted(at=2, input_id="i1", turn_id="t1", text="go"),
                      E.TurnStarted(at=2, turn_id="t1", input_ids=["i1"]),
                      E.TurnCompleted(at=3, turn_id="t1"),
                      E.SessionDeleted(at=4))
    with pytest.raises(ValueError, match="was deleted"):
        plan_rerun("s1", events, 0)


def test_plan_refuses_a_session_with_a_turn_in_progress() -> None:
    events = recorded(E.SessionCreated(at=1, session_id="s1"),
                      E.InputAccepted(at=2, input_id="i1", turn_id="t1", text="go"),
                      E.TurnStarted(at=2, turn_id="t1", input_ids=["i1"]))
    with pytest.raises(ValueError, match="turn in progress"):
        plan_rerun("s1", events, 0)


def test_plan_refuses_to_start_inside_the_history_a_fork_was_given(host) -> None:
    session, _ = run_turns(host, "one", "two")
    fork = host.fork(session.id)
    fork.run("three", timeout=10)
    events = host.store.read_stream(f"session-{fork.id}")
    with pytest.raises(ValueError, match="at least 2"):
        plan_rerun(fork.id, events, 0)
    assert [t.input.text for t in plan_rerun(fork.id, events, 2).turns] == ["three"]


def test_comparable_moves_a_queued_input_before_its_turn_and_leaves_owner_actions_out() -> None:
    events = recorded(
        E.SessionCreated(at=1, session_id="s1"),
        E.InputAccepted(at=2, input_id="i1", turn_id="t1", text="a"),
        E.TurnStarted(at=2, turn_id="t1", input_ids=["i1"]),
        E.InputAccepted(at=3, input_id="i2", turn_id="t2", text="b"),
        E.SessionRenamed(at=3, title="x"),
        E.TurnCompleted(at=4, turn_id="t1", output_text="ok"),
        E.TurnStarted(at=5, turn_id="t2", input_ids=["i2"]),
        E.PlanCleared(at=5),
        E.TurnCompleted(at=6, turn_id="t2"),
    )
    tags = [(turn, E.event_tag(r.event)) for turn, r in comparable(events, {"t1", "t2"})]
    assert tags == [("t1", "input.accepted"), ("t1", "turn.started"), ("t1", "turn.completed"),
                    ("t2", "input.accepted"), ("t2", "turn.started"), ("t2", "turn.completed")]
    assert [t for t, _ in comparable(events, {"t2"})] == ["t2", "t2", "t2"]


def test_compare_logs_ignores_ids_and_times_but_not_text() -> None:
    a = comparable(recorded(E.InputAccepted(at=1, input_id="i1", turn_id="t1", text="x"),
                            E.TurnStarted(at=1, turn_id="t1", input_ids=["i1"]),
                            E.TurnCompleted(at=2, turn_id="t1", output_text="same")), {"t1"})
    b = comparable(recorded(E.InputAccepted(at=7, input_id="i9", turn_id="t9", text="x"),
                            E.TurnStarted(at=7, turn_id="t9", input_ids=["i9"]),
                            E.TurnCompleted(at=9, turn_id="t9", output_text="other")), {"t9"})
    numbers = {"t1": 1, "t9": 1}
    assert compare_logs(a, a, numbers) == (None, [])
    d, _ = compare_logs(a, b, numbers)
    assert d is not None and (d.index, d.expected_tag, d.path, d.expected, d.got, d.turn) == (
        3, "turn.completed", "output_text", "same", "other", 1)


def test_compare_logs_reports_a_log_that_ends_early_or_goes_on() -> None:
    a = comparable(recorded(E.TurnStarted(at=1, turn_id="t1"), E.TurnCompleted(at=2, turn_id="t1")), {"t1"})
    d, _ = compare_logs(a, a[:1], {"t1": 1})
    assert d is not None and (d.index, d.expected_tag, d.got_tag, d.got) == (2, "turn.completed", None, ABSENT)
    d, _ = compare_logs(a[:1], a, {"t1": 1})
    assert d is not None and (d.expected_tag, d.got_tag) == (None, "turn.completed")


def test_compare_logs_reports_loosened_fields_apart_from_the_divergence() -> None:
    a = comparable(recorded(E.TurnStarted(at=1, turn_id="t1"),
                            E.ToolFinished(at=2, turn_id="t1", call_id="c", status="completed", output=1)), {"t1"})
    b = comparable(recorded(E.TurnStarted(at=1, turn_id="t1"),
                            E.ToolFinished(at=2, turn_id="t1", call_id="c", status="failed", output=2)), {"t1"})
    d, relaxed = compare_logs(a, b, {"t1": 1}, loose={1: frozenset({"output", "status"})})
    assert d is None and len(relaxed) == 1 and relaxed[0].path == "status"


# --- verify against a live host --------------------------------------------------------------------


@pytest.fixture
def gateway(host):
    """The gateway a server runs over the ``host`` fixture's host (real connections, no sockets)."""
    service = host.protocol()
    yield service
    service.close()


def live_report(host: Any, service: Any, session: Any) -> Any:
    events = host.store.read_stream(f"session-{session.id}")
    return verify(session.id, events, *stored(host, session), live=serve_live_view(service, session.id))


def test_verify_against_a_live_host_passes_and_says_what_it_compared(host, gateway) -> None:
    session = host.create(title="live")
    first = serve_live_view(gateway, session.id)  # a subscriber: the actor now keeps its items up to date
    assert first.snapshot == {"items": [], "before": None} and first.error is None
    run_turns_on(session, "hi", '!tool write_file {"path": "a.txt", "content": "x"}', "!error e",
                 '!tool update_plan {"entries": [{"text": "a", "status": "pending"}]}', "!reason r\nthere")
    report = live_report(host, gateway, session)
    assert report.difference is None, report.difference
    assert (report.compared, report.live_epoch, report.history_pages) == ("live", host.epoch, 1)
    assert report.snapshot_items is not None and report.snapshot_items > report.history_items  # + plan, usage


def test_verify_against_a_live_host_reports_an_event_its_session_actor_did_not_see(host, gateway) -> None:
    session = host.create(title="live")
    run_turns_on(session, "hi")
    serve_live_view(gateway, session.id)  # the actor builds its projection now
    stream = f"session-{session.id}"
    planted = E.NoticePosted(at=1, notice_id="planted", topic="info", text="written behind the actor's back")
    host.store.append(stream, [planted], expected_version=host.store.stream_version(stream))
    offline = verify(session.id, host.store.read_stream(stream), *stored(host, session))
    assert offline.difference is None and offline.compared == "offline"  # the log agrees with itself
    d = live_report(host, gateway, session).difference
    assert d is not None and d.check == "live projection", d
    assert (d.path, d.got, d.version) == ("items['planted']", ABSENT, host.store.stream_version(stream) - 1)
    assert d.expected["itemId"] == "planted" and d.expected["text"] == "written behind the actor's back"


def test_verify_against_a_live_host_accepts_a_deleted_session_it_does_not_serve(open_host, data_dir) -> None:
    """A log that ends with ``session.deleted`` (an older server's delete, before purging): the
    live host serves not-found for it, and verify agrees."""
    first = open_host(permission_mode="acceptCalls")
    session = first.create(title="gone")
    run_turns_on(session, "hi")
    first.close()
    store = open_store(os.path.join(data_dir, "store"), durability="nosync")
    stream = f"session-{session.id}"
    state = new_state(session.id)
    for recorded in store.read_stream(stream):
        state = evolve(state, recorded.event)
    deleted = E.SessionDeleted(at=2)
    record = summary_record(evolve(state, deleted))  # with its listing record, as that server's commit had it
    store.append(stream, [deleted], expected_version=state.version - 1, meta=encode_summary_record(record))
    store.close()
    host = open_host(permission_mode="acceptCalls")
    gateway = host.protocol()
    try:
        view = serve_live_view(gateway, session.id)
        assert view.error is not None and view.error["data"]["code"] == "not-found"
        report = live_report(host, gateway, host.session(session.id))
        assert report.difference is None and report.compared == "live"
    finally:
        gateway.close()


def run_turns_on(session: Any, *texts: str) -> None:
    for text in texts:
        assert session.run(text, timeout=10).state != "timeout"


# --- what-if steps: tool results and model answers -------------------------------------------------


def test_find_step_names_a_model_call_by_step_id_or_number_and_a_tool_call_as_before(host) -> None:
    session, events = run_turns(host, "one", '!tool list_files {"path": "."}', "!error down", "four")
    plan = plan_rerun(session.id, events, 1)
    steps = [r.event.step_id for r in events if isinstance(r.event, (E.LlmCompleted, E.LlmFailed))][1:]
    assert [s for _, s, _ in plan.model_steps] == steps
    second = plan.find_step("llm:2")
    assert (second.kind, second.turn, second.call, second.step_id) == ("model", 1, 2, steps[1])
    assert isinstance(second.recorded, E.LlmCompleted) and second.recorded.text == "done: 1 tool calls"
    failed = plan.find_step(steps[2])
    assert (failed.turn, failed.call) == (2, 1) and isinstance(failed.recorded, E.LlmFailed)
    tool = plan.find_step("1")
    assert (tool.kind, tool.turn, tool.tool) == ("tool", 1, "list_files")
    assert plan.find_step(tool.call_id).call_id == tool.call_id


def test_find_step_refuses_an_unknown_step_naming_what_exists(host) -> None:
    session, events = run_turns(host, "one", '!tool list_files {"path": "."}')
    plan = plan_rerun(session.id, events, 1)
    with pytest.raises(ValueError, match=r"model call llm:3 does not exist: 2 model calls were recorded after "
                                         r"turn 1 \(llm:1 to llm:2\)"):
        plan.find_step("llm:3")
    with pytest.raises(ValueError, match=r"step 'nope' is neither a tool call that ran nor a model call recorded "
                                         r"after turn 1 \(tool calls: a call id or 1 to 1; model calls"):
        plan.find_step("nope")
    with pytest.raises(ValueError, match="tool call 2 does not exist"):
        plan.find_step("2")


def test_parse_model_answer_takes_text_and_tool_calls_or_an_error() -> None:
    answer = parse_model_answer({"text": "hm", "toolCalls": [{"name": "list_files", "args": {"path": "."}},
                                                             {"name": "read_file", "callId": "mine"}]})
    assert answer.text == "hm" and answer.error is None
    assert answer.tool_call_specs() == [E.ToolCallSpec(call_id="override_1", name="list_files", args={"path": "."}),
                                        E.ToolCallSpec(call_id="mine", name="read_file")]
    assert parse_model_answer({"error": "rate limited"}).error == "rate limited"


@pytest.mark.parametrize(("value", "message"), [
    ([1], "a model answer must be a JSON object"),
    ({}, "the model answer is empty"),
    ({"txt": "x"}, "unknown field `txt`"),
    ({"text": 3}, r"Expected `str`, got `int` - at `\$.text`"),
    ({"toolCalls": [{"args": {}}]}, "missing required field `name`"),
    ({"text": "a", "error": "b"}, "either error .* or text/toolCalls, not both"),
    ({"toolCalls": [{"name": "a", "callId": "x"}, {"name": "b", "callId": "x"}]}, "repeats a tool call id"),
])
def test_parse_model_answer_says_what_is_wrong(value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_model_answer(value)


# --- rerun: approvals as recorded answers ----------------------------------------------------------


def test_a_replayed_grant_lasts_as_long_after_the_rerun_answer_as_it_did_after_the_recorded_one() -> None:
    terms = E.GrantTerms(scope="session", tool="exec", command_prefix="git status", expires_at=1_000 + 3_600_000)
    recorded_answer = E.Settlement(state="approved", source="answer", at=1_000, by=RERUN_OWNER, grant=terms)
    again = replayed_settlement(recorded_answer, now=50_000_000_000)  # long after the grant had expired
    assert again.at == 50_000_000_000 and again.grant is not None
    assert again.grant.expires_at == 50_000_000_000 + 3_600_000
    assert (again.state, again.source, again.by, again.grant.command_prefix) == ("approved", "answer", RERUN_OWNER,
                                                                                  "git status")


def _approval(asked: bool, source: str, state: str = "denied") -> RecordedApproval:
    return RecordedApproval(number=1, turn=1, call_id="call_1", tool="exec", approval_id="s.t.call_1", asked=asked,
                            settlement=E.Settlement(state=state, source=source, at=1))  # type: ignore[arg-type]


def test_the_rerun_gate_asks_what_was_asked_and_settles_at_once_what_the_recording_settled_at_once() -> None:
    def gate(recorded: RecordedApproval | None, overridden: bool = False) -> tuple[bool, bool, bool]:
        g = rerun_gate(recorded, overridden)
        return g.present, g.rate_limited, g.grants

    assert gate(_approval(True, "answer", "approved")) == (True, False, False)  # asked, answered as recorded
    assert gate(_approval(True, "timeout", "expired")) == (True, False, False)
    assert gate(_approval(False, "grant", "approved")) == (True, False, True)  # the replayed grant settles it
    assert gate(_approval(False, "absent")) == (False, False, False)  # nobody was present
    assert gate(_approval(False, "rate-limit")) == (True, True, False)
    assert gate(_approval(False, "grant", "approved"), overridden=True) == (True, False, False)  # asked: the override
    assert gate(None) == (False, False, True)  # not in the recording: nobody is present in a rerun


def test_a_rerun_plan_knows_how_each_approval_was_settled_and_the_settings_of_each_turn() -> None:
    grant = E.GrantTerms(scope="session", tool="exec", expires_at=10_000)
    events = recorded(
        E.SessionCreated(at=1, session_id="s1", permission_mode="ask"),
        E.SessionSettingChanged(at=2, plugin="tools", key="sandbox", value="read-only"),
        E.InputAccepted(at=3, input_id="i1", turn_id="t1", text="one"),
        E.TurnStarted(at=3, turn_id="t1", input_ids=["i1"]),
        E.LlmStarted(at=3, turn_id="t1", step_id="l1"),
        E.LlmCompleted(at=4, turn_id="t1", step_id="l1", tool_calls=[
            E.ToolCallSpec(call_id="c1", name="exec", args={"command": "ls"}),
            E.ToolCallSpec(call_id="c2", name="exec", args={"command": "ls -l"})]),
        E.ToolApprovalRequested(at=4, turn_id="t1", call_id="c1", approval_id="s1.t1.c1"),
        E.ToolApprovalSettled(at=5, turn_id="t1", call_id="c1", approval_id="s1.t1.c1", settlement=E.Settlement(
            state="approved", source="answer", at=5, grant=grant)),
        E.ToolStarted(at=5, turn_id="t1", call_id="c1", tool="exec", args={"command": "ls"}),
        E.ToolFinished(at=6, turn_id="t1", call_id="c1", status="completed", output={"exitCode": 0}),
        E.ToolApprovalSettled(at=6, turn_id="t1", call_id="c2", approval_id="s1.t1.c2", settlement=E.Settlement(
            state="approved", source="grant", at=6, grant_id="s1.t1.c1")),
        E.ToolStarted(at=6, turn_id="t1", call_id="c2", tool="exec", args={"command": "ls -l"}),
        E.ToolFinished(at=7, turn_id="t1", call_id="c2", status="completed", output={"exitCode": 0}),
        E.LlmStarted(at=7, turn_id="t1", step_id="l2"),
        E.LlmCompleted(at=8, turn_id="t1", step_id="l2", text="done"),
        E.TurnCompleted(at=8, turn_id="t1", output_text="done"),
        E.SessionSettingChanged(at=9, plugin="tools", key="sandbox", deleted=True),
        E.InputAccepted(at=10, input_id="i2", turn_id="t2", text="two"),
        E.TurnStarted(at=10, turn_id="t2", input_ids=["i2"]),
        E.LlmStarted(at=10, turn_id="t2", step_id="l3"),
        E.LlmCompleted(at=11, turn_id="t2", step_id="l3", tool_calls=[
            E.ToolCallSpec(call_id="c3", name="write_file", args={"path": "a", "content": "b"})]),
        E.ToolFinished(at=11, turn_id="t2", call_id="c3", status="denied", output={"error": "denied"},
                       approval_id="s1.t2.c3", settlement=E.Settlement(state="denied", source="absent", at=11)),
        E.LlmStarted(at=11, turn_id="t2", step_id="l4"),
        E.LlmCompleted(at=12, turn_id="t2", step_id="l4", text="ok"),
        E.TurnCompleted(at=12, turn_id="t2", output_text="ok"),
    )
    plan = plan_rerun("s1", events, 0)
    found = {key: (a.number, a.tool, a.asked, a.settlement.source if a.settlement else None)
             for key, a in plan.approvals.items()}
    assert found == {(1, "c1"): (1, "exec", True, "answer"), (1, "c2"): (2, "exec", False, "grant"),
                     (2, "c3"): (3, "write_file", False, "absent")}
    assert plan.settings == {1: {"tools/sandbox": "read-only"}, 2: {}}
    assert plan.find_approval("2").call_id == "c2" and plan.find_approval("s1.t2.c3").call_id == "c3"
    assert plan.find_approval("c1").approval_id == "s1.t1.c1"
    with pytest.raises(ValueError, match="approval 4 does not exist: 3 approvals after turn 0"):
        plan.find_approval("4")


def test_the_timeline_of_a_failed_turn_names_its_code_reason_and_failing_step(host) -> None:
    session = host.create(title="fails")
    session.run("!error the upstream said no")
    events = list(session.events())
    (ended,) = [e for e in build_timeline(session.id, events).entries if e.kind == "turn" and e.what == "ended"]
    (failed_call,) = [r.event for r in events if isinstance(r.event, E.LlmFailed)]
    assert ended.status == "failed" and ended.facts["code"] == "model-error"
    assert ended.facts["reason"] == "the upstream said no" and ended.facts["step"] == failed_call.step_id
