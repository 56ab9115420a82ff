"""``sessionloop rerun``: fork a session at user turn N, re-run the later inputs, compare the logs.

The re-run itself is ``actors/replay/rerun.py`` (the plan in ``plan.py``, the comparison in
``compare.py``); this module refuses what it can before taking the data directory's writer lock
(an unknown session, a bad ``--from-turn`` or override, other sessions' unfinished work), parses
the what-if overrides (``--override-tool``, ``--override-approval``), opens the host once with
the rerun's ports (its provider, approvals and tool handlers: ``RerunScript.ports``), refuses if
the session changed since it was planned, and prints the report. A rerun writes (the fork), so
it refuses clearly (StoreLocked) while a server runs on the data directory.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import click
import msgspec

from sessionloop.actors.api.host import Host
from sessionloop.actors.replay.plan import LaterTurn, RerunPlan, parse_model_answer, plan_rerun
from sessionloop.actors.replay.rerun import Override, Progress, Rerun, RerunFailed, RerunScript
from sessionloop.actors.system.ports import HostPorts
from sessionloop.actors.system.runtime import HostOptions
from sessionloop.cli.session_log import (
    data_option,
    json_option,
    open_store,
    print_json,
    read_session,
    say,
    session_id_of,
    short,
)
from sessionloop.eventstore import RecordedEvent
from sessionloop.eventstore.errors import StoreLocked

__all__ = ["rerun"]


def _parse_overrides(plan: RerunPlan, values: tuple[str, ...]) -> list[Override]:
    out: list[Override] = []
    for value in values:
        step, sep, text = value.partition("=")
        if not sep or not step:
            raise click.ClickException(f"--override-tool {value!r}: expected STEP=JSON (a tool call id or number, "
                                       "or a model step: an llm step id or llm:N)")
        try:
            output = msgspec.json.decode(text)
        except msgspec.DecodeError as e:
            raise click.ClickException(f"--override-tool {step}: not valid JSON: {e}") from e
        try:
            ref = plan.find_step(step)
        except ValueError as e:
            raise click.ClickException(f"--override-tool {step}: {e}") from e
        if ref.kind == "tool":
            override = Override(step=step, kind="tool", turn=ref.turn, call_id=ref.call_id, tool=ref.tool,
                                 output=output)
        else:
            try:
                answer = parse_model_answer(output)
            except ValueError as e:
                raise click.ClickException(f"--override-tool {step} (model call {ref.step_id}): {e}") from e
            override = Override(step=step, kind="model", turn=ref.turn, step_id=ref.step_id, call=ref.call,
                                 answer=answer, recorded=ref.recorded)
        same = [o for o in out if (o.kind, o.turn, o.call_id, o.call) == (override.kind, override.turn,
                                                                          override.call_id, override.call)]
        if same:
            raise click.ClickException(f"--override-tool {step}: the same step as --override-tool {same[0].step}")
        out.append(override)
    return out


def _parse_approval_overrides(plan: RerunPlan, values: tuple[str, ...]) -> list[Override]:
    out: list[Override] = []
    for value in values:
        ref, sep, decision = value.partition("=")
        if not sep or not ref or decision not in ("approve", "deny"):
            raise click.ClickException(f"--override-approval {value!r}: expected ID=approve or ID=deny (an "
                                       "approval id, a call id, or the number of the approval after the fork point)")
        try:
            found = plan.find_approval(ref)
        except ValueError as e:
            raise click.ClickException(f"--override-approval {ref}: {e}") from e
        if any(o.approval_id == found.approval_id for o in out):
            raise click.ClickException(f"--override-approval {ref}: approval {found.approval_id} is overridden twice")
        s = found.settlement
        out.append(Override(step=ref, kind="approval", turn=found.turn, call_id=found.call_id, tool=found.tool,
                             decision=decision, approval_id=found.approval_id,
                             recorded=f"{s.state} ({s.source})" if s is not None else "never settled"))
    return out


def _other_unfinished(data_dir: str, session_id: str) -> list[str]:
    """Sessions with unfinished work (an interrupted turn, queued inputs): opening a host on the
    data directory resumes them, and a rerun must run no turn but its own, with its own model."""
    store = open_store(data_dir, session_id)
    try:
        return [s for s in store.flagged("active") if s.startswith("session-") and s != f"session-{session_id}"]
    finally:
        store.close()


def _open_rerun_host(data_dir: str, max_steps: int | None, ports: HostPorts) -> Host:
    try:
        steps = HostOptions().max_steps if max_steps is None else max_steps  # 0: unlimited
        return Host.open(data_dir, durability="sync", max_steps=steps, provider=ports.provider,
                         approvals=ports.approvals, tool_handler=ports.tool_handler)
    except StoreLocked as e:
        raise click.ClickException(
            f"{data_dir} is in use by a running server ({e.holder}); rerun forks the session in the same data "
            "directory and needs the writer lock: stop the server first, or copy the directory and rerun there"
        ) from e


@click.command("rerun")
@click.argument("session")
@click.option("--from-turn", "from_turn", type=click.IntRange(min=0), required=True,
              help="Keep the first N user turns (0: none) and re-send the later ones.")
@click.option("--provider", type=click.Choice(["replay", "mock", "openai"]), default="replay", show_default=True,
              help="replay: the model answers come from the recording; mock/openai: a live model.")
@click.option("--tools", "tools_mode", type=click.Choice(["replay", "live"]), default="replay", show_default=True,
              help="replay: tool results come from the recording (nothing is executed); live: tools run again.")
@click.option("--override-tool", "overrides", multiple=True, metavar="STEP=JSON",
              help="What-if: replace one recorded step and report where behaviour then diverged. A tool call "
                   "(a call id, or the 1-based number of the calls after the fork point) gets JSON as its result; "
                   "a model call (its llm step id as replay shows it, or llm:N, the N-th model call after the fork "
                   'point) gets JSON as its answer: {"text": ..., "toolCalls": [{"name": ..., "args": ...}]}, '
                   'or {"error": ...} to fail. Repeatable.')
@click.option("--override-approval", "approval_overrides", multiple=True, metavar="ID=approve|deny",
              help="What-if: answer one approval of the re-run turns otherwise than recorded (ID: its approval "
                   "id as replay shows it, the call id when one call has it, or its 1-based number after the "
                   "fork point). The answer wins over a grant that settled the call in the recording. "
                   "Repeatable.")
@click.option("--discard", is_flag=True,
              help="Delete the fork when the comparison is done (session/delete, as an owner would) and the "
                   "workspace the rerun made for it; the report still names it.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=120.0, show_default=True,
              help="Seconds to wait for each re-run turn.")
@data_option
@json_option
def rerun(session: str, from_turn: int, provider: str, tools_mode: str, overrides: tuple[str, ...],
          approval_overrides: tuple[str, ...], discard: bool, timeout: float, data_dir: str,
          as_json: bool) -> None:
    """Fork SESSION at user turn N and re-run the later inputs, then compare the new event log with
    the recorded one modulo ids and times. The first divergence is reported like a workflow
    replayer's non-determinism error (event index, tag, field, expected and got) and exits 1.

    The fork is titled "rerun of SESSION from turn N" and kept in the same data directory
    (inspect it with ``replay``) unless --discard is given; the command needs the writer lock,
    so it refuses while a server runs there. Approvals are answered as recorded: a call the
    owner approved or denied is asked and gets the recorded answer (a grant it made settles the
    same later calls), a call a grant or nobody's presence settled at once is settled so again;
    --override-approval answers one otherwise. The fork takes the original's session settings
    (permission mode, sandbox policy, agent options) as they were at each re-run turn. Other
    owner actions (renames, rewinds, grant revocations, manual compaction) are not repeated and
    not compared.

    \b
    Examples:
      sessionloop rerun 18f3a2c0d41e5b7a90c1d --from-turn 2
      sessionloop rerun 18f3a2c0d41e5b7a90c1d --from-turn 0 --provider mock --json --discard
      sessionloop rerun 18f3a2c0d41e5b7a90c1d --from-turn 1 --override-tool 1='{"entries": []}'
      sessionloop rerun 18f3a2c0d41e5b7a90c1d --from-turn 1 --override-tool llm:1='{"text": "no"}'
      sessionloop rerun 18f3a2c0d41e5b7a90c1d --from-turn 0 --override-approval 1=deny
    """
    session_id = session_id_of(session)
    plan, events = _check_before_opening(data_dir, session_id, from_turn, overrides, approval_overrides)
    parsed = _parse_overrides(plan, overrides) + _parse_approval_overrides(plan, approval_overrides)
    try:
        script = RerunScript(plan, events, provider=provider, tools=tools_mode, overrides=parsed)
    except RerunFailed as e:
        raise click.ClickException(str(e)) from e
    host = _open_rerun_host(data_dir, plan.max_steps, script.ports())
    try:
        _check_unchanged(read_session(host.store, data_dir, session_id), events, data_dir, session_id)
        job = Rerun(host, script, timeout=timeout)
        try:
            job.prepare()
            outcome = job.run(_progress_bar(not as_json and sys.stderr.isatty()))
            if discard:
                job.discard()
        finally:
            job.close()
    except RerunFailed as e:
        raise click.ClickException(str(e)) from e
    finally:
        host.close()
    report = _rerun_report(job, outcome, parsed, provider, tools_mode, data_dir)
    report["discarded"] = discard
    if as_json:
        print_json(report)
    else:
        for line in _render_rerun(report):
            say(line)
    if report["divergence"] is not None and not parsed:
        sys.exit(1)


def _check_before_opening(data_dir: str, session_id: str, from_turn: int, overrides: tuple[str, ...],
                          approval_overrides: tuple[str, ...]) -> tuple[RerunPlan, list[RecordedEvent]]:
    """The plan and the session's events it was made from, from a read-only store: an unknown
    session, a bad ``--from-turn`` or override, or other sessions' unfinished work that opening
    the directory would resume, is refused before the writer lock is taken (and even while a
    server runs)."""
    if not os.path.isdir(os.path.join(data_dir, "store")):
        raise click.ClickException(f"session {session_id} not found in {data_dir} (no event store there)")
    events = _read_readonly(data_dir, session_id)
    try:
        plan = plan_rerun(session_id, events, from_turn)
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    _parse_overrides(plan, overrides)
    _parse_approval_overrides(plan, approval_overrides)
    unfinished = _other_unfinished(data_dir, session_id)
    if unfinished:
        raise click.ClickException(
            f"{len(unfinished)} other session(s) in {data_dir} have unfinished work (e.g. {unfinished[0]}) "
            "that opening the directory would resume with the rerun's model; start the server once to let them "
            "finish, or rerun on a copy of the directory")
    return plan, events


def _check_unchanged(now: list[RecordedEvent], planned: list[RecordedEvent], data_dir: str, session_id: str) -> None:
    """The session's events read again under the writer lock are the ones the rerun was planned
    from (its answers, approvals and tool results come from them); a session that changed in
    between (a server wrote to it before the lock was taken) is refused."""
    if now != planned:
        raise click.ClickException(
            f"session {session_id} in {data_dir} changed while the rerun was being prepared ({len(planned)} events "
            f"when planned, {len(now)} now, up to version {now[-1].version}); nothing was re-run: run rerun again")


def _progress_bar(shown: bool) -> Progress:
    """The re-run turns behind a progress bar on stderr (hidden unless ``shown``)."""

    def bar(turns: list[LaterTurn]) -> Any:
        return click.progressbar(turns, label="re-running turns", file=sys.stderr, hidden=not shown)

    return bar


def _read_readonly(data_dir: str, session_id: str) -> list[RecordedEvent]:
    """The session's events through a read-only store, closed again at once: an unknown session
    or a bad ``--from-turn`` is reported even while a server runs."""
    store = open_store(data_dir, session_id)
    try:
        return read_session(store, data_dir, session_id)
    finally:
        store.close()


def _rerun_report(job: Rerun, outcome: dict[str, Any], overrides: list[Override], provider: str, tools: str,
                  data_dir: str) -> dict[str, Any]:
    plan = job.plan
    divergence = outcome["divergence"]
    return {
        "session": plan.session_id,
        "fork": job.fork.id,
        "data": data_dir,
        "fromTurn": plan.from_turn,
        "provider": provider,
        "tools": tools,
        "turns": len(plan.turns),
        "turnsSent": outcome["sent"],
        "compared": outcome["compared"],
        "identical": divergence is None and not outcome["relaxed"],
        "divergence": msgspec.to_builtins(divergence) if divergence is not None else None,
        "overrides": [_override_json(o) for o in overrides],
        "overrideChanges": [msgspec.to_builtins(d) for d in outcome["relaxed"]],
        "problems": job.problems,
    }


def _override_json(o: Override) -> dict[str, Any]:
    if o.kind == "tool":
        return {"step": o.step, "kind": "tool", "callId": o.call_id, "tool": o.tool, "turn": o.turn,
                "output": o.output}
    if o.kind == "approval":
        return {"step": o.step, "kind": "approval", "approvalId": o.approval_id, "callId": o.call_id,
                "tool": o.tool, "turn": o.turn, "decision": o.decision, "recorded": o.recorded}
    return {"step": o.step, "kind": "model", "stepId": o.step_id, "turn": o.turn, "call": o.call,
            "answer": msgspec.to_builtins(o.answer)}


def _render_rerun(r: dict[str, Any]) -> Iterator[str]:
    yield (f"rerun of {r['session']} from turn {r['fromTurn']}: {r['turnsSent']} of {r['turns']} turns re-sent "
           f"to fork {r['fork']} (provider {r['provider']}, tools {r['tools']})")
    for o in r["overrides"]:
        if o["kind"] == "tool":
            yield (f"override: tool call {o['callId']} ({o['tool']}, re-run turn {o['turn']}) answered with "
                   f"{short(o['output'])}")
        elif o["kind"] == "approval":
            yield (f"override: approval {o['approvalId']} ({o['tool']} call {o['callId']}, re-run turn "
                   f"{o['turn']}) answered {o['decision']} (recorded: {o['recorded']})")
        else:
            yield (f"override: model call {o['call']} of re-run turn {o['turn']} (step {o['stepId']}) answered "
                   f"with {short(o['answer'])}")
    for d in r["overrideChanges"]:
        yield (f"  changed by the override: event {d['index']} ({d.get('expectedTag')}, original "
               f"v{d.get('expectedVersion')}) {d.get('path')}: {short(d.get('expected'))} -> {short(d.get('got'))}")
    for problem in r["problems"]:
        yield f"note: {problem}"
    d = r["divergence"]
    if d is None and r["overrides"]:
        yield f"after the override: no divergence in {r['compared']} events"
    elif d is None:
        yield f"identical: {r['compared']} events match the recording (modulo ids and times)"
    else:
        lead = "behaviour after the override diverged" if r["overrides"] else "divergence"
        turn = f" (re-run turn {d['turn']} of {r['turns']})" if d.get("turn") else ""
        yield (f"{lead} at event {d['index']}{turn}: expected {d.get('expectedTag') or 'the end of the log'}"
               f"{_at(d, 'expectedVersion', 'original')}, got {d.get('gotTag') or 'the end of the log'}"
               f"{_at(d, 'gotVersion', 'rerun')}")
        if d.get("path"):
            yield f"  field {d['path']}: expected {short(d.get('expected'), 200)}, got {short(d.get('got'), 200)}"
        else:
            yield f"  expected {short(d.get('expected'), 200)}"
            yield f"  got      {short(d.get('got'), 200)}"
    if r.get("discarded"):
        yield f"the fork {r['fork']} was discarded (--discard)"
    else:
        yield f"inspect the fork: sessionloop replay {r['fork']} --data {r['data']}"


def _at(d: dict[str, Any], key: str, label: str) -> str:
    return f" ({label} v{d[key]})" if d.get(key) is not None else ""
