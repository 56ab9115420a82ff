"""The session's workspace directory, and the one place where tool paths are confined to it.

Tools are confined to the session's workspace directory: a path outside it is refused.
Every tool resolves its paths through :meth:`Workspace.resolve`, which refuses:

* absolute paths outside the root (``/etc/passwd``);
* ``..`` escapes (``../secret``, ``a/../../secret``), checked after normalisation, so
  ``a/../b`` inside the root is fine;
* symlink escapes: the path is resolved with symlinks followed, so a link inside the workspace
  that points outside is refused as well (for files that exist and for new files whose parent
  directory is such a link);
* NUL bytes, which the OS would reject with a less helpful error.

The file tools run as the server, while a command (``exec``, in its sandbox, maybe still running
in the background) may change the workspace at any moment, e.g. swap a directory for a symlink
to the data directory between the check and the use. So the check is not what protects: every
read, write and removal goes through :meth:`Workspace.read_bytes`, :meth:`write_bytes` and
:meth:`remove`, which open the checked path one component at a time from the root with
``O_NOFOLLOW`` (``openat``), so a link that appeared after the check fails the call instead of
being followed; a write goes to a new file made with ``O_EXCL`` and is renamed into place, and
only regular files are read (a FIFO would block the server). ``exec`` itself is confined by its
sandbox (:mod:`actors.tools.sandbox`), not by this module.

The error (a :class:`ToolError`) names the path the model gave, never the
resolved absolute path, so the message does not leak the server's directory layout.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from sessionloop.eventstore.errors import SessionloopError


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
        read = self.read_bytes(path)
        return (False, None) if read is None else (True, read[1])

    # --- file operations that never follow a link planted after the check -----------------------

    def _parent_fd(self, path: str | os.PathLike[str], *, create: bool = False) -> tuple[int, str, Path]:
        """An fd of the checked path's directory, opened component by component without
        following links (made with ``create``), the final name, and the checked path."""
        real = self.resolve(path)
        if real == self.root:
            raise ToolError(f"{os.fspath(path)!r} is the workspace itself")
        parts = real.relative_to(self.root).parts
        if create:
            self.ensure()
        fd = os.open(self._root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts[:-1]:
                if create:
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass
                fd = _step(fd, part, os.fspath(path))
        except BaseException:
            os.close(fd)
            raise
        return fd, parts[-1], real

    def read_bytes(self, path: str | os.PathLike[str], limit: int | None = None) -> tuple[int, bytes] | None:
        """``(size, at most limit bytes)`` of the regular file at ``path``; None when there is
        none. Raises ToolError for a directory, a FIFO or device, or a link swapped in."""
        try:
            dfd, name, _ = self._parent_fd(path)
        except FileNotFoundError:
            return None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise _changed(path, e) from e
        finally:
            os.close(dfd)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if stat.S_ISDIR(st.st_mode):
                raise ToolError(f"{os.fspath(path)!r} is a directory")
            if not stat.S_ISREG(st.st_mode):
                raise ToolError(f"{os.fspath(path)!r} is not a regular file")
            return st.st_size, f.read() if limit is None else f.read(limit)

    def write_bytes(self, path: str | os.PathLike[str], data: bytes) -> bool:
        """Replace (or create) the file at ``path`` with ``data``, making parent directories;
        atomic (a new file renamed into place, keeping the old one's mode); True when it existed."""
        dfd, name, _ = self._parent_fd(path, create=True)
        try:
            try:
                old = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                old = None
            if old is not None and stat.S_ISDIR(old.st_mode):
                raise ToolError(f"{os.fspath(path)!r} is a directory")
            tmp = f".{name}.sessionloop-{secrets.token_hex(6)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         stat.S_IMODE(old.st_mode) if old is not None and stat.S_ISREG(old.st_mode) else 0o644,
                         dir_fd=dfd)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except OSError:
                    pass
                raise
            return old is not None
        finally:
            os.close(dfd)

    def remove(self, path: str | os.PathLike[str]) -> bool:
        """Remove the file (or link) at ``path`` itself, never what a link points to; False when
        there was none."""
        try:
            dfd, name, _ = self._parent_fd(path)
        except FileNotFoundError:
            return False
        try:
            os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            return False
        finally:
            os.close(dfd)
        return True


def _step(fd: int, part: str, path: str) -> int:
    """Open directory ``part`` below ``fd`` without following a link; close ``fd``."""
    try:
        return os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise _changed(path, e) from e
    finally:
        os.close(fd)


def _changed(path: str | os.PathLike[str], error: OSError) -> ToolError:
    if error.errno in (errno.ELOOP, errno.ENOTDIR):
        return ToolError(f"path {os.fspath(path)!r} changed while it was opened (a symlink where a "
                         "directory or file was): refused")
    return ToolError(f"{os.fspath(path)!r}: {error.strerror}")
