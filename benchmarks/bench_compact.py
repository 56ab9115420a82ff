"""How long ``EventStore.compact`` and ``EventStore.backup`` take on a store of realistic size (not
a test: run it by hand); writes ``benchmarks/results/compact.json``.

    python benchmarks/bench_compact.py [--sessions 2000] [--turns 10] [--runs 3]

Builds a store of SESSIONS sessions of TURNS turns each (an input of ~200 bytes, a step, an
answer of ~1.5 KB, the feed, idempotency receipts, a snapshot, stream metadata and flags, as
tests/eventstore/test_purge.py ``fill`` writes), purges one session in ten, then times a backup
and a compaction, RUNS times each, and prints the medians with the file sizes.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.measure import write_results  # noqa: E402
from sessionloop.eventstore import ANY_VERSION, EventStore, IdempotencyClaim, request_hash
from tests.eventstore.test_purge import purge
from tests.eventstore.union import Finished, Noted, Opened, Stepped, open_test_store


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(("turn", "session", "the", "model", "answer", "tool", "exec", "file", "line"))
                    for _ in range(n))


def build(store: EventStore, sessions: int, turns: int) -> None:
    rng = random.Random(7)
    for s in range(sessions):
        sid = f"b{s}"
        stream = f"session-{sid}"
        store.append(stream, [Opened(at=1, name=sid, title=words(rng, 6))], 0, feed="bot",
                     meta=words(rng, 20).encode(), flags={"active": True})
        for t in range(turns):
            text = words(rng, 35)
            store.append(stream, [Noted(at=2, key=f"i{t}", text=text), Stepped(at=2, step=f"t{t}"),
                                  Finished(at=3, step=f"t{t}", output=words(rng, 260))],
                         ANY_VERSION, idempotency=IdempotencyClaim(f"app:bot:{sid}", f"k{t}",
                                                                   request_hash({"text": text}), b"r"),
                         feed="bot")
        store.save_snapshot(stream, store.stream_version(stream), words(rng, 300).encode())
    for s in range(0, sessions, 10):
        purge(store, f"b{s}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-compact-")
    try:
        path = os.path.join(work, "store")
        store = open_test_store(path, durability="nosync")
        try:
            t0 = time.perf_counter()
            build(store, args.sessions, args.turns)
            built = time.perf_counter() - t0
            backups, compacts, sizes = [], [], []
            for run in range(args.runs):
                dest = os.path.join(work, f"backup-{run}")
                t0 = time.perf_counter()
                size = store.backup(dest)
                backups.append(time.perf_counter() - t0)
                shutil.rmtree(dest)
                t0 = time.perf_counter()
                sizes.append(store.compact())
                compacts.append(time.perf_counter() - t0)
        finally:
            store.close()
        mib = 1 << 20
        print(f"store: {args.sessions} sessions x {args.turns} turns, one in ten purged (built in {built:.1f} s)")
        print(f"data.mdb: {sizes[0][0] / mib:.1f} MiB before the first compact, {sizes[0][1] / mib:.1f} MiB after; "
              f"backup {size / mib:.1f} MiB")
        print(f"backup:  median {statistics.median(backups) * 1000:.0f} ms of {args.runs} "
              f"({', '.join(f'{b * 1000:.0f}' for b in backups)})")
        print(f"compact: median {statistics.median(compacts) * 1000:.0f} ms of {args.runs} "
              f"({', '.join(f'{c * 1000:.0f}' for c in compacts)})")
        write_results("compact", {"sessions": args.sessions, "turns": args.turns, "runs": args.runs,
                                  "backup_ms": [b * 1000 for b in backups], "compact_ms": [c * 1000 for c in compacts],
                                  "data_mdb_bytes": [list(s) for s in sizes], "backup_bytes": size})
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
