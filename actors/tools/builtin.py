"""The built-in tools: ``list_files``, ``read_file``, ``write_file``, ``exec``, ``update_plan``.

All are coroutines run on the shared asyncio loop, never on an actor thread (no handler blocks), and
all confine their paths to the session's workspace with :class:`~actors.tools.workspace.Workspace`.

* ``list_files {path}`` and ``read_file {path}`` (capped at :data:`READ_LIMIT` bytes) need no
  approval.
* ``write_file {path, content}`` needs approval, shows a ``file-change`` display (removed and
  added text), and calls ``record_before_image`` *before* it writes, so ``turn/rewind`` can
  restore the file (checkpoints: one before-image per file per turn).
* ``exec {command, cwd?, background?}`` needs approval, may go to the background, shows a
  ``command`` display completed with ``exitCode``; it runs ``/bin/sh -c`` in its own process
  group, streams output through ``on_output`` and returns ``{"exitCode": n, "output": tail}``.
  Cancelling the call (a cancelled turn reaches the tool) terminates the whole process group.
  ``background`` is a request to the session (the call moves to a background task on
  request or after a yield timeout); the tool itself runs the same either way. A non-zero exit
  is a result, not a tool error: the model reads the exit code.
* ``update_plan {entries: [{text, status}], explanation?}`` returns the plan; the session turns
  it into a ``plan.updated`` event (:func:`plan_from_output`).

``spawn_session`` needs the Session Loop API (§5), so it is not here: its module builds a
:class:`ToolSpec` and passes it to :func:`default_registry` (``extra=``) or
:meth:`ToolRegistry.register`; the API reaches it through ``ToolContext.extras``.
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import os
import signal
import stat
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from sessionloop.actors.events import PlanEntry, ToolDisplay
from sessionloop.actors.tools.registry import ToolContext, ToolError, ToolRegistry, ToolResult, ToolSpec
from sessionloop.actors.tools.sandbox import Launch, Sandbox
from sessionloop.actors.tools.workspace import Workspace

log = logging.getLogger("sessionloop.tools")

#: ``read_file`` returns at most this many bytes of a file.
READ_LIMIT = 256 * 1024
#: ``list_files`` returns at most this many entries.
LIST_LIMIT = 1000
#: ``exec`` returns the last this-many characters of the output (it streams all of it).
OUTPUT_TAIL = 16_000
#: Text shown in a ``file-change`` display is cut to this many characters per side.
DISPLAY_LIMIT = 64 * 1024
#: After SIGTERM, a cancelled command's process group has this long before SIGKILL.
KILL_GRACE_S = 1.0
#: After the shell exits, output still buffered by children it left behind is read this long.
DEFAULT_YIELD_S = 10.0  # seconds in the foreground before exec moves to the background
DRAIN_GRACE_S = 0.2

_READ_CHUNK = 8192
_RELEASE_TRIES = 500  # x 2 ms: a finished command's pids cgroup empties within a few ms
_RELEASE_PAUSE_S = 0.002
_PLAN_STATUSES = ["pending", "in_progress", "completed"]


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n[… {len(text) - limit} more chars]"


# --- list_files / read_file ---------------------------------------------------------------------


async def list_files(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """The entries of a directory, sorted, directories with a trailing ``/``."""
    path = args.get("path") or "."
    real = ctx.workspace.resolve(path)
    try:  # one system call when the directory is there, as it is for all but a session's first list
        with os.scandir(real) as scan:
            entries = sorted((e.name + "/" if e.is_dir() else e.name) for e in scan)
    except FileNotFoundError:
        if real == ctx.workspace.root:
            return {"path": ".", "entries": [], "truncated": False}  # not created until first written
        raise ToolError(f"{path!r} does not exist") from None
    except NotADirectoryError:
        raise ToolError(f"{path!r} is not a directory") from None
    return {
        "path": ctx.workspace.relative(path),
        "entries": entries[:LIST_LIMIT],
        "truncated": len(entries) > LIST_LIMIT,
    }


async def read_file(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """A text file's content, at most :data:`READ_LIMIT` bytes; binary files are reported as such."""
    path = args["path"]
    read = ctx.workspace.read_bytes(path, READ_LIMIT)
    if read is None:
        raise ToolError(f"{path!r} does not exist")
    size, data = read
    result: dict[str, Any] = {
        "path": ctx.workspace.relative(path),
        "size": size,
        "truncated": size > len(data),
    }
    if b"\x00" in data[:8192]:
        result.update(content="", binary=True)
    else:
        result["content"] = data.decode("utf-8", "replace")
    return result


