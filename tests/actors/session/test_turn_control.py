"""Turn control in detail (seed 002 上下文压缩 / maxSteps, seed 004 回合控制 / 快照 / 在场与审批):
manual compaction refused, interrupted and cancelled; maxSteps without a limit and the guard
that keeps such a turn stoppable; the usage a session without any gets after its snapshot; the
approval grace against the total wait. Real session actors on a real store; the gateway through
in-memory clients; the summary model held open by a gate instead of a timer."""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.errors import CompactionFailed, SessionBusy
from sessionloop.actors.model import MockProvider, ModelResponse
from sessionloop.actors.session.commands import StateCopy
from sessionloop.actors.session.context import SUMMARY_PROMPT
from sessionloop.actors.session.messages import Ask
from tests.actors.gateway_harness import MemoryClient, wait_until


def is_summary_call(request: Any) -> bool:
    return bool(request.messages) and request.messages[0].content == SUMMARY_PROMPT


class GatedSummaries:
    """The mock model, except that a summary call waits until the test opens ``gate`` (a slow
    summary model, held open for exactly as long as the test needs); ``started`` is set when a
    summary call begins and ``cancelled`` when one is cancelled."""

    name = "gated"

    def __init__(self) -> None:
        self.mock = MockProvider()
        self.started = threading.Event()
        self.cancelled = threading.Event()
        self.gate = threading.Event()
        self.summaries = 0

    def answer_now(self, request: Any, on_delta: Any) -> Any:
        return None if is_summary_call(request) else self.mock.answer_now(request, on_delta)

    async def generate(self, request: Any, on_delta: Any) -> ModelResponse:
        if not is_summary_call(request):
            return await self.mock.generate(request, on_delta)
        self.started.set()
        try:
            while not self.gate.is_set():
                await asyncio.sleep(0.005)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        self.summaries += 1
        return ModelResponse(text="the user said a and b", usage=E.Usage(prompt_tokens=50, completion_tokens=6))


class Compacting:
    """``session.compact()`` on a thread of its own: ``outcome()`` is its value or its error."""

    def __init__(self, session: Any) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(session,), daemon=True)
        self.thread.start()

    def _run(self, session: Any) -> None:
        try:
            self.value = session.compact(timeout=20)
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            self.error = e

    def outcome(self) -> tuple[Any, BaseException | None]:
        self.thread.join(20)
        assert not self.thread.is_alive(), "compact() did not return"
        return self.value, self.error


def compaction_events(session: Any) -> list[Any]:
    return [e.event for e in session.events() if isinstance(e.event, (E.ContextCompacted, E.ContextCompactFailed))]


@pytest.fixture
def gated(open_host):
    model = GatedSummaries()
    host = open_host(permission_mode="acceptCalls", provider=model)
    session = host.create()
    session.run("a")
    session.run("b")
    return host, model, session


# --- seed 002 compact(): cancel() 可以中止 -------------------------------------------------------------


def test_cancel_stops_a_manual_compaction_its_summary_call_and_commits_no_summary(gated):
    host, model, s = gated
    running = Compacting(s)
    assert model.started.wait(10)
    assert s.cancel(reason="the user changed their mind") is True
    value, error = running.outcome()
    assert isinstance(error, CompactionFailed) and "cancelled: the user changed their mind" in str(error)
    assert model.cancelled.wait(5), "the summary call was not cancelled"
    [failed] = compaction_events(s)
    assert isinstance(failed, E.ContextCompactFailed) and failed.error == "cancelled: the user changed their mind"
    assert not any(m.content.startswith("[Summary") for m in s.snapshot().messages)
    # nothing is left running: a new compaction starts and completes
    model.gate.set()
    assert s.compact(timeout=10) == {"turns": 2, "chars": len("[Summary of the earlier conversation] "
                                                               "the user said a and b")}


def test_cancel_with_neither_a_turn_nor_a_compaction_running_changes_nothing(gated):
    host, model, s = gated
    before = len(s.events())
    assert s.cancel() is False
    assert len(s.events()) == before


# --- seed 004 session/compress: 正在压缩时直接拒绝; 期间历史被改动 -> 没压成 --------------------------------


def test_a_second_compact_while_one_runs_is_refused_and_records_nothing(gated):
    host, model, s = gated
    running = Compacting(s)
    assert model.started.wait(10)
    with pytest.raises(SessionBusy, match="already being compressed"):
        s.compact(timeout=10)
    assert compaction_events(s) == []  # the refusal recorded nothing: no notice
    model.gate.set()
    value, error = running.outcome()
    assert error is None and value["turns"] == 2
    assert [type(e) for e in compaction_events(s)] == [E.ContextCompacted]


