"""The re-run of a session forked at user turn N: ``rerun`` with the replay provider, the recorded
tool results and approvals, and the what-if overrides.

:class:`RerunScript` is what the fork is answered with, made from the plan before the host
opens, and its :meth:`~RerunScript.ports` are the parts the host is opened with
(``actors.system.ports.HostPorts``): the model's answers come from the recording
(:class:`ReplayAnswers`: answers, provider failures, automatic summaries) unless a live provider
is asked for; tools replay their recorded results (their file changes too) unless ``live``; each
approval is settled as the recording settled it (:class:`RecordedApprovals`, :func:`rerun_gate`).
An :class:`Override` answers one step otherwise -- a tool call's result, a model call's answer
or an approval -- and the differences it causes are reported apart from the divergence.

:class:`Rerun` drives the opened host: it forks the original
(:class:`~sessionloop.actors.replay.plan.RerunPlan` says where), gives the fork the session
settings and the workspace the original had, sends the later inputs again turn by turn and
compares the fork's log with the recording after each turn (``actors/replay/compare.py``),
keeping the script's facts (the re-run turn, the fork, its workspace) up to date.
``cli/rerun_cmd.py`` parses the overrides, opens the host with the script's ports and prints the
report.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Final

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.approvals.actor import ApprovalService
from sessionloop.actors.approvals.model import GateInputs
from sessionloop.actors.errors import ActorError
from sessionloop.actors.model import ModelError, ModelResponse, ReplayProvider, make_provider
from sessionloop.actors.model.base import stream_now
from sessionloop.actors.replay.compare import comparable, compare_logs
from sessionloop.actors.replay.live import MemoryClient
from sessionloop.actors.replay.plan import LaterTurn, RecordedApproval, RerunPlan
from sessionloop.actors.replay.values import fold_events, one_line
from sessionloop.actors.session.checkpoints import restore_before
from sessionloop.actors.session.commands import SettingsOf
from sessionloop.actors.session.messages import Ask
from sessionloop.actors.system.ports import HostPorts
from sessionloop.actors.tools import ToolResult, ToolSpec
from sessionloop.eventstore.errors import SessionloopError
from sessionloop.eventstore.records import RecordedEvent

__all__ = [
    "RERUN_OWNER",
    "Override",
    "Progress",
    "ReplayAnswers",
    "RecordedApprovals",
    "Rerun",
    "RerunFailed",
    "RerunScript",
    "override_settlement",
    "replayed_settlement",
    "rerun_gate",
]

#: what :meth:`Rerun.run` wraps the re-run turns in (a progress bar); by default, nothing
Progress = Callable[[list[LaterTurn]], AbstractContextManager[Iterable[LaterTurn]]]


class RerunFailed(ActorError):
    """A re-run could not be carried out: the fork's workspace is the original's and tools would
    run live, a re-run turn did not end in time, or the fork could not be discarded."""

    code = "rerun-failed"


#: who answers an approval in a rerun's what-if (``--override-approval``): the owner, as over the wire
RERUN_OWNER: Final = E.Speaker(platform="console", user_id="owner", owner=True)


def rerun_gate(recorded: RecordedApproval | None, overridden: bool) -> GateInputs:
    """What a rerun's approval gate is told about a call, so that it settles the call the way the
    recording did: asked (someone present, no grant), at once by a grant, at once ``absent`` or
    ``rate-limit``. An overridden call is asked, whatever grants say, and the override answers
    it. A call the recording has no approval for (the answers differ from the recording) meets
    what a rerun has: nobody present, and the grants the replayed answers made."""
    if overridden or (recorded is not None and recorded.asked):
        return GateInputs(present=True, rate_limited=False, grants=False)
    settled = recorded.settlement if recorded is not None else None
    if settled is None:
        return GateInputs(present=False, rate_limited=False)
    if settled.source == "grant":
        return GateInputs(present=True, rate_limited=False)  # the grant should settle it again
    return GateInputs(present=settled.source != "absent", rate_limited=settled.source == "rate-limit",
                      grants=False)


def replayed_settlement(recorded: E.Settlement, now: int) -> E.Settlement:
    """A recorded settlement given again at ``now``: a grant it made lasts as long after ``now``
    as it did after the recorded answer (so it settles the same later calls)."""
    grant = recorded.grant
    if grant is not None:
        grant = msgspec.structs.replace(grant, expires_at=now + max(0, grant.expires_at - recorded.at))
    return msgspec.structs.replace(recorded, at=now, grant=grant)


def override_settlement(decision: str, now: int) -> E.Settlement:
    """The owner's answer ``approve`` or ``deny`` (no note, no grant) for ``--override-approval``."""
    return E.Settlement(state="approved" if decision == "approve" else "denied", source="answer", at=now,
                        by=RERUN_OWNER)


