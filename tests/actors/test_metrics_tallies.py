"""The commit-path metrics: counted per thread without locks, added up exactly at scrape time."""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest


def scraped(host) -> dict[str, float]:
    values = {}
    for line in host.rt.metrics.render().decode().splitlines():
        m = re.match(r"^(\S+?)(\{[^}]*\})?\s+(\S+)$", line)
        if m and not line.startswith("#"):
            values[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return values


@pytest.mark.parametrize("threads", [0, 4])
def test_turn_and_commit_counts_from_many_threads_add_up_exactly(open_host, threads):
    """Also with a thread per actor (0), whose threads end when their sessions passivate."""
    host = open_host(permission_mode="acceptCalls", dispatcher_threads=threads, idle_timeout_s=0.05)
    sessions = [host.create() for _ in range(30)]

    def work(s):
        s.run("plain")
        s.run('!tool list_files {"path": "."}\nx')
        s.run("!error boom")

    with ThreadPoolExecutor(10) as pool:
        list(pool.map(work, sessions))
    m = scraped(host)
    assert m['sessionloop_turns_total{outcome="completed"}'] == 60
    assert m['sessionloop_turns_total{outcome="failed"}'] == 30
    assert m["sessionloop_turn_duration_seconds_count"] == 90
    assert m['sessionloop_turn_duration_seconds_bucket{le="+Inf"}'] == 90
    assert m["sessionloop_model_call_duration_seconds_count"] == 30 * (1 + 2)  # completed calls; the error fails
    # every event in the store was appended by a session commit
    assert m["sessionloop_events_appended_total"] == host.store.head_position
    assert m["sessionloop_session_commits_total"] >= 30 * 4


def test_ended_threads_tallies_are_folded_not_kept(open_host):
    from actors.metrics import _TallyBoard

    board = _TallyBoard()

    def bump():
        board.mine().commits += 1

    for _ in range(50):
        t = threading.Thread(target=bump)
        t.start()
        t.join()
    bump()  # this thread registers last and folds every ended one
    assert len(board._live) <= 2  # noqa: SLF001 - this thread (and at most the last one, if alive)
    assert board.totals().commits == 51
