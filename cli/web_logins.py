"""The web page's logins for a data directory: cookies every process of it verifies, logouts every
one of them holds to, across restarts (``transport_http.MemoryLogins`` with its logouts on disk).

The cookies are signed under ``login_key(DATA/secret, owner token)`` (``protocol/web_login.py``):
each worker of ``serve --workers`` and the server after a restart derive the same key, so nothing
about a login has to be stored or shared until it is logged out; a new owner token ends them all.

A logout is written to ``DATA/web-logouts`` (JSON, mode 0600): under an ``flock`` on
``DATA/web-logouts.lock`` the file is read, the logout added and the expired ones dropped
(:meth:`Logouts.with_logout`), and the result written to a temporary file, fsynced and renamed
over it (then the directory fsynced), so a reader sees the old file or the new one and a logout
answered survives a crash. Readers take no lock: a ``stat`` tells whether the file changed
(inode, size, mtime) and only then is it read again (or while it is under two seconds old). A file
that does not decode ends every login issued before it was written (and is replaced by the next
logout): a logout is never forgotten by accident.

Why a file and not the event store: a logout is not a fact of any session or actor, it must be
written by whichever worker the request reached (the store has one writer per shard, reached
through the cluster), and it is read at every cookie check before anything else is running for
the request; the data directory already keeps ``token`` and ``secret`` as files beside the store.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time

import msgspec

from sessionloop.protocol.transport_http import MemoryLogins, now_ms
from sessionloop.protocol.web_login import DEFAULT_LOGIN_TTL_S, Login, LoginCookies, Logouts, login_key

__all__ = ["LOGOUTS_FILE", "DataDirLogins"]

log = logging.getLogger("sessionloop.web")

LOGOUTS_FILE = "web-logouts"
RACY_NS = 2_000_000_000


class DataDirLogins(MemoryLogins):
    """The logins of the data directory ``data_dir`` (whose ``secret`` is ``secret``) for the owner
    token ``owner_token``."""

    def __init__(self, data_dir: str, secret: bytes, owner_token: str, ttl_s: float = DEFAULT_LOGIN_TTL_S) -> None:
        super().__init__(LoginCookies(login_key(secret, owner_token), ttl_s))
        self.path = os.path.join(data_dir, LOGOUTS_FILE)
        self._lock_path = self.path + ".lock"
        self._seen: tuple[int, int, int] | None = None
        self._guard = threading.Lock()  # logouts are recorded off the event loop, on executor threads

    def logouts(self) -> Logouts:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._seen, self._logouts = None, Logouts()
            return self._logouts
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        # a file changed in the last RACY_NS is read again anyway: file times are coarse (a few
        # ms), so a second rename within one tick could keep size, time and a reused inode
        if stamp != self._seen or time.time_ns() - st.st_mtime_ns < RACY_NS:
            self._logouts = self._read()
            self._seen = stamp
        return self._logouts

    def _read(self) -> Logouts:
        try:
            with open(self.path, "rb") as f:
                data, written = f.read(), os.fstat(f.fileno()).st_mtime_ns // 1_000_000
        except FileNotFoundError:
            return Logouts()
        except OSError as e:
            log.warning("%s cannot be read (%s): every web page login is ended", self.path, e)
            return Logouts(not_before_ms=now_ms() + 1)
        try:
            return Logouts.decode(data)
        except msgspec.DecodeError as e:
            # what it held is unknown: every login issued until it was written may be in it
            log.warning("%s is not a logouts file (%s): every web page login issued before it was written is "
                        "ended; the next logout rewrites it", self.path, e)
            return Logouts(not_before_ms=max(written + 1, 0))

    def record(self, login: Login) -> None:
        """Add ``login``'s logout to the file (see the module docstring); raises OSError when it
        cannot be written (the logout is then not answered as done)."""
        with self._guard:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                updated = self._read().with_logout(login, now_ms())
                self._write(updated.encode())
            finally:
                os.close(fd)  # closing the descriptor releases the flock
            self._seen = None  # read it again at the next check, as every other process does

    def _write(self, data: bytes) -> None:
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(os.path.dirname(self.path), os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