class ReplayAnswers:
    """The replay provider, completed with what it does not play back by itself:

    * recorded provider failures (``llm.failed``, not aborted): the call fails again with the
      recorded error, in its place in the order (``ReplayProvider`` only knows ``llm.completed``
      and would hand the next answer to the failed call);
    * automatic summaries: a summary request (one with no tool schemas) is answered from the
      recorded ``agent.context.compacted`` / ``compact-failed``, in order.
    """

    name = "replay"

    def __init__(self, inner: Any, model_calls: list[E.Event], summaries: list[E.Event]) -> None:
        self.inner = inner
        self.model_calls = list(model_calls)
        self.summaries = list(summaries)

    async def generate(self, request: Any, on_delta: Any) -> Any:
        if not request.tools:
            return self._summary()
        recorded = self.model_calls.pop(0) if self.model_calls else None
        if isinstance(recorded, E.LlmFailed):
            raise ModelError(recorded.error)
        return await self.inner.generate(request, on_delta)

    def skip(self) -> None:
        """Pass over the next recorded model call (an override answers it instead), so the later
        calls keep their recorded answers."""
        recorded = self.model_calls.pop(0) if self.model_calls else None
        if isinstance(recorded, E.LlmCompleted):
            self.inner.calls += 1

    def _summary(self) -> ModelResponse:
        if not self.summaries:
            raise ModelError("replay: the re-run asked for a summary the recording does not have")
        recorded = self.summaries.pop(0)
        if isinstance(recorded, E.ContextCompactFailed):
            raise ModelError(recorded.error)
        assert isinstance(recorded, E.ContextCompacted)
        return ModelResponse(text=recorded.summary, provider="replay")


class ModelOverrides:
    """The provider of a rerun with ``--override-tool`` on model steps: the model call a step
    names (by re-run turn and its number within the turn) gets the given answer, or fails with
    its ``error``; every other call goes to ``inner`` (which, replaying, skips the recording of
    the overridden call)."""

    def __init__(self, inner: Any, job: RerunScript) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", "override")
        self.job = job
        self.calls: dict[int, int] = {}  # re-run turn -> model calls made in it

    async def generate(self, request: Any, on_delta: Any) -> Any:
        if not request.tools:  # a summary request, not a step of the turn
            return await self.inner.generate(request, on_delta)
        turn = self.job.current_turn
        self.calls[turn] = number = self.calls.get(turn, 0) + 1
        override = self.job.model_overrides.get((turn, number))
        if override is None:
            return await self.inner.generate(request, on_delta)
        skip = getattr(self.inner, "skip", None)
        if skip is not None:
            skip()
        answer = override.answer
        if answer.error is not None:
            raise ModelError(answer.error)
        stream_now(on_delta, "reasoning", answer.reasoning, 8)
        stream_now(on_delta, "text", answer.text, 8)
        recorded = override.recorded if isinstance(override.recorded, E.LlmCompleted) else None
        return ModelResponse(text=answer.text, reasoning=answer.reasoning, tool_calls=answer.tool_call_specs(),
                             usage=recorded.usage if recorded is not None else E.Usage(),
                             model=recorded.model if recorded is not None else "",
                             provider=recorded.provider if recorded is not None else self.name)


class Override(msgspec.Struct, kw_only=True):
    """One ``--override-tool STEP=JSON``: a tool call's result (``output``) or a model call's
    answer (``answer``, for ``kind == "model"``); or one ``--override-approval ID=DECISION``
    (``kind == "approval"``: ``decision`` answers the approval ``approval_id``)."""

    step: str
    kind: str
    turn: int
    call_id: str = ""
    tool: str = ""
    output: Any = None
    step_id: str = ""
    call: int = 0
    answer: Any = None
    recorded: Any = None
    decision: str = ""
    approval_id: str = ""


