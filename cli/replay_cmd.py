"""``sessionloop replay / rerun / events / import``: replay-based debugging (SPEC §9).

The pure work (timeline, verification, the re-run plan and the log comparison) is in
``actors/replay/timeline.py``; this module reads the store, runs a host for ``rerun``, and prints.

* ``replay`` and ``events`` open the store read-only, so they work while a server runs.
  ``replay --verify`` then also opens a live host (and its gateway) on the data directory when
  it may (no server holds it, no unfinished turn would resume) and compares with what it serves;
  otherwise it compares with the store only and says why.
* ``rerun`` and ``import`` write (a fork, an imported stream), so they need the data directory's
  writer lock and refuse clearly (StoreLocked) while a server runs there.

It is one I/O shell for the four commands of SPEC §9 (they share the store helpers, the
renderers and the option set), hence longer than the house module size.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import click
import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.approvals.actor import ApprovalService, GateInputs
from sessionloop.actors.events import encode_event, event_from_builtins, open_store
from sessionloop.actors.gateway.service import SessionProtocolService
from sessionloop.actors.replay.timeline import (
    MemoryClient,
    override_settlement,
    replayed_settlement,
    rerun_gate,
)
from sessionloop.actors.session.actor import Ask
from sessionloop.actors.session.commands import SettingsOf
from sessionloop.cli.serve import DEFAULT_DATA
from sessionloop.eventstore import EventStore, RecordedEvent
from sessionloop.eventstore.errors import (
    EventDecodeError,
    SessionloopError,
    StorageError,
    StoreLocked,
    WrongExpectedVersion,
)

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


# --- shared helpers --------------------------------------------------------------------------------


def _session_id(text: str) -> str:
    return text.removeprefix("session-")


def _open_store(data_dir: str, session_id: str, *, readonly: bool = True) -> EventStore:
    path = os.path.join(data_dir, "store")
    if not os.path.isdir(path):
        raise click.ClickException(f"session {session_id} not found in {data_dir} (no event store there)")
    try:
        return open_store(path, readonly=readonly)
    except StoreLocked as e:
        raise click.ClickException(
            f"{data_dir} is in use by a running server ({e.holder}); this command writes and needs the "
            "writer lock: stop the server first, or copy the data directory and work on the copy") from e
    except StorageError as e:
        raise click.ClickException(f"cannot open the event store in {data_dir}: {e}") from e


def _read_session(store: EventStore, data_dir: str, session_id: str) -> list[RecordedEvent]:
    """The session's events; one clear line (ClickException) when it does not exist or was
    deleted (a deleted session's stream holds only its tombstone: there is nothing to show)."""
    try:
        events = store.read_stream(f"session-{session_id}")
        deleted = bool(events) and store.purged(f"session-{session_id}")
    except SessionloopError as e:
        raise click.ClickException(str(e)) from e
    if deleted:
        raise click.ClickException(f"session {session_id} not found in {data_dir}: it was deleted")
    if not events:
        raise click.ClickException(f"session {session_id} not found in {data_dir}")
    return events


def _print_json(value: Any) -> None:
    from sessionloop.cli.output import echo_json

    echo_json(value)


def _say(line: str) -> None:
    """One line of text output, cleaned of characters that would make it read differently."""
    from sessionloop.cli.output import clean

    click.echo(clean(line))


def _clock(at: int) -> str:
    if not at:
        return "--:--:--.---"
    return datetime.fromtimestamp(at / 1000, tz=UTC).strftime("%H:%M:%S.%f")[:-3]


def _short(value: Any, limit: int = 100) -> str:
    from sessionloop.actors.replay.timeline import excerpt, summarize_args

    return excerpt(value, limit) if isinstance(value, str) else summarize_args(value, limit)


_data_option = click.option("--data", "data_dir", default=DEFAULT_DATA, show_default=True,
                            help="Data directory (the event store is DATA/store).")
_json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")


# --- replay ------------------------------------------------------------------------------------------


@click.command("replay")
@click.argument("session")
@_data_option
@click.option("--until", metavar="TURN|EVENT", default=None,
              help="Stop after this event version (a number) or after this turn (a turn id or a unique prefix).")
@click.option("--verify", is_flag=True,
              help="Rebuild state, listing record and history from the events and compare them with what is "
                   "stored and with what a live host serves (the session actor's projection and state, "
                   "session/history pages, the session/subscribe snapshot); exit 1 on the first difference.")
@click.option("--offline", is_flag=True,
              help="With --verify: compare with the store only, without opening a live host on DATA.")
@click.option("--url", default=None, metavar="WS_URL",
              help="With --verify: ask the server running on DATA at this URL (ws://HOST:PORT/session) for its "
                   "session/subscribe snapshot and session/history pages, instead of opening a host.")
@click.option("--token", default=None, envvar="SESSIONLOOP_TOKEN",
              help="With --url: the owner token (default: SESSIONLOOP_TOKEN, else DATA/token).")
@_json_option
def replay(session: str, data_dir: str, until: str | None, verify: bool, offline: bool, url: str | None,
           token: str | None, as_json: bool) -> None:
    """Rebuild SESSION from its events and print its timeline: turns, model calls (provider, model,
    tokens, durations), tool calls (args, status, exit code, repairs), approvals, notices, context
    trimming and compaction, checkpoints and rewinds.

    Opens the store read-only: works while a server runs on the same data directory.

    --verify also opens a live host on DATA, as ``serve`` would (a new epoch; what a crash left is
    settled), and asks its gateway and session actor what they serve, unless --offline is given,
    a server holds DATA (the writer lock) or opening it would resume unfinished turns: then only
    what the store holds is compared, and the output says why.

    \b
    Examples:
      sessionloop replay 18f3a2c0d41e5b7a90c1d --data ./.sessionloop
      sessionloop replay 18f3a2c0d41e5b7a90c1d --until 42 --json
      sessionloop replay 18f3a2c0d41e5b7a90c1d --verify
      sessionloop replay 18f3a2c0d41e5b7a90c1d --verify --url ws://127.0.0.1:8765/session
    """
    from sessionloop.actors.replay.timeline import build_timeline, until_version

    session_id = _session_id(session)
    if offline and not verify:
        raise click.ClickException("--offline only applies to --verify")
    if url is not None and (not verify or offline):
        raise click.ClickException("--url only applies to --verify without --offline")
    if verify and until is not None:
        raise click.ClickException("--until cannot be combined with --verify (verify checks the whole log)")
    store = _open_store(data_dir, session_id)
    try:
        events = _read_session(store, data_dir, session_id)
        if verify:
            stream = f"session-{session_id}"
            stored = (events, store.load_snapshot(stream), store.stream_meta(stream))
            why = "--offline was given" if offline else _no_live_host(store, data_dir)
        else:
            try:
                cut = until_version(events, until)
            except ValueError as e:
                raise click.ClickException(f"{e} in session {session_id}") from e
            timeline = build_timeline(session_id, events, cut)
    finally:
        store.close()  # before a live host opens the same environment (one LMDB env per process)
    if verify:
        remote = _remote_live_view(url, token, data_dir, session_id) if url is not None else None
        _verify(data_dir, session_id, stored, why if remote is None else None, as_json, remote)
        return
    if as_json:
        _print_json(timeline)
    else:
        for line in _render_timeline(timeline):
            _say(line)


def _no_live_host(store: EventStore, data_dir: str) -> str | None:
    """Why no live host may be opened on ``data_dir`` for --verify, or None if one may."""
    unfinished = [s for s in store.flagged("active") if s.startswith("session-")]
    if unfinished:
        return (f"opening {data_dir} would resume {len(unfinished)} session(s) with unfinished work "
                f"(e.g. {unfinished[0]}) with this command's model")
    return None


def _verify(data_dir: str, session_id: str, stored: tuple[Any, Any, Any], why: str | None, as_json: bool,
            remote: Any = None) -> None:
    from sessionloop.actors.replay.timeline import verify

    if remote is not None:  # the running server answered over the wire; the store was read beside it
        live_stored, live, reason = None, remote, None
    else:
        live_stored, live, reason = _live_view(data_dir, session_id) if why is None else (None, None, why)
    events, snapshot, meta = live_stored or stored
    report = verify(session_id, events, snapshot, meta, live=live)
    report.offline_reason = reason
    if as_json:
        _print_json(report)
    elif report.difference is None:
        snap = "no snapshot" if report.snapshot_version is None else f"snapshot at version {report.snapshot_version}"
        if report.snapshot_note:
            snap += f" ({report.snapshot_note})"
        _say(f"verified: {report.events} events, {snap}, listing record, history of {report.history_items} items")
        _say(_compared_line(report, data_dir))
    else:
        d = report.difference
        where = f" (event version {d.version})" if d.version is not None else ""
        _say(f"difference in the {d.check} at {d.path}{where}:")
        _say(f"  expected (from the events): {_short(d.expected, 300)}")
        _say(f"  got (stored/served):        {_short(d.got, 300)}")
        if d.note:
            _say(f"  {d.note}")
        _say(_compared_line(report, data_dir))
    if report.difference is not None:
        sys.exit(1)


def _compared_line(report: Any, data_dir: str) -> str:
    if report.compared == "live" and report.remote_url:
        return (f"compared with the server at {report.remote_url} (epoch {report.live_epoch}): "
                f"{report.history_pages} session/history page(s), the session/subscribe snapshot of "
                f"{report.snapshot_items} items")
    if report.compared == "live":
        if report.history_pages is None:
            return f"compared with a live host on {data_dir} (epoch {report.live_epoch})"
        return (f"compared with a live host on {data_dir} (epoch {report.live_epoch}): the session actor's "
                f"projection and state, {report.history_pages} session/history page(s), the session/subscribe "
                f"snapshot of {report.snapshot_items} items")
    return f"compared offline, with the store only: {report.offline_reason or 'no live host'}"


def _remote_live_view(url: str, token: str | None, data_dir: str, session_id: str, timeout: float = 30.0) -> Any:
    """What the server at ``url`` serves for ``session_id`` (:func:`actors.replay.timeline.ask_served` over
    a WebSocket as the owner, through :class:`cli.client.Client` with results kept as sent): its
    ``session/subscribe`` snapshot and every ``session/history`` page, without the actor's own
    projection and state, which a server does not send; download handles masked."""
    import asyncio

    from sessionloop.actors.replay.timeline import (
        LiveUnavailable,
        LiveView,
        ask_served,
        remote_decorate,
        served_handles_masked,
    )
    from sessionloop.cli.client import ClientError, Endpoint, RpcFailed, connect
    from sessionloop.cli.serve import TOKEN_FILE

    if token is None:
        path = os.path.join(data_dir, TOKEN_FILE)
        token = open(path).read().strip() if os.path.exists(path) else None
    view = LiveView(session_id=session_id, decorate=remote_decorate, remote=True, remote_url=url)

    async def ask() -> None:
        async with connect(Endpoint(url=url, token=token), initialize=False) as client:
            loop = asyncio.get_running_loop()

            async def reply(method: str, params: dict[str, Any]) -> dict[str, Any]:
                try:
                    return {"result": await asyncio.wait_for(client.call(method, params, plain=True), timeout)}
                except RpcFailed as e:
                    return {"error": e.error}

            def call(method: str, params: dict[str, Any]) -> dict[str, Any]:
                return asyncio.run_coroutine_threadsafe(reply(method, params), loop).result()

            # ask_served is synchronous: it runs on a thread, its requests on this loop
            await asyncio.to_thread(ask_served, call, view, served_handles_masked)

    try:
        asyncio.run(ask())
    except (ClientError, LiveUnavailable) as e:
        raise click.ClickException(str(e)) from None
    except (TimeoutError, OSError) as e:
        raise click.ClickException(f"the server at {url} did not answer: {e or type(e).__name__}") from None
    return view


def _live_view(data_dir: str, session_id: str) -> tuple[Any, Any, str | None]:
    """``(stored, live view, None)`` from a host opened on ``data_dir`` (the events, snapshot and
    listing record re-read under its writer lock), or ``(None, None, why not)``."""
    from sessionloop.actors.api.host import Host
    from sessionloop.actors.gateway.service import SessionProtocolService
    from sessionloop.actors.replay.timeline import LiveUnavailable, serve_live_view

    try:
        host = Host.open(data_dir)
    except StoreLocked as e:
        return None, None, f"{data_dir} is in use by a running server ({e.holder})"
    except SessionloopError as e:
        return None, None, f"cannot open a live host on {data_dir}: {e}"
    try:
        stream = f"session-{session_id}"
        stored = (_read_session(host.store, data_dir, session_id), host.store.load_snapshot(stream),
                  host.store.stream_meta(stream))
        service = SessionProtocolService(host.rt, host=host)
        try:
            return stored, serve_live_view(service, session_id), None
        except LiveUnavailable as e:
            return None, None, str(e)
        finally:
            service.close()
    finally:
        host.close()


def _render_timeline(tl: Any) -> Iterator[str]:
    from sessionloop.actors.replay.timeline import Entry

    title = f' "{tl.title}"' if tl.title else ""
    cut = f", until version {tl.until}" if tl.until is not None else ""
    yield (f"session {tl.session_id}{title} ({tl.kind}, {tl.status}{', deleted' if tl.deleted else ''}): "
           f"{tl.events} events, {len(tl.turns)} turns{cut}")
    if tl.created_at:
        created = datetime.fromtimestamp(tl.created_at / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
        yield f"created {created} UTC (times below are UTC)"
    if tl.forked_from:
        yield f"forked from {tl.forked_from}"
    turns = {t.turn_id: t for t in tl.turns}
    entries: list[Entry] = tl.entries
    for i, entry in enumerate(entries):
        if entry.kind == "input" and entry.what == "accepted" and _opens_next(entries, i):
            continue  # the turn line shows it
        if entry.kind == "turn" and entry.what == "started":
            yield ""
            yield _turn_line(turns.get(entry.turn_id or ""), entry)
            continue
        yield f"  v{entry.version:<5} {_clock(entry.at)}  {_entry_text(entry)}"
    model_calls = sum(t.model_calls for t in tl.turns)
    tool_calls = sum(t.tool_calls for t in tl.turns)
    tokens_in = sum(t.prompt_tokens for t in tl.turns)
    tokens_out = sum(t.completion_tokens for t in tl.turns)
    yield ""
    yield (f"totals: {len(tl.turns)} turns, {model_calls} model calls ({tokens_in} prompt + {tokens_out} "
           f"completion tokens), {tool_calls} tool calls")


def _opens_next(entries: list[Any], i: int) -> bool:
    nxt = entries[i + 1] if i + 1 < len(entries) else None
    return (nxt is not None and nxt.kind == "turn" and nxt.what == "started"
            and nxt.version == entries[i].version + 1)


def _turn_line(turn: Any, entry: Any) -> str:
    if turn is None:
        return f"turn ? {entry.turn_id}"
    source = f" [{turn.source}]" if turn.source else ""
    head = f"turn {turn.number}  {turn.turn_id}{source}  {_short(turn.input, 60)!r}  (v{turn.first_version}"
    if turn.ended_at is None:
        return f"{head}, {_clock(turn.started_at)})  -> still running"
    outcome = f" ({turn.outcome})" if turn.outcome else ""
    return (f"{head}-v{turn.last_version}, {_clock(turn.started_at)})  "
            f"-> {turn.status}{outcome} in {turn.duration_ms} ms")


def _entry_text(e: Any) -> str:
    f = e.facts
    render = _RENDER.get(e.kind)
    text = render(e, f) if render is not None else f"{e.kind} {e.what} {_short(f)}"
    return text


def _duration(e: Any) -> str:
    return f"{e.duration_ms} ms" if e.duration_ms is not None else "-"


def _r_session(e: Any, f: dict[str, Any]) -> str:
    facts = " ".join(f"{k}={_short(v, 60)}" for k, v in f.items() if v is not None)
    return f"session {e.what}  {facts}".rstrip()


def _r_input(e: Any, f: dict[str, Any]) -> str:
    if e.what == "dropped":
        return f"input dropped  {f.get('inputId')}  ({f.get('reason')})"
    source = f" [{f['source']}]" if f.get("source") else ""
    return f"input queued{source}  {f.get('text', '')!r}"


def _r_turn(e: Any, f: dict[str, Any]) -> str:
    if e.status == "completed":
        return f"turn ended  {e.status} ({f.get('outcome')})  output {f.get('output', '')!r}"
    return f"turn ended  {e.status}  {f.get('code') or ''} {f.get('reason') or ''}".rstrip()


def _r_model(e: Any, f: dict[str, Any]) -> str:
    who = f"{f.get('provider') or '?'}/{f.get('model') or '?'}"
    if e.status == "running":
        return f"model call  (no answer recorded)  step {f.get('stepId')}"
    step = f"  [{f['stepId']}]" if f.get("stepId") else ""  # what --override-tool names a model step by
    if e.status in ("failed", "aborted"):
        return f"model call  {e.status} after {_duration(e)}: {f.get('error')}{step}"
    tokens = f"{f.get('promptTokens', 0)} prompt + {f.get('completionTokens', 0)} completion tokens"
    answer = f"tool calls: {', '.join(f['toolCalls'])}" if f.get("toolCalls") else repr(f.get("text", ""))
    reasoning = f"  (reasoning {f['reasoning']!r})" if f.get("reasoning") else ""
    return f"model call  {who}  {tokens}  {_duration(e)}  -> {answer}{reasoning}{step}"


def _r_tool(e: Any, f: dict[str, Any]) -> str:
    parts = [f"tool call  {f.get('tool')} {f.get('args', '')}".rstrip(), f"[{f.get('callId')}]", e.status or "?"]
    if "exitCode" in f:
        parts.append(f"exit {f['exitCode']}")
    if "repair" in f:
        parts.append(f"repair: {f['repair']}")
    if "approval" in f:
        parts.append(f"approval: {f['approval']}")
    if "taskId" in f:
        parts.append(f"background task {f['taskId']}")
    parts.append(_duration(e))
    out = f"  -> {f['output']}" if "output" in f else ""
    return "  ".join(parts) + out


def _r_approval(e: Any, f: dict[str, Any]) -> str:
    if e.status == "pending":
        return f"approval requested for {f.get('callId')}  ({f.get('approvalId')}): not settled"
    by = f" by {f['by']}" if f.get("by") else ""
    return (f"approval for {f.get('callId')}  ({f.get('approvalId')}): {f.get('settlement')} "
            f"({f.get('source')}){by} after {_duration(e)}")


def _r_context(e: Any, f: dict[str, Any]) -> str:
    if e.what == "trimmed":
        return (f"context trimmed  {f['charsBefore']} -> {f['charsAfter']} chars, {f['omittedOutputs']} outputs "
                f"omitted, {f['droppedTurns']} turns dropped")
    if e.what == "compacted":
        how = "auto" if f.get("auto") else "manual"
        return f"context compacted ({how})  {f['turns']} turns into {f['chars']} chars: {f['summary']!r}"
    return f"context compaction failed ({'auto' if f.get('auto') else 'manual'}): {f.get('error')}"


def _r_checkpoint(e: Any, f: dict[str, Any]) -> str:
    before = f"existed, {f.get('bytes', 0)} bytes" if f.get("existed") else "new file"
    return f"checkpoint  {f.get('path')} ({before})  [{f.get('callId')}]"


def _r_rewind(e: Any, f: dict[str, Any]) -> str:
    chat = f", {f['deletedMessages']} messages deleted" if f.get("chatDeleted") else ""
    return (f"rewind ({e.what}) to before turn {e.turn_id}: restored {f['restored']}, removed {f['removed']}, "
            f"conflicts {f['conflicts']}{chat}")


_RENDER: dict[str, Any] = {
    "session": _r_session,
    "input": _r_input,
    "turn": _r_turn,
    "model": _r_model,
    "tool": _r_tool,
    "approval": _r_approval,
    "notice": lambda e, f: f"notice [{f.get('topic')}]  {f.get('text', '')!r}" + (
        "  (can continue)" if f.get("canContinue") else ""),
    "plan": lambda e, f: f"plan {e.what}  {'; '.join(f.get('entries', []))}".rstrip(),
    "context": _r_context,
    "checkpoint": _r_checkpoint,
    "rewind": _r_rewind,
    "artifact": lambda e, f: f"artifact  {f.get('name')} at {f.get('path')} ({f.get('size')} bytes, {f.get('mime')})",
    "unknown": lambda e, f: f"unknown event {f.get('type')} (kept, skipped by this release)",
}


# --- rerun -------------------------------------------------------------------------------------------


class _ReplayAnswers:
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
        from sessionloop.actors.model import ModelError, ModelResponse

        if not request.tools:
            return self._summary(ModelError, ModelResponse)
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

    def _summary(self, error: Any, response: Any) -> Any:
        if not self.summaries:
            raise error("replay: the re-run asked for a summary the recording does not have")
        recorded = self.summaries.pop(0)
        if isinstance(recorded, E.ContextCompactFailed):
            raise error(recorded.error)
        assert isinstance(recorded, E.ContextCompacted)
        return response(text=recorded.summary, provider="replay")


class _ModelOverrides:
    """The provider of a rerun with ``--override-tool`` on model steps: the model call a step
    names (by re-run turn and its number within the turn) gets the given answer, or fails with
    its ``error``; every other call goes to ``inner`` (which, replaying, skips the recording of
    the overridden call)."""

    def __init__(self, inner: Any, job: _Rerun) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", "override")
        self.job = job
        self.calls: dict[int, int] = {}  # re-run turn -> model calls made in it

    async def generate(self, request: Any, on_delta: Any) -> Any:
        from sessionloop.actors.model import ModelError, ModelResponse
        from sessionloop.actors.model.base import stream_now

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


class _Override(msgspec.Struct, kw_only=True):
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


class _RecordedApprovals(ApprovalService):
    """The approvals of a rerun's fork, answered from the recording (SPEC §9), as the model's
    answers and the tools' results are: each call that needs one meets the gate the recording
    says it met (asked; or settled at once by a grant, ``absent``, ``rate-limit``:
    :func:`actors.replay.timeline.rerun_gate`), and an approval the fork asks for is answered at once
    with the recorded settlement (a grant it made lasting as long as it did) or with the
    ``--override-approval`` answer, which wins over a recorded grant. Nobody is asked: no
    approval actor, push or approval stream. Sessions other than the fork keep the real rules."""

    def __init__(self, job: _Rerun) -> None:
        super().__init__(job.rt, job.rt.approvals.timing)
        self.job = job

    def _is_fork(self, session_id: str) -> bool:
        return self.job.fork is not None and session_id == self.job.fork.id

    def gate(self, session_id: str, call_id: str) -> GateInputs:
        if not self._is_fork(session_id):
            return super().gate(session_id, call_id)
        key = (self.job.current_turn, call_id)
        return rerun_gate(self.job.plan.approvals.get(key), key in self.job.approval_overrides)

    def open(self, session_actor: Any, event: E.ToolApprovalRequested) -> None:
        if not self._is_fork(session_actor.sid):
            super().open(session_actor, event)
            return
        asked = _Asked(id=event.approval_id, session_id=session_actor.sid, turn_id=event.turn_id,
                       call_id=event.call_id)
        self.rt.approval_settled(asked, self.job.approval_answer(event.call_id))


class _Rerun:
    """One ``rerun``: fork, re-send the later inputs turn by turn, compare after each turn."""

    def __init__(self, host: Any, plan: Any, events: list[RecordedEvent], *, provider: str, tools: str,
                 overrides: list[_Override], timeout: float) -> None:
        self.host, self.rt, self.plan, self.events = host, host.rt, plan, events
        self.provider_name, self.tools_mode, self.timeout = provider, tools, timeout
        self.overrides = {(o.turn, o.call_id): o for o in overrides if o.kind == "tool"}
        self.model_overrides = {(o.turn, o.call): o for o in overrides if o.kind == "model"}
        self.approval_overrides = {(o.turn, o.call_id): o for o in overrides if o.kind == "approval"}
        self.current_turn = 0
        self.fork: Any = None
        self.gateway: Any = None  # the host's protocol service: the settings layers, session/delete
        self.client: Any = None  # an owner connection to it
        self.fork_workspace: Any = None
        self.original_workspace: Any = None
        self.shared_workspace = False
        self.problems: list[str] = []

    # setup

    def prepare(self) -> None:
        from sessionloop.actors.model import ReplayProvider, make_provider

        original = self._original_state()
        self.shared_workspace = bool(original.created and original.created.cwd)
        if self.shared_workspace and self.tools_mode == "live":
            raise click.ClickException(
                f"session {self.plan.session_id} works in its own directory ({original.created.cwd}); "
                "--tools live would change it: use --tools replay")
        if self.provider_name == "replay":
            provider: Any = _ReplayAnswers(ReplayProvider(self.plan.answers), self.plan.model_calls,
                                            self.plan.summaries)
        else:
            provider = make_provider(self.provider_name)
        if self.model_overrides:
            provider = _ModelOverrides(provider, self)
        self.rt.set_provider(provider)
        self.rt.set_approvals(_RecordedApprovals(self))
        if self.tools_mode == "replay" or self.overrides:
            self._install_tools()
        # the settings layers resolve as on a server (config.toml, places, the session layer)
        self.gateway = SessionProtocolService(self.rt, host=self.host)
        self.client = MemoryClient(self.gateway, self.timeout)
        self.client.initialize("sessionloop-rerun")

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.gateway is not None:
            self.gateway.close()

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

    def _original_state(self) -> Any:
        from sessionloop.actors.replay.timeline import fold_events

        return fold_events(self.plan.session_id, self.events)

    def _install_tools(self) -> None:
        registry = self.rt.tools
        for name in registry.names():
            spec = registry.get(name)
            registry.register(dataclasses.replace(spec, handler=self._handler(spec)), replace=True)

    def _handler(self, spec: Any) -> Any:
        from sessionloop.actors.tools import ToolResult

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
        from sessionloop.actors.tools import ToolResult

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

    def _seed_workspace(self) -> None:
        """The fork starts with the files as they were before the first re-run turn: a copy of
        the original's workspace with that turn's and later turns' changes undone (checkpoints)."""
        from sessionloop.actors.session.checkpoints import restore_before

        original = self._original_state()
        self.original_workspace = self.rt.workspace(original)
        if self.shared_workspace:
            return
        self.fork_workspace = self.rt.workspace(self.fork.snapshot())
        if self.original_workspace.exists():  # a session whose tools never wrote has none
            shutil.copytree(self.original_workspace.root, self.fork_workspace.root, symlinks=True, dirs_exist_ok=True)
        if self.plan.turns:
            _, _, conflicts = restore_before(original, self.plan.turns[0].turn_id, self.fork_workspace)
            self.problems.extend(f"could not restore {p} in the fork's workspace" for p in conflicts)

    # run

    def run(self, show_progress: bool) -> dict[str, Any]:
        from sessionloop.actors.replay.timeline import comparable, compare_logs

        plan = self.plan
        title = f"rerun of {plan.session_id} from turn {plan.from_turn}"
        self.fork = self.host.fork(plan.session_id, turns=plan.from_turn, title=title)
        self._seed_workspace()
        numbers = {t.turn_id: t.number for t in plan.turns}
        loose = self._loose()
        new_ids: set[str] = set()
        divergence: Any = None
        relaxed: list[Any] = []
        got: list[Any] = []
        sent = 0
        with click.progressbar(plan.turns, label="re-running turns", file=sys.stderr,
                               hidden=not show_progress) as turns:
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

    def _send(self, turn: Any) -> str:
        self.current_turn = turn.number
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
            raise click.ClickException(f"re-run turn {turn.number} did not end within {self.timeout:g} s "
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
                                     f"{_short(wanted.get(key))}: {reply['error'].get('message')}")

    def discard(self) -> None:
        """Delete the fork (``session/delete``, as an owner would) and the workspace the rerun made."""
        reply = self.client.call("session/delete", {"sessionId": self.fork.id})
        if "error" in reply:
            raise click.ClickException(f"--discard: the fork {self.fork.id} could not be deleted: "
                                       f"{reply['error'].get('message')}")
        if self.fork_workspace is not None and not self.shared_workspace:
            shutil.rmtree(self.fork_workspace.root, ignore_errors=True)

    def _loose(self) -> dict[int, frozenset[str]]:
        loose: dict[int, frozenset[str]] = {}
        numbers = {t.turn_id: t.number for t in self.plan.turns}
        overridden_steps = {o.step_id for o in self.model_overrides.values()}
        for i, (turn_id, rec) in enumerate(self.plan.expected):
            e = rec.event
            key = (numbers.get(turn_id), getattr(e, "call_id", None))
            if isinstance(e, E.ToolFinished) and key in self.overrides:
                loose[i] = frozenset({"output", "status", "exit_code"})
            elif isinstance(e, (E.LlmCompleted, E.LlmFailed)) and e.step_id in overridden_steps:
                loose[i] = frozenset({"text", "reasoning", "tool_calls", "usage", "model", "provider", "error"})
            elif isinstance(e, (E.ToolApprovalSettled, E.ToolFinished)) and key in self.approval_overrides:
                loose[i] = frozenset({"settlement", "output", "status", "exit_code"})
        return loose


def _parse_overrides(plan: Any, values: tuple[str, ...]) -> list[_Override]:
    from sessionloop.actors.replay.timeline import parse_model_answer

    out: list[_Override] = []
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
            override = _Override(step=step, kind="tool", turn=ref.turn, call_id=ref.call_id, tool=ref.tool,
                                 output=output)
        else:
            try:
                answer = parse_model_answer(output)
            except ValueError as e:
                raise click.ClickException(f"--override-tool {step} (model call {ref.step_id}): {e}") from e
            override = _Override(step=step, kind="model", turn=ref.turn, step_id=ref.step_id, call=ref.call,
                                 answer=answer, recorded=ref.recorded)
        same = [o for o in out if (o.kind, o.turn, o.call_id, o.call) == (override.kind, override.turn,
                                                                          override.call_id, override.call)]
        if same:
            raise click.ClickException(f"--override-tool {step}: the same step as --override-tool {same[0].step}")
        out.append(override)
    return out


def _parse_approval_overrides(plan: Any, values: tuple[str, ...]) -> list[_Override]:
    out: list[_Override] = []
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
        out.append(_Override(step=ref, kind="approval", turn=found.turn, call_id=found.call_id, tool=found.tool,
                             decision=decision, approval_id=found.approval_id,
                             recorded=f"{s.state} ({s.source})" if s is not None else "never settled"))
    return out


def _other_unfinished(data_dir: str, session_id: str) -> list[str]:
    """Sessions with unfinished work (an interrupted turn, queued inputs): opening a host on the
    data directory resumes them, and a rerun must run no turn but its own, with its own model."""
    store = _open_store(data_dir, session_id)
    try:
        return [s for s in store.flagged("active") if s.startswith("session-") and s != f"session-{session_id}"]
    finally:
        store.close()


def _open_rerun_host(data_dir: str, max_steps: int | None) -> Any:
    from sessionloop.actors.api.host import Host
    from sessionloop.actors.system.runtime import HostOptions

    try:
        steps = HostOptions().max_steps if max_steps is None else max_steps  # 0: unlimited
        return Host.open(data_dir, durability="sync", max_steps=steps)
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
@_data_option
@_json_option
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
    from sessionloop.actors.replay.timeline import plan_rerun

    session_id = _session_id(session)
    if not os.path.isdir(os.path.join(data_dir, "store")):
        raise click.ClickException(f"session {session_id} not found in {data_dir} (no event store there)")
    try:
        plan = plan_rerun(session_id, _read_readonly(data_dir, session_id), from_turn)
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    parsed = _parse_overrides(plan, overrides) + _parse_approval_overrides(plan, approval_overrides)
    unfinished = _other_unfinished(data_dir, session_id)
    if unfinished:
        raise click.ClickException(
            f"{len(unfinished)} other session(s) in {data_dir} have unfinished work (e.g. {unfinished[0]}) "
            "that opening the directory would resume with the rerun's model; start the server once to let them "
            "finish, or rerun on a copy of the directory")
    host = _open_rerun_host(data_dir, plan.max_steps)
    try:
        events = _read_session(host.store, data_dir, session_id)
        plan = plan_rerun(session_id, events, from_turn)  # again, under the writer lock
        parsed = _parse_overrides(plan, overrides) + _parse_approval_overrides(plan, approval_overrides)
        job = _Rerun(host, plan, events, provider=provider, tools=tools_mode, overrides=parsed, timeout=timeout)
        try:
            job.prepare()
            outcome = job.run(show_progress=not as_json and sys.stderr.isatty())
            if discard:
                job.discard()
        finally:
            job.close()
    finally:
        host.close()
    report = _rerun_report(job, outcome, parsed, provider, tools_mode, data_dir)
    report["discarded"] = discard
    if as_json:
        _print_json(report)
    else:
        for line in _render_rerun(report):
            _say(line)
    if report["divergence"] is not None and not parsed:
        sys.exit(1)


def _read_readonly(data_dir: str, session_id: str) -> list[RecordedEvent]:
    """The session's events through a read-only store, closed again at once: an unknown session
    or a bad ``--from-turn`` is reported even while a server runs."""
    store = _open_store(data_dir, session_id)
    try:
        return _read_session(store, data_dir, session_id)
    finally:
        store.close()


def _rerun_report(job: _Rerun, outcome: dict[str, Any], overrides: list[_Override], provider: str, tools: str,
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


def _override_json(o: _Override) -> dict[str, Any]:
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
                   f"{_short(o['output'])}")
        elif o["kind"] == "approval":
            yield (f"override: approval {o['approvalId']} ({o['tool']} call {o['callId']}, re-run turn "
                   f"{o['turn']}) answered {o['decision']} (recorded: {o['recorded']})")
        else:
            yield (f"override: model call {o['call']} of re-run turn {o['turn']} (step {o['stepId']}) answered "
                   f"with {_short(o['answer'])}")
    for d in r["overrideChanges"]:
        yield (f"  changed by the override: event {d['index']} ({d.get('expectedTag')}, original "
               f"v{d.get('expectedVersion')}) {d.get('path')}: {_short(d.get('expected'))} -> {_short(d.get('got'))}")
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
            yield f"  field {d['path']}: expected {_short(d.get('expected'), 200)}, got {_short(d.get('got'), 200)}"
        else:
            yield f"  expected {_short(d.get('expected'), 200)}"
            yield f"  got      {_short(d.get('got'), 200)}"
    if r.get("discarded"):
        yield f"the fork {r['fork']} was discarded (--discard)"
    else:
        yield f"inspect the fork: sessionloop replay {r['fork']} --data {r['data']}"


def _at(d: dict[str, Any], key: str, label: str) -> str:
    return f" ({label} v{d[key]})" if d.get(key) is not None else ""


# --- events and import -------------------------------------------------------------------------------


@click.command("events")
@click.argument("session")
@_data_option
@_json_option
def events(session: str, data_dir: str, as_json: bool) -> None:
    """Print the raw events of SESSION; with --json as JSON lines, one object per event with its
    stream, version, position, commit time and the event in the codec's JSON form (the input of
    ``sessionloop import``). Opens the store read-only.

    \b
    Examples:
      sessionloop events 18f3a2c0d41e5b7a90c1d
      sessionloop events 18f3a2c0d41e5b7a90c1d --json > session.jsonl
    """
    from sessionloop.eventstore.codec import event_to_builtins

    session_id = _session_id(session)
    store = _open_store(data_dir, session_id)
    try:
        recorded = _read_session(store, data_dir, session_id)
        if as_json:
            from sessionloop.cli.output import echo_json_line

            for line in store.export_jsonl(f"session-{session_id}"):
                echo_json_line(msgspec.json.decode(line))
            return
    finally:
        store.close()
    for rec in recorded:
        body = event_to_builtins(rec.event)
        tag = body.pop("type", "?")
        body.pop("at", None)
        _say(f"v{rec.version:<5} pos {rec.position:<7} {_clock(rec.at)}  {tag:<26} {_short(body, 110)}")


class _ImportLine(msgspec.Struct):
    event: dict[str, Any]
    stream: str | None = None
    version: int | None = None


_line_decoder = msgspec.json.Decoder(_ImportLine)


def _parse_import(text: str, as_id: str | None) -> tuple[str, list[E.Event | E.UnknownEvent]]:
    """Validate every line; returns the target session id and the events. Raises ClickException
    naming the first bad line, before anything is written."""
    stream: str | None = None
    out: list[E.Event | E.UnknownEvent] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = _line_decoder.decode(line)
            event = event_from_builtins(item.event)
        except msgspec.DecodeError as e:
            raise click.ClickException(f"line {number}: not an exported event: {e}") from e
        except EventDecodeError as e:
            raise click.ClickException(f"line {number}: {e.args[0].split(': ', 1)[-1]}") from e
        if item.stream is not None:
            if stream is None:
                stream = item.stream
            elif item.stream != stream:
                raise click.ClickException(f"line {number}: stream {item.stream}, but the file started with {stream} "
                                           "(one session per file)")
        if not out and not isinstance(event, E.SessionCreated):
            raise click.ClickException(f"line {number}: the first event must be session.created, "
                                       f"got {E.event_tag(event)}")
        if item.version is not None and item.version != len(out) + 1:
            raise click.ClickException(f"line {number}: version {item.version}, expected {len(out) + 1}")
        out.append(event)
    if not out:
        raise click.ClickException("the file holds no events")
    if as_id is None and (stream is None or not stream.startswith("session-")):
        raise click.ClickException("the file names no session stream; give the new session id with --as")
    session_id = as_id if as_id is not None else _session_id(stream or "")
    if not _ID.match(session_id):
        raise click.ClickException(f"invalid session id {session_id!r}: use letters, digits, '.', '_' and '-'")
    first = out[0]
    assert isinstance(first, E.SessionCreated)
    out[0] = msgspec.structs.replace(first, session_id=session_id)
    return session_id, out


@click.command("import")
@click.argument("file", type=click.File("r", encoding="utf-8"))
@_data_option
@click.option("--as", "as_id", default=None, metavar="SESSION_ID",
              help="Import under this session id (default: the id in the file).")
def import_events(file: Any, data_dir: str, as_id: str | None) -> None:
    """Load a session exported with ``sessionloop events --json`` into a new stream.

    Every line is checked first; on a bad line nothing is written and the error names the line.
    An existing session id is refused (import it again with --as). Needs the writer lock.

    \b
    Examples:
      sessionloop events 18f3a2c0d41e5b7a90c1d --json > s.jsonl
      sessionloop import s.jsonl --data ./other --as copy-of-s
    """
    from sessionloop.actors.replay.timeline import fold_events
    from sessionloop.actors.views.summary import encode_summary_record, summary_record

    session_id, parsed = _parse_import(file.read(), as_id)
    state = fold_events(session_id, parsed)
    payloads = [e.raw if isinstance(e, E.UnknownEvent) else encode_event(e) for e in parsed]
    os.makedirs(os.path.join(data_dir, "store"), exist_ok=True)
    store = _open_store(data_dir, session_id, readonly=False)
    stream = f"session-{session_id}"
    try:
        if store.stream_version(stream) > 0:
            raise click.ClickException(
                f"session {session_id} already exists in {data_dir}; choose another id with --as")
        store.append(stream, [msgspec.Raw(p) for p in payloads], expected_version=0,
                     meta=encode_summary_record(summary_record(state)),
                     flags={"active": bool(state.current_turn or state.queue)})
    except WrongExpectedVersion as e:
        raise click.ClickException(f"session {session_id} already exists in {data_dir}; choose another id with --as") \
            from e
    finally:
        store.close()
    click.echo(f"imported {len(parsed)} events as session {session_id} into {data_dir}")


__all__ = ["events", "import_events", "replay", "rerun"]
