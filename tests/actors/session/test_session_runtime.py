"""Seed 002 rules of the agent runtime, through real session actors on a real store."""

from __future__ import annotations

import gc
import re
import threading
import time

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.errors import InvalidCommand, NotFound, SessionBusy
from sessionloop.actors.model import ModelResponse
from sessionloop.actors.model.scripted import ScriptedProvider
from sessionloop.actors.system.ids import new_id


def tags(session) -> list[str]:
    return [E.event_tag(e.event) for e in session.events()]


def test_a_new_session_is_idle_and_created_is_its_first_event(host):
    s = host.create(title="demo")
    assert s.state == "idle"
    assert tags(s) == ["session.created"]


def test_run_answers_with_the_mock_echo_and_completes(host):
    s = host.create()
    result = s.run("hello there")
    assert (result.state, result.output_text) == ("completed", "echo: hello there")
    assert s.state == "completed"
    assert tags(s) == ["session.created", "input.accepted", "turn.started", "llm.started", "llm.completed",
                       "turn.completed"]


def test_messages_are_derived_from_events(host):
    s = host.create()
    s.run("one")
    s.run("two")
    roles = [(m.role, m.content) for m in s.snapshot().messages]
    assert roles == [("user", "one"), ("assistant", "echo: one"), ("user", "two"), ("assistant", "echo: two")]


def test_a_tool_directive_runs_the_tool_then_the_model_answers_done(host):
    s = host.create()
    result = s.run('!tool list_files {"path": "."}')
    assert result.output_text == "done: 1 tool calls"
    state = s.snapshot()
    [call] = state.tool_calls.values()
    assert (call.tool, call.status) == ("list_files", "completed")
    assert [st.type for st in state.steps] == ["llm", "tool", "llm"]
    assert [m.role for m in state.messages] == ["user", "assistant", "tool", "assistant"]


def test_several_tool_calls_run_in_order_and_each_result_is_appended(host):
    s = host.create()
    s.run('!tool list_files {"path": "."}\n!tool write_file {"path": "a.txt", "content": "x"}\n'
          '!tool read_file {"path": "a.txt"}')
    state = s.snapshot()
    assert [c.tool for c in state.tool_calls.values()] == ["list_files", "write_file", "read_file"]
    assert all(c.status == "completed" for c in state.tool_calls.values())
    started = [e.event.call_id for e in s.events() if isinstance(e.event, (E.ToolStarted, E.ToolFinished))]
    assert started == ["call_1", "call_1", "call_2", "call_2", "call_3", "call_3"]


def test_inputs_queue_in_fifo_order_and_one_turn_runs_at_a_time(host):
    s = host.create()
    receipts = [s.send(f"!sleep 30\nmsg {i}") for i in range(5)]
    assert receipts[0].state == "accepted" and all(r.state == "queued" for r in receipts[1:])
    outcomes = [s.wait(r.turn_id, 10) for r in receipts]
    assert [o.output_text for o in outcomes] == [f"echo: msg {i}" for i in range(5)]
    starts = [e.event.turn_id for e in s.events() if isinstance(e.event, E.TurnStarted)]
    ends = [e.event.turn_id for e in s.events() if isinstance(e.event, E.TurnCompleted)]
    assert starts == ends == [r.turn_id for r in receipts]
    order = [E.event_tag(e.event) for e in s.events() if isinstance(e.event, (E.TurnStarted, E.TurnCompleted))]
    assert order == ["turn.started", "turn.completed"] * 5


def test_cancel_during_a_long_model_call_returns_in_well_under_100_ms(host, paused_gc):
    s = host.create()
    receipt = s.send("!sleep 5000\nslow")
    time.sleep(0.05)
    started = time.perf_counter()
    assert s.cancel() is True
    elapsed = time.perf_counter() - started
    assert elapsed < 0.1, f"cancel took {elapsed * 1000:.1f} ms"
    result = s.wait(receipt.turn_id, 5)
    assert (result.state, result.code) == ("failed", "aborted")
    assert s.state == "cancelled"


