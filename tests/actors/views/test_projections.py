"""Items and summaries projected from a session's events (seed 004: 订阅与条目, 摘要, 按会话树算的
字段, 完成未读). Event logs are written by hand and also folded by ``session_model.evolve``, so every
log here is one the session could really have."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from msgspec import UNSET

from sessionloop.actors import events as E
from sessionloop.actors.errors import NotFound
from sessionloop.actors.session.context import summary_message
from sessionloop.actors.session.state import SessionState, evolve, new_state
from sessionloop.actors.settings.texts import enc_hook
from sessionloop.actors.views.items import ItemsProjection, Push
from sessionloop.actors.views.summary import (
    SummaryRecord,
    decode_summary_record,
    encode_summary_record,
    summary_from_record,
    summary_node,
    summary_of,
    summary_record,
)
from sessionloop.actors.views.timeline import HISTORY_DEFAULT_LIMIT, HISTORY_MAX_LIMIT
from sessionloop.protocol.listing import compute_tree_fields
from sessionloop.protocol.schemas_items import (
    AgentMessageItem,
    NoticeItem,
    PlanItem,
    QueueItem,
    SessionItem,
    ToolCallItem,
    TurnItem,
    UserMessageItem,
)
from sessionloop.protocol.schemas_types import CommandDisplay, ItemAttachment

OWNER = E.Speaker(platform="console", user_id="owner", owner=True)


class Log:
    """A session's event log written by hand, with a clock that moves 10 ms per event."""

    def __init__(self, session_id: str = "s1", **created: Any) -> None:
        self.session_id = session_id
        self.now = 1_000
        self.events: list[E.Event | E.UnknownEvent] = []
        self.add(E.SessionCreated, session_id=session_id, **created)

    def add(self, cls: type[E.Event], **fields: Any) -> E.Event:
        self.now += 10
        event = cls(at=self.now, **fields)
        self.events.append(event)
        return event

    def accept(self, input_id: str, turn_id: str, text: str = "hello", **fields: Any) -> None:
        self.add(E.InputAccepted, input_id=input_id, turn_id=turn_id, text=text, **fields)

    def start(self, turn_id: str, *input_ids: str, source: str | None = None) -> None:
        self.add(E.TurnStarted, turn_id=turn_id, input_ids=list(input_ids), source=source)

    def turn(self, turn_id: str, text: str = "hello") -> None:
        self.accept(f"in-{turn_id}", turn_id, text, speaker=OWNER)
        self.start(turn_id, f"in-{turn_id}")

    def answer(
        self,
        turn_id: str,
        step_id: str,
        text: str = "",
        *,
        reasoning: str = "",
        calls: tuple[E.ToolCallSpec, ...] = (),
        usage: tuple[int, int] = (100, 20),
    ) -> None:
        self.add(E.LlmStarted, turn_id=turn_id, step_id=step_id)
        self.add(
            E.LlmCompleted, turn_id=turn_id, step_id=step_id, text=text, reasoning=reasoning,
            tool_calls=list(calls), usage=E.Usage(prompt_tokens=usage[0], completion_tokens=usage[1]),
            model="mock-1", provider="mock",
        )

    def run_tool(self, turn_id: str, call_id: str, args: Any = None, **fields: Any) -> None:
        self.add(E.ToolStarted, turn_id=turn_id, call_id=call_id, tool="exec", args=args, **fields)

    def finish(
        self, turn_id: str, call_id: str, output: Any = "ok", status: str = "completed", **fields: Any
    ) -> None:
        self.add(E.ToolFinished, turn_id=turn_id, call_id=call_id, status=status, output=output, **fields)

    def reply(self, turn_id: str, step_id: str, text: str = "done") -> None:
        self.answer(turn_id, step_id, text)
        self.add(E.TurnCompleted, turn_id=turn_id, outcome="replied", output_text=text)

    def chat(self, turn_id: str, question: str = "hello", answer: str = "done") -> None:
        """One whole turn: a user message and a reply (two archived messages)."""
        self.turn(turn_id, question)
        self.reply(turn_id, f"{turn_id}.s1", answer)

    def project(self) -> tuple[ItemsProjection, list[Push]]:
        projection = ItemsProjection(self.session_id)
        return projection, projection.apply_all(self.events)

    def state(self) -> SessionState:
        state = new_state(self.session_id)
        for event in self.events:
            evolve(state, event)
        return state

    def pushes_of_last(self) -> list[Push]:
        projection = ItemsProjection(self.session_id)
        projection.apply_all(self.events[:-1])
        return projection.apply(self.events[-1])


def call(call_id: str, name: str = "exec", args: Any = None) -> E.ToolCallSpec:
    return E.ToolCallSpec(call_id=call_id, name=name, args=args if args is not None else {"cmd": "ls"})


def ids(items: list[SessionItem]) -> list[str]:
    return [item.item_id for item in items]


def kinds(pushes: list[Push]) -> list[tuple[str, str, str]]:
    return [(method, type(item).__name__, item.item_id) for method, item in pushes]


def card(projection: ItemsProjection, call_id: str) -> ToolCallItem:
    item = projection.item(call_id)
    assert isinstance(item, ToolCallItem)
    return item


_wire = msgspec.json.Encoder(enc_hook=enc_hook(lambda: "en"))  # as the gateway's: text objects rendered
_item_decoder = msgspec.json.Decoder(SessionItem)


# --- the queue and user messages ------------------------------------------------------------------


def test_an_accepted_input_replaces_the_whole_queue_item() -> None:
    log = Log()
    log.accept("i1", "t1", "first", speaker=OWNER)
    image = E.AttachmentRef(name="a.png", kind="image", mime="image/png", size=3, sha256="x")
    log.accept("i2", "t2", "second", attachments=[image])
    projection, pushes = log.project()
    assert [m for m, _ in pushes] == ["item/completed", "item/completed"]
    queue = projection.queue_item()
    assert queue is not None and queue.item_id == "queue"
    assert [(e.text, e.attachments) for e in queue.entries] == [("first", 0), ("second", 1)]
    assert queue.entries[0].speaker is not None and queue.entries[0].speaker.owner
    assert projection.items() == []  # the queue is not on the timeline


