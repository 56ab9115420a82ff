"""In ``sync`` mode an fsync reaches the disk before every append returns (RELIABILITY: a SIGKILL
test cannot prove this, because the page cache survives a process crash; a syscall trace can)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap

from tests.conftest import REPO

SCRIPT = textwrap.dedent(
    """
    import os, sys
    from tests.eventstore.union import Stepped, open_test_store
    store = open_test_store(sys.argv[1], durability=sys.argv[2])
    os.write(1, b"OPENED\\n")
    for i in range(5):
        store.append("session-a", [Stepped(step=str(i))], i)
        os.write(1, b"ACK %d\\n" % i)
    store.close()
    """
)


def trace(store_path: str, durability: str) -> list[str]:
    strace = shutil.which("strace")
    assert strace, ".ci/run installs strace; this machine lacks it"
    proc = subprocess.run(
        [strace, "-f", "-e", "trace=fsync,fdatasync,msync,write", "-o", "/dev/stderr",
         sys.executable, "-c", SCRIPT, store_path, durability],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = []
    for line in proc.stderr.splitlines():
        if re.search(r"\b(fsync|fdatasync|msync)\(", line):
            events.append("SYNC")
        elif m := re.search(r'write\(1, "(OPENED|ACK \d)', line):
            events.append(m.group(1))
    return events


def test_sync_mode_fsyncs_before_every_acknowledged_append(store_path):
    events = trace(store_path, "sync")
    acks = [i for i, e in enumerate(events) if e.startswith("ACK")]
    assert len(acks) == 5
    previous = events.index("OPENED")
    for ack in acks:
        assert "SYNC" in events[previous + 1:ack], f"no fsync between {events[previous]} and {events[ack]}"
        previous = ack


def test_nosync_mode_does_not_fsync_per_append(store_path):
    events = trace(store_path, "nosync")
    start = events.index("OPENED")
    last_ack = max(i for i, e in enumerate(events) if e.startswith("ACK"))
    assert "SYNC" not in events[start:last_ack + 1]