class _Asked(msgspec.Struct, frozen=True, kw_only=True):
    """What ``Runtime.approval_settled`` needs of an approval the fork asked for."""

    id: str
    session_id: str
    turn_id: str
    call_id: str


class RecordedApprovals(ApprovalService):
    """The approvals of a rerun's fork, answered from the recording, as the model's
    answers and the tools' results are: each call that needs one meets the gate the recording
    says it met (asked; or settled at once by a grant, ``absent``, ``rate-limit``:
    :func:`rerun_gate`), and an approval the fork asks for is answered at once
    with the recorded settlement (a grant it made lasting as long as it did) or with the
    ``--override-approval`` answer, which wins over a recorded grant. Nobody is asked: no
    approval actor, push or approval stream. Sessions other than the fork keep the real rules."""

    def __init__(self, runtime: Any, job: RerunScript) -> None:
        super().__init__(runtime, runtime.approval_timing)
        self.job = job

    def _is_fork(self, session_id: str) -> bool:
        return self.job.fork_id is not None and session_id == self.job.fork_id

    def gate(self, session_id: str, call_id: str) -> GateInputs:
        if not self._is_fork(session_id):
            return super().gate(session_id, call_id)
        key = (self.job.current_turn, call_id)
        return rerun_gate(self.job.plan.approvals.get(key), key in self.job.approval_overrides)

    def open(self, state: Any, event: E.ToolApprovalRequested) -> None:
        if not self._is_fork(state.session_id):
            super().open(state, event)
            return
        asked = _Asked(id=event.approval_id, session_id=state.session_id, turn_id=event.turn_id,
                       call_id=event.call_id)
        self.rt.approval_settled(asked, self.job.approval_answer(event.call_id))


class RerunScript:
    """What one ``rerun`` answers its fork with, made from the plan before the host opens: the
    recording's (or a live model's) answers, the recorded tool results and approvals, and the
    overrides; :meth:`ports` are the parts the host is opened with. :class:`Rerun` keeps the
    facts they depend on up to date: ``current_turn`` (the re-run turn being sent), ``fork_id``
    and the two workspaces. Raises RerunFailed when tools would run live in the workspace the
    original works in."""

    def __init__(self, plan: RerunPlan, events: list[RecordedEvent], *, provider: str, tools: str,
                 overrides: list[Override]) -> None:
        self.plan, self.events = plan, events
        self.provider_name, self.tools_mode = provider, tools
        self.overrides = {(o.turn, o.call_id): o for o in overrides if o.kind == "tool"}
        self.model_overrides = {(o.turn, o.call): o for o in overrides if o.kind == "model"}
        self.approval_overrides = {(o.turn, o.call_id): o for o in overrides if o.kind == "approval"}
        self.current_turn = 0
        self.fork_id: str | None = None
        self.fork_workspace: Any = None
        self.original_workspace: Any = None
        self.problems: list[str] = []
        original = self.original_state()
        self.shared_workspace = bool(original.created and original.created.cwd)
        if self.shared_workspace and self.tools_mode == "live":
            raise RerunFailed(
                f"session {self.plan.session_id} works in its own directory ({original.created.cwd}); "
                "--tools live would change it: use --tools replay")

    def original_state(self) -> Any:
        return fold_events(self.plan.session_id, self.events)

    def ports(self) -> HostPorts:
        """The host's provider (the recording's answers, or a live one), its approvals (answered
        from the recording) and, when tools replay or a tool call is overridden, its tools'
        handlers."""
        if self.provider_name == "replay":
            provider: Any = ReplayAnswers(ReplayProvider(self.plan.answers), self.plan.model_calls,
                                          self.plan.summaries)
        else:
            provider = make_provider(self.provider_name)
        if self.model_overrides:
            provider = ModelOverrides(provider, self)
        replays = self.tools_mode == "replay" or bool(self.overrides)
        return HostPorts(provider=provider, approvals=lambda runtime: RecordedApprovals(runtime, self),
                         tool_handler=self.tool_handler if replays else None)

    def approval_answer(self, call_id: str) -> E.Settlement:
        """How the approval of ``call_id`` in the current re-run turn is answered: the override,
        else the recorded settlement; an approval the recording never answered is denied as
        nobody was present (said in the report)."""
        key = (self.current_turn, call_id)
        now = int(time.time() * 1000)
        override = self.approval_overrides.get(key)
        if override is not None:
            return override_settlement(override.decision, now)
        recorded = self.plan.approvals.get(key)
        if recorded is not None and recorded.settlement is not None:
            return replayed_settlement(recorded.settlement, now)
        self.problems.append(f"re-run turn {key[0]}: call {call_id} asked for an approval the recording has no "
                             "answer to; it was denied as nobody was present")
        return E.Settlement(state="denied", source="absent", at=now)

    def tool_handler(self, spec: ToolSpec) -> Any:
        """The handler ``spec`` runs with in the rerun: the recorded result (``--tools replay``) or
        the tool itself (``live``), then the override of the call, if any."""

        async def handle(args: dict[str, Any], ctx: Any) -> Any:
            key = (self.current_turn, ctx.call_id)
            if self.tools_mode == "live":
                result = await spec.handler(args, ctx)
            else:
                result = await self._replayed(key, spec.name, ctx)
            override = self.overrides.get(key)
            if override is None:
                return result
            # what-if: the call did what it did (files, checkpoints), but answered ``override``
            out = override.output
            return ToolResult(output=out, is_error=isinstance(out, dict) and "error" in out)

        return handle

    async def _replayed(self, key: tuple[int, str], tool: str, ctx: Any) -> Any:
        recorded = self.plan.tool_results.get(key)
        if recorded is None:
            self.problems.append(f"re-run turn {key[0]}: tool call {key[1]} ({tool}) has no recorded result")
            return ToolResult.error(f"rerun: no recorded result for tool call {key[1]}")
        for path in self.plan.checkpoints.get(key, []):
            await ctx.before_change(path)
            self._apply_after_image(path)
        return ToolResult(output=recorded.output, is_error=recorded.status != "completed",
                          exit_code=recorded.exit_code)

    def _apply_after_image(self, path: str) -> None:
        """Replayed file tools change the fork's workspace as the recording did, so later displays
        and checkpoints see the same files (never in a workspace shared with the original)."""
        if self.shared_workspace or self.fork_workspace is None:
            return
        image = self.plan.image_after(self.current_turn, path)
        try:
            target = self.fork_workspace.resolve(path)
            if image is None:
                source = self.original_workspace.resolve(path)
                image = (source.is_file(), source.read_bytes() if source.is_file() else None)
            existed, content = image
            if existed:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content or b"")
            elif target.is_file():
                target.unlink()
        except (OSError, SessionloopError) as e:
            self.problems.append(f"could not replay the change of {path}: {e}")