def test_a_dropped_input_leaves_the_queue_and_an_empty_queue_is_no_queue() -> None:
    log = Log()
    log.accept("i1", "t1")
    log.add(E.InputDropped, input_id="i1", turn_id="t1", reason="stopAll")
    projection, pushes = log.project()
    method, last = pushes[-1]
    assert method == "item/completed" and isinstance(last, QueueItem) and last.entries == []
    assert projection.queue_item() is None


def test_a_turn_start_turns_its_inputs_into_opened_user_messages_then_starts_the_turn() -> None:
    log = Log()
    image = E.AttachmentRef(name="cat.png", kind="image", mime="image/png", size=10, sha256="abc")
    log.accept("i1", "t1", "look", speaker=OWNER, source="webui", attachments=[image])
    log.start("t1", "i1", source="webui")
    pushes = log.pushes_of_last()
    assert kinds(pushes) == [
        ("item/completed", "UserMessageItem", "i1"),
        ("item/started", "TurnItem", "t1"),
        ("item/completed", "QueueItem", "queue"),
    ]
    message = pushes[0][1]
    assert isinstance(message, UserMessageItem)
    assert (message.turn_id, message.text, message.entry) == ("t1", "look", "opened")
    # an internal blob reference: the gateway swaps it for a signed handle before sending
    assert message.attachments == [ItemAttachment(kind="image", name="cat.png", src="blob:abc")]
    assert message.speaker is not None and message.speaker.source == "webui" and message.speaker.owner
    assert message.at == log.events[1].at  # when it was said
    turn = pushes[1][1]
    assert isinstance(turn, TurnItem) and turn.source == "webui" and turn.outcome is None


# --- model answers --------------------------------------------------------------------------------


def test_a_model_answer_gives_reasoning_then_the_message_then_generating_calls_then_usage() -> None:
    log = Log()
    log.turn("t1")
    log.answer("t1", "st1", "Let me look.", reasoning="thinking...", calls=(call("c1"), call("c2")))
    pushes = log.pushes_of_last()
    assert kinds(pushes) == [
        ("item/completed", "ReasoningItem", "st1.thinking"),
        ("item/completed", "AgentMessageItem", "st1"),
        ("item/started", "ToolCallItem", "c1"),
        ("item/started", "ToolCallItem", "c2"),
        ("item/completed", "UsageItem", "usage"),
    ]
    message = pushes[1][1]
    assert isinstance(message, AgentMessageItem) and message.turn_id == "t1"
    assert message.model is not None
    assert (message.model.provider, message.model.model) == ("mock", "mock-1")
    assert (message.model.prompt_tokens, message.model.completion_tokens) == (100, 20)
    generating = pushes[2][1]
    assert isinstance(generating, ToolCallItem)
    assert (generating.status, generating.tool, generating.args) == ("generating", "exec", UNSET)


def test_an_agent_message_has_the_latest_prompt_and_the_turn_s_summed_completion_tokens() -> None:
    log = Log()
    log.turn("t1")
    log.answer("t1", "st1", calls=(call("c1"),), usage=(100, 20))
    log.run_tool("t1", "c1")
    log.finish("t1", "c1")
    log.answer("t1", "st2", "All done.", usage=(180, 30))
    projection, _ = log.project()
    message = projection.item("st2")
    assert isinstance(message, AgentMessageItem) and message.model is not None
    assert (message.model.prompt_tokens, message.model.completion_tokens) == (180, 50)


def test_a_model_answer_without_text_or_tokens_gives_no_message_and_no_usage() -> None:
    log = Log()
    log.turn("t1")
    log.answer("t1", "st1", calls=(call("c1"),), usage=(0, 0))
    pushes = log.pushes_of_last()
    assert kinds(pushes) == [("item/started", "ToolCallItem", "c1")]


def test_a_provider_that_reports_no_tokens_gives_a_message_without_token_counts() -> None:
    log = Log()
    log.turn("t1")
    log.answer("t1", "st1", "hi", usage=(0, 0))
    projection, _ = log.project()
    message = projection.item("st1")
    assert isinstance(message, AgentMessageItem) and message.model is not None
    assert message.model.prompt_tokens is None and message.model.completion_tokens is None


def test_usage_is_replaced_whole_by_each_model_call_and_uses_the_context_window() -> None:
    log = Log()
    log.turn("t1")
    log.answer("t1", "st1", calls=(call("c1"),), usage=(100, 20))
    log.run_tool("t1", "c1")
    log.finish("t1", "c1")
    log.answer("t1", "st2", "ok", usage=(300, 100))
    projection = ItemsProjection("s1", context_window=1000)
    projection.apply_all(log.events)
    usage = projection.usage_item()
    assert usage is not None and usage.item_id == "usage"
    assert usage.tokens == 400 and usage.usage_ratio == pytest.approx(0.4) and usage.context_window == 1000
    assert [(p.label, p.tokens) for p in usage.parts] == [("Context", 300), ("Reply", 100)]
    assert "usage" not in ids(projection.items())


# --- tool calls -----------------------------------------------------------------------------------


def test_a_tool_call_goes_from_generating_to_running_to_completed_in_place() -> None:
    log = Log()
    log.turn("t1")
    log.answer("t1", "st1", "Listing.", calls=(call("c1"),))
    display = E.ToolDisplay(kind="command", command="ls -la", cwd="/w")
    log.run_tool("t1", "c1", {"cmd": "ls -la"}, display=display)
    log.finish("t1", "c1", {"stdout": "a\nb", "exitCode": 0}, exit_code=0, duration_ms=12)
    projection = ItemsProjection("s1")
    statuses: list[tuple[str, str]] = []
    for event in log.events:
        pushes = projection.apply(event)
        statuses += [(m, item.status) for m, item in pushes if isinstance(item, ToolCallItem)]
    assert statuses == [
        ("item/started", "generating"), ("item/started", "running"), ("item/completed", "completed"),
    ]
    done = card(projection, "c1")
    assert done.args == {"cmd": "ls -la"} and done.result == {"stdout": "a\nb", "exitCode": 0}
    assert done.display == CommandDisplay(command="ls -la", cwd="/w", exit_code=0)
    assert done.duration_ms == 12
    assert ids(projection.items()) == ["t1", "in-t1", "st1", "c1"]  # replaced in place


