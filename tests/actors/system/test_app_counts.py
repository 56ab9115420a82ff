"""The per-app quota's counts shared by worker processes (``actors.system.app_counts``): real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sessionloop.actors.system.app_counts import LocalAppCounts, SharedAppCounts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

RESERVER = textwrap.dedent("""
    import json, sys, threading
    from sessionloop.actors.system.app_counts import SharedAppCounts
    path, worker = sys.argv[1], int(sys.argv[2])
    counts = SharedAppCounts(path, worker)
    sys.stdin.readline()
    taken = {"bot": 0, "other": 0}
    lock = threading.Lock()

    def take():
        for _ in range(300):
            for app in ("bot", "other"):
                if counts.reserve(app, 200):
                    with lock:
                        taken[app] += 1

    threads = [threading.Thread(target=take) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(json.dumps(taken), flush=True)
    sys.stdin.readline()
""")


def test_three_workers_reserving_at_once_take_exactly_the_limit_between_them(tmp_path):
    path = str(tmp_path / "app-counts")
    SharedAppCounts.create(path, 3)
    procs = [subprocess.Popen([sys.executable, "-c", RESERVER, path, str(w)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT) for w in range(3)]
    for p in procs:
        p.stdin.write("\n")
        p.stdin.flush()
    taken = [json.loads(p.stdout.readline()) for p in procs]
    for p in procs:
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.wait(30) == 0
    for app in ("bot", "other"):
        assert sum(t[app] for t in taken) == 200  # 3 processes x 4 threads x 300 tries: never one more
    reader = SharedAppCounts(path, 0)  # worker 0 again: its column is zeroed, the others' stay
    try:
        assert reader.count("bot") == 200 - taken[0]["bot"]
        reader.add("bot", 5)
        assert reader.count("bot") == 205 - taken[0]["bot"]
        assert reader.count("never-seen") == 0
    finally:
        reader.close()


def test_a_released_slot_can_be_taken_again_by_another_worker(tmp_path):
    path = str(tmp_path / "app-counts")
    SharedAppCounts.create(path, 2)
    a, b = SharedAppCounts(path, 0), SharedAppCounts(path, 1)
    try:
        assert a.reserve("bot", 2) and b.reserve("bot", 2)
        assert not a.reserve("bot", 2) and not b.reserve("bot", 2)
        a.add("bot", -1)  # a turn of worker 0's ended
        assert b.reserve("bot", 2) and not a.reserve("bot", 2)
        assert a.count("bot") == b.count("bot") == 2
    finally:
        a.close()
        b.close()


def test_a_file_that_is_not_an_app_counts_file_or_a_worker_out_of_range_is_refused(tmp_path):
    path = str(tmp_path / "app-counts")
    SharedAppCounts.create(path, 2)
    with pytest.raises(ValueError, match="worker 2"):
        SharedAppCounts(path, 2)
    other = tmp_path / "other"
    other.write_bytes(b"\0" * 4096)
    with pytest.raises(ValueError, match="not the app counts file"):
        SharedAppCounts(str(other), 0)


def test_one_process_counts_in_memory_with_the_same_rules():
    counts = LocalAppCounts()
    assert counts.reserve("bot", 1) and not counts.reserve("bot", 1)
    counts.add("bot", -1)
    assert counts.reserve("bot", 1) and counts.count("bot") == 1 and counts.count("other") == 0
