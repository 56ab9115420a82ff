"""``sessionloop replay``: a session's timeline from its log, and ``--verify``.

The pure work is in ``actors/replay/`` (``timeline.py``, ``verify.py``, ``live.py``); this module
reads the store, opens a live host or asks a running server, and prints. The store is opened
read-only, so ``replay`` works while a server runs. ``replay --verify`` then also opens a live
host (and its gateway) on the data directory when it may (no server holds it, no unfinished
turn would resume) and compares with what it serves; otherwise it compares with the store only
and says why.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import click

from sessionloop.actors.api.host import Host
from sessionloop.actors.replay.live import (
    LiveUnavailable,
    LiveView,
    ask_served,
    remote_decorate,
    serve_live_view,
    served_handles_masked,
)
from sessionloop.actors.replay.timeline import Entry, build_timeline, until_version
from sessionloop.actors.replay.verify import verify as verify_log
from sessionloop.cli.client import ClientError, Endpoint, RpcFailed, connect
from sessionloop.cli.serve import TOKEN_FILE
from sessionloop.cli.session_log import (
    clock,
    data_option,
    json_option,
    open_store,
    print_json,
    read_session,
    say,
    session_id_of,
    short,
)
from sessionloop.eventstore import EventStore
from sessionloop.eventstore.errors import SessionloopError, StoreLocked

__all__ = ["replay"]


@click.command("replay")
@click.argument("session")
@data_option
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
@json_option
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
    session_id = session_id_of(session)
    if offline and not verify:
        raise click.ClickException("--offline only applies to --verify")
    if url is not None and (not verify or offline):
        raise click.ClickException("--url only applies to --verify without --offline")
    if verify and until is not None:
        raise click.ClickException("--until cannot be combined with --verify (verify checks the whole log)")
    store = open_store(data_dir, session_id)
    try:
        events = read_session(store, data_dir, session_id)
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
        print_json(timeline)
    else:
        for line in _render_timeline(timeline):
            say(line)


def _no_live_host(store: EventStore, data_dir: str) -> str | None:
    """Why no live host may be opened on ``data_dir`` for --verify, or None if one may."""
    unfinished = [s for s in store.flagged("active") if s.startswith("session-")]
    if unfinished:
        return (f"opening {data_dir} would resume {len(unfinished)} session(s) with unfinished work "
                f"(e.g. {unfinished[0]}) with this command's model")
    return None


def _verify(data_dir: str, session_id: str, stored: tuple[Any, Any, Any], why: str | None, as_json: bool,
            remote: Any = None) -> None:
    if remote is not None:  # the running server answered over the wire; the store was read beside it
        live_stored, live, reason = None, remote, None
    else:
        live_stored, live, reason = _live_view(data_dir, session_id) if why is None else (None, None, why)
    events, snapshot, meta = live_stored or stored
    report = verify_log(session_id, events, snapshot, meta, live=live)
    report.offline_reason = reason
    if as_json:
        print_json(report)
    elif report.difference is None:
        snap = "no snapshot" if report.snapshot_version is None else f"snapshot at version {report.snapshot_version}"
        if report.snapshot_note:
            snap += f" ({report.snapshot_note})"
        say(f"verified: {report.events} events, {snap}, listing record, history of {report.history_items} items")
        say(_compared_line(report, data_dir))
    else:
        d = report.difference
        where = f" (event version {d.version})" if d.version is not None else ""
        say(f"difference in the {d.check} at {d.path}{where}:")
        say(f"  expected (from the events): {short(d.expected, 300)}")
        say(f"  got (stored/served):        {short(d.got, 300)}")
        if d.note:
            say(f"  {d.note}")
        say(_compared_line(report, data_dir))
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
    """What the server at ``url`` serves for ``session_id`` (:func:`actors.replay.live.ask_served` over
    a WebSocket as the owner, through :class:`cli.client.Client` with results kept as sent): its
    ``session/subscribe`` snapshot and every ``session/history`` page, without the actor's own
    projection and state, which a server does not send; download handles masked."""
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
    try:
        host = Host.open(data_dir)
    except StoreLocked as e:
        return None, None, f"{data_dir} is in use by a running server ({e.holder})"
    except SessionloopError as e:
        return None, None, f"cannot open a live host on {data_dir}: {e}"
    try:
        stream = f"session-{session_id}"
        stored = (read_session(host.store, data_dir, session_id), host.store.load_snapshot(stream),
                  host.store.stream_meta(stream))
        service = host.protocol()
        try:
            return stored, serve_live_view(service, session_id), None
        except LiveUnavailable as e:
            return None, None, str(e)
        finally:
            service.close()
    finally:
        host.close()


def _render_timeline(tl: Any) -> Iterator[str]:
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
        yield f"  v{entry.version:<5} {clock(entry.at)}  {_entry_text(entry)}"
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
    head = f"turn {turn.number}  {turn.turn_id}{source}  {short(turn.input, 60)!r}  (v{turn.first_version}"
    if turn.ended_at is None:
        return f"{head}, {clock(turn.started_at)})  -> still running"
    outcome = f" ({turn.outcome})" if turn.outcome else ""
    return (f"{head}-v{turn.last_version}, {clock(turn.started_at)})  "
            f"-> {turn.status}{outcome} in {turn.duration_ms} ms")


def _entry_text(e: Any) -> str:
    f = e.facts
    render = _RENDER.get(e.kind)
    text = render(e, f) if render is not None else f"{e.kind} {e.what} {short(f)}"
    return text


def _duration(e: Any) -> str:
    return f"{e.duration_ms} ms" if e.duration_ms is not None else "-"


def _r_session(e: Any, f: dict[str, Any]) -> str:
    facts = " ".join(f"{k}={short(v, 60)}" for k, v in f.items() if v is not None)
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