def test_a_rewind_during_a_manual_compaction_fails_it_and_commits_no_summary(gated):
    host, model, s = gated
    second = s.snapshot().turn_order[1]
    running = Compacting(s)
    assert model.started.wait(10)
    s.rewind(second, "code-and-chat")
    value, error = running.outcome()
    assert isinstance(error, CompactionFailed) and "the session was rewound" in str(error)
    model.gate.set()
    assert [m.content for m in s.snapshot().messages] == ["a", "echo: a"]
    [failed] = compaction_events(s)
    assert "history changed during compression" in failed.error
    assert model.cancelled.wait(5)


def test_an_input_during_a_manual_compaction_fails_it_and_the_input_stays_in_every_later_request(gated):
    host, model, s = gated
    running = Compacting(s)
    assert model.started.wait(10)
    assert s.run("c").output_text == "echo: c"
    value, error = running.outcome()
    assert isinstance(error, CompactionFailed) and "a new input arrived" in str(error)
    model.gate.set()
    assert s.compact(timeout=10)["turns"] == 3  # the next compaction summarises the input too
    summary_at = next(i for i, m in enumerate(s.snapshot().messages) if m.content.startswith("[Summary"))
    assert summary_at == 6  # after a, b and c with their answers: no summary landed before "c"
    assert model.summaries == 1  # the interrupted summary call never answered


def test_the_summary_calls_tokens_count_in_the_sessions_token_accounting(gated):
    host, model, s = gated
    before = s.snapshot()
    model.gate.set()
    s.compact(timeout=10)
    after = s.snapshot()
    assert (after.tokens_in - before.tokens_in, after.tokens_out - before.tokens_out) == (50, 6)


def test_stopping_a_turn_that_waits_for_its_automatic_compaction_drops_that_summary(open_host):
    # no system prompt: the built-in one alone is over this small budget
    model = GatedSummaries()
    host = open_host(permission_mode="acceptCalls", context_chars=400, system_prompt="", provider=model)
    s = host.create()
    s.run("first " * 30)  # 180 characters, and 186 of echo: under the budget of 400
    s.run("b")
    receipt = s.send("third " * 10)  # over the budget: its first model call waits for a summary
    assert model.started.wait(10)
    assert s.cancel() is True
    assert model.cancelled.wait(5), "the summary call was not cancelled"
    model.gate.set()
    assert host.rt.results.get(receipt.turn_id).outcome == "aborted"
    assert compaction_events(s) == []  # no summary inserted into a turn that is over
    assert s.run("fourth").state == "completed"  # and the next turn compacts and runs as usual
    assert [type(e) for e in compaction_events(s)] == [E.ContextCompacted]


# --- seed 002 maxSteps: Infinity 不限 --------------------------------------------------------------------


class EndlessRefusedCalls:
    """A model that answers at once, every time, with a call of a tool that does not exist: each
    call is refused at once, so a turn never waits for anything (the worst runaway)."""

    name = "endless"

    def __init__(self) -> None:
        self.calls = 0

    def _answer(self) -> ModelResponse:
        self.calls += 1
        return ModelResponse(tool_calls=[E.ToolCallSpec(call_id=f"c{self.calls}", name="no_such_tool", args={})])

    def answer_now(self, request: Any, on_delta: Any) -> ModelResponse:
        return self._answer()

    async def generate(self, request: Any, on_delta: Any) -> ModelResponse:
        return self._answer()


def test_max_steps_infinity_lets_a_turn_run_past_any_limit_and_records_it_as_unlimited(open_host):
    host = open_host(permission_mode="acceptCalls", max_steps=math.inf)
    s = host.create()
    result = s.run('!tool list_files {"path": "."}')
    assert result.state == "completed"
    assert host.rt.options.max_steps == 0
    [started] = [e.event for e in s.events() if isinstance(e.event, E.TurnStarted)]
    assert started.max_steps == 0  # recorded as unlimited (0), not as "not recorded" (None)


@pytest.mark.parametrize("value", [0, "unlimited", "Infinity", math.inf])
def test_the_host_option_max_steps_takes_every_spelling_of_unlimited(open_host, value):
    host = open_host(permission_mode="acceptCalls", max_steps=value)
    assert host.rt.options.max_steps == 0
    s = host.create()
    assert s.run('!tool list_files {"path": "."}').output_text == "done: 1 tool calls"
    assert not any(isinstance(e.event, E.TurnLimitReached) for e in s.events())


@pytest.mark.parametrize("value", [-1, "lots", 2.5, True])
def test_a_bad_max_steps_host_option_is_refused_naming_it(open_host, value):
    with pytest.raises(ValueError, match="max_steps"):
        open_host(max_steps=value)


