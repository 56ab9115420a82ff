"""RELIABILITY crash_point_matrix, the three points test_crash.py does not reach: ``snapshot``
(events committed, the snapshot they complete not yet written), ``map-resize`` (the store's map
full, the group's transaction aborted, the map not yet grown) and ``approval-commit`` (an
approval's answer committed, not yet acknowledged or acted on).

Each trial runs a real ``sessionloop serve`` under bot load until it SIGKILLs itself at the
point, restarts it, resends what was in flight with its key, waits for every turn, and audits the
store (harness.audit): 0 lost acknowledged inputs, 0 duplicate turns, every turn ended. Then the
point's own checks: sessions activate from snapshot + tail to the fold of their events; the map
grew and everything acknowledged is there; an approval is settled exactly once, its tool ran at
most once, and a second answer is refused.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import signal
import subprocess
import sys
from typing import Any

import lmdb
import pytest
from click.testing import CliRunner
from websockets.exceptions import ConnectionClosed, WebSocketException

from sessionloop.actors import events as E
from sessionloop.actors.events import open_store
from sessionloop.actors.replay.verify import verify
from sessionloop.actors.views.items import ItemsProjection
from sessionloop.cli.main import main as cli_main
from sessionloop.eventstore import EventStore
from tests.conftest import REPO
from tests.e2e.conftest import ServerProcess, initialized, open_client
from tests.reliability.harness import (
    SERVE_ARGS,
    Op,
    Recorder,
    app_client,
    audit,
    call,
    create_sessions,
    load,
    prepare,
    result,
    send_op,
    settle,
)

pytestmark = pytest.mark.e2e

EVERY = 5  # the snapshot interval of the snapshot test



def serve(data: str, *options: str, crash_at: str | None = None) -> ServerProcess:
    env = {"SESSIONLOOP_CRASH_AT": crash_at} if crash_at else None
    return ServerProcess(data, *SERVE_ARGS, *options, env=env).start()


def load_until_it_dies(server: ServerProcess, load_coro: Any, timeout: float = 20.0) -> None:
    """Run the bots' load until the server kills itself at the crash point (the bots end when
    it dies); a point never reached fails the test instead of loading forever."""
    try:
        asyncio.run(asyncio.wait_for(load_coro, timeout))
    except TimeoutError:
        server.stop(signal.SIGKILL)
        raise AssertionError(f"the server did not reach its crash point in {timeout:.0f} s of load") from None
    assert server.proc is not None
    assert server.proc.wait(15) == -signal.SIGKILL, "the server did not kill itself at the crash point"


def store_of(data: str) -> EventStore:
    return open_store(os.path.join(data, "store"), readonly=True)


# --- snapshot ------------------------------------------------------------------------------------


async def subscribe_all(server: ServerProcess, rec: Recorder) -> dict[str, list[str]]:
    """What each activated session serves: the item ids of its ``session/subscribe`` snapshot."""
    async with open_client(server) as ws:
        c = await initialized(ws)
        served = {}
        for sid in rec.sessions:
            reply = await c.result("session/subscribe", {"sessionId": sid})
            assert reply["session"]["id"] == sid, reply["session"]
            served[sid] = [item["itemId"] for item in reply["items"]]
        return served


def folded_items(data: str, rec: Recorder) -> dict[str, list[str]]:
    """The item ids a subscription snapshot holds, projected from all the events."""

    store = store_of(data)
    try:
        out = {}
        for sid in rec.sessions:
            items = ItemsProjection(sid)
            items.apply_all(r.event for r in store.read_stream(f"session-{sid}"))
            out[sid] = [item.item_id for item in items.snapshot_items()[0]]
        return out
    finally:
        store.close()


def verify_offline(data: str, rec: Recorder) -> dict[str, int | None]:
    """actors.replay.verify.verify: the stored snapshot is the fold of the events up to its version, and
    the listing record and history follow from the events."""

    store = store_of(data)
    try:
        versions = {}
        for sid in rec.sessions:
            stream = f"session-{sid}"
            report = verify(sid, store.read_stream(stream), store.load_snapshot(stream), store.stream_meta(stream))
            assert report.ok, f"session {sid}: {report.difference}"
            versions[sid] = report.snapshot_version
        return versions
    finally:
        store.close()


def snapshot_lag(data: str, rec: Recorder) -> dict[str, int]:
    """Events each session has after its last snapshot."""
    store = store_of(data)
    try:
        lag = {}
        for sid in rec.sessions:
            stream = f"session-{sid}"
            snap = store.load_snapshot(stream)
            lag[sid] = store.stream_version(stream) - (snap.version if snap is not None else 0)
        return lag
    finally:
        store.close()


def test_the_server_killing_itself_before_a_snapshot_is_written_loses_nothing_and_activates_from_the_fold(tmp_path):
    data = str(tmp_path / "data")
    prepare(data)
    rng = random.Random("snapshot")
    rec = Recorder()
    options = ("--snapshot-every", str(EVERY))  # a plain turn is ~5 events: a snapshot almost every turn
    server = serve(data, *options)
    asyncio.run(create_sessions(server, rec, 4))
    server.stop()
    for trial in range(2):
        server = serve(data, *options, crash_at=f"snapshot:{rng.randint(3, 12)}")
        since = len(rec.ops)
        load_until_it_dies(server, load(server, rec, rng, trial))
        # the kill left events newer than their sessions' last snapshot; the stored snapshots
        # still agree with the fold up to their own version
        verify_offline(data, rec)
        # snapshots were taken every few events during the load (the interval reached the host):
        # no session is far behind its last one; the one whose snapshot the kill prevented is at
        # least an interval behind
        lag = snapshot_lag(data, rec)
        assert EVERY <= max(lag.values()) <= 6 * EVERY, lag
        server = serve(data, *options)
        asyncio.run(settle(server, rec, since))
        # every session activates (snapshot + the events after it) and serves its subscription
        served = asyncio.run(subscribe_all(server, rec))
        assert served == folded_items(data, rec)
        assert sum(map(len, served.values())) > 0
        server.stop()
        audit(data, rec)
        snapshots = verify_offline(data, rec)
        assert any(v is not None and v >= EVERY for v in snapshots.values()), f"no snapshot was written: {snapshots}"
    assert rec.acknowledged()
    print(f"\nsnapshot: {len(rec.acknowledged())} inputs acknowledged, snapshots at {snapshots}")
    # the live check: `sessionloop replay --verify` opens a host on DATA, activates the session
    # from its snapshot and tail, and compares its actor's state, history and subscribe snapshot
    # with the fold of the events
    for sid in rec.sessions[:2]:
        out = subprocess.run([sys.executable, "-m", "sessionloop", "replay", sid, "--data", data, "--verify", "--json"],
                             check=False, capture_output=True, text=True, cwd=REPO, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        report = json.loads(out.stdout)
        assert report["compared"] == "live" and "difference" not in report, report
        assert report.get("snapshotVersion"), report


# --- map-resize ----------------------------------------------------------------------------------


def lmdb_map(data: str) -> tuple[int, int]:
    """(map size recorded in the environment, bytes in use), read with LMDB itself (map_size=0:
    take the size the file records)."""
    env = lmdb.open(os.path.join(data, "store"), readonly=True, max_dbs=32, map_size=0, lock=True)
    try:
        info = env.info()
        return int(info["map_size"]), (int(info["last_pgno"]) + 1) * int(env.stat()["psize"])
    finally:
        env.close()


def test_the_server_killing_itself_while_growing_a_full_map_loses_nothing_and_the_map_grows(tmp_path):
    data = str(tmp_path / "data")
    prepare(data)
    rng = random.Random("map-resize")
    rec = Recorder()
    options = ("--map-size-mb", "1")
    server = serve(data, *options)
    asyncio.run(create_sessions(server, rec, 4))
    server.stop()
    mib = 1024 * 1024
    assert lmdb_map(data)[0] == mib  # the option reached LMDB
    for trial, nth in enumerate((1, 2)):
        server = serve(data, *options, crash_at=f"map-resize:{nth}")
        since = len(rec.ops)
        load_until_it_dies(server, load(server, rec, rng, trial))
        at_crash, used = lmdb_map(data)
        assert used <= at_crash
        if trial == 0:
            assert at_crash == mib  # died growing the first map: it was not grown
        server = serve(data, *options)  # the same tiny option: the store opens at its used size
        asyncio.run(settle(server, rec, since))
        server.stop()
        after, used_after = lmdb_map(data)
        assert after >= at_crash and after >= used_after, (after, at_crash, used_after)
        assert after > mib  # it grew under the load after the restart (or the one before)
        audit(data, rec)
    counts = audit(data, rec)
    assert counts["inputs"] == len(rec.acknowledged()) > 0
    print(f"\nmap-resize: {counts['inputs']} inputs, map {at_crash // mib} MiB at the last kill, "
          f"{after // mib} MiB after the restart")


# --- approval-commit -----------------------------------------------------------------------------


class Approvals:
    """What the owner saw and answered: every approval pushed, every answer and its reply."""

    def __init__(self) -> None:
        self.pushed: dict[str, dict[str, Any]] = {}
        self.answered: list[str] = []  # the answer was acknowledged
        self.unknown: list[str] = []  # the server died before the answer's reply


async def owner(server: ServerProcess, seen: Approvals, ready: asyncio.Event) -> None:
    """The owner's console, present, approving each approval with its content hash."""
    try:
        async with open_client(server) as ws:
            c = await initialized(ws)
            assert await c.result("presence/update", {"active": True}) == {}
            ready.set()
            while True:
                pushed = await c.push(lambda m: m["method"] == "approval/requested", timeout=30)
                approval = pushed["params"]["approval"]
                if approval["id"] in seen.pushed:
                    continue  # pushed again (presence re-push)
                seen.pushed[approval["id"]] = approval
                seen.unknown.append(approval["id"])
                reply = await call(c, "approval/respond", {"approvalId": approval["id"], "decision": "approve",
                                                          "contentHash": approval["contentHash"]})
                assert "result" in reply, reply
                seen.unknown.remove(approval["id"])
                seen.answered.append(approval["id"])
    except (ConnectionClosed, ConnectionError):
        pass  # the server died under it
    finally:
        ready.set()