def test_status_answers_at_once_while_a_turn_runs(host, paused_gc):
    s = host.create()
    s.send("!sleep 3000\nbusy")
    time.sleep(0.05)
    started = time.perf_counter()
    assert s.state == "running"
    assert time.perf_counter() - started < 0.1
    s.cancel()


def test_cancel_with_nothing_running_is_false(host):
    assert host.create().cancel() is False


def test_a_model_error_fails_the_turn_with_its_message(host):
    s = host.create()
    result = s.run("!error the provider is down")
    assert (result.state, result.code, result.reason) == ("failed", "model-error", "the provider is down")
    assert s.state == "failed"
    assert "llm.failed" in tags(s)


def test_max_steps_stops_the_turn_with_a_tool_limit_notice_and_continue_resumes(open_host):
    host = open_host(permission_mode="acceptCalls", max_steps=3)
    s = host.create()
    result = s.run("!loop")
    assert (result.state, result.code) == ("completed", "tool-limit")
    notices = [e.event for e in s.events() if isinstance(e.event, E.NoticePosted)]
    assert [(n.topic, n.can_continue) for n in notices] == [("tool-limit", True)]
    assert sum(isinstance(e.event, E.LlmStarted) for e in s.events()) == 3
    receipt = s.continue_turn()
    again = s.wait(receipt.turn_id, 10)
    assert again.code == "tool-limit"
    assert sum(isinstance(e.event, E.LlmStarted) for e in s.events()) == 6
    # a continue turn adds no user message
    assert [m.content for m in s.snapshot().messages if m.role == "user"] == ["!loop"]


def test_reasoning_is_a_thinking_step(host):
    s = host.create()
    s.run("!reason let me think\nanswer")
    state = s.snapshot()
    assert [st.type for st in state.steps] == ["llm", "thinking"]
    completed = [e.event for e in s.events() if isinstance(e.event, E.LlmCompleted)][0]
    assert completed.reasoning == "let me think"


def test_usage_follows_the_mock_rule(open_host):
    host = open_host(permission_mode="acceptCalls", system_prompt="")  # "": no system prompt is sent
    s = host.create()
    s.run("abcdefgh")
    completed = [e.event for e in s.events() if isinstance(e.event, E.LlmCompleted)][0]
    assert completed.usage.prompt_tokens == len("abcdefgh") // 4
    assert completed.usage.completion_tokens == len("echo: abcdefgh") // 4
    state = s.snapshot()
    assert (state.tokens_in, state.tokens_out) == (2, 3)


def test_a_reopened_session_uses_the_current_system_prompt(open_host, data_dir):
    first = open_host(permission_mode="acceptCalls", system_prompt="You are old.")
    s = first.create()
    s.run("hi")
    first.close()
    scripted = ScriptedProvider(["fine"])
    second = open_host(permission_mode="acceptCalls", system_prompt="You are new.", provider=scripted)
    second.session(s.id).run("again")
    [request] = scripted.requests
    assert request.messages[0].role == "system" and request.messages[0].content == "You are new."
    assert "You are old." not in [m.content for m in request.messages]


def test_the_system_prompt_is_the_first_message_of_a_new_session(open_host):
    scripted = ScriptedProvider(["ok"])
    host = open_host(system_prompt="Be brief.", provider=scripted)
    host.create().run("hello")
    assert [(m.role, m.content) for m in scripted.requests[0].messages] == [("system", "Be brief."), ("user", "hello")]


def test_context_over_budget_is_trimmed_and_the_trim_is_recorded(open_host):
    def call(name: str, args: dict, n: int) -> ModelResponse:
        return ModelResponse(tool_calls=[E.ToolCallSpec(call_id=f"c{n}", name=name, args=args)])

    scripted = ScriptedProvider([
        call("write_file", {"path": "big.txt", "content": "z" * 1000}, 1),
        call("read_file", {"path": "big.txt"}, 2),
        call("read_file", {"path": "big.txt"}, 3),
        "done",
    ])
    host = open_host(permission_mode="acceptCalls", context_chars=400, provider=scripted)
    s = host.create()
    assert s.run("read it twice").output_text == "done"
    trimmed = [e.event for e in s.events() if isinstance(e.event, E.ContextTrimmed)]
    assert trimmed, "no agent.context.trimmed event"
    assert all(t.chars_before > 400 and t.omitted_outputs >= 1 for t in trimmed)
    # what the model got was cut; the stored history is complete
    last = scripted.requests[-1].messages
    assert any("omitted" in m.content for m in last if m.role == "tool")
    assert all("omitted" not in m.content for m in s.snapshot().messages)


