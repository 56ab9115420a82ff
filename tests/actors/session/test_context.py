"""Context trimming and compaction (seed 002 上下文裁剪 v0.22, 上下文压缩 0.31; SPEC §4)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionloop.actors.events import Message, ToolCallSpec
from sessionloop.actors.session.context import (
    SUMMARY_INPUT_LIMIT,
    SUMMARY_PREFIX,
    apply_summary,
    build_summary_request,
    compaction_input,
    count_chars,
    dropped_note,
    keep_turns,
    message_chars,
    model_view,
    omitted_placeholder,
    project_context,
    summary_message,
    summary_text,
    turns_of,
    unanswered_tool_calls,
)

SYSTEM = Message(role="system", content="You are helpful.")


def user(text: str) -> Message:
    return Message(role="user", content=text)


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def calls(*ids: str, args: object = None) -> Message:
    return Message(
        role="assistant",
        tool_calls=[ToolCallSpec(call_id=i, name="read_file", args=args or {"path": i}) for i in ids],
    )


def result(call_id: str, size: int) -> Message:
    return Message(role="tool", tool_call_id=call_id, content="o" * size)


def tool_turn(n: int, size: int) -> list[Message]:
    """A turn with one tool call whose output has ``size`` characters."""
    return [user(f"question {n}"), calls(f"c{n}"), result(f"c{n}", size), say(f"answer {n}")]


# --- counting and turns -------------------------------------------------------------------------


def test_characters_are_content_plus_tool_call_arguments_as_json() -> None:
    assert message_chars(user("abc")) == 3
    assert message_chars(calls("x", args={"path": "ab"})) == len('{"path":"ab"}')


def test_a_turn_runs_from_a_user_message_to_the_next_one() -> None:
    history = [SYSTEM, *tool_turn(1, 10), user("next"), say("ok")]
    assert turns_of(history) == [(1, 5), (5, 7)]


def test_a_user_message_between_a_call_and_its_result_does_not_start_a_turn() -> None:
    history = [SYSTEM, user("q"), calls("c1"), user("joined mid-step"), result("c1", 5), user("next")]
    assert turns_of(history) == [(1, 5), (5, 6)]


def test_fork_keeps_the_first_n_turns_and_zero_keeps_only_the_system_part() -> None:
    history = [SYSTEM, *tool_turn(1, 5), *tool_turn(2, 5)]
    assert keep_turns(history, 0) == [SYSTEM]
    assert keep_turns(history, 1) == [SYSTEM, *tool_turn(1, 5)]
    assert keep_turns(history, 9) == history


def test_unanswered_tool_calls_are_the_ones_without_a_result() -> None:
    history = [user("q"), calls("a", "b"), result("a", 1)]
    assert [c.call_id for c in unanswered_tool_calls(history)] == ["b"]


# --- trimming, rule by rule ---------------------------------------------------------------------


def test_no_budget_means_no_trimming() -> None:
    history = [SYSTEM, *tool_turn(1, 10_000)]
    sent, report = project_context(history, None)
    assert sent == history and not report.trimmed
    assert report.chars_before == report.chars_after == count_chars(history)


def test_a_history_within_budget_is_sent_unchanged() -> None:
    history = [SYSTEM, *tool_turn(1, 100)]
    sent, report = project_context(history, count_chars(history))
    assert sent == history and sent is not history and not report.trimmed


def test_old_tool_outputs_are_omitted_first_with_a_placeholder_naming_their_size() -> None:
    history = [SYSTEM, *tool_turn(1, 5000), *tool_turn(2, 10)]
    sent, report = project_context(history, count_chars(history) - 1000)
    assert sent[3].content == "[tool output omitted … 5000 chars]"
    assert sent[3].content == omitted_placeholder(5000)
    assert [m.role for m in sent] == [m.role for m in history]
    assert report.omitted_outputs == 1 and report.dropped_turns == 0 and report.trimmed


def test_old_outputs_are_omitted_oldest_first_and_only_as_far_as_needed() -> None:
    history = [SYSTEM, *tool_turn(1, 3000), *tool_turn(2, 3000), *tool_turn(3, 10)]
    sent, report = project_context(history, count_chars(history) - 2000)
    assert sent[3].content == omitted_placeholder(3000)
    assert sent[7].content == history[7].content
    assert report.omitted_outputs == 1


def test_a_short_tool_output_is_never_replaced_by_a_longer_placeholder() -> None:
    history = [SYSTEM, *tool_turn(1, 5), *tool_turn(2, 5)]
    sent, _ = project_context(history, 1)
    assert all("omitted …" not in m.content for m in sent if m.role == "tool")


def test_whole_old_turns_are_dropped_oldest_first_when_omitting_outputs_is_not_enough() -> None:
    big = "u" * 4000
    history = [SYSTEM, user(big), say("a1"), user(big), say("a2"), *tool_turn(3, 10)]
    budget = count_chars(history) - 4000 + len(dropped_note(1)) + 2
    sent, report = project_context(history, budget)
    assert report.dropped_turns == 1
    assert [m.content for m in sent[1:3]] == [big, "a2"]
    assert report.chars_after <= budget


def test_dropped_turns_are_noted_at_the_end_of_the_system_message() -> None:
    history = [SYSTEM, user("x" * 1000), say("a"), user("y" * 1000), say("b"), user("now")]
    sent, report = project_context(history, 200)
    assert report.dropped_turns == 2
    assert sent[0].content == f"{SYSTEM.content}\n\n{dropped_note(2)}"
    assert sent[1:] == [user("now")]


def test_the_note_becomes_a_system_message_when_there_is_none() -> None:
    history = [user("x" * 1000), say("a"), user("now")]
    sent, report = project_context(history, 150)
    assert sent == [Message(role="system", content=dropped_note(1)), user("now")]
    assert report.chars_after == count_chars(sent)


def test_seen_outputs_of_the_current_turn_are_omitted_only_after_old_turns_are_gone() -> None:
    history = [
        SYSTEM,
        *tool_turn(1, 100),
        user("now"),
        calls("a"),
        result("a", 3000),
        calls("b"),
        result("b", 3000),
    ]
    sent, report = project_context(history, 3400)
    assert report.dropped_turns == 1
    assert sent[-3].content == omitted_placeholder(3000), "seen by the model: omitted"
    assert sent[-1].content == "o" * 3000, "the latest batch is always kept"
    assert report.chars_after <= 3400


def test_the_latest_tool_batch_and_the_current_turn_are_kept_even_over_budget() -> None:
    current = [user("q" * 500), calls("a", "b"), result("a", 2000), result("b", 2000)]
    sent, report = project_context([SYSTEM, *tool_turn(1, 10), *current], 10)
    assert sent[-4:] == current
    assert report.chars_after > 10 and report.trimmed


def test_the_input_list_is_not_changed() -> None:
    history = [SYSTEM, *tool_turn(1, 5000), *tool_turn(2, 5000), user("now")]
    copy = list(history)
    project_context(history, 100)
    assert history == copy


def test_the_report_counts_what_was_done() -> None:
    history = [SYSTEM, *tool_turn(1, 5000), *tool_turn(2, 5000), user("now")]
    sent, report = project_context(history, 110)
    assert sent == [Message(role="system", content=f"{SYSTEM.content}\n\n{dropped_note(2)}"), user("now")]
    assert report.chars_before == count_chars(history)
    assert report.chars_after == count_chars(sent)
    assert report.dropped_turns == 2 and report.omitted_outputs == 0


# --- trimming, as properties --------------------------------------------------------------------


@dataclass
class History:
    messages: list[Message]
    current_start: int  # index of the current turn's user message
    latest_batch: list[Message]


@st.composite
def histories(draw: st.DrawFn) -> History:
    messages: list[Message] = [SYSTEM] if draw(st.booleans()) else []
    sizes = st.integers(0, 400)
    next_id = 0
    current_start = 0
    latest: list[Message] = []
    for _ in range(draw(st.integers(1, 5))):
        current_start = len(messages)
        messages.append(user("u" * draw(sizes)))
        latest = []
        for _ in range(draw(st.integers(0, 3))):
            ids = [f"c{next_id + i}" for i in range(draw(st.integers(1, 3)))]
            next_id += len(ids)
            messages.append(
                Message(
                    role="assistant",
                    content="a" * draw(st.integers(0, 50)),
                    tool_calls=[
                        ToolCallSpec(call_id=i, name="t", args={"p": "x" * draw(sizes)}) for i in ids
                    ],
                )
            )
            if draw(st.integers(0, 9)) == 0:
                messages.append(user("joined " + "j" * draw(sizes)))  # an input joined mid-step
            latest = [result(i, draw(sizes)) for i in ids]
            messages.extend(latest)
        if draw(st.booleans()):
            messages.append(say("r" * draw(sizes)))
    return History(messages, current_start, latest)


def pairs(messages: list[Message]) -> set[str]:
    return {m.tool_call_id or "" for m in messages if m.role == "tool"}


@settings(max_examples=300, deadline=None)
@given(histories(), st.integers(0, 6000))
def test_trimming_never_splits_a_tool_call_from_its_result(history: History, budget: int) -> None:
    sent, _ = project_context(history.messages, budget)
    called = {c.call_id for m in sent for c in m.tool_calls}
    answered = pairs(sent)
    assert called == answered
    for i, m in enumerate(sent):  # every result comes after its call
        if m.role == "tool":
            assert any(c.call_id == m.tool_call_id for earlier in sent[:i] for c in earlier.tool_calls)


@settings(max_examples=300, deadline=None)
@given(histories(), st.integers(0, 6000))
def test_trimming_respects_the_budget_whenever_the_most_trimmed_form_fits(
    history: History, budget: int
) -> None:
    most_trimmed, _ = project_context(history.messages, 0)
    sent, report = project_context(history.messages, budget)
    if count_chars(most_trimmed) <= budget:
        assert report.chars_after <= budget
    assert report.chars_after == count_chars(sent)
    assert report.chars_before == count_chars(history.messages)


@settings(max_examples=300, deadline=None)
@given(histories(), st.integers(0, 6000))
def test_trimming_always_keeps_the_current_turn_and_the_latest_tool_batch(
    history: History, budget: int
) -> None:
    sent, _ = project_context(history.messages, budget)
    current = history.messages[history.current_start :]
    tail = sent[len(sent) - len(current) :]
    assert [(m.role, m.tool_call_id) for m in tail] == [(m.role, m.tool_call_id) for m in current]
    for kept, original in zip(tail, current, strict=True):
        if original.role != "tool":
            assert kept == original
    for batch_message in history.latest_batch:
        assert batch_message in tail


@settings(max_examples=200, deadline=None)
@given(histories(), st.integers(0, 6000))
def test_trimming_leaves_its_input_unchanged_and_drops_only_the_oldest_turns(
    history: History, budget: int
) -> None:
    before = list(history.messages)
    sent, report = project_context(history.messages, budget)
    assert history.messages == before
    users = [m.content for m in history.messages if m.role == "user"]
    kept_users = [m.content for m in sent if m.role == "user"]
    assert kept_users == users[len(users) - len(kept_users) :]
    assert report.trimmed == (sent != history.messages)


# --- summaries ----------------------------------------------------------------------------------


def test_a_summary_message_is_a_system_message_with_the_prefix() -> None:
    message = summary_message("We fixed the bug.")
    assert message.role == "system" and message.content == f"{SUMMARY_PREFIX}\nWe fixed the bug."
    assert summary_message(message.content) == message
    assert summary_text(message) == "We fixed the bug."


def test_apply_summary_merges_the_latest_summary_into_the_leading_system_message() -> None:
    summary = summary_message("earlier work")
    history = [SYSTEM, *tool_turn(1, 10), summary, user("now")]
    sent = apply_summary(history)
    assert sent == [Message(role="system", content=f"{SYSTEM.content}\n\n{summary.content}"), user("now")]


def test_apply_summary_uses_only_the_latest_summary() -> None:
    history = [SYSTEM, summary_message("old"), user("a"), summary_message("new"), user("b")]
    sent = apply_summary(history)
    assert "new" in sent[0].content and "old" not in sent[0].content
    assert sent[1:] == [user("b")]


def test_apply_summary_without_a_summary_changes_nothing() -> None:
    history = [SYSTEM, user("a")]
    assert apply_summary(history) == history


def test_apply_summary_without_a_leading_system_message_starts_with_the_summary() -> None:
    summary = summary_message("s")
    assert apply_summary([user("a"), summary, user("b")]) == [summary, user("b")]


def test_model_view_applies_the_summary_before_trimming() -> None:
    history = [SYSTEM, user("x" * 10_000), summary_message("s"), user("now")]
    sent, report = model_view(history, 1000)
    assert not report.trimmed and len(sent) == 2


def test_compaction_input_for_auto_stops_before_the_current_turn() -> None:
    history = [SYSTEM, summary_message("prev"), *tool_turn(1, 10), *tool_turn(2, 10), user("now")]
    chunk = compaction_input(history, include_current=False)
    assert chunk.previous_summary == "prev"
    assert chunk.turns == 2 and chunk.messages == [*tool_turn(1, 10), *tool_turn(2, 10)]


def test_compaction_input_for_manual_compaction_takes_every_turn() -> None:
    history = [SYSTEM, *tool_turn(1, 10), user("last"), say("ok")]
    chunk = compaction_input(history, include_current=True)
    assert chunk.previous_summary is None and chunk.turns == 2 and chunk.messages == history[1:]


def test_compaction_input_with_nothing_to_compact_has_zero_turns() -> None:
    assert compaction_input([SYSTEM, user("only")], include_current=False).turns == 0
    assert compaction_input([SYSTEM, user("a"), summary_message("s")], include_current=True).turns == 0


def test_the_summary_request_holds_messages_tool_calls_results_and_the_previous_summary() -> None:
    history = [SYSTEM, user("please fix"), calls("c1"), result("c1", 20), say("fixed")]
    prompt, body = build_summary_request(history, "we started")
    assert prompt.role == "system" and body.role == "user"
    for heading in ("Goals", "Decisions", "File changes", "Command results", "Open items", "Key facts"):
        assert heading in prompt.content
    assert "language the user writes in" in prompt.content
    for piece in (
        "we started",
        "User: please fix",
        'Tool call read_file {"path":"c1"}',
        "Tool result (read_file): " + "o" * 20,
        "Assistant: fixed",
    ):
        assert piece in body.content
    assert SYSTEM.content not in body.content


def test_the_summary_request_cuts_each_entry_and_stays_within_200000_characters() -> None:
    history = [m for n in range(100) for m in (user(f"q{n} " + "x" * 10_000), say("y" * 10_000))]
    _, body = build_summary_request(history, "p" * 300_000)
    assert len(body.content) <= SUMMARY_INPUT_LIMIT
    assert "more chars]" in body.content
    assert "earlier entries left out" in body.content
    assert "q99 " in body.content and "q0 " not in body.content, "the oldest entries go first"
