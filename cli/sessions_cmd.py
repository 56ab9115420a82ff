"""``sessionloop sessions ls|show|new|rename|archive|unarchive|delete``, ``watch`` and ``send``.

Each command is one short conversation with the server (``cli.client``): connect, initialize,
a call or two, print (``cli.output``). SESSION arguments accept an id, a unique id prefix or a
unique title (``client.resolve_session``). Errors are one line and exit 1 (``cli.main.CleanErrors``).

``send`` takes the idempotent path (``loop/send`` with ``--key``, the Session Loop API) when the token is an
app's; the owner has no loop identity (the gateway answers ``forbidden``), so the owner's ``send`` is
``turn/send`` and ``--key`` is only reported.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from sessionloop.cli.client import (
    Client,
    ClientError,
    Endpoint,
    connect,
    connection_options,
    resolve_session,
    run,
)
from sessionloop.cli.output import (
    SESSION_HEADERS,
    approval_line,
    clean,
    echo_json,
    echo_json_line,
    echo_table,
    fmt_clock,
    session_row,
    session_status,
    summary_lines,
    timeline,
)
from sessionloop.cli.session_view import SessionView, subscribe, wait_for_turn
from sessionloop.protocol.schemas import (
    HistoryResult,
    LoopSendResult,
    LoopWaitForTurnResult,
    SessionsChanged,
    SessionsListResult,
    SessionSummary,
    SubscribeResult,
)

__all__ = ["send", "sessions", "watch"]

PAGE: int = 200  # the largest page sessions/list gives


@click.group("sessions")
def sessions() -> None:
    """List, inspect and manage sessions.

    SESSION is an id, a unique id prefix, or a unique title.

    \b
    Examples:
      sessionloop sessions ls
      sessionloop sessions show 1a2266
      sessionloop sessions rename 1a2266 "release notes"
    """


# --- ls -------------------------------------------------------------------------------------------


async def _list(endpoint: Endpoint, archived: bool, query: str | None, limit: int | None) -> list[SessionSummary]:
    found: list[SessionSummary] = []
    params: dict[str, Any] = {"limit": PAGE}
    if archived:
        params["archived"] = True
    if query:
        params["query"] = query
    async with connect(endpoint) as client:
        while limit is None or len(found) < limit:
            page: SessionsListResult = await client.call("sessions/list", params)
            found.extend(page.sessions)
            if page.next_cursor is None:
                break
            params["cursor"] = page.next_cursor
    return found[:limit] if limit is not None else found


@sessions.command("ls")
@click.option("--archived", is_flag=True, help="List archived sessions instead.")
@click.option("--query", "-q", help="Only sessions whose name, title or id contains Q (any case).")
@click.option("--limit", type=click.IntRange(min=1), help="At most this many sessions (default: all).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of session summaries.")
@connection_options
def ls(archived: bool, query: str | None, limit: int | None, as_json: bool, endpoint: Endpoint) -> None:
    """List root sessions: the ones needing you first, then by last activity.

    \b
    Examples:
      sessionloop sessions ls
      sessionloop sessions ls --archived --query notes
      sessionloop sessions ls --json | jq -r '.[].id'
    """
    found = run(_list(endpoint, archived, query, limit))
    if as_json:
        echo_json(found)
    elif not found:
        click.echo("no archived sessions" if archived else "no sessions (start one with `sessionloop chat`)",
                   err=True)
    else:
        echo_table(SESSION_HEADERS, (session_row(s) for s in found))


# --- show -----------------------------------------------------------------------------------------


async def _show(endpoint: Endpoint, ref: str, everything: bool) -> tuple[SubscribeResult, list[Any]]:
    async with connect(endpoint) as client:
        session_id = await resolve_session(client, ref)
        snapshot = await subscribe(client, session_id)
        items = list(snapshot.items)
        before = snapshot.before
        while everything and before is not None:
            older: HistoryResult = await client.call("session/history", {"sessionId": session_id, "before": before})
            items[:0] = older.items
            before = older.before
        await client.call("session/unsubscribe", {"sessionId": session_id})
    return snapshot, items


@sessions.command("show")
@click.argument("session")
@click.option("--all", "everything", is_flag=True, help="Page back through the whole history.")
@click.option("--json", "as_json", is_flag=True, help="Print {session, items, approvals} as JSON.")
@connection_options
def show(session: str, everything: bool, as_json: bool, endpoint: Endpoint) -> None:
    """Show a session's summary and its latest conversation (the subscribe snapshot).

    \b
    Examples:
      sessionloop sessions show 1a2266
      sessionloop sessions show "release notes" --all
      sessionloop sessions show 1a2266 --json | jq '.items | length'
    """
    snapshot, items = run(_show(endpoint, session, everything))
    if as_json:
        echo_json({"session": snapshot.session, "items": items, "approvals": snapshot.approvals,
                   "epoch": snapshot.epoch, "seq": snapshot.seq})
        return
    for line in summary_lines(snapshot.session):
        click.echo(line)
    if snapshot.before is not None and not everything:
        click.echo("  (older history not shown: --all)")
    lines = timeline(items)
    if lines:
        click.echo()
        for line in lines:
            click.echo(line)
    for approval in snapshot.approvals:
        click.echo(approval_line(approval))


# --- create, rename, archive, unarchive, delete ---------------------------------------------------


async def _create(endpoint: Endpoint, name: str | None) -> SessionSummary:
    async with connect(endpoint) as client:
        created = await client.call("session/create", {"name": name} if name else {})
        summary: SessionSummary = created.session
        return summary


@sessions.command("new")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the new session's summary as JSON.")
@connection_options
def new(name: str | None, as_json: bool, endpoint: Endpoint) -> None:
    """Create a session and print its id.

    \b
    Examples:
      sessionloop sessions new "release notes"
      SID=$(sessionloop sessions new)
    """
    summary = run(_create(endpoint, name))
    if as_json:
        echo_json(summary)
    else:
        click.echo(summary.id)


async def _on_session(endpoint: Endpoint, ref: str, method: str, **params: Any) -> str:
    async with connect(endpoint) as client:
        session_id = await resolve_session(client, ref)
        await client.call(method, {"sessionId": session_id, **params})
        return session_id


@sessions.command("rename")
@click.argument("session")
@click.argument("title")
@connection_options
def rename(session: str, title: str, endpoint: Endpoint) -> None:
    """Set a session's title.

    \b
    Example:
      sessionloop sessions rename 1a2266 "release notes"
    """
    session_id = run(_on_session(endpoint, session, "session/rename", title=title))
    click.echo(f"renamed {session_id} to \"{clean(title)}\"")


@sessions.command("archive")
@click.argument("session")
@connection_options
def archive(session: str, endpoint: Endpoint) -> None:
    """Archive a session and its child sessions (they leave `sessions ls`; see --archived).

    \b
    Example:
      sessionloop sessions archive 1a2266
    """
    session_id = run(_on_session(endpoint, session, "session/archive"))
    click.echo(f"archived {session_id} (with its child sessions)")


@sessions.command("unarchive")
@click.argument("session")
@connection_options
def unarchive(session: str, endpoint: Endpoint) -> None:
    """Bring an archived session (and its child sessions) back to the list.

    \b
    Example:
      sessionloop sessions unarchive 1a2266
    """
    session_id = run(_on_session(endpoint, session, "session/unarchive"))
    click.echo(f"unarchived {session_id}")


async def _find(endpoint: Endpoint, ref: str) -> SessionSummary:
    async with connect(endpoint) as client:
        session_id = await resolve_session(client, ref)
        snapshot = await subscribe(client, session_id)  # not-found here, before asking anything
        await client.call("session/unsubscribe", {"sessionId": session_id})
        return snapshot.session


@sessions.command("delete")
@click.argument("session")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@connection_options
def delete(session: str, yes: bool, endpoint: Endpoint) -> None:
    """Delete a session with its child sessions and their history. Asks first unless --yes.

    \b
    Examples:
      sessionloop sessions delete 1a2266
      sessionloop sessions delete 1a2266 --yes
    """
    summary = run(_find(endpoint, session))
    if not yes:
        what = f"and its {summary.child_count} child sessions, with their" if summary.child_count else "with its"
        if not click.confirm(f"Delete session {summary.id} \"{clean(summary.title)}\" {what} history?"):
            click.echo("not deleted", err=True)
            sys.exit(1)
    session_id = run(_on_session(endpoint, summary.id, "session/delete"))
    click.echo(f"deleted {session_id}")


# --- watch ----------------------------------------------------------------------------------------


def _print_change(change: SessionsChanged) -> None:
    now = fmt_clock(int(time.time() * 1000))
    for s in change.upserts:
        click.echo(f"{now}  upsert   {s.id}  {clean(s.title)}  [{session_status(s)}]")
    for session_id in change.removes:
        click.echo(f"{now}  removed  {session_id}")


async def _watch(endpoint: Endpoint, as_json: bool, count: int | None) -> None:
    async with connect(endpoint) as client:
        await client.call("sessions/watch")
        click.echo(f"watching sessions on {endpoint.url} (Ctrl-C stops)", err=True)
        seen = 0
        while count is None or seen < count:
            note = await client.next()
            if note.method != "sessions/changed":
                continue
            seen += 1
            if as_json:
                echo_json_line(note.params)
            else:
                _print_change(note.params)


@click.command("watch")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per change (JSON Lines).")
@click.option("--count", type=click.IntRange(min=1), help="Exit after this many changes.")
@connection_options
def watch(as_json: bool, count: int | None, endpoint: Endpoint) -> None:
    """Print session list changes as they happen (sessions/changed) until Ctrl-C.

    Each change prints one line per changed session (upsert: its summary) and per removed id.

    \b
    Examples:
      sessionloop watch
      sessionloop watch --json | jq -c '.upserts[] | {id, running}'
    """
    try:
        run(_watch(endpoint, as_json, count))
    except KeyboardInterrupt:
        pass


# --- send -----------------------------------------------------------------------------------------

_FAILED_OUTCOMES = ("error", "aborted", "failed")
#: ``send --wait``'s exit status by how the turn ended (a wait that timed out exits 4).
EXIT_BY_OUTCOME = {"replied": 0, "completed": 0, "error": 1, "failed": 1, "aborted": 2, "silent": 3}
EXIT_TIMEOUT = 4


class WaitTimedOut(ClientError):
    """``send --wait`` got no answer in time (the turn goes on)."""


def _is_owner(client: Client) -> bool:
    """The owner token is ``{platform: 'console', userId: 'owner'}``; anything else is an app."""
    identity = client.info.identity if client.info is not None else None
    return identity is not None and identity.platform == "console" and identity.user_id == "owner"


async def _send_as_owner(client: Client, session_id: str, text: str, wait: bool,
                         timeout: float) -> dict[str, Any]:
    """``turn/send``: no idempotency key on this path; ``--wait`` follows the subscription."""
    params = {"sessionId": session_id, "content": text}
    if not wait:
        await client.call("turn/send", params)
        return {"state": "accepted", "idempotent": False}
    view = SessionView(await subscribe(client, session_id), emit=None)
    view.expect(text)
    await client.call("turn/send", params)
    if not await wait_for_turn(client, view, timeout):
        raise WaitTimedOut(f"no answer from {session_id} within {timeout:g} s (the turn goes on; "
                           "see `sessionloop sessions show`)")
    return {"state": "accepted", "idempotent": False, "turnId": view.turn_id, "outcome": view.outcome,
            "text": view.answer, **({"reason": view.reason} if view.reason else {})}


async def _send_as_app(client: Client, session_id: str, text: str, key: str, wait: bool,
                       timeout: float) -> dict[str, Any]:
    """``loop/send`` (the Session Loop API): a repeated key returns the first receipt; ``loop/waitForTurn``."""
    receipt: LoopSendResult = await client.call(
        "loop/send", {"sessionId": session_id, "text": text, "idempotencyKey": key})
    if receipt.state == "rejected":
        raise ClientError(f"loop/send: rejected, too many unfinished turns; retry after "
                          f"{receipt.retry_after_ms or 1000} ms")
    out: dict[str, Any] = {"state": receipt.state, "idempotent": True, "turnId": receipt.turn_id}
    if not wait or receipt.turn_id is None:
        return out
    done: LoopWaitForTurnResult = await client.call(
        "loop/waitForTurn", {"sessionId": session_id, "turnId": receipt.turn_id, "timeoutMs": int(timeout * 1000)})
    if done.state == "timeout":
        raise WaitTimedOut(f"no answer from {session_id} within {timeout:g} s (the turn goes on)")
    outcome = "aborted" if done.code == "aborted" else done.state
    return {**out, "outcome": outcome, "text": done.output_text or "",
            **({"code": done.code} if done.code else {}), **({"reason": done.message} if done.message else {})}


#: Why the owner token cannot take ``--key`` (one line, said before anything is sent).
OWNER_KEY_REFUSED = ("--key cannot be kept with the owner token: the owner sends with turn/send, which takes no "
                     "idempotency key, so sending again would make a second turn; send without --key, "
                     "or with an app token (loop/send keeps the key)")
APP_KEY_REQUIRED = ("--key is required with an app token: loop/send needs an idempotency key (sending again with "
                    "the same key returns the first receipt)")


async def _send(endpoint: Endpoint, ref: str, text: str, key: str | None, wait: bool,
                timeout: float) -> dict[str, Any]:
    async with connect(endpoint) as client:
        owner = _is_owner(client)
        if owner and key is not None:
            raise ClientError(OWNER_KEY_REFUSED)
        if not owner and key is None:
            raise ClientError(APP_KEY_REQUIRED)
        session_id = await resolve_session(client, ref)
        if owner:
            receipt = await _send_as_owner(client, session_id, text, wait, timeout)
        else:
            assert key is not None
            receipt = await _send_as_app(client, session_id, text, key, wait, timeout)
        return {"sessionId": session_id, "key": key, **receipt}


@click.command("send")
@click.argument("session")
@click.argument("text")
@click.option("--key", default=None,
              help="Idempotency key of this message: required with an app token, refused with the owner's "
                   "(see below).")
@click.option("--wait", is_flag=True, help="Wait for the turn to end and print the agent's answer.")
@click.option("--timeout", default=600.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds --wait waits; the turn itself is not stopped.")
@click.option("--json", "as_json", is_flag=True,
              help="Print {sessionId, key, state, idempotent, turnId, outcome, text}.")
@connection_options
def send(session: str, text: str, key: str | None, wait: bool, timeout: float, as_json: bool,
         endpoint: Endpoint) -> None:
    """Send TEXT to SESSION as a new message (TEXT "-" reads it from stdin).

    With an app token this is the Session Loop API's loop/send, and --key is required: sending
    again with the same --key does not send twice, it returns the first receipt (state
    "duplicate") and --wait waits for that same turn. With the owner token it is turn/send,
    which has no idempotency key: --key is refused before anything is sent, since
    it could not be kept; each send is a new message. With --wait the exit status says how the
    turn ended: 0 replied, 1 error (the reason is printed), 2 aborted, 3 silent (no reply),
    4 no answer within --timeout.

    \b
    Examples:
      sessionloop send 1a2266 "summarise the log" --key job-42       # an app token
      SESSIONLOOP_TOKEN=$BOT_TOKEN sessionloop send 1a2266 "what changed?" --key q-7 --wait
      git log -5 | sessionloop send 1a2266 - --wait --json            # the owner token: no --key
    """
    if text == "-":
        text = sys.stdin.read()
    if not text.strip():
        raise click.BadParameter("the message is empty", param_hint="TEXT")
    try:
        receipt = run(_send(endpoint, session, text, key, wait, timeout))
    except WaitTimedOut as e:
        click.echo(f"Error: {e}", err=True)
        sys.exit(EXIT_TIMEOUT)
    if as_json:
        echo_json(receipt)
    elif wait:
        if receipt["text"] or receipt.get("outcome") not in _FAILED_OUTCOMES:
            click.echo(clean(receipt["text"]))
    else:
        keyed = f" (key {clean(key)})" if key is not None else ""
        click.echo(f"{receipt['state']}: sent to {receipt['sessionId']}{keyed}")
    if wait and receipt.get("outcome") in _FAILED_OUTCOMES and not as_json:
        code = f" ({clean(receipt['code'])})" if receipt.get("code") else ""
        reason = f": {clean(receipt['reason'])}" if receipt.get("reason") else ""
        click.echo(f"the turn ended: {receipt['outcome']}{code}{reason}", err=True)
    if wait:
        sys.exit(EXIT_BY_OUTCOME.get(str(receipt.get("outcome")), 1))