def test_automatic_compaction_summarises_earlier_turns_once_per_turn(open_host):
    # no system prompt: the built-in one alone is over this small budget
    answers: list = ["a" * 180, "b" * 180, "SUMMARY of both", "c"]
    scripted = ScriptedProvider(answers)
    host = open_host(permission_mode="acceptCalls", context_chars=400, system_prompt="", provider=scripted)
    s = host.create()
    s.run("first " * 5)
    s.run("second " * 5)
    result = s.run("third")
    assert result.output_text == "c"
    compacted = [e.event for e in s.events() if isinstance(e.event, E.ContextCompacted)]
    assert len(compacted) == 1 and compacted[0].auto
    assert compacted[0].summary.startswith("[Summary of the earlier conversation]")
    messages = s.snapshot().messages
    summary_at = next(i for i, m in enumerate(messages) if m.content.startswith("[Summary"))
    assert messages[summary_at + 1].content == "third"  # inserted right before the current user message
    # the model then sees the summary merged into the system part, not the earlier turns
    last = scripted.requests[-1].messages
    assert "first" not in " ".join(m.content for m in last)


def test_a_failed_automatic_compaction_is_recorded_and_falls_back_to_trimming(open_host):
    scripted = ScriptedProvider(["a" * 180, "b" * 180, RuntimeError("summary model unavailable"), "c"])
    host = open_host(permission_mode="acceptCalls", context_chars=400, system_prompt="", provider=scripted)
    s = host.create()
    s.run("first " * 5)
    s.run("second " * 5)
    assert s.run("third").output_text == "c"
    failed = [e.event for e in s.events() if isinstance(e.event, E.ContextCompactFailed)]
    assert len(failed) == 1 and "summary model unavailable" in failed[0].error


def test_manual_compact_returns_turns_and_chars(open_host):
    scripted = ScriptedProvider(["one", "two", "the summary"])
    host = open_host(permission_mode="acceptCalls", provider=scripted)
    s = host.create()
    s.run("a")
    s.run("b")
    result = s.compact()
    assert result["turns"] == 2 and result["chars"] > 0
    assert s.snapshot().messages[-1].content.startswith("[Summary of the earlier conversation]")


def test_manual_compact_with_nothing_to_compact_returns_none(host):
    assert host.create().compact() is None


def test_manual_compact_refuses_while_a_turn_runs(host):
    s = host.create()
    s.send("!sleep 3000\nbusy")
    time.sleep(0.05)
    with pytest.raises(SessionBusy, match="refuses while running"):
        s.compact()
    s.cancel()


def test_fork_copies_the_messages_to_a_new_session_and_leaves_the_source(host):
    s = host.create(title="src")
    s.run("one")
    s.run("two")
    f = host.fork(s.id)
    assert f.id != s.id
    assert [m.content for m in f.snapshot().messages] == [m.content for m in s.snapshot().messages]
    assert f.snapshot().steps == []
    f.run("three")
    assert len(s.snapshot().messages) == 4 and len(f.snapshot().messages) == 6
    forked = [e.event for e in f.events() if isinstance(e.event, E.MessagesImported)][0]
    assert forked.source_session_id == s.id


def test_fork_with_turns_keeps_only_the_first_n_turns(host):
    s = host.create()
    for word in ("one", "two", "three"):
        s.run(word)
    assert [m.content for m in host.fork(s.id, turns=1).snapshot().messages] == ["one", "echo: one"]
    assert host.fork(s.id, turns=0).snapshot().messages == []