def test_an_unlimited_turn_of_instant_answers_is_still_stopped_by_cancel(open_host, paused_gc):
    """The runaway guard: answers a commit takes in place are bounded, so the mailbox gets a
    turn and cancel() (turn/abort) stops a turn no limit would ever stop."""
    model = EndlessRefusedCalls()
    host = open_host(permission_mode="acceptCalls", max_steps="unlimited", provider=model)
    s = host.create()
    receipt = s.send("go")
    wait_until(lambda: model.calls > 200, timeout=30, what="the turn to pass 200 model calls")
    assert s.cancel() is True
    outcome = host.rt.results.get(receipt.turn_id)
    assert outcome is not None and outcome.outcome == "aborted"
    assert not any(isinstance(e.event, E.TurnLimitReached) for e in s.events())


def test_a_session_setting_of_zero_max_steps_means_unlimited(service):
    host, svc = service(permission_mode="acceptCalls", max_steps=1)  # a tool turn takes 2 model calls
    c = MemoryClient(svc)
    sid = c.result("session/create", {})["session"]["id"]
    c.result("session/subscribe", {"sessionId": sid})
    update = c.call("session/config/update", {"sessionId": sid, "plugin": "agent", "key": "maxSteps", "value": 0})
    assert "result" in update, update
    c.result("turn/send", {"sessionId": sid, "content": '!tool list_files {"path": "."}'})
    c.wait(lambda f: f.get("method") == "item/completed" and f["params"]["item"]["kind"] == "turn", 10)
    state = host.rt.ask(sid, lambda r: Ask(StateCopy(), r))
    turn = state.turns[state.turn_order[-1]]
    assert (turn.status, turn.llm_calls, turn.max_steps) == ("completed", 2, 0)
    big = c.call("session/config/update", {"sessionId": sid, "plugin": "agent", "key": "maxSteps", "value": 5000})
    assert "result" in big, big  # no finite maximum caps it any more


# --- seed 004 快照: 还没有用量时，服务端在快照之后请 agent 算一次 -------------------------------------------


def test_a_forked_session_gets_its_usage_computed_and_pushed_after_the_snapshot(service):
    host, svc = service(permission_mode="acceptCalls", system_prompt="be brief")
    source = host.create()
    source.run("tell me about forks")
    fork = host.fork(source.id)
    c = MemoryClient(svc)
    snap = c.result("session/subscribe", {"sessionId": fork.id})
    assert [i for i in snap["items"] if i["kind"] == "usage"] == []  # the snapshot has none
    push = c.wait(lambda f: f.get("method") == "item/completed" and f["params"]["sessionId"] == fork.id
                  and f["params"]["item"]["kind"] == "usage", 5)["params"]
    assert push["seq"] > snap["seq"]
    chars = len("be brief") + len("tell me about forks") + len("echo: tell me about forks")
    assert push["item"]["parts"] == [{"label": "Context", "tokens": chars // 4}]
    assert push["item"]["tokens"] == chars // 4


def test_a_session_with_usage_or_without_history_gets_no_computed_usage(service):
    host, svc = service(permission_mode="acceptCalls")
    used = host.create()
    used.run("hello")
    empty = host.create()
    c = MemoryClient(svc)
    snap = c.result("session/subscribe", {"sessionId": used.id})
    assert [i["itemId"] for i in snap["items"] if i["kind"] == "usage"] == ["usage"]
    c.result("session/subscribe", {"sessionId": empty.id})
    c.result("sessions/list", {})  # a round trip: what the subscribes pushed is in by now
    assert [f for f in c.pushes("item/completed") if f["params"]["item"]["kind"] == "usage"] == []


# --- seed 004 在场与审批: 宽限不延长 300 秒的总等待 ---------------------------------------------------------


def test_the_reconnect_grace_does_not_extend_the_total_wait(service):
    host, svc = service(approval_wait_s=1.0, approval_grace_s=30.0)
    owner = MemoryClient(svc)
    watcher = MemoryClient(svc)  # stays to see the outcome, never present
    owner.result("presence/update", {"active": True})
    sid = owner.result("session/create", {})["session"]["id"]
    watcher.result("session/subscribe", {"sessionId": sid})
    owner.result("turn/send", {"sessionId": sid, "content": '!tool write_file {"path": "a.txt", "content": "x"}'})
    owner.wait(lambda f: f.get("method") == "approval/requested", 10)
    owner.result("presence/update", {"active": False})  # the 30 s grace starts, ending well after the total
    card = watcher.wait(lambda f: f.get("method") == "item/completed" and f["params"]["item"]["kind"] == "tool-call"
                        and f["params"]["item"]["status"] == "denied", 10)["params"]["item"]
    assert (card["settlement"]["state"], card["settlement"]["source"]) == ("expired", "timeout")