class Rerun:
    """One ``rerun`` on a host opened with ``script``'s ports: fork, re-send the later inputs
    turn by turn, compare after each turn."""

    def __init__(self, host: Any, script: RerunScript, *, timeout: float) -> None:
        self.host, self.rt, self.script, self.plan = host, host.rt, script, script.plan
        self.timeout = timeout
        self.problems = script.problems
        self.fork: Any = None
        self.gateway: Any = None  # the host's protocol service: the settings layers, session/delete
        self.client: Any = None  # an owner connection to it

    # setup

    def prepare(self) -> None:
        # the settings layers resolve as on a server (config.toml, places, the session layer)
        self.gateway = self.host.protocol()
        self.client = MemoryClient(self.gateway, self.timeout)
        self.client.initialize("sessionloop-rerun")

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.gateway is not None:
            self.gateway.close()

    def _start_fork_workspace(self) -> None:
        """The fork starts with the files as they were before the first re-run turn: a copy of
        the original's workspace with that turn's and later turns' changes undone (checkpoints)."""
        script = self.script
        original = script.original_state()
        script.original_workspace = self.rt.workspace(original)
        if script.shared_workspace:
            return
        script.fork_workspace = fork_workspace = self.rt.workspace(self.fork.snapshot())
        if script.original_workspace.exists():  # a session whose tools never wrote has none
            shutil.copytree(script.original_workspace.root, fork_workspace.root, symlinks=True, dirs_exist_ok=True)
        if self.plan.turns:
            _, _, conflicts = restore_before(original, self.plan.turns[0].turn_id, fork_workspace)
            self.problems.extend(f"could not restore {p} in the fork's workspace" for p in conflicts)

    # run

    def run(self, progress: Progress = nullcontext) -> dict[str, Any]:
        """Fork, then send each later turn and compare the fork's log with the recording after it,
        up to the first divergence; ``progress`` wraps the turns (a progress bar)."""
        plan = self.plan
        title = f"rerun of {plan.session_id} from turn {plan.from_turn}"
        self.fork = self.host.fork(plan.session_id, turns=plan.from_turn, title=title)
        self.script.fork_id = self.fork.id
        self._start_fork_workspace()
        numbers = {t.turn_id: t.number for t in plan.turns}
        loose = self._loose()
        new_ids: set[str] = set()
        divergence: Any = None
        relaxed: list[Any] = []
        got: list[Any] = []
        sent = 0
        with progress(plan.turns) as turns:
            for turn in turns:
                turn_id = self._send(turn)
                sent += 1
                new_ids.add(turn_id)
                numbers[turn_id] = turn.number
                got = comparable(self.rt.store.read_stream(f"session-{self.fork.id}"), new_ids)
                expected = [p for p in plan.expected if numbers[p[0]] <= turn.number]
                divergence, relaxed = compare_logs(expected, got, numbers, loose=loose)
                if divergence is not None:
                    break
        return {"sent": sent, "divergence": divergence, "relaxed": relaxed, "compared": len(got)}

    def _send(self, turn: LaterTurn) -> str:
        self.script.current_turn = turn.number
        self._settings_for(turn.number)
        session = self.host.session(self.fork.id)
        if turn.is_continue:
            receipt = session.continue_turn()
        else:
            inp = turn.input
            receipt = session.send(inp.text, source=inp.source, speaker=inp.speaker, attachments=list(inp.attachments))
        result = session.wait(receipt.turn_id, self.timeout)
        if result.state == "timeout":
            session.cancel(receipt.turn_id, "rerun: the turn did not end in time")
            raise RerunFailed(f"re-run turn {turn.number} did not end within {self.timeout:g} s "
                                       f"(fork {self.fork.id} kept; raise --timeout)")
        return str(receipt.turn_id)

    def _settings_for(self, turn: int) -> None:
        """Give the fork the session layer of settings the original had when turn ``turn``
        started (a fork copies the conversation only), through ``session/config/update``: the
        permission mode, the sandbox policy and the agent options then decide as they did."""
        wanted = self.plan.settings.get(turn, {})
        have = self.rt.ask(self.fork.id, lambda r: Ask(SettingsOf(), r), self.timeout)
        for key in sorted(set(wanted) | set(have)):
            if key in wanted and key in have and wanted[key] == have[key]:
                continue
            plugin, _, name = key.partition("/")
            reply = self.client.call("session/config/update", {"sessionId": self.fork.id, "plugin": plugin,
                                                               "key": name, "value": wanted.get(key)})
            if "error" in reply:
                self.problems.append(f"re-run turn {turn}: the fork could not take the setting {key} = "
                                     f"{one_line(wanted.get(key))}: {reply['error'].get('message')}")

    def discard(self) -> None:
        """Delete the fork (``session/delete``, as an owner would) and the workspace the rerun made."""
        reply = self.client.call("session/delete", {"sessionId": self.fork.id})
        if "error" in reply:
            raise RerunFailed(f"--discard: the fork {self.fork.id} could not be deleted: "
                                       f"{reply['error'].get('message')}")
        script = self.script
        if script.fork_workspace is not None and not script.shared_workspace:
            shutil.rmtree(script.fork_workspace.root, ignore_errors=True)

    def _loose(self) -> dict[int, frozenset[str]]:
        loose: dict[int, frozenset[str]] = {}
        numbers = {t.turn_id: t.number for t in self.plan.turns}
        overridden_steps = {o.step_id for o in self.script.model_overrides.values()}
        for i, (turn_id, rec) in enumerate(self.plan.expected):
            e = rec.event
            key = (numbers.get(turn_id), getattr(e, "call_id", None))
            if isinstance(e, E.ToolFinished) and key in self.script.overrides:
                loose[i] = frozenset({"output", "status", "exit_code"})
            elif isinstance(e, (E.LlmCompleted, E.LlmFailed)) and e.step_id in overridden_steps:
                loose[i] = frozenset({"text", "reasoning", "tool_calls", "usage", "model", "provider", "error"})
            elif isinstance(e, (E.ToolApprovalSettled, E.ToolFinished)) and key in self.script.approval_overrides:
                loose[i] = frozenset({"settlement", "output", "status", "exit_code"})
        return loose