EFFECTS = "effects.log"  # in each session's workspace: the sandbox lets a command write nowhere else


def exec_text(key: str) -> str:
    return "!tool exec " + json.dumps({"command": f"echo {key} >> {EFFECTS}"})


async def approval_load(server: ServerProcess, rec: Recorder, rng: random.Random, trial: int,
                        seen: Approvals, bots: int = 3) -> None:
    """Bots send exec calls that need approval (and plain inputs) until the server dies; the
    present owner approves them."""
    ready = asyncio.Event()
    console = asyncio.create_task(owner(server, seen, ready))
    await ready.wait()

    async def bot(b: int) -> None:
        try:
            ws, c = await app_client(server)
        except (WebSocketException, OSError):
            return  # the server already died
        j = 0
        try:
            while True:
                sid = rng.choice(rec.sessions)
                key = f"a{trial}-b{b}-m{j}"
                op = Op(sid, key, exec_text(key) if rng.random() < 0.8 else "hello")
                rec.ops.append(op)
                j += 1
                await send_op(c, op)
        except ConnectionClosed:
            return  # the server died: the op in flight stays unknown
        finally:
            await ws.close()

    bots_done = asyncio.gather(*(bot(b) for b in range(bots)))
    try:
        await console  # ends when the server dies
    except BaseException:
        bots_done.cancel()  # the owner failed: do not leave the bots sending forever
        server.stop(signal.SIGKILL)
        raise
    await bots_done