def test_fork_of_a_missing_session_is_not_found(host):
    with pytest.raises(NotFound):
        host.fork("nope")


def test_get_returns_none_for_an_unknown_session(host):
    assert host.get("does-not-exist") is None
    assert host.get(host.create().id) is not None


def test_list_reads_stored_sessions_without_activating_them(open_host):
    host = open_host(permission_mode="acceptCalls")
    ids = {host.create(title=f"s{i}").id for i in range(3)}
    host.close()
    again = open_host(permission_mode="acceptCalls")
    listed = again.list()
    assert {s.id for s in listed} == ids
    assert again.rt.directory.live_count() == 0


def test_startup_activates_only_sessions_with_unfinished_work(open_host):
    host = open_host(permission_mode="acceptCalls")
    idle = [host.create() for _ in range(5)]
    for s in idle:
        s.run("done")
    busy = host.create()
    busy.send("!sleep 10000\nlong")
    time.sleep(0.05)
    host.close()
    again = open_host(permission_mode="acceptCalls")
    assert again.rt.directory.live_ids() == [busy.id]
    again.session(busy.id).cancel()


def test_rename_changes_the_title_and_refuses_an_empty_one(host):
    s = host.create(title="old")
    s.rename("new")
    assert s.snapshot().title == "new"
    with pytest.raises(InvalidCommand, match="empty"):
        s.rename("   ")


def test_messages_to_a_missing_session_are_not_found(host):
    with pytest.raises(NotFound):
        host.session("missing").send("hi")
    with pytest.raises(NotFound):
        _ = host.session("missing").state


def test_a_provider_answer_with_a_tool_call_and_text_keeps_both(open_host):
    scripted = ScriptedProvider([
        ModelResponse(text="let me look", tool_calls=[E.ToolCallSpec(call_id="c1", name="list_files",
                                                                     args={"path": "."})]),
        "found nothing",
    ])
    host = open_host(permission_mode="acceptCalls", provider=scripted)
    s = host.create()
    assert s.run("look").output_text == "found nothing"
    assert [m.content for m in s.snapshot().messages if m.role == "assistant"] == ["let me look", "found nothing"]


def test_concurrent_runs_on_many_sessions_all_complete(host):
    sessions = [host.create() for _ in range(20)]
    results: list = []
    lock = threading.Lock()

    def go(s) -> None:
        for i in range(5):
            r = s.run(f"m{i}")
            with lock:
                results.append(r)

    threads = [threading.Thread(target=go, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 100 and all(r.state == "completed" for r in results)


def test_a_sessions_history_holds_nothing_the_cyclic_gc_must_walk(open_host):
    """A full GC pass stops every thread and walks every tracked object (README, Turns: the
    latency tail). Events, messages and per-turn records are untracked msgspec structs, and a
    message's calls are a tuple, so a long conversation does not lengthen those pauses."""

    host = open_host(permission_mode="acceptCalls")
    session = host.create(title="gc")
    session.run("hello")
    session.run('!tool list_files {"path": "."}')
    state = session.snapshot()
    records = [*state.messages, *state.turns.values(), *state.tool_calls.values(), *state.steps]
    assert records and not any(gc.is_tracked(r) for r in records)
    assert all(isinstance(m.tool_calls, tuple) for m in state.messages)
    assert any(m.tool_calls for m in state.messages)  # the tool turn's call is among them
    assert all(isinstance(t.input_ids, tuple) for t in state.turns.values())
    events = [r.event for r in session.events()]
    assert events and not any(gc.is_tracked(e) for e in events)


def test_ids_are_time_ordered_hex_and_unique_without_a_system_call_each():
    """``new_id``: 11 hex digits of milliseconds, 10 of a generator seeded once from the OS."""


    before = int(time.time() * 1000)
    ids = [new_id() for _ in range(100_000)]
    after = int(time.time() * 1000)
    assert all(re.fullmatch(r"[0-9a-f]{21}", i) for i in ids[:1000])
    assert len(set(ids)) == len(ids)
    assert before <= int(ids[0][:11], 16) <= int(ids[-1][:11], 16) <= after