def test_the_running_card_carries_args_and_display_but_no_exit_code_yet() -> None:
    log = Log()
    log.turn("t1")
    log.answer("t1", "st1", calls=(call("c1"),))
    log.run_tool("t1", "c1", {"cmd": "make"}, display=E.ToolDisplay(kind="command", command="make"))
    (method, running), = log.pushes_of_last()
    assert isinstance(running, ToolCallItem) and method == "item/started"
    assert running.status == "running" and running.args == {"cmd": "make"}
    assert running.display == CommandDisplay(command="make")


def test_a_display_without_a_command_string_is_no_display() -> None:
    log = Log()
    log.turn("t1")
    log.answer("t1", "st1", calls=(call("c1"),))
    log.run_tool("t1", "c1", {}, display=E.ToolDisplay(kind="command"))
    projection, _ = log.project()
    assert card(projection, "c1").display is None


def test_a_result_with_an_error_key_makes_the_call_failed() -> None:
    log = Log()
    log.turn("t1")
    log.answer("t1", "st1", calls=(call("c1"),))
    log.run_tool("t1", "c1")
    log.finish("t1", "c1", {"error": "no such file"})
    projection, _ = log.project()
    assert card(projection, "c1").status == "failed"


def test_a_nonzero_exit_code_makes_the_call_failed_and_shows_in_the_display() -> None:
    log = Log()
    log.turn("t1")
    log.answer("t1", "st1", calls=(call("c1"),))
    log.run_tool("t1", "c1", display=E.ToolDisplay(kind="command", command="false"))
    log.finish("t1", "c1", {"exitCode": 1}, exit_code=1)
    projection, _ = log.project()
    failed = card(projection, "c1")
    assert failed.status == "failed" and failed.display == CommandDisplay(command="false", exit_code=1)


def test_a_call_moved_to_the_background_completes_with_its_task_id() -> None:
    log = Log()
    log.turn("t1")
    log.answer("t1", "st1", calls=(call("c1"),))
    log.run_tool("t1", "c1")
    log.finish("t1", "c1", "moved to the background as task k1", task_id="k1")
    projection, _ = log.project()
    moved = card(projection, "c1")
    assert (moved.status, moved.task_id) == ("completed", "k1")


def test_a_denied_tool_finish_keeps_its_status_and_settlement() -> None:
    settlement = E.Settlement(state="denied", source="absent", at=5)
    log = Log()
    log.turn("t1")
    log.answer("t1", "st1", calls=(call("c1"),))
    log.finish("t1", "c1", "denied: nobody present", status="denied", approval_id="a1", settlement=settlement)
    projection, _ = log.project()
    denied = card(projection, "c1")
    assert denied.status == "denied" and denied.approval_id == "a1"
    assert denied.settlement is not None and denied.settlement.source == "absent"


def test_an_approval_request_pushes_the_card_again_with_its_approval_id() -> None:
    log = Log()
    log.turn("t1")
    log.answer("t1", "st1", calls=(call("c1"),))
    log.add(E.ToolApprovalRequested, turn_id="t1", call_id="c1", approval_id="a1")
    (method, item), = log.pushes_of_last()
    assert method == "item/started" and isinstance(item, ToolCallItem)
    assert item.approval_id == "a1" and item.status == "generating"


def test_a_refused_approval_completes_the_card_as_denied_with_the_settlement() -> None:
    by = E.Speaker(platform="console", user_id="owner", owner=True)
    log = Log()
    log.turn("t1")
    log.answer("t1", "st1", calls=(call("c1"),))
    log.add(E.ToolApprovalRequested, turn_id="t1", call_id="c1", approval_id="a1")
    log.add(E.ToolApprovalSettled, turn_id="t1", call_id="c1", approval_id="a1",
            settlement=E.Settlement(state="denied", source="answer", at=7, by=by))
    (method, item), = log.pushes_of_last()
    assert method == "item/completed" and isinstance(item, ToolCallItem) and item.status == "denied"
    assert item.settlement is not None and item.settlement.by is not None and item.settlement.by.owner


def test_an_approved_call_is_started_again_with_its_settlement_then_runs() -> None:
    log = Log()
    log.turn("t1")
    log.answer("t1", "st1", calls=(call("c1"),))
    log.add(E.ToolApprovalRequested, turn_id="t1", call_id="c1", approval_id="a1")
    log.add(E.ToolApprovalSettled, turn_id="t1", call_id="c1", approval_id="a1",
            settlement=E.Settlement(state="approved", source="answer", at=7))
    (method, item), = log.pushes_of_last()
    assert method == "item/started" and isinstance(item, ToolCallItem) and item.settlement is not None
    log.run_tool("t1", "c1")
    log.finish("t1", "c1")
    projection, _ = log.project()
    done = card(projection, "c1")
    assert done.status == "completed" and done.approval_id == "a1" and done.settlement is not None


# --- notices, plan, compression -------------------------------------------------------------------


def test_a_notice_becomes_a_notice_item_with_its_id_and_facts() -> None:
    log = Log()
    log.add(E.NoticePosted, notice_id="n1", topic="background-task", text="task k1 ended",
            facts={"taskId": "k1"})
    (method, item), = log.pushes_of_last()
    assert method == "item/completed" and isinstance(item, NoticeItem)
    assert (item.item_id, item.notice_id, item.topic) == ("n1", "n1", "background-task")
    assert item.text == "task k1 ended"
    assert item.facts == {"taskId": "k1"} and item.can_continue is None and item.turn_id is None


