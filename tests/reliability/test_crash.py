"""SPEC §11 / RELIABILITY kill9_random and crash_point_matrix, CI-sized: a real server under bot
load is killed with SIGKILL (at random moments, or by itself at named points), restarted, and the
history is checked: 0 lost acknowledged inputs, 0 duplicate turns, every session resumes."""

from __future__ import annotations

import asyncio
import random
import signal
import threading
import time

import pytest

from tests.e2e.conftest import ServerProcess
from tests.reliability.harness import (
    SERVE_ARGS,
    Recorder,
    audit,
    create_sessions,
    kill_after,
    load,
    prepare,
    settle,
    start,
)

pytestmark = pytest.mark.e2e

TRIALS = 20


def test_sigkill_at_random_moments_loses_and_duplicates_nothing(tmp_path):
    data = str(tmp_path / "data")
    prepare(data)
    rng = random.Random(20261129)
    rec = Recorder()
    server = start(data)
    asyncio.run(create_sessions(server, rec, 6))
    epochs = [server.epoch]
    totals = {"acknowledged": 0, "unknown": 0, "duplicate_on_resend": 0}
    ready: list[float] = []
    for trial in range(TRIALS):
        since = len(rec.ops)
        killer = threading.Thread(target=kill_after, args=(server, rng.uniform(0.15, 0.8)))
        killer.start()
        asyncio.run(load(server, rec, rng, trial))
        killer.join()
        server.proc.wait(10)
        began = time.monotonic()
        server = start(data)
        ready.append(time.monotonic() - began)
        assert ready[-1] <= 5.0, f"the restarted server took {ready[-1]:.1f} s to listen"  # RELIABILITY kill9_random
        assert server.epoch > epochs[-1]  # a new epoch at every start
        epochs.append(server.epoch)
        totals["unknown"] += len(rec.unknown())
        resent = asyncio.run(settle(server, rec, since))
        totals["duplicate_on_resend"] += resent["duplicate"]
        audit(data, rec)
    totals["acknowledged"] = len(rec.acknowledged())
    server.stop()
    counts = audit(data, rec)
    assert totals["acknowledged"] > TRIALS  # the load really ran
    assert counts["inputs"] == len(rec.acknowledged())
    print(f"\nkill9: {TRIALS} trials, {len(rec.ops)} inputs tried, {totals['acknowledged']} acknowledged, "
          f"{totals['unknown']} in flight at a kill ({totals['duplicate_on_resend']} of them had been committed), "
          f"0 lost, 0 duplicated, {counts['turns']} turns, ready after a restart in at most {max(ready):.2f} s")


@pytest.mark.parametrize("point", ["before-commit", "after-commit", "after-ack", "model-stream", "tool-run"])
def test_the_server_killing_itself_at_named_points_loses_and_duplicates_nothing(tmp_path, point):
    data = str(tmp_path / "data")
    prepare(data)
    rng = random.Random(point)
    rec = Recorder()
    server = start(data)
    asyncio.run(create_sessions(server, rec, 4))
    server.stop()
    for trial in range(3):
        nth = rng.randint(3, 25)
        server = start(data, env={"SESSIONLOOP_CRASH_AT": f"{point}:{nth}"})
        since = len(rec.ops)
        asyncio.run(load(server, rec, rng, trial))
        assert server.proc.wait(15) == -signal.SIGKILL  # it killed itself at the crash point
        server = start(data)
        asyncio.run(settle(server, rec, since))
        server.stop()
        audit(data, rec)
    assert rec.acknowledged()


def test_the_server_killing_itself_while_recovering_loses_and_duplicates_nothing(tmp_path):
    """Crash point ``recovery``: a restart dies while it repairs the sessions a crash interrupted;
    the start after that repairs them again and every acknowledged input still runs once."""
    data = str(tmp_path / "data")
    prepare(data)
    rng = random.Random("recovery")
    rec = Recorder()
    server = start(data)
    asyncio.run(create_sessions(server, rec, 4))
    server.stop()
    for trial in range(2):
        # killed early in the load, so inputs are queued or running: sessions left to recover
        server = start(data, env={"SESSIONLOOP_CRASH_AT": f"after-commit:{rng.randint(4, 8)}"})
        since = len(rec.ops)
        asyncio.run(load(server, rec, rng, trial))
        assert server.proc.wait(15) == -signal.SIGKILL
        recovering = ServerProcess(data, *SERVE_ARGS, env={"SESSIONLOOP_CRASH_AT": "recovery:1"})
        try:
            recovering.start()
        except RuntimeError:
            pass  # it died before it printed its address: recovery starts as the host opens
        assert recovering.proc is not None and recovering.proc.wait(15) == -signal.SIGKILL
        server = start(data)
        asyncio.run(settle(server, rec, since))
        server.stop()
        audit(data, rec)
    assert rec.acknowledged()