# --- write_file ---------------------------------------------------------------------------------


def describe_write(args: dict[str, Any], workspace: Workspace) -> ToolDisplay:
    """The ``file-change`` display: the text the write removes (None for a new file) and adds."""
    path = str(args.get("path", ""))
    removed: str | None = None
    read = workspace.read_bytes(path, DISPLAY_LIMIT * 4)  # at most 4 bytes a character
    if read is not None:
        removed = _clip(read[1].decode("utf-8", "replace"), DISPLAY_LIMIT)
    added = _clip(str(args.get("content", "")), DISPLAY_LIMIT)
    return ToolDisplay(kind="file-change", path=workspace.relative(path), removed=removed, added=added)


async def write_file(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Write ``content`` to ``path`` (UTF-8), creating parent directories; before-image first."""
    path, content = args["path"], args["content"]
    if ctx.workspace.resolve(path).is_dir():
        raise ToolError(f"{path!r} is a directory")
    rel = ctx.workspace.relative(path)
    await ctx.before_change(rel)  # the checkpoint precedes the change
    data = content.encode("utf-8")
    existed = ctx.workspace.write_bytes(path, data)
    return {"path": rel, "bytes": len(data), "created": not existed}


# --- exec ---------------------------------------------------------------------------------------


def describe_exec(args: dict[str, Any], workspace: Workspace) -> ToolDisplay:
    """The ``command`` display, its fields taken verbatim from the arguments (the tool card's display:
    各项从参数里逐字取出; no ``cwd`` when the call gave none; no display when the command is not a
    string); the exit code is filled in from the result."""
    command, cwd = args.get("command"), args.get("cwd")
    if not isinstance(command, str):
        raise TypeError("exec's command is not a string")
    return ToolDisplay(kind="command", command=command, cwd=cwd if isinstance(cwd, str) else None)


def _exit_code(returncode: int) -> int:
    """The shell convention: a process killed by signal N exits with 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class _Sink:
    """Where output goes; redirected from the tool card to a background task's buffer."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def __call__(self, text: str) -> None:
        self.target(text)


async def _pump(command: _Command, out: Any, tail: list[str], limit: int) -> bool:
    """Read the merged output to EOF, streaming it and keeping the last :data:`OUTPUT_TAIL` chars.

    Past ``limit`` bytes (0: none) the command is killed, a line saying so ends the output, and
    the answer is True: a command flooding its output cannot flood the session's subscribers."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    total = 0
    while True:
        data = await command.stdout.read(_READ_CHUNK)
        over = bool(limit) and total + len(data) > limit
        if over:
            data = data[: limit - total]
        total += len(data)
        text = decoder.decode(data, final=not data or over)
        if over:
            text += f"\n[output limit of {limit} bytes reached: the command was stopped]\n"
        if text:
            tail[0] = (tail[0] + text)[-OUTPUT_TAIL:]
            out(text)
        if over:
            await command.kill_group()
            return True
        if not data:
            return False


class _ExecProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """The stream protocol plus a future set when the process exits.

    Why: ``Process.wait()`` also waits until every pipe is closed, so a command that leaves a
    child in the background (``server &``) would hold the tool call until that child exits.
    """

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        # An Event, not a Future: cancelling a task that awaits a future cancels the future too,
        # and the kill path must still be able to wait for the real exit.
        self.exited = asyncio.Event()

    def process_exited(self) -> None:
        super().process_exited()
        self.exited.set()


class _Command:
    """One ``/bin/sh -c`` child in its own process group (``start_new_session``)."""

    def __init__(self, transport: asyncio.SubprocessTransport, protocol: _ExecProtocol) -> None:
        self.transport = transport
        self.protocol = protocol
        self.pid = transport.get_pid()

    @classmethod
    async def start(cls, launch: Launch, cwd: Path) -> _Command:
        """Start ``launch`` (built by :meth:`Sandbox.prepare`: the sandbox's argv and environment;
        nobody can page, stdin is closed)."""
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.subprocess_exec(
            lambda: _ExecProtocol(limit=2**16, loop=loop),
            *launch.argv,
            cwd=cwd, env=launch.env, start_new_session=True,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        return cls(transport, protocol)

    @property
    def stdout(self) -> asyncio.StreamReader:
        assert self.protocol.stdout is not None
        return self.protocol.stdout

    def exit_code(self) -> int:
        returncode = self.transport.get_returncode()
        return _exit_code(-1 if returncode is None else returncode)

    async def kill_group(self) -> None:
        """SIGTERM the process group, SIGKILL it after :data:`KILL_GRACE_S`.

        SIGKILL goes to the group even when the shell left at SIGTERM, for children that
        ignore SIGTERM.
        """
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            if sig == signal.SIGTERM:
                try:
                    await asyncio.wait_for(self.protocol.exited.wait(), KILL_GRACE_S)
                except TimeoutError:
                    pass
        await self.protocol.exited.wait()

    def close(self) -> None:
        """Release the pipes (a child left in the background may still hold their other end)."""
        self.transport.close()


SNAPSHOT_MAX_FILES = 2000
SNAPSHOT_MAX_FILE = 1024 * 1024
SNAPSHOT_MAX_TOTAL = 20 * 1024 * 1024
SNAPSHOT_SKIP = {".git", "node_modules", "__pycache__", ".venv"}


def snapshot_files(root: str) -> dict[str, tuple[int, int, bytes | None]]:
    """rel path -> (mtime_ns, size, content) of the workspace's files, bounded; content only for
    regular files up to 1 MB and 20 MB in all (larger changes are seen, not restorable).

    A command may leave anything in the workspace, and this runs as the server: a symlink is
    recorded without content (never followed: a link to a secret would put the secret into a
    checkpoint that ``turn/rewind`` writes back as a plain file), and a FIFO or device is never
    opened (a FIFO would block the read)."""
    out: dict[str, tuple[int, int, bytes | None]] = {}
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SNAPSHOT_SKIP]
        for name in filenames:
            if len(out) >= SNAPSHOT_MAX_FILES:
                return out
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
                content = None
                if stat.S_ISREG(st.st_mode) and st.st_size <= SNAPSHOT_MAX_FILE \
                        and total + st.st_size <= SNAPSHOT_MAX_TOTAL:
                    content = read_regular(full, st, SNAPSHOT_MAX_FILE)
                    total += len(content or b"")
            except OSError:
                continue
            out[os.path.relpath(full, root)] = (st.st_mtime_ns, st.st_size, content)
    return out


def read_regular(path: str, seen: os.stat_result, limit: int) -> bytes | None:
    """At most ``limit`` bytes of the regular file ``seen`` at ``path``; None when ``path`` is no
    longer that file (swapped for a link or another file since the ``lstat``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit)
    finally:
        os.close(fd)


def changed_images(before: dict[str, tuple[int, int, bytes | None]],
                   after: dict[str, tuple[int, int, bytes | None]]) -> list[tuple[str, bool, bytes | None]]:
    """The before-images of files the command created, changed or removed."""
    images: list[tuple[str, bool, bytes | None]] = []
    for path, (mtime, size, content) in before.items():
        now = after.get(path)
        if now is None or now[0] != mtime or now[1] != size:
            images.append((path, True, content))
    images += [(path, False, None) for path in after if path not in before]
    return sorted(images)


class RunningCommand:
    """A command handed to a background task: it keeps running after the tool call returned."""

    def __init__(self, command: _Command, reader: asyncio.Future[bool], sink: _Sink, tail: list[str],
                 release: Callable[[], Awaitable[None]]) -> None:
        self._command = command
        self._reader = reader
        self._sink = sink
        self._tail = tail
        self._release = release

    @property
    def tail(self) -> str:
        return self._tail[0]

    def redirect(self, out: Any) -> None:
        self._sink.target = out

    async def wait(self) -> int:
        """Wait for the exit (and the output's end, briefly); release the pipes; the exit code."""
        await self._command.protocol.exited.wait()
        await _drain(self._reader)
        self._command.close()
        await self._release()
        return self._command.exit_code()

    async def kill(self) -> None:
        await self._command.kill_group()


async def _drain(reader: asyncio.Future[bool]) -> bool:
    """Let the reader finish the output briefly (children left running in the background may hold
    the pipe open: do not wait for them); whether the output limit stopped the command."""
    done, _ = await asyncio.wait({reader}, timeout=DRAIN_GRACE_S)
    if not done:
        reader.cancel()
    outcome = (await asyncio.gather(reader, return_exceptions=True))[0]
    return outcome is True


async def _released(sandbox: Sandbox, launch: Launch) -> None:
    """Free the command's sandbox resources (its pids cgroup empties a moment after the exit)."""
    for _ in range(_RELEASE_TRIES):
        if await asyncio.to_thread(sandbox.release, launch):
            return
        await asyncio.sleep(_RELEASE_PAUSE_S)
    log.warning("the pids cgroup of a finished command could not be removed: %s", launch.cgroup)


async def exec_command(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """Run ``/bin/sh -c command`` in the workspace (or ``cwd`` inside it) inside the sandbox
    (:mod:`actors.tools.sandbox`) under ``ctx.sandbox_policy``; see the module doc.

    With a background-task service in ``ctx.extras["background"]``, a command still running after
    the yield timeout (``ctx.extras["exec_yield_s"]``), or asked for with ``background: true``,
    is handed to a background task: the call returns at once with the task id and the output so
    far, and the command goes on. Raises ToolError (``SandboxUnavailable`` when no
    sandbox can be made: the call fails with the cause, nothing runs).
    """
    cwd_arg = args.get("cwd") or "."
    ctx.workspace.ensure()
    cwd = ctx.workspace.resolve(cwd_arg)
    if not cwd.is_dir():
        raise ToolError(f"cwd {cwd_arg!r} is not a directory")
    root = str(ctx.workspace.root)
    sandbox = ctx.sandbox
    launch = await asyncio.to_thread(sandbox.prepare, ctx.sandbox_policy, args["command"], root, str(cwd))

    async def release() -> None:
        await _released(sandbox, launch)

    try:
        before = await asyncio.to_thread(snapshot_files, root) if ctx.record_images is not None else None
        command = await _Command.start(launch, cwd)
    except BaseException:
        await release()
        raise
    tail = [""]
    sink = _Sink(ctx.on_output)
    reader = asyncio.ensure_future(_pump(command, sink, tail, sandbox.limits.output_bytes))
    to_background = ctx.extras.get("background")
    asked = bool(args.get("background"))
    try:
        if to_background is not None and not asked:
            try:
                await asyncio.wait_for(asyncio.shield(command.protocol.exited.wait()),
                                       ctx.extras.get("exec_yield_s", DEFAULT_YIELD_S))
            except TimeoutError:
                pass
        elif to_background is None:
            await command.protocol.exited.wait()
        # Asked for: a task even if the command has exited already. On Python 3.12+ asyncio
        # watches children with a pidfd in the event loop, so a quick command's exit is often
        # seen before subprocess_exec returns (3.11's watcher thread reported it later).
        if to_background is not None and (asked or not command.protocol.exited.is_set()):
            task_id = to_background(RunningCommand(command, reader, sink, tail, release))
            return ToolResult(output={"taskId": task_id, "status": "running", "output": tail[0],
                                      "note": "the command goes on as a background task"})
        limited = await _drain(reader)
    except BaseException:  # cancellation (a cancelled turn reaches the tool) or anything else
        reader.cancel()
        await command.kill_group()
        await asyncio.gather(reader, return_exceptions=True)
        command.close()
        await release()
        raise
    command.close()
    await release()
    code = command.exit_code()
    if before is not None and ctx.record_images is not None:
        images = changed_images(before, await asyncio.to_thread(snapshot_files, root))
        if images:  # checkpoints: what the command changed can be rewound
            outcome = ctx.record_images(images)
            if outcome is not None:
                await outcome
    output: dict[str, Any] = {"exitCode": code, "output": tail[0]}
    if limited:
        output["outputLimited"] = True
    return ToolResult(output=output, exit_code=code)


# --- update_plan --------------------------------------------------------------------------------


async def update_plan(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Echo the plan back; the session records it as ``plan.updated`` (shown as the plan item)."""
    entries = [{"text": e["text"], "status": e.get("status", "pending")} for e in args["entries"]]
    return {"entries": entries, "explanation": args.get("explanation", "")}


def plan_from_output(output: dict[str, Any]) -> tuple[list[PlanEntry], str]:
    """The ``PlanUpdated`` fields from an ``update_plan`` result."""
    entries = [PlanEntry(text=e["text"], status=e["status"]) for e in output.get("entries", [])]
    return entries, str(output.get("explanation", ""))


# --- the specs ----------------------------------------------------------------------------------


def _path_schema(description: str, required: bool = True) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"path": {"type": "string", "description": description}},
    }
    if required:
        schema["required"] = ["path"]
    return schema


LIST_FILES = ToolSpec(
    name="list_files",
    description="List the files and directories in a directory of the workspace (directories end with '/').",
    parameters=_path_schema("Directory, relative to the workspace root; '.' for the root.", required=False),
    handler=list_files,
)

READ_FILE = ToolSpec(
    name="read_file",
    description=f"Read a text file of the workspace (at most {READ_LIMIT // 1024} KiB).",
    parameters=_path_schema("File path, relative to the workspace root."),
    handler=read_file,
)

WRITE_FILE = ToolSpec(
    name="write_file",
    description="Create or overwrite a file of the workspace with the given text content.",
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, relative to the workspace root."},
            "content": {"type": "string", "description": "The whole new content of the file."},
        },
        "required": ["path", "content"],
    },
    handler=write_file,
    needs_approval=True,
    display_kind="file-change",
    describe=describe_write,
)

EXEC = ToolSpec(
    name="exec",
    description="Run a shell command (/bin/sh -c) in the workspace; returns its exit code and output.",
    parameters={
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The shell command line."},
            "cwd": {"type": "string", "description": "Working directory, relative to the workspace root."},
            "background": {"type": "boolean", "description": "Run as a background task and return at once."},
        },
        "required": ["command"],
    },
    handler=exec_command,
    needs_approval=True,
    can_background=True,
    display_kind="command",
    display_result_key="exitCode",
    describe=describe_exec,
    sandboxed=True,
)

UPDATE_PLAN = ToolSpec(
    name="update_plan",
    description="Replace the task plan shown to the user: a list of steps, each with a status.",
    parameters={
        "type": "object",
        "properties": {
            "entries": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "text": {"type": "string"},
                        "status": {"type": "string", "enum": _PLAN_STATUSES},
                    },
                    "required": ["text", "status"],
                },
            },
            "explanation": {"type": "string"},
        },
        "required": ["entries"],
    },
    handler=update_plan,
)


def builtin_tools() -> list[ToolSpec]:
    """The built-in tools, in the order the model is shown them."""
    return [LIST_FILES, READ_FILE, WRITE_FILE, EXEC, UPDATE_PLAN]


def default_registry(extra: Iterable[ToolSpec] = ()) -> ToolRegistry:
    """A registry with the built-in tools plus ``extra`` (the hook for ``spawn_session``)."""
    registry = ToolRegistry(builtin_tools())
    for spec in extra:
        registry.register(spec)
    return registry
