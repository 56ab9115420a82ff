"""The session's workspace directory, and the one place where tool paths are confined to it.

SPEC §4 / §7: "Tools are confined to the session's workspace directory: a path outside it is
refused." Every tool resolves its paths through :meth:`Workspace.resolve`, which refuses:

* absolute paths outside the root (``/etc/passwd``);
* ``..`` escapes (``../secret``, ``a/../../secret``), checked after normalisation, so
  ``a/../b`` inside the root is fine;
* symlink escapes: the path is resolved with symlinks followed, so a link inside the workspace
  that points outside is refused as well (for files that exist and for new files whose parent
  directory is such a link);
* NUL bytes, which the OS would reject with a less helpful error.

Limits, said plainly: this is a check at the time of the call. A process started by ``exec``
runs a shell in the workspace and can reach anything the server's user can; confinement is for
the file tools and for ``exec``'s ``cwd``. A symlink swapped in between the check and the use
(a TOCTOU race by another process) is not defended against.

The error (a :class:`ToolError`) names the path the model gave, never the
resolved absolute path, so the message does not leak the server's directory layout.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from eventstore.errors import SessionloopError


class ToolError(SessionloopError):
    """A tool call cannot be carried out; the message is shown to the model and the user.

    It lives here, in the lowest module of ``tools/``, because the workspace raises it and the
    registry imports the workspace; :mod:`actors.tools.registry` re-exports it.
    """

    code = "tool-error"


class Workspace:
    """A root directory; :meth:`resolve` maps tool paths into it or refuses them."""

    def __init__(self, root: str | os.PathLike[str], *, create: bool = False, real: bool = False) -> None:
        """``create=True`` allows a root that does not exist yet: it is made by :meth:`ensure`
        when a tool first writes (a session's own directory; a ``mkdir`` costs ~0.3 ms of
        kernel time here, so a session that only talks or reads never pays it). ``real=True``
        says ``root`` is already absolute and free of symlinks (see :meth:`child`).

        One ``stat`` and ``os.path`` rather than ``pathlib``'s ``is_dir`` and ``exists``: a
        session builds its workspace on its first tool call after each activation."""
        text = os.fspath(root) if real else os.path.expanduser(os.fspath(root))
        try:
            exists, is_dir = True, stat.S_ISDIR(os.stat(text).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            exists = is_dir = False
        if not is_dir and not (create and not exists):
            raise ValueError(f"workspace root {text} is not a directory")
        self._root = text if real else os.path.realpath(text)
        self.root = Path(self._root)
        self._prefix = self._root.rstrip(os.sep) + os.sep

    @classmethod
    def child(cls, parent_real: str, name: str) -> Workspace:
        """The workspace ``parent_real/name`` for a parent that is already a real path (no
        symlink in it) and a plain name: a session's own directory under the host's workspaces.
        Skips ``realpath``'s walk over every component (a few syscalls and ~20 µs each time
        a session activates); a ``name`` that is a symlink is resolved the full way."""
        path = os.path.join(parent_real, name)
        plain = os.sep not in name and name not in ("", ".", "..") and not os.path.islink(path)
        return cls(path, create=True, real=plain)

    def exists(self) -> bool:
        return os.path.isdir(self._root)

    def ensure(self) -> Path:
        """Create the root if it is missing (tools that write or run commands call this)."""
        os.makedirs(self._root, exist_ok=True)
        return self.root

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r})"

    def resolve(self, path: str | os.PathLike[str] = ".") -> Path:
        """The absolute, symlink-free path of ``path`` inside the workspace.

        ``path`` is relative to the root, or absolute but inside it. Raises ToolError
        ``path '…' is outside the workspace`` otherwise; the file need not exist.
        """
        text = os.fspath(path)
        if "\x00" in text:
            raise ToolError(f"path {text!r} contains a NUL character")
        # os.path rather than pathlib, and only the components below the (already real) root are
        # looked at: this runs for every file a tool touches. ``~`` is a name like any other.
        if os.path.isabs(text):
            rel = os.path.relpath(os.path.normpath(text), self._root)
        else:
            rel = os.path.normpath(text)
        if rel == ".":
            return self.root
        if rel == ".." or rel.startswith(".." + os.sep):
            raise ToolError(f"path {text!r} is outside the workspace")
        real = self._follow(text, rel)
        if real != self._root and not real.startswith(self._prefix):
            raise ToolError(f"path {text!r} is outside the workspace")
        return Path(real)

    def _follow(self, text: str, rel: str) -> str:
        """The real path of ``root/rel``: as is when no component is a symlink, else resolved."""
        current = self._root
        for part in rel.split(os.sep):
            current = os.path.join(current, part)
            if os.path.islink(current):
                try:
                    return os.path.realpath(os.path.join(self._root, rel))
                except (RuntimeError, OSError) as e:  # a symlink loop
                    raise ToolError(f"path {text!r} cannot be resolved: {e}") from e
        return current

    def relative(self, path: str | os.PathLike[str]) -> str:
        """The workspace-relative POSIX form of ``path`` (``"."`` for the root), after :meth:`resolve`.

        Used for displays and checkpoint records, which must not depend on where the workspace
        lives on disk (a restored session may be served from another directory).
        """
        real = self.resolve(path)
        rel = real.relative_to(self.root).as_posix()
        return rel or "."

    def contains(self, path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` resolves inside the workspace (no exception)."""
        try:
            self.resolve(path)
        except ToolError:
            return False
        return True

    def before_image(self, path: str | os.PathLike[str]) -> tuple[bool, bytes | None]:
        """``(existed, content)`` of a file now, for a checkpoint taken before a change."""
        real = self.resolve(path)
        if not real.is_file():
            return False, None
        return True, real.read_bytes()