def test_a_tool_limit_notice_says_the_turn_can_continue() -> None:
    log = Log()
    log.add(E.NoticePosted, notice_id="n1", topic="tool-limit", text="limit", can_continue=True, turn_id="t9")
    projection, _ = log.project()
    notice = projection.item("n1")
    assert isinstance(notice, NoticeItem) and notice.can_continue is True and notice.facts is UNSET


def test_a_notice_that_opens_a_turn_is_entered_as_opened_and_is_in_flight() -> None:
    log = Log()
    log.add(E.NoticePosted, notice_id="n1", topic="poke", text="poked", turn_id="t1", starts_turn=True)
    log.start("t1")
    projection, _ = log.project()
    notice = projection.item("n1")
    assert isinstance(notice, NoticeItem) and notice.entry == "opened"
    assert projection.history_page()[0] == []
    assert ids(projection.snapshot_items()[0]) == ["n1", "t1"]


def test_a_plan_update_replaces_the_plan_and_clearing_it_pushes_an_empty_plan() -> None:
    log = Log()
    log.add(E.PlanUpdated, entries=[E.PlanEntry(text="a"), E.PlanEntry(text="b", status="completed")])
    projection, _ = log.project()
    plan = projection.plan_item()
    assert plan is not None and plan.item_id == "plan"
    assert [(e.text, e.status) for e in plan.entries] == [("a", "pending"), ("b", "completed")]
    log.add(E.PlanCleared)
    (method, cleared), = log.pushes_of_last()
    assert method == "item/completed" and isinstance(cleared, PlanItem) and cleared.entries == []
    projection, _ = log.project()
    assert projection.plan_item() is None and projection.items() == []


def test_a_compaction_posts_a_compress_notice() -> None:
    log = Log()
    log.chat("t1")
    log.add(E.ContextCompacted, summary="they talked", turns=1, chars=40)
    (method, item), = log.pushes_of_last()
    assert method == "item/completed" and isinstance(item, NoticeItem)
    assert item.topic == "compress" and "1" in item.text
    assert item.facts == {"turns": 1, "chars": 40, "auto": False}


def test_a_failed_compaction_posts_a_compress_notice_with_the_error() -> None:
    log = Log()
    log.add(E.ContextCompactFailed, error="no summary model")
    log.add(E.ContextCompactFailed, error="again")
    projection, _ = log.project()
    notices = projection.items()
    assert [n.topic for n in notices] == ["compress", "compress"]  # type: ignore[union-attr]
    assert len(set(ids(notices))) == 2
    assert "no summary model" in notices[0].text  # type: ignore[union-attr]


# --- turn ends ------------------------------------------------------------------------------------


def test_a_completed_turn_completes_its_turn_item_with_the_outcome() -> None:
    log = Log()
    log.turn("t1", "hi")
    log.reply("t1", "st1", "hello!")
    (method, turn), = log.pushes_of_last()
    assert method == "item/completed" and isinstance(turn, TurnItem)
    assert turn.outcome == "replied" and turn.ended_at == log.now and turn.at < log.now


def test_the_turn_item_moves_after_the_last_item_of_its_turn_when_it_ends() -> None:
    log = Log()
    log.chat("t1")
    projection, _ = log.project()
    assert ids(projection.items()) == ["in-t1", "t1.s1", "t1"]


@pytest.mark.parametrize(
    ("end", "outcome"),
    [(E.TurnFailed, "error"), (E.TurnAborted, "aborted"), (E.TurnLimitReached, "silent")],
)
def test_every_turn_end_gives_the_turn_item_its_outcome(end: type[E.Event], outcome: str) -> None:
    log = Log()
    log.turn("t1")
    extra: dict[str, Any] = {"code": "model", "reason": "boom"} if end is E.TurnFailed else {}
    if end is E.TurnLimitReached:
        extra = {"max_steps": 3}
    log.add(end, turn_id="t1", **extra)
    projection, _ = log.project()
    turn = projection.item("t1")
    assert isinstance(turn, TurnItem) and turn.outcome == outcome


def test_an_aborted_turn_aborts_every_unfinished_call_before_completing_the_turn() -> None:
    log = Log()
    log.turn("t1")
    log.answer("t1", "st1", calls=(call("c1"), call("c2"), call("c3")))
    log.run_tool("t1", "c1")
    log.finish("t1", "c1")
    log.run_tool("t1", "c2")
    log.add(E.TurnAborted, turn_id="t1", reason="stopped")
    pushes = log.pushes_of_last()
    assert [(m, i.item_id, getattr(i, "status", None)) for m, i in pushes] == [
        ("item/completed", "c2", "aborted"),
        ("item/completed", "c3", "aborted"),
        ("item/completed", "t1", None),
    ]
    projection, _ = log.project()
    assert card(projection, "c1").status == "completed"


def test_a_tool_result_after_the_stop_does_not_change_the_aborted_card() -> None:
    log = Log()
    log.turn("t1")
    log.answer("t1", "st1", calls=(call("c1"),))
    log.run_tool("t1", "c1")
    log.add(E.TurnAborted, turn_id="t1")
    log.finish("t1", "c1", "finished anyway")
    assert log.pushes_of_last() == []
    projection, _ = log.project()
    assert card(projection, "c1").status == "aborted" and card(projection, "c1").result is UNSET


def test_at_the_step_limit_generated_calls_fail_as_not_executed_with_their_args() -> None:
    log = Log()
    log.turn("t1")
    log.answer("t1", "st1", calls=(call("c1", args={"cmd": "rm x"}),))
    log.add(E.TurnLimitReached, turn_id="t1", max_steps=1)
    projection, _ = log.project()
    limited = card(projection, "c1")
    assert limited.status == "failed" and limited.not_executed
    assert limited.result is UNSET and limited.args == {"cmd": "rm x"}


