"""SPEC §11 / RELIABILITY kill9_random and crash_point_matrix, CI-sized: a real server under bot
load is killed with SIGKILL (at random moments, or by itself at named points), restarted, and the
history is checked: 0 lost acknowledged inputs, 0 duplicate turns, every session resumes."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

from tests.reliability.harness import Recorder, audit, create_sessions, kill_after, load, prepare, settle, start

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
    for trial in range(TRIALS):
        since = len(rec.ops)
        killer = threading.Thread(target=kill_after, args=(server, rng.uniform(0.15, 0.8)))
        killer.start()
        asyncio.run(load(server, rec, rng, trial))
        killer.join()
        server.proc.wait(10)
        server = start(data)
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
          f"0 lost, 0 duplicated, {counts['turns']} turns")


@pytest.mark.parametrize("point", ["before-commit", "after-commit"])
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
        assert server.proc.wait(15) != 0  # it died at the crash point
        server = start(data)
        asyncio.run(settle(server, rec, since))
        server.stop()
        audit(data, rec)
    assert rec.acknowledged()