async def create_asking_sessions(server: ServerProcess, rec: Recorder, n: int) -> None:
    ws, c = await app_client(server)
    try:
        for _ in range(n):
            created = await result(c, "loop/create", {"containerId": "inbox", "permissionMode": "ask"})
            rec.sessions.append(created["sessionId"])
    finally:
        await ws.close()


async def answer_again(server: ServerProcess, approvals: list[dict[str, Any]]) -> list[str]:
    async with open_client(server) as ws:
        c = await initialized(ws)
        assert await c.result("presence/update", {"active": True}) == {}
        codes = []
        for approval in approvals:
            reply = await c.call("approval/respond", {"approvalId": approval["id"], "decision": "approve",
                                                     "contentHash": approval["contentHash"]})
            assert "error" in reply, f"a second answer to {approval['id']} was accepted: {reply}"
            codes.append(reply["error"]["data"]["code"])
        return codes


def audit_approvals(data: str, rec: Recorder, seen: Approvals) -> dict[str, Any]:
    """Each approval settled once in its own stream and once in its session's; each tool call
    started at most once; each exec's effect (a line in its workspace's :data:`EFFECTS`) there at
    most once, and there exactly when its call completed."""
    lines: collections.Counter[str] = collections.Counter()
    for sid in rec.sessions:
        effects = os.path.join(data, "workspaces", sid, EFFECTS)
        if os.path.exists(effects):
            with open(effects) as f:
                lines.update(f.read().split())
    assert all(n == 1 for n in lines.values()), f"a tool ran twice: {lines.most_common(3)}"
    store = store_of(data)
    try:
        for approval_id in seen.pushed:
            events = [r.event for r in store.read_stream(f"approval-{approval_id}")]
            assert isinstance(events[0], E.ApprovalRequested), events
            settled = [e for e in events if isinstance(e, E.ApprovalSettled)]
            assert len(settled) == 1, f"approval {approval_id} settled {len(settled)} times: {settled}"
            if approval_id in seen.answered or approval_id in seen.unknown:
                # the answer was committed before the kill (the crash point is after its commit)
                assert (settled[0].settlement.state, settled[0].settlement.source) == ("approved", "answer"), settled
        session_settled: dict[str, list[E.Settlement]] = collections.defaultdict(list)
        started: collections.Counter[tuple[str, str]] = collections.Counter()
        completed_keys: set[str] = set()
        started_keys: set[str] = set()
        for sid in rec.sessions:
            calls: dict[tuple[str, str], str] = {}
            for r in store.read_stream(f"session-{sid}"):
                ev = r.event
                if isinstance(ev, E.ToolApprovalSettled):
                    session_settled[ev.approval_id].append(ev.settlement)
                elif isinstance(ev, E.ToolStarted):
                    started[(ev.turn_id, ev.call_id)] += 1
                    assert ev.tool == "exec", ev
                    key = ev.args["command"].split()[1]
                    calls[(ev.turn_id, ev.call_id)] = key
                    started_keys.add(key)
                elif isinstance(ev, E.ToolFinished) and ev.status == "completed" and (ev.turn_id, ev.call_id) in calls:
                    assert ev.output["exitCode"] == 0, ev.output
                    completed_keys.add(calls[(ev.turn_id, ev.call_id)])
        assert all(n == 1 for n in started.values()), f"a tool call started twice: {started.most_common(3)}"
        for approval_id in seen.pushed:
            assert len(session_settled[approval_id]) == 1, (approval_id, session_settled[approval_id])
        assert completed_keys <= set(lines) <= started_keys, (completed_keys - set(lines), set(lines) - started_keys)
        return {"restarted": {a: session_settled[a][0] for a in seen.unknown}, "ran": len(lines)}
    finally:
        store.close()


