"""A failed commit is answered with what is in the store (lmdb_recorder, "When a commit fails").

Real failures, no double of our own parts: a full tmpfs (the tests run as root, as CI does), and
an ``EIO`` that ``strace`` injects into the real ``pwrite64`` of LMDB's meta page, the one write
after which LMDB cannot say whether the transaction is on disk (it marks the environment fatal:
every later transaction gets ``MDB_PANIC``). What the store answered is then compared with what
a fresh process finds after opening the store again.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading

from sessionloop.eventstore import IdempotencyClaim, StorageFull, StorageUnavailable
from tests.conftest import REPO
from tests.eventstore.union import Stepped, open_test_store

SCOPE = "app:test:a"

# Appends k0..k2, writes a marker, appends the victim k3, writes a marker, appends k4; prints
# one JSON line per append with the store's answer, then the store's counters.
CHILD = textwrap.dedent(
    """
    import json, os, sys
    from sessionloop.eventstore import IdempotencyClaim, StorageUnavailable
    from tests.eventstore.union import Stepped, open_test_store
    store = open_test_store(sys.argv[1], durability="sync", prune_interval_s=3600)
    marker = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT, 0o600)

    def append(i):
        try:
            r = store.append("session-a", [Stepped(step=f"t{i}")],
                             idempotency=IdempotencyClaim("app:test:a", f"k{i}", f"h{i}"))
            return {"key": f"k{i}", "ok": True, "version": r.last_version}
        except StorageUnavailable as e:
            return {"key": f"k{i}", "ok": False, "outcome": e.outcome, "reason": e.reason,
                    "retry": e.retry_after_ms, "message": str(e)}

    for i in range(3):
        print(json.dumps(append(i)), flush=True)
    os.write(marker, b"victim\\n")
    print(json.dumps(append(3)), flush=True)
    os.write(marker, b"after\\n")
    print(json.dumps(append(4)), flush=True)
    read = [e.event.step for e in store.read_stream("session-a")]
    info = store.info()
    print(json.dumps({"read": read, "writable": info["writable"], "reopens": info["reopens"]}), flush=True)
    store.close()
    """
)


def _traced(store_path: str, marker: str, inject: str | None) -> tuple[list[dict], list[str]]:
    """Run CHILD under strace, tracing the ``pwrite64`` calls on ``data.mdb`` (and the markers)."""
    strace = shutil.which("strace")
    assert strace, ".ci/run installs strace; this machine lacks it"
    trace = marker + ".trace"
    args = [strace, "-f", "-o", trace, "-P", os.path.join(store_path, "data.mdb"), "-P", marker,
            "-e", "trace=pwrite64,write"]
    if inject is not None:
        args += ["-e", f"inject=pwrite64:error=EIO:when={inject}"]
    if os.path.exists(marker):
        os.unlink(marker)
    proc = subprocess.run([*args, sys.executable, "-c", CHILD, store_path, marker], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(trace) as f:
        lines = [line for line in f if "pwrite64(" in line or "victim" in line]
    return [json.loads(line) for line in proc.stdout.splitlines()], lines


def _victims_meta_write(store_path: str, tmp_path) -> int:
    """Which ``pwrite64`` on data.mdb (1-based, as strace's ``when=`` counts) writes the meta
    page of the victim's commit: the first one after the marker that is shorter than a page."""
    open_test_store(store_path).close()
    dry = str(tmp_path / "dry")
    shutil.copytree(store_path, dry)
    answers, lines = _traced(dry, str(tmp_path / "dry-marker"), None)
    assert all(a.get("ok", True) for a in answers), answers
    n = 0
    seen_marker = False
    for line in lines:
        if "victim" in line and "pwrite64(" not in line:
            seen_marker = True
            continue
        n += 1
        size = int(re.search(r", (\d+), \d+\) += ", line).group(1))
        if seen_marker and size < 4096:
            return n
    raise AssertionError(f"no meta page write after the marker in {lines}")


def _keys_in(store_path: str) -> tuple[list[str], list[str]]:
    """The turn ids in the log and the keys with a receipt, read by a fresh open (as a restart)."""
    with open_test_store(store_path, durability="sync") as s:
        turns = [e.event.step for e in s.read_stream("session-a")]
        receipts = [f"k{i}" for i in range(5) if s.get_receipt(SCOPE, f"k{i}") is not None]
    return turns, receipts


def test_a_failed_meta_page_write_is_answered_not_written_and_the_store_reopens_and_goes_on(store_path, tmp_path):
    nth = _victims_meta_write(store_path, tmp_path)
    answers, lines = _traced(store_path, str(tmp_path / "marker"), str(nth))
    injected = [line for line in lines if "INJECTED" in line]
    assert len(injected) == 1 and re.search(r", (\d+), \d+\) += ", injected[0]).group(1) != "4096", injected
    victim, after, final = answers[3], answers[4], answers[5]
    # before the fix: "event store write failed ... Input/output error", then MDB_PANIC on every
    # later transaction, reads included, until the process restarts
    assert victim["ok"] is False and victim["outcome"] == "not-written" and victim["retry"] > 0, victim
    assert store_path not in victim["message"], "the client's message names no server path"
    assert after == {"key": "k4", "ok": True, "version": 4}
    assert final == {"read": ["t0", "t1", "t2", "t4"], "writable": True, "reopens": 1}
    # what a fresh process finds is what the store answered
    assert _keys_in(store_path) == (["t0", "t1", "t2", "t4"], ["k0", "k1", "k2", "k4"])
    with open_test_store(store_path, durability="sync") as s:  # the refused key, sent again: written once
        again = s.append("session-a", [Stepped(step="t3")], idempotency=IdempotencyClaim(SCOPE, "k3", "h3"))
        assert not again.duplicate
    assert _keys_in(store_path) == (["t0", "t1", "t2", "t4", "t3"], ["k0", "k1", "k2", "k3", "k4"])


def test_a_commit_whose_outcome_cannot_be_found_stops_the_store_and_a_restart_settles_it(store_path, tmp_path):
    nth = _victims_meta_write(store_path, tmp_path)
    # every pwrite64 from the victim's meta page on fails: LMDB's own restore of the old meta
    # page, and the store's synced write after reopening, too
    answers, _ = _traced(store_path, str(tmp_path / "marker"), f"{nth}+")
    victim, after, final = answers[3], answers[4], answers[5]
    assert victim["ok"] is False and victim["outcome"] == "unknown" and victim["reason"] == "stopped", victim
    assert "same idempotency key" in victim["message"]
    assert after["ok"] is False and after["outcome"] == "not-written" and after["reason"] == "stopped", after
    assert final["writable"] is False and final["read"] == ["t0", "t1", "t2"]  # reads still answer
    # the restart decides; a retry with the same key gives the original receipt or one write
    turns, receipts = _keys_in(store_path)
    assert turns[:3] == ["t0", "t1", "t2"] and "t4" not in turns
    with open_test_store(store_path, durability="sync") as s:
        again = s.append("session-a", [Stepped(step="t3")], idempotency=IdempotencyClaim(SCOPE, "k3", "h3"))
        assert again.duplicate == ("k3" in receipts)
    turns, receipts = _keys_in(store_path)
    assert turns == ["t0", "t1", "t2", "t3"] and receipts == ["k0", "k1", "k2", "k3"]


def _mount_tmpfs(path: str, size: str) -> None:
    os.makedirs(path, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, f"this test mounts a tmpfs (root; .ci/run runs as root): {done.stderr}"


def test_on_a_full_disk_every_refused_append_is_absent_and_every_acknowledged_one_is_present(tmp_path):
    mount = str(tmp_path / "small")
    _mount_tmpfs(mount, "3m")
    try:
        path = os.path.join(mount, "store")
        answers: dict[str, BaseException | None] = {}
        lock = threading.Lock()
        with open_test_store(path, durability="sync") as s:
            def writer(w: int) -> None:
                for i in range(300):
                    key = f"w{w}-{i}"
                    try:
                        s.append(f"session-w{w}", [Stepped(step=key + "-" + "x" * 20_000)],
                                 idempotency=IdempotencyClaim(f"app:test:w{w}", key, "h"))
                        error = None
                    except StorageUnavailable as e:
                        error = e
                    with lock:
                        answers[key] = error

            threads = [threading.Thread(target=writer, args=(w,)) for w in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert s.info()["writable"]  # a full disk is a definite refusal: the store goes on
        refused = {k: e for k, e in answers.items() if e is not None}
        assert refused and len(refused) < len(answers)
        assert all(e.outcome == "not-written" and e.retry_after_ms > 0 for e in refused.values())
        assert any(isinstance(e, StorageFull) for e in refused.values())
        with open_test_store(path, readonly=True) as s:
            present = {k for k in answers if s.get_receipt(f"app:test:w{k[1:k.index('-')]}", k) is not None}
            logged = {e.event.step.split("-x")[0] for w in range(6) for e in s.read_stream(f"session-w{w}")}
        assert present == logged
        assert present == {k for k, e in answers.items() if e is None}
    finally:
        subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