def test_a_failed_turn_fails_generated_calls_and_aborts_the_running_one() -> None:
    log = Log()
    log.turn("t1")
    log.answer("t1", "st1", calls=(call("c1"), call("c2")))
    log.run_tool("t1", "c1")
    log.add(E.TurnFailed, turn_id="t1", code="tool", reason="crashed")
    projection, _ = log.project()
    assert card(projection, "c1").status == "aborted" and not card(projection, "c1").not_executed
    assert card(projection, "c2").status == "failed" and card(projection, "c2").not_executed


def test_in_a_room_words_said_before_a_tool_call_are_marked_undelivered() -> None:
    log = Log(kind="room", platform="onebot")
    log.turn("t1")
    log.answer("t1", "st1", "let me check", calls=(call("c1"),))
    log.run_tool("t1", "c1")
    log.finish("t1", "c1")
    log.reply("t1", "st2", "here it is")
    projection, _ = log.project()
    before, final = projection.item("st1"), projection.item("st2")
    assert isinstance(before, AgentMessageItem) and before.undelivered is not None
    assert isinstance(final, AgentMessageItem) and final.undelivered is None


def test_in_a_room_the_last_words_of_a_turn_without_a_reply_are_marked_undelivered() -> None:
    log = Log(kind="room", platform="onebot")
    log.turn("t1")
    log.answer("t1", "st1", "hmm")
    log.add(E.TurnCompleted, turn_id="t1", outcome="silent")
    pushes = log.pushes_of_last()
    assert kinds(pushes) == [
        ("item/completed", "AgentMessageItem", "st1"), ("item/completed", "TurnItem", "t1"),
    ]
    assert pushes[0][1].undelivered is not None  # type: ignore[union-attr]


def test_outside_rooms_nothing_is_marked_undelivered() -> None:
    log = Log()
    log.turn("t1")
    log.answer("t1", "st1", "let me check", calls=(call("c1"),))
    log.add(E.TurnAborted, turn_id="t1")
    projection, _ = log.project()
    assert projection.item("st1").undelivered is None  # type: ignore[union-attr]


# --- fork, rewind, deletion, odd events -----------------------------------------------------------


def test_a_fork_imports_its_messages_as_archived_items() -> None:
    messages = [
        E.Message(role="system", content="You are helpful."),
        summary_message("earlier they met"),
        E.Message(role="user", content="list files", turn_id="old1"),
        E.Message(role="assistant", content="", turn_id="old1",
                  tool_calls=[E.ToolCallSpec(call_id="x1", name="exec", args={"cmd": "ls"}),
                              E.ToolCallSpec(call_id="x2", name="exec", args={"cmd": "pwd"})]),
        E.Message(role="tool", content='{"stdout": "a"}', tool_call_id="x1", turn_id="old1"),
        E.Message(role="assistant", content="one file", turn_id="old1"),
    ]
    log = Log("s2", forked_from="s1")
    log.add(E.MessagesImported, source_session_id="s1", messages=messages)
    projection, pushes = log.project()
    assert all(m == "item/completed" for m, _ in pushes)
    items = projection.items()
    assert [type(i).__name__ for i in items] == [
        "NoticeItem", "UserMessageItem", "ToolCallItem", "ToolCallItem", "AgentMessageItem",
    ]
    marker = items[0]
    assert isinstance(marker, NoticeItem) and marker.topic == "event-marker"
    assert marker.facts == {"summary": "earlier they met"}
    assert card(projection, "x1").status == "completed" and card(projection, "x1").result == {"stdout": "a"}
    assert card(projection, "x2").status == "aborted"  # no result in the copied history
    assert projection.history_page()[0] == items


def test_rewinding_with_the_chat_removes_the_items_of_that_turn_and_later_ones() -> None:
    log = Log()
    log.chat("t1")
    log.add(E.NoticePosted, notice_id="n1", topic="event-marker", text="between")
    log.chat("t2")
    log.chat("t3")
    log.add(E.TurnRewound, turn_id="t2", scope="code-and-chat", chat_deleted=True)
    assert log.pushes_of_last() == []  # the caller pushes session/resync
    projection, _ = log.project()
    assert ids(projection.items()) == ["in-t1", "t1.s1", "t1", "n1"]
    log.chat("t4")
    projection, _ = log.project()
    assert ids(projection.items())[-3:] == ["in-t4", "t4.s1", "t4"]


def test_rewinding_only_the_code_keeps_every_item() -> None:
    log = Log()
    log.chat("t1")
    log.add(E.TurnRewound, turn_id="t1", scope="code", restored=["a.py"])
    projection, _ = log.project()
    assert ids(projection.items()) == ["in-t1", "t1.s1", "t1"]


def test_a_deleted_session_has_no_items_left() -> None:
    log = Log()
    log.chat("t1")
    log.add(E.PlanUpdated, entries=[E.PlanEntry(text="a")])
    log.add(E.SessionDeleted)
    projection, _ = log.project()
    assert projection.items() == [] and projection.plan_item() is None and projection.usage_item() is None


def test_events_without_items_push_nothing() -> None:
    log = Log()
    projection = ItemsProjection("s1")
    quiet: list[E.Event | E.UnknownEvent] = [
        log.events[0],
        E.UnknownEvent(type="from.the.future", raw=b"\x80"),
        E.SessionRenamed(title="x"),
        E.CheckpointRecorded(turn_id="t1", call_id="c1", path="a", existed=False),
        E.ContextTrimmed(turn_id="t1", step_id="s", chars_before=2, chars_after=1),
        E.LlmFailed(turn_id="t1", step_id="s", error="timeout"),
    ]
    assert [projection.apply(event) for event in quiet] == [[]] * len(quiet)


def test_a_result_for_a_call_never_seen_still_gets_a_card() -> None:
    projection = ItemsProjection("s1")
    finished = E.ToolFinished(at=5, turn_id="t0", call_id="c0", status="aborted", repair="crash")
    pushes = projection.apply(finished)
    assert kinds(pushes) == [("item/completed", "ToolCallItem", "c0")]
    assert projection.history_page()[0] == [pushes[0][1]]


