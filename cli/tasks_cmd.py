"""``sessionloop tasks ls|output|stop|stop-all``: the owner's background tasks (docs/protocol.md).

A background task is a tool call that went on running after its turn let go of it (``exec`` with
``background: true``, or one that outlived the foreground wait). Each command is one short
conversation with the server (``cli.client``):

* ``ls``       ``background/list``: running tasks and the last ended ones of every session.
* ``output``   ``background/output {taskId, after}``: the text after character ``after`` and ``end``,
               the offset to ask from next time; the server keeps only the tail, and says
               ``truncated`` when ``after`` is before it. ``--follow`` asks again from ``end``
               whenever ``background/changed`` says the task moved (at most once a second) or a
               second passed, until the task has ended and its last output was read.
* ``stop``     ``background/stop``: the server answers once the task has settled; the command then
               reads the task back and prints the status the server gives it (never its own guess).
* ``stop-all`` ``background/stopAll {sessionId}``: every background task of a session and of its
               child sessions, and the child sessions' turns (not the session's own turn).

TASK is a task id or a unique prefix of one. Output text is sanitized before it reaches the
terminal (``cli.output``); ``--json`` prints the wire shapes.
"""

from __future__ import annotations

import time
from typing import Any, Final

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
    TASK_HEADERS,
    clean,
    echo_json,
    echo_json_line,
    echo_table,
    task_row,
    task_status,
)
from sessionloop.protocol.schemas import (
    BackgroundChanged,
    BackgroundListResult,
    BackgroundOutputResult,
    BackgroundTask,
)

__all__ = ["tasks"]

FOLLOW_POLL_S: Final = 1.0  # the server pushes lastLine/lastOutputAt at most once a second


@click.group("tasks")
def tasks() -> None:
    """List background tasks, read their output, stop them.

    TASK is a task id or a unique prefix of one (see `sessionloop tasks ls`).

    \b
    Examples:
      sessionloop tasks ls
      sessionloop tasks output 1a2266 --follow
      sessionloop tasks stop 1a2266
    """


async def _all(client: Client) -> list[BackgroundTask]:
    listed: BackgroundListResult = await client.call("background/list", {})
    return listed.tasks


