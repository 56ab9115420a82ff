"""The web page's logins of a data directory (cli/web_logins.py): what one process logs out, every
other process of the directory (a worker, the next start) refuses; the file is owner-only, holds
no cookie, and one that cannot be read ends every login."""

from __future__ import annotations

import os
import stat
import threading

from sessionloop.cli.web_logins import LOGOUTS_FILE, DataDirLogins
from sessionloop.protocol.transport_http import now_ms
from sessionloop.protocol.web_login import Login

SECRET = b"k" * 32


def test_a_logout_in_one_process_is_refused_by_another_and_by_a_later_start(tmp_path):
    a, b = DataDirLogins(str(tmp_path), SECRET, "owner"), DataDirLogins(str(tmp_path), SECRET, "owner")
    ended, kept = a.issue(), a.issue()
    login = b.login(ended)
    assert login is not None and b.login(kept) is not None  # verified without asking the one that issued it
    assert a.logout(ended) == login
    assert b.login(ended) is None and not b.live(login) and b.login(kept) is not None
    later = DataDirLogins(str(tmp_path), SECRET, "owner")
    assert later.login(ended) is None and later.login(kept) is not None
    path = os.path.join(tmp_path, LOGOUTS_FILE)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as f:
        held = f.read()
    assert ended not in held and login.id in held


def test_another_owner_token_or_secret_verifies_nothing_issued_before(tmp_path):
    value = DataDirLogins(str(tmp_path), SECRET, "owner").issue()
    assert DataDirLogins(str(tmp_path), SECRET, "rotated").login(value) is None
    assert DataDirLogins(str(tmp_path), b"j" * 32, "owner").login(value) is None


def test_concurrent_logouts_from_many_threads_and_processes_all_hold(tmp_path):
    stores = [DataDirLogins(str(tmp_path), SECRET, "owner") for _ in range(4)]
    values = [stores[0].issue() for _ in range(40)]
    threads = [threading.Thread(target=lambda i=i: [stores[i % 4].logout(v) for v in values[i::8]]) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fresh = DataDirLogins(str(tmp_path), SECRET, "owner")
    assert [fresh.login(v) for v in values] == [None] * 40


def test_a_logouts_file_that_does_not_decode_ends_every_login_issued_before_it_was_written(tmp_path):
    logins = DataDirLogins(str(tmp_path), SECRET, "owner")
    value = logins.issue()
    path = os.path.join(tmp_path, LOGOUTS_FILE)
    with open(path, "w") as f:
        f.write("{not json")
    written_ms = logins.cookies.verify(value, now_ms()).issued_ms + 5
    os.utime(path, ns=(written_ms * 1_000_000, written_ms * 1_000_000))
    assert logins.login(value) is None
    other = logins.cookies.issue(written_ms + 10)[1]
    assert logins.login(other) is not None  # issued after the file was written
    assert logins.logout(other) is not None and logins.login(other) is None  # the logout rewrote it
    assert logins.login(value) is None  # what the broken file may have held stays ended


def test_an_expired_login_is_not_live():
    logins = DataDirLogins("/nonexistent-dir", SECRET, "owner")
    assert not logins.live(Login("an-id", 0, now_ms() - 1))