def test_replaying_the_same_log_gives_the_same_pushes_and_items() -> None:
    log = Log()
    log.chat("t1")
    log.turn("t2")
    log.answer("t2", "st", "x", reasoning="r", calls=(call("c1"),))
    log.add(E.ContextCompactFailed, error="e")
    first, second = log.project(), log.project()
    assert first[1] == second[1] and first[0].items() == second[0].items()


def test_every_pushed_item_is_valid_on_the_wire() -> None:
    log = Log(kind="room")
    odd = E.AttachmentRef(name="f", kind="weird", mime="x", size=1, sha256="s")
    log.accept("i1", "t1", speaker=OWNER, attachments=[odd])
    log.start("t1", "i1")
    log.answer("t1", "st1", "x", reasoning="r", calls=(call("c1"),))
    log.add(E.ToolApprovalRequested, turn_id="t1", call_id="c1", approval_id="a1")
    log.add(E.ToolApprovalSettled, turn_id="t1", call_id="c1", approval_id="a1",
            settlement=E.Settlement(state="approved", source="answer", at=3, by=OWNER))
    log.run_tool("t1", "c1", {"path": "a"}, display=E.ToolDisplay(kind="file-change", path="a", added="x"))
    log.finish("t1", "c1", {"ok": True})
    log.add(E.NoticePosted, notice_id="n1", topic="t", facts={"a": 1}, turn_id="t1")
    log.add(E.PlanUpdated, entries=[E.PlanEntry(text="a")])
    log.add(E.TurnFailed, turn_id="t1", code="x")
    _, pushes = log.project()
    for _, item in pushes:
        assert _item_decoder.decode(_wire.encode(item)) == item


# --- history pages --------------------------------------------------------------------------------


def messages_in(items: list[SessionItem]) -> int:
    return sum(isinstance(i, (UserMessageItem, AgentMessageItem, NoticeItem)) for i in items)


def chats(n: int) -> Log:
    log = Log()
    for i in range(1, n + 1):
        log.chat(f"t{i}", f"q{i}", f"a{i}")
    return log


def test_history_pages_count_messages_and_chain_by_cursor() -> None:
    projection, _ = chats(5).project()  # 10 messages, 15 items
    page, before = projection.history_page(limit=4)
    assert ids(page) == ["in-t4", "t4.s1", "t4", "in-t5", "t5.s1", "t5"]
    assert before == "in-t4"
    page, before = projection.history_page(before, limit=4)
    assert ids(page) == ["in-t2", "t2.s1", "t2", "in-t3", "t3.s1", "t3"]
    page, before = projection.history_page(before, limit=4)
    assert ids(page) == ["in-t1", "t1.s1", "t1"] and before is None


def test_history_limit_defaults_to_100_and_is_capped_at_200() -> None:
    projection, _ = chats(120).project()  # 240 messages
    default_page, _ = projection.history_page()
    assert messages_in(default_page) == HISTORY_DEFAULT_LIMIT
    big_page, before = projection.history_page(limit=10_000)
    assert messages_in(big_page) == HISTORY_MAX_LIMIT
    assert before is not None


def test_a_history_page_never_splits_a_turn_s_tool_call_group() -> None:
    log = Log()
    log.chat("t1")
    log.turn("t2", "fix it")
    log.answer("t2", "s1", "looking", calls=(call("c1"),))
    log.run_tool("t2", "c1")
    log.finish("t2", "c1")
    log.answer("t2", "s2", "patching", calls=(call("c2"),))
    log.run_tool("t2", "c2")
    log.finish("t2", "c2")
    log.reply("t2", "s3", "fixed")
    projection, _ = log.project()
    # 2 messages would start the page at "patching", between c1 and c2: it grows back instead.
    page, before = projection.history_page(limit=2)
    assert ids(page) == ["s1", "c1", "s2", "c2", "s3", "t2"]
    assert before == "s1"
    older, before = projection.history_page(before, limit=2)
    assert ids(older) == ["t1.s1", "t1", "in-t2"]
    assert projection.history_page(before, limit=2) == ([projection.item("in-t1")], None)


def test_the_reasoning_of_a_message_stays_on_its_page() -> None:
    log = Log()
    log.turn("t1", "q")
    log.answer("t1", "s1", "a", reasoning="hmm")
    log.add(E.TurnCompleted, turn_id="t1")
    projection, _ = log.project()
    page, before = projection.history_page(limit=1)
    assert ids(page) == ["s1.thinking", "s1", "t1"] and before == "s1.thinking"


def test_history_leaves_out_the_turn_in_flight() -> None:
    log = chats(1)
    log.turn("t2", "still going")
    log.answer("t2", "s", "partial", calls=(call("c1"),))
    projection, _ = log.project()
    page, before = projection.history_page()
    assert ids(page) == ["in-t1", "t1.s1", "t1"] and before is None


def test_a_cursor_removed_by_a_rewind_is_not_found() -> None:
    log = chats(3)
    projection, _ = log.project()
    _, before = projection.history_page(limit=2)
    assert before == "in-t3"
    projection.apply(E.TurnRewound(at=9_999, turn_id="t3", scope="code-and-chat", chat_deleted=True))
    with pytest.raises(NotFound):
        projection.history_page(before)


def test_an_unknown_or_in_flight_cursor_is_not_found() -> None:
    log = chats(1)
    log.turn("t2")
    projection, _ = log.project()
    with pytest.raises(NotFound):
        projection.history_page("nonsense")
    with pytest.raises(NotFound):
        projection.history_page("in-t2")


def test_an_empty_session_has_an_empty_history_and_snapshot() -> None:
    projection, _ = Log().project()
    assert projection.history_page() == ([], None)
    assert projection.snapshot_items() == ([], None)


# --- snapshots ------------------------------------------------------------------------------------