async def resolve_task(client: Client, ref: str) -> BackgroundTask:
    """The task ``ref`` names (an id or a unique id prefix); ClientError when none or several."""
    found = await _all(client)
    for t in found:
        if t.id == ref:
            return t
    matches = [t for t in found if t.id.startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ClientError(f"no background task {ref!r} (`sessionloop tasks ls` lists them)")
    shown = ", ".join(t.id for t in matches[:5]) + (f" and {len(matches) - 5} more" if len(matches) > 5 else "")
    raise ClientError(f"{ref!r} matches {len(matches)} background tasks: {shown}; give more of the id")


def _order(found: list[BackgroundTask]) -> list[BackgroundTask]:
    """Running first, then the most recently started."""
    return sorted(found, key=lambda t: (t.status != "running", -t.started_at))


# --- ls -------------------------------------------------------------------------------------------


async def _ls(endpoint: Endpoint, session: str | None, running: bool) -> list[BackgroundTask]:
    async with connect(endpoint) as client:
        session_id = await resolve_session(client, session) if session else None
        found = await _all(client)
    return _order([t for t in found if (session_id is None or t.session_id == session_id)
                   and (not running or t.status == "running")])


@tasks.command("ls")
@click.option("--session", "-s", help="Only the tasks of this session (id, id prefix or title).")
@click.option("--running", is_flag=True, help="Only the tasks still running.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of background tasks.")
@connection_options
def ls(session: str | None, running: bool, as_json: bool, endpoint: Endpoint) -> None:
    """List background tasks: the running ones first, then the ended ones the server keeps
    (the last 20 of each session), with their status, exit code and last line of output.

    \b
    Examples:
      sessionloop tasks ls
      sessionloop tasks ls --running --session 1a2266
      sessionloop tasks ls --json | jq -r '.[] | select(.status == "running") | .id'
    """
    found = run(_ls(endpoint, session, running))
    if as_json:
        echo_json(found)
    elif not found:
        click.echo("no background tasks", err=True)
    else:
        echo_table(TASK_HEADERS, (task_row(t) for t in found))


# --- output ---------------------------------------------------------------------------------------


class _Printer:
    """Prints pages of output: text as it is (sanitized), or one JSON line per page."""

    def __init__(self, as_json: bool, follow: bool) -> None:
        self.as_json, self.follow = as_json, follow
        self.open_line = False

    def page(self, page: BackgroundOutputResult) -> None:
        if self.as_json:
            if self.follow:
                echo_json_line(page)
            else:
                echo_json(page)
            return
        if page.truncated:
            gone = page.end - len(page.text)
            click.echo(f"[output truncated: the first {gone} characters are no longer kept]", err=True)
        if page.text:
            text = clean(page.text)
            click.echo(text, nl=False)
            self.open_line = not text.endswith("\n")

    def finish(self) -> None:
        if self.open_line:
            click.echo()
            self.open_line = False


async def _changed(client: Client, task_id: str, timeout: float) -> BackgroundTask | None | bool:
    """Wait up to ``timeout`` for a ``background/changed`` about the task: the task as pushed,
    True when it was removed, None when nothing came."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            note = await client.next(timeout=left)
        except TimeoutError:
            return None
        if note.method != "background/changed" or not isinstance(note.params, BackgroundChanged):
            continue
        if task_id in note.params.removes:
            return True
        for t in note.params.upserts:
            if t.id == task_id:
                return t
    return None


async def _output(endpoint: Endpoint, ref: str, after: int, follow: bool, printer: _Printer) -> BackgroundTask:
    async with connect(endpoint) as client:
        task = await resolve_task(client, ref)
        if follow:
            await client.call("background/watch", {})
            task = await resolve_task(client, task.id)  # as of the watch: later changes are pushed
        ended = task.status != "running"
        position = after
        while True:
            params: dict[str, Any] = {"taskId": task.id}
            if position:
                params["after"] = position
            page: BackgroundOutputResult = await client.call("background/output", params)
            printer.page(page)
            position = page.end
            if not follow or ended:
                return task
            # Ended is decided before the next read, so that read still gets the last output.
            changed = await _changed(client, task.id, FOLLOW_POLL_S)
            if changed is True:
                ended = True
            elif isinstance(changed, BackgroundTask):
                task = changed
                ended = task.status != "running"


@tasks.command("output")
@click.argument("task")
@click.option("--after", type=click.IntRange(min=0), default=0, show_default=True,
              help="Start after this many characters (the `end` of an earlier read).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new output until the task ends.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the {text, end, truncated} result (with --follow: one JSON line per read).")
@connection_options
def output(task: str, after: int, follow: bool, as_json: bool, endpoint: Endpoint) -> None:
    """Print a background task's output.

    The server keeps the tail of each task's output; when the output asked for starts before that,
    a `[output truncated ...]` line goes to stderr. With --json the result carries `end`: give it
    as --after next time to read only what is new. With --follow the command reads again as the
    task writes, and ends with the task (its final status goes to stderr).

    \b
    Examples:
      sessionloop tasks output 1a2266
      sessionloop tasks output 1a2266 --follow
      sessionloop tasks output 1a2266 --json | jq .end
      sessionloop tasks output 1a2266 --after 4096
    """
    printer = _Printer(as_json, follow)
    try:
        final = run(_output(endpoint, task, after, follow, printer))
    finally:
        printer.finish()
    if follow and not as_json:
        click.echo(f"[task {final.id} {task_status(final)}]", err=True)


# --- stop -----------------------------------------------------------------------------------------


async def _stop(endpoint: Endpoint, ref: str) -> tuple[BackgroundTask, BackgroundTask]:
    async with connect(endpoint) as client:
        before = await resolve_task(client, ref)
        await client.call("background/stop", {"taskId": before.id})
        after = next((t for t in await _all(client) if t.id == before.id), before)
    return before, after


@tasks.command("stop")
@click.argument("task")
@click.option("--json", "as_json", is_flag=True, help="Print the task as the server has it afterwards.")
@connection_options
def stop(task: str, as_json: bool, endpoint: Endpoint) -> None:
    """Stop a running background task and wait for it to settle (a few seconds at most).

    Prints the status the server then gives it: `stopped` (with the exit code of a command), or
    how it had already ended. A stopped task sends the model no end notice.

    \b
    Examples:
      sessionloop tasks stop 1a2266
      sessionloop tasks stop 1a22670d423b5e66cd8c3.call_1.1a22670d42954fd87f6dd --json
    """
    before, after = run(_stop(endpoint, task))
    if as_json:
        echo_json(after)
    elif before.status != "running":
        click.echo(f"{after.id}: had already ended: {task_status(after)}")
    else:
        click.echo(f"{after.id}: {task_status(after)}")


async def _stop_all(endpoint: Endpoint, ref: str) -> tuple[str, list[BackgroundTask]]:
    async with connect(endpoint) as client:
        session_id = await resolve_session(client, ref)
        running = {t.id for t in await _all(client) if t.status == "running"}
        await client.call("background/stopAll", {"sessionId": session_id})
        ended = [t for t in await _all(client) if t.id in running and t.status != "running"]
    return session_id, _order(ended)


@tasks.command("stop-all")
@click.argument("session")
@click.option("--json", "as_json", is_flag=True, help="Print the tasks that ended, as JSON.")
@connection_options
def stop_all(session: str, as_json: bool, endpoint: Endpoint) -> None:
    """Stop all background work under a session: its background tasks, and the tasks, running
    turns and queued input of its child sessions. The session's own turn goes on (Ctrl-C in
    `sessionloop chat`, or turn/abort, stops that). Waits until the tasks have settled.

    SESSION is an id, a unique id prefix, or a title.

    \b
    Examples:
      sessionloop tasks stop-all 1a2266
      sessionloop tasks stop-all "release notes" --json
    """
    session_id, ended = run(_stop_all(endpoint, session))
    if as_json:
        echo_json(ended)
        return
    click.echo(f"stopped the background work of session {session_id}"
               + (f"; {len(ended)} task(s) ended:" if ended else "; no task was running"))
    for t in ended:
        click.echo(f"  {t.id}: {task_status(t)}")
