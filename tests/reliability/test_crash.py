"""SPEC §11 / RELIABILITY kill9_random and crash_point_matrix, CI-sized: a real server under bot
load is killed with SIGKILL (at random moments, or by itself at named points), restarted, and the
history is checked: 0 lost acknowledged inputs (``loop/send`` receipts and ``turn/send`` ``{}`` replies),
0 duplicate turns, every session resumes, subscribers resubscribe in the new epoch."""

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
    Subscriber,
    audit,
    create_owner_sessions,
    create_sessions,
    kill_after,
    load,
    prepare,
    settle,
    settle_owner,
    start,
)

pytestmark = pytest.mark.e2e

TRIALS = 20


@pytest.mark.timeout(300)  # 20 kills and restarts: ~110 s alone, more beside CI's other interpreters
def test_sigkill_at_random_moments_loses_and_duplicates_nothing(tmp_path):
    """Apps send ``loop/send`` (receipts), an owner sends ``turn/send`` (``{}`` replies) and two
    owner connections follow the owner sessions; after every kill and restart the subscribers
    see a greater epoch, resubscribe and get the pushes of the turns that end after it."""
    data = str(tmp_path / "data")
    prepare(data)
    rng = random.Random(20261129)
    rec = Recorder()
    server = start(data)
    asyncio.run(create_sessions(server, rec, 6))
    asyncio.run(create_owner_sessions(server, rec, 3))
    o = rec.owner_sessions
    subscribers = [Subscriber([o[0], o[1]]), Subscriber([o[1], o[2]])]  # o[1] followed twice
    epochs = [server.epoch]
    totals = {"acknowledged": 0, "unknown": 0, "duplicate_on_resend": 0, "unreplied": 0, "turn_pushes": 0}
    ready: list[float] = []
    for trial in range(TRIALS):
        since = len(rec.ops)
        sends_before = len(rec.sends)
        killer = threading.Thread(target=kill_after, args=(server, rng.uniform(0.15, 0.8)))
        killer.start()
        asyncio.run(load(server, rec, rng, trial, subscribers=subscribers))
        killer.join()
        server.proc.wait(10)
        totals["unreplied"] += sum(1 for s in rec.sends[sends_before:] if not s.replied)
        began = time.monotonic()
        server = start(data)
        ready.append(time.monotonic() - began)
        assert ready[-1] <= 5.0, f"the restarted server took {ready[-1]:.1f} s to listen"  # RELIABILITY kill9_random
        assert server.epoch > epochs[-1]  # a new epoch at every start
        epochs.append(server.epoch)
        totals["unknown"] += len(rec.unknown())

        resent, owner = asyncio.run(after_restart(server, data, rec, subscribers, since, trial))
        totals["duplicate_on_resend"] += resent["duplicate"]
        totals["turn_pushes"] += owner["turn_pushes"]
        audit(data, rec)
    totals["acknowledged"] = len(rec.acknowledged())
    server.stop()
    counts = audit(data, rec)
    assert totals["acknowledged"] > TRIALS  # the load really ran
    assert counts["inputs"] == len(rec.acknowledged())
    errors = [s for s in rec.sends if s.error is not None]
    assert not errors, f"turn/send answered with errors: {[s.error for s in errors[:3]]}"
    acknowledged_sends = len(rec.acknowledged_sends())
    assert acknowledged_sends > 2 * TRIALS  # the owner load really ran (the sends after restarts alone are 3 a trial)
    assert counts["owner_inputs"] == acknowledged_sends + counts["unreplied_committed"]
    assert all(sub.resubscribes == TRIALS for sub in subscribers)
    # at least the turns of the sends after each restart, for each subscription
    assert totals["turn_pushes"] >= sum(len(sub.sessions) for sub in subscribers) * TRIALS
    print(f"\nkill9: {TRIALS} trials, {len(rec.ops)} inputs tried, {totals['acknowledged']} acknowledged, "
          f"{totals['unknown']} in flight at a kill ({totals['duplicate_on_resend']} of them had been committed), "
          f"0 lost, 0 duplicated, {counts['turns']} turns, ready after a restart in at most {max(ready):.2f} s; "
          f"turn/send: {len(rec.sends)} tried, {acknowledged_sends} acknowledged, {totals['unreplied']} unreplied "
          f"at a kill ({counts['unreplied_committed']} of them committed, once), 0 lost, 0 duplicated, "
          f"{counts['owner_turns']} turns; {len(subscribers)} subscribers resubscribed {TRIALS} times each, "
          f"{totals['turn_pushes']} turn ends pushed after restarts, built state = fresh snapshot")


async def after_restart(server: ServerProcess, data: str, rec: Recorder, subscribers: list[Subscriber],
                        since: int, trial: int) -> tuple[dict[str, int], dict[str, int]]:
    """The app bots' unknown inputs resent and their turns waited for, while the subscribers
    resubscribe and the owner sessions' turns settle."""
    resent, owner = await asyncio.gather(settle(server, rec, since),
                                         settle_owner(server, data, rec, subscribers, trial))
    return resent, owner


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