def test_a_snapshot_is_the_newest_page_plus_the_turn_in_flight() -> None:
    log = chats(3)
    log.turn("t4", "now")
    log.answer("t4", "s", "working", calls=(call("c1"),))
    log.run_tool("t4", "c1")
    projection, _ = log.project()
    items, before = projection.snapshot_items(limit=2, singletons=False)
    assert ids(items) == ["in-t3", "t3.s1", "t3", "t4", "in-t4", "s", "c1"]
    assert before == "in-t3"
    assert ids(projection.history_page(before, limit=2)[0]) == ["in-t2", "t2.s1", "t2"]


def test_a_notice_posted_during_a_turn_sits_between_its_items_in_the_snapshot() -> None:
    log = chats(1)
    log.turn("t2")
    log.answer("t2", "s", "a", calls=(call("c1"),))
    log.add(E.NoticePosted, notice_id="n1", topic="event-marker", text="someone joined")
    log.run_tool("t2", "c1")
    projection, _ = log.project()
    items, _ = projection.snapshot_items(singletons=False)
    assert ids(items) == ["in-t1", "t1.s1", "t1", "t2", "in-t2", "s", "c1", "n1"]
    assert ids(projection.history_page()[0]) == ["in-t1", "t1.s1", "t1", "n1"]


def test_a_turn_in_flight_older_than_the_page_is_still_whole_in_the_snapshot() -> None:
    log = chats(1)
    log.turn("t2", "long job")
    for n in range(3):
        log.add(E.NoticePosted, notice_id=f"n{n}", topic="event-marker", text=str(n))
    projection, _ = log.project()
    items, before = projection.snapshot_items(limit=2, singletons=False)
    assert ids(items) == ["t2", "in-t2", "n1", "n2"]
    assert before == "n1"


def test_a_snapshot_ends_with_the_plan_the_usage_and_a_non_empty_queue() -> None:
    log = chats(1)
    log.add(E.PlanUpdated, entries=[E.PlanEntry(text="x")])
    log.accept("i9", "t9", "later")
    projection, _ = log.project()
    items, _ = projection.snapshot_items()
    assert ids(items)[-3:] == ["plan", "usage", "queue"]
    log.start("t9", "i9")
    projection, _ = log.project()
    assert "queue" not in ids(projection.snapshot_items()[0])


# --- summaries ------------------------------------------------------------------------------------


def test_a_new_session_s_summary_has_the_default_title_and_no_tokens() -> None:
    log = Log()
    summary = summary_of(log.state(), None)
    assert summary.id == "s1" and summary.title == "New session"
    assert (summary.kind, summary.section) == ("owner", "owner")
    assert summary.tokens is None and summary.last_turn is None and summary.reason is None
    assert not (summary.running or summary.error or summary.unread or summary.archived or summary.attention)
    assert summary.created_at == log.events[0].at and summary.child_count == 0


def test_the_title_falls_back_to_the_name_and_a_rename_wins() -> None:
    log = Log(name="planning")
    assert summary_of(log.state(), None).title == "planning"
    log.add(E.SessionRenamed, title="Q3 plan")
    assert summary_of(log.state(), None).title == "Q3 plan"


def test_a_room_is_in_the_rooms_section_with_its_origin_and_never_unread() -> None:
    log = Log(kind="room", platform="onebot", instance="onebot-1", account="42",
              chat=E.ChatInfo(type="group", multi_party=True),
              place=E.PlaceRef(key="onebot:42:group:7", kind="window", name="Friends"))
    log.chat("t1")
    summary = summary_of(log.state(), None)
    assert (summary.kind, summary.section) == ("room", "rooms")
    assert (summary.platform, summary.instance, summary.account) == ("onebot", "onebot-1", "42")
    assert summary.chat is not None and summary.chat.multi_party and summary.chat.type == "group"
    assert summary.place is not None and summary.place.name == "Friends" and summary.place.kind == "window"
    assert summary.last_reply_at is not None and not summary.unread


def test_a_reply_after_mark_seen_is_unread_until_seen_again() -> None:
    log = Log()
    log.chat("t1")
    assert summary_of(log.state(), None).unread
    log.add(E.SessionSeen)
    assert not summary_of(log.state(), None).unread
    log.chat("t2")
    summary = summary_of(log.state(), None)
    assert summary.unread and summary.last_reply_at == log.now
    assert summary.last_turn is not None and summary.last_turn.outcome == "replied"


def test_a_running_turn_makes_the_summary_running() -> None:
    log = Log()
    log.turn("t1")
    assert summary_of(log.state(), None).running
    log.reply("t1", "s")
    assert not summary_of(log.state(), None).running


def test_a_failed_last_turn_gives_error_and_its_reason() -> None:
    log = Log()
    log.turn("t1")
    log.add(E.TurnFailed, turn_id="t1", code="model", reason="the model is unreachable")
    summary = summary_of(log.state(), None)
    assert summary.error and summary.reason == "the model is unreachable"
    assert summary.last_turn is not None and summary.last_turn.outcome == "error"
    assert summary.last_turn.ended_at == log.now


def test_an_error_without_a_reason_has_no_reason_and_a_later_reply_clears_the_error() -> None:
    log = Log()
    log.turn("t1")
    log.add(E.TurnFailed, turn_id="t1", code="model")
    summary = summary_of(log.state(), None)
    assert summary.error and summary.reason is None
    log.chat("t2")
    summary = summary_of(log.state(), None)
    assert not summary.error and summary.reason is None


def test_a_turn_stopped_at_the_limit_ends_silent_and_an_aborted_one_aborted() -> None:
    log = Log()
    log.turn("t1")
    log.add(E.TurnLimitReached, turn_id="t1", max_steps=2)
    assert summary_of(log.state(), None).last_turn.outcome == "silent"  # type: ignore[union-attr]
    log.turn("t2")
    log.add(E.TurnAborted, turn_id="t2")
    summary = summary_of(log.state(), None)
    assert summary.last_turn is not None and summary.last_turn.outcome == "aborted" and not summary.error