def test_the_server_killing_itself_after_committing_an_approval_answer_settles_it_once(tmp_path):
    data = str(tmp_path / "data")
    prepare(data)
    rng = random.Random("approval-commit")
    rec = Recorder()
    seen = Approvals()
    server = serve(data)
    asyncio.run(create_asking_sessions(server, rec, 4))
    server.stop()
    ran_before = 0
    for trial in range(2):
        # more answers than sessions: some session asked again, so its first approved exec ended
        server = serve(data, crash_at=f"approval-commit:{rng.randint(5, 7)}")
        since = len(rec.ops)
        load_until_it_dies(server, approval_load(server, rec, rng, trial, seen))
        # the owner answers one approval at a time: the one it was waiting on is the one whose
        # answer was being committed when the server died
        assert len(seen.unknown) == 1, (seen.unknown, seen.answered)
        in_flight = seen.pushed[seen.unknown[0]]
        server = serve(data)
        asyncio.run(settle(server, rec, since))
        codes = asyncio.run(answer_again(server, [in_flight, seen.pushed[seen.answered[0]]]))
        assert all(code in ("approval-settled", "not-found") for code in codes), codes
        server.stop()
        audit(data, rec)
        outcome = audit_approvals(data, rec, seen)
        # the crashed approval's call: one settlement in its session, the answer its approval
        # recorded (not "cancelled by shutdown"), and its exec ran at most once (audit_approvals)
        assert set(outcome["restarted"]) == {in_flight["id"]}
        restarted = outcome["restarted"][in_flight["id"]]
        assert (restarted.state, restarted.source) == ("approved", "answer"), restarted
        assert outcome["ran"] > ran_before  # approved tools really ran in this trial
        ran_before = outcome["ran"]
        seen.unknown.clear()
    assert rec.acknowledged()
    print(f"\napproval-commit: {len(seen.pushed)} approvals, {len(seen.answered)} answers acknowledged, "
          f"{outcome['ran']} execs ran once each; the answer in flight at the kill ended in its session as "
          f"{outcome['restarted'][in_flight['id']].state}/{outcome['restarted'][in_flight['id']].source}")


# --- the operator options ------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--snapshot-every", "--map-size-mb"])
@pytest.mark.parametrize("value", ["0", "-5"])
def test_serve_refuses_a_snapshot_interval_or_map_size_below_one(tmp_path, option, value):
    data = tmp_path / "data"
    out = CliRunner().invoke(cli_main, ["serve", "--data", str(data), "--port", "0", option, value])
    assert out.exit_code == 2, out.output
    assert f"Invalid value for '{option}': {value} is not in the range x>=1" in out.output
    assert not data.exists()  # refused before anything was opened