def test_tokens_are_the_session_s_own_model_calls() -> None:
    log = Log()
    log.turn("t1")
    log.answer("t1", "a", calls=(call("c1"),), usage=(100, 20))
    log.run_tool("t1", "c1")
    log.finish("t1", "c1")
    log.reply("t1", "b")  # another 100 / 20
    tokens = summary_of(log.state(), None).tokens
    assert tokens is not None and (tokens.input, tokens.output) == (200, 40)


def test_a_model_call_that_reported_no_tokens_still_counts_as_accounted() -> None:
    log = Log()
    log.turn("t1")
    log.answer("t1", "a", "hi", usage=(0, 0))
    tokens = summary_of(log.state(), None).tokens
    assert tokens is not None and (tokens.input, tokens.output) == (0, 0)


def test_archiving_shows_in_the_summary() -> None:
    log = Log()
    log.add(E.SessionArchived)
    assert summary_of(log.state(), None).archived
    log.add(E.SessionUnarchived)
    assert not summary_of(log.state(), None).archived


def test_tree_fields_give_a_task_its_root_s_section_and_the_subtree_totals() -> None:
    root = Log("room1", kind="room", platform="onebot")
    child = Log("task1", kind="task", parent_id="room1", root_id="room1")
    child.turn("t1")
    child.answer("t1", "s", "x", usage=(10, 5))
    nodes = [summary_node(root.state()), summary_node(child.state(), attention=True, background=1)]
    tree = compute_tree_fields(nodes)
    root_summary = summary_of(root.state(), tree["room1"])
    child_summary = summary_of(child.state(), tree["task1"], attention=True, background=1)
    assert child_summary.section == "rooms" and summary_of(child.state(), None).section == "owner"
    assert child_summary.ancestors is not None and [a.id for a in child_summary.ancestors] == ["room1"]
    assert root_summary.child_count == 1 and root_summary.attention
    assert root_summary.background == 1  # one child with a turn running (or a task): counted once
    assert root_summary.tokens is not None
    assert (root_summary.tokens.input, root_summary.tokens.output) == (10, 5)
    assert child_summary.running and child_summary.parent_id == "room1"


def test_summary_node_says_what_the_session_knows_about_itself() -> None:
    log = Log("s1", kind="task", parent_id="p", name="sub")
    log.turn("t1")
    node = summary_node(log.state(), attention=True, background=2)
    assert (node.id, node.title, node.parent_id, node.kind) == ("s1", "sub", "p", "task")
    assert node.attention and node.background == 2 and node.running and node.tokens is None


# --- summary records ------------------------------------------------------------------------------


def full_log() -> Log:
    log = Log(kind="room", name="general", platform="onebot", instance="ob1", account="9",
              chat=E.ChatInfo(type="group", multi_party=True),
              place=E.PlaceRef(key="onebot:9:group:1", kind="window", name="General"))
    for i in range(30):
        log.chat(f"t{i}", "a long question " * 20, "a long answer " * 20)
    log.turn("t99")
    log.add(E.TurnFailed, turn_id="t99", code="model", reason="overloaded")
    return log


def test_a_summary_record_round_trips_through_msgpack() -> None:
    record = summary_record(full_log().state(), attention=True, background=3)
    assert decode_summary_record(encode_summary_record(record)) == record


def test_a_summary_record_puts_each_value_in_its_own_field() -> None:
    """``summary_record`` passes the fields by position (speed): each must land where it belongs."""
    state = full_log().state()
    record = summary_record(state, attention=True, background=3)
    created = state.created
    assert created is not None
    assert msgspec.structs.asdict(record) == {
        "id": state.session_id, "title": state.title, "name": "general", "kind": "room", "parent_id": None,
        "platform": "onebot", "instance": "ob1", "account": "9", "chat": created.chat, "place": created.place,
        "created_at": state.created_at, "updated_at": state.updated_at, "last_reply_at": state.last_reply_at,
        "seen_at": state.seen_at, "running": False, "archived": False, "attention": True, "background": 3,
        "tokens_in": state.tokens_in, "tokens_out": state.tokens_out, "metered": state.last_usage is not None,
        "last_outcome": "error", "last_ended_at": state.turns["t99"].ended_at, "last_reason": "overloaded",
        "deleted": False, "status": state.status.value, "app_id": None, "activity": created.activity,
    }


def test_a_summary_record_holds_no_messages_and_stays_small() -> None:
    state = full_log().state()
    data = encode_summary_record(summary_record(state))
    assert len(data) < 200
    assert b"long question" not in data


def test_a_summary_from_the_record_equals_the_summary_of_the_state() -> None:
    state = full_log().state()
    record = summary_record(state, attention=True, background=2)
    tree = compute_tree_fields([summary_node(state, attention=True, background=2)])
    stored = decode_summary_record(encode_summary_record(record))
    assert summary_from_record(stored, tree[state.session_id]) == summary_of(
        state, tree[state.session_id], attention=True, background=2
    )
    assert summary_from_record(stored, None) == summary_of(state, None, attention=True, background=2)


def test_a_record_written_before_later_fields_existed_still_decodes() -> None:
    old = msgspec.msgpack.encode(["s1", "title"])  # a prefix of the array: the rest take defaults
    record = decode_summary_record(old)
    assert record == SummaryRecord(id="s1", title="title")
    assert summary_from_record(record).title == "title"


def test_a_summary_encodes_on_the_wire() -> None:
    summary = summary_of(full_log().state(), None, attention=True)
    wire = msgspec.json.decode(msgspec.json.encode(summary))
    assert wire["lastTurn"]["outcome"] == "error" and wire["reason"] == "overloaded"
    assert wire["chat"] == {"type": "group", "multiParty": True} and wire["attention"] is True


def test_a_record_carries_the_session_status_and_deletion_for_the_api_listing() -> None:
    log = Log()
    log.turn("t1")
    assert summary_record(log.state()).status == "running"
    log.add(E.TurnAborted, turn_id="t1")
    log.add(E.SessionDeleted)
    record = decode_summary_record(encode_summary_record(summary_record(log.state())))
    assert record.deleted and record.status == "cancelled"
