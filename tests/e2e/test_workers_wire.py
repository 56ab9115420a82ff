"""``serve --workers 2``: two worker processes on one port, NATS between them, real clients.

A connection lands on either worker (``SO_REUSEPORT``); a session runs on the worker of its shard.
These tests open connections until both workers hold sessions made through their own clients,
then drive every session from every connection: a request for the other worker's session is
relayed to it, and its pushes come back on the client's socket.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import zlib
from contextlib import AsyncExitStack

from tests.e2e.conftest import initialized, open_client

SHARDS = 16


def owner(session_id: str, workers: int = 2) -> int:
    return zlib.crc32(session_id.encode()) % SHARDS % workers


def run(coro):
    return asyncio.run(coro)


def worker_pids(server) -> list[int]:
    """The supervisor's children that are workers (not nats-server)."""
    pid = server.proc.pid
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        children = [int(p) for p in f.read().split()]
    out = []
    for child in children:
        with open(f"/proc/{child}/cmdline", "rb") as f:
            if b"sessionloop" in f.read():
                out.append(child)
    return out


async def _clients_on_both_workers(server, stack, limit: int = 40):
    """(client, session id) pairs until sessions made on both workers are among them."""
    made: list[tuple[object, str]] = []
    for _ in range(limit):
        ws = await stack.enter_async_context(open_client(server))
        c = await initialized(ws)
        sid = (await c.result("session/create", {"name": f"s{len(made)}"}))["session"]["id"]
        made.append((c, sid))
        if len({owner(s) for _, s in made}) == 2 and len(made) >= 4:
            return made
    raise AssertionError(f"{limit} connections all landed on one worker")


def _across(made):
    """A client and a session of the other worker than the client's (its requests are relayed)."""
    return next((c, s) for c, own in made for _, s in made if owner(s) != owner(own))


def test_every_connection_drives_every_session_whichever_worker_runs_it(server_factory):
    server = server_factory("--workers", "2")

    async def go():
        async with AsyncExitStack() as stack:
            made = await _clients_on_both_workers(server, stack)
            sessions = [sid for _, sid in made]
            # a session runs where its shard is: the connection that made it was on that worker
            clients = [c for c, _ in made]
            for c in clients:
                for sid in sessions:
                    await c.result("session/subscribe", {"sessionId": sid})
            for n, c in enumerate(clients):
                for sid in sessions:
                    assert await c.result("turn/send", {"sessionId": sid, "content": f"hello {n}"}) == {}
                for sid in sessions:
                    await c.turn_done(sid, timeout=30)
            # every client saw every session's answers to every client, through its own socket
            listed = [await c.result("sessions/list", {"limit": 100}) for c in clients]
            history = await clients[0].result("session/history", {"sessionId": sessions[-1], "limit": 200})
            return sessions, clients, listed, history

    sessions, clients, listed, history = run(go())
    assert {owner(s) for s in sessions} == {0, 1}
    for page in listed:  # every worker lists every session, both workers' alike
        assert {s["id"] for s in page["sessions"]} >= set(sessions)
    texts = [i["text"] for i in history["items"] if i["kind"] == "agent-message"]
    assert sorted(texts) == sorted(f"echo: hello {n}" for n in range(len(clients)))


def worker_pid(server, index: int) -> int:
    for pid in worker_pids(server):
        with open(f"/proc/{pid}/environ", "rb") as f:
            if f"SESSIONLOOP_WORKER={index}/".encode() in f.read():
                return pid
    raise AssertionError(f"no worker {index}")


def test_a_killed_worker_is_started_again_its_sessions_answer_unavailable_meanwhile_then_resync(server_factory):
    server = server_factory("--workers", "2")

    async def go():
        async with AsyncExitStack() as stack:
            made = await _clients_on_both_workers(server, stack)
            # a client on one worker, a session of the other
            client, sid = _across(made)
            victim = owner(sid)
            snap = await client.result("session/subscribe", {"sessionId": sid})
            assert await client.result("turn/send", {"sessionId": sid, "content": "before"}) == {}
            await client.turn_done(sid, timeout=30)
            pid = worker_pid(server, victim)
            os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.05)
            refused = await client.call("turn/send", {"sessionId": sid, "content": "while down"})
            # its next incarnation announces itself: the subscription is told to subscribe again
            resync = await client.push(lambda m: m["method"] == "session/resync" and m["params"]["sessionId"] == sid,
                                       timeout=30)
            again = await client.result("session/subscribe", {"sessionId": sid})
            assert await client.result("turn/send", {"sessionId": sid, "content": "after"}) == {}
            await client.turn_done(sid, timeout=30)
            history = await client.result("session/history", {"sessionId": sid, "limit": 200})
            return snap, pid, refused, resync, again, history, worker_pid(server, victim)

    snap, pid, refused, resync, again, history, new_pid = run(go())
    assert refused["error"]["data"]["code"] == "unavailable", refused
    assert refused["error"]["data"]["retryAfterMs"] > 0
    assert new_pid != pid
    assert resync["params"]["epoch"] == again["epoch"] and again["epoch"] > snap["epoch"]
    texts = [i["text"] for i in history["items"] if i["kind"] == "agent-message"]
    assert texts == ["echo: before", "echo: after"]  # nothing acknowledged was lost, nothing refused was done


def test_an_owner_present_on_one_worker_approves_a_tool_call_of_a_session_the_other_runs(server_factory):
    server = server_factory("--workers", "2")

    async def go():
        async with AsyncExitStack() as stack:
            made = await _clients_on_both_workers(server, stack)
            client, sid = _across(made)
            for other, _ in made:  # nobody else is present: only this client can be asked
                if other is not client:
                    await other.result("presence/update", {"active": False})
            assert await client.result("presence/update", {"active": True}) == {}
            await client.result("session/subscribe", {"sessionId": sid})
            await client.result("turn/send", {"sessionId": sid, "content": '!tool exec {"command": "echo approved"}'})
            asked = await client.push(lambda m: m["method"] == "approval/requested"
                                      and m["params"]["approval"]["sessionId"] == sid, timeout=30)
            approval = asked["params"]["approval"]
            answered = await client.result("approval/respond", {"approvalId": approval["id"], "decision": "approve",
                                                                "contentHash": approval["contentHash"]})
            await client.turn_done(sid, timeout=30)
            history = await client.result("session/history", {"sessionId": sid, "limit": 200})
            return answered, history

    answered, history = run(go())
    assert answered is not None
    calls = [i for i in history["items"] if i["kind"] == "tool-call"]
    assert calls and calls[-1]["status"] == "completed", calls
    assert "approved" in str(calls[-1].get("output") or calls[-1])


BOT_TOKEN = "bot-token-for-the-end-to-end-tests"


def bot_data_dir(tmp_path):
    """A data directory whose apps.toml declares the bot ``mybot`` (its token BOT_TOKEN)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "apps.toml").write_text(f'[apps.mybot]\ntoken = "{BOT_TOKEN}"\nplatform = "telegram"\n'
                                    'containers = ["inbox"]\n')
    return data


async def bot_sessions(server, stack, at_least: int, limit: int = 60) -> list[tuple[object, str]]:
    """(bot client, session id) pairs, a connection and a ``loop/create`` each, until there are
    ``at_least`` and both workers made some (a connection lands on either)."""
    made: list[tuple[object, str]] = []
    for _ in range(limit):
        c = await initialized(await stack.enter_async_context(open_client(server, BOT_TOKEN)))
        made.append((c, (await c.result("loop/create", {"containerId": "inbox"}))["sessionId"]))
        if len(made) >= at_least and len({owner(s) for _, s in made}) == 2:
            return made
    raise AssertionError(f"{limit} bot connections all landed on one worker")


def test_the_app_quota_holds_exactly_across_workers(server_factory, tmp_path):
    """200 unfinished turns per app, counted by both workers together: 15 sessions on both workers
    get 17 slow sends each (255, each session under its own 20): exactly 200 accepted."""
    data = bot_data_dir(tmp_path)
    server = server_factory("--workers", "2", data_dir=str(data))

    async def go():
        async with AsyncExitStack() as stack:
            sessions = await bot_sessions(server, stack, 15)
            receipts = []
            for k in range(17):
                for c, sid in sessions:
                    receipts.append(await c.result("loop/send", {"sessionId": sid, "text": "!sleep 8000\nslow",
                                                                 "idempotencyKey": f"{sid}-{k}"}))
            return sessions, receipts

    sessions, receipts = run(go())
    assert {owner(s) for _, s in sessions} == {0, 1}
    statuses = [r["state"] for r in receipts]
    expected_sends = len(sessions) * 17
    assert len(statuses) == expected_sends and expected_sends > 200
    assert statuses.count("accepted") + statuses.count("queued") == 200, statuses
    rejected = [r for r in receipts if r["state"] == "rejected"]
    assert len(rejected) == expected_sends - 200 and all(r["retryAfterMs"] > 0 for r in rejected)


def test_the_app_feed_is_one_across_workers_listed_and_watched_from_either(server_factory, tmp_path):
    """One bot app's sessions on both workers: ``loop/listEvents`` pages one feed, the same from a
    connection on either worker (every event once, cursors in order), and ``loop/watch`` on one
    connection hears both workers' sessions' events, the same ones."""
    data = bot_data_dir(tmp_path)
    server = server_factory("--workers", "2", data_dir=str(data))

    async def go():
        async with AsyncExitStack() as stack:
            made = await bot_sessions(server, stack, 4)
            watcher = made[0][0]
            assert "cursor" in await watcher.result("loop/watch", {})
            for k in range(3):
                for c, sid in made:
                    receipt = await c.result("loop/send", {"sessionId": sid, "text": f"hello {k}",
                                                           "idempotencyKey": f"{sid}-{k}"})
                    await c.result("loop/waitForTurn", {"sessionId": sid, "turnId": receipt["turnId"],
                                                        "timeoutMs": 30_000})
            lists = []
            for c in (made[0][0], next(c for c, s in made if owner(s) != owner(made[0][1]))):
                events, after = [], None
                while True:
                    page = await c.result("loop/listEvents", {"limit": 7, **({"after": after} if after else {})})
                    events += page["events"]
                    after = page.get("nextCursor")
                    if not after or not page["events"]:
                        break
                lists.append(events)
            listed = {e["cursor"] for e in lists[0]}
            watched = {}
            while not listed <= set(watched):  # live deltas come too (not stored: no cursor of the feed)
                event = (await watcher.push(lambda m: m["method"] == "loop/event", timeout=30))["params"]["event"]
                if event["type"] != "assistant.delta":
                    watched[event["cursor"]] = event
            return made, lists, watched

    made, (from_one, from_other), watched = run(go())
    assert {owner(s) for _, s in made} == {0, 1}
    assert from_one == from_other  # one feed, whichever worker answers
    cursors = [e["cursor"] for e in from_one]
    assert len(cursors) == len(set(cursors)) and cursors == sorted(cursors, key=int)
    for _, sid in made:  # every session's three turns, each once
        ended = [e for e in from_one if e["sessionId"] == sid and e["type"] == "turn.completed"]
        assert len(ended) == 3, [e["type"] for e in from_one if e["sessionId"] == sid]
    assert set(watched) == {e["cursor"] for e in from_one}  # what was stored, heard live from both workers
    assert {e["sessionId"] for e in watched.values()} == {sid for _, sid in made}


def test_changing_the_worker_count_between_restarts_keeps_every_session_and_idempotency_key(server_factory,
                                                                                          tmp_path):
    """Sessions made and sent to under ``--workers 2``, the server stopped, started again with 4
    workers, then with one process: each time every session answers, every repeated key gets the
    original receipt (its turn, ``duplicate``), and new keys make new turns; no migration step."""
    data = bot_data_dir(tmp_path)

    async def first_run(server):
        async with AsyncExitStack() as stack:
            made: dict[str, str] = {}
            for n, (c, sid) in enumerate(await bot_sessions(server, stack, 6)):
                receipt = await c.result("loop/send", {"sessionId": sid, "text": f"first {n}",
                                                       "idempotencyKey": f"key-{n}"})
                await c.result("loop/waitForTurn", {"sessionId": sid, "turnId": receipt["turnId"],
                                                    "timeoutMs": 30_000})
                made[sid] = receipt["turnId"]
            return made

    async def again(server, made, run_n):
        async with AsyncExitStack() as stack:
            ws = await stack.enter_async_context(open_client(server, BOT_TOKEN))
            c = await initialized(ws)
            repeats, new = {}, {}
            for n, sid in enumerate(made):
                repeats[sid] = await c.result("loop/send", {"sessionId": sid, "text": f"first {n}",
                                                            "idempotencyKey": f"key-{n}"})
                receipt = await c.result("loop/send", {"sessionId": sid, "text": f"run {run_n}",
                                                       "idempotencyKey": f"key-{n}-run-{run_n}"})
                new[sid] = await c.result("loop/waitForTurn", {"sessionId": sid, "turnId": receipt["turnId"],
                                                               "timeoutMs": 30_000})
            return repeats, new

    server = server_factory("--workers", "2", data_dir=str(data))
    made = run(first_run(server))
    assert len({owner(s) for s in made}) == 2  # both workers had sessions
    assert server.stop() == 0
    for run_n, workers in enumerate(("4", "1"), start=1):
        server = server_factory("--workers", workers, data_dir=str(data))
        repeats, new = run(again(server, made, run_n))
        assert server.stop() == 0
        for sid, turn in made.items():
            assert repeats[sid]["state"] == "duplicate" and repeats[sid]["turnId"] == turn, repeats[sid]
            assert new[sid]["state"] == "completed" and new[sid]["outputText"] == f"echo: run {run_n}", new[sid]


def test_background_list_and_session_batch_answer_for_both_workers_sessions(server_factory):
    server = server_factory("--workers", "2")

    async def go():
        async with AsyncExitStack() as stack:
            made = await _clients_on_both_workers(server, stack)
            client = made[0][0]
            one = {owner(s): s for _, s in made}  # a session of each worker
            await client.result("background/watch", {})
            tasks = {}
            for worker, sid in sorted(one.items()):
                await client.result("session/subscribe", {"sessionId": sid})
                await client.result("session/config/update", {"sessionId": sid, "plugin": "tools",
                                                              "key": "permissionMode", "value": "acceptCalls"})
                args = json.dumps({"command": "sleep 30", "background": True})
                await client.result("turn/send", {"sessionId": sid, "content": f"!tool exec {args}"})
                card = await client.push(lambda m, sid=sid: m["method"] == "item/completed"
                                         and m["params"]["sessionId"] == sid
                                         and m["params"]["item"]["kind"] == "tool-call"
                                         and m["params"]["item"].get("taskId"), timeout=30)
                tasks[worker] = card["params"]["item"]["taskId"]
                await client.turn_done(sid, timeout=30)
            listed = await client.result("background/list", {})
            # the watch hears both workers' tasks; stopping the other worker's task is relayed to it
            stopped = await client.result("background/stop", {"taskId": tasks[1 - owner(made[0][1])]})
            changed = await client.push(lambda m: m["method"] == "background/changed"
                                        and any(t["id"] == tasks[1 - owner(made[0][1])] and t["status"] != "running"
                                                for t in m["params"]["upserts"]), timeout=30)
            batch = await client.result("session/batch", {"op": "archive", "ids": [*one.values(), "0" * 21]})
            archived = await client.result("sessions/list", {"archived": True, "limit": 100})
            return tasks, listed, stopped, changed, batch, archived, one

    tasks, listed, stopped, changed, batch, archived, one = run(go())
    assert {t["id"] for t in listed["tasks"]} >= set(tasks.values())  # both workers' tasks in one list
    assert stopped == {} and changed
    assert [f["sessionId"] for f in batch["failed"]] == ["0" * 21]  # the unknown one fails, both others archived
    assert {s["id"] for s in archived["sessions"]} >= set(one.values())


def test_requests_in_flight_to_a_worker_that_dies_are_answered_unavailable_when_it_is_back(server_factory):
    """A worker stopped (SIGSTOP) holds a relayed request and a scattered one unanswered; killed, it
    is started again, and both are answered ``unavailable`` when its next incarnation announces
    itself, not after the relay's 60 s timeout (the calls here give up after 30 s)."""
    server = server_factory("--workers", "2")

    async def go():
        async with AsyncExitStack() as stack:
            made = await _clients_on_both_workers(server, stack)
            client, sid = _across(made)
            victim = owner(sid)
            pid = worker_pid(server, victim)
            os.kill(pid, signal.SIGSTOP)
            try:
                await client.ws.send(json.dumps({"jsonrpc": "2.0", "id": "relayed", "method": "session/history",
                                                 "params": {"sessionId": sid, "limit": 5}}))
                await client.ws.send(json.dumps({"jsonrpc": "2.0", "id": "scattered", "method": "background/list",
                                                 "params": {}}))
                await asyncio.sleep(0.5)  # both reached NATS, and the stopped worker's socket
            finally:
                os.kill(pid, signal.SIGKILL)
            answers = {}
            while len(answers) < 2:
                msg = json.loads(await asyncio.wait_for(client.ws.recv(), 30))
                if msg.get("id") in ("relayed", "scattered"):
                    answers[msg["id"]] = msg
            deadline = asyncio.get_running_loop().time() + 30
            while True:  # the new incarnation answers both again
                again = await client.call("background/list", {})
                if "result" in again or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.2)
            history = await client.call("session/history", {"sessionId": sid, "limit": 5})
            return answers, again, history, worker_pid(server, victim), pid

    answers, again, history, new_pid, pid = run(go())
    for reply in answers.values():
        assert reply["error"]["data"]["code"] == "unavailable", reply
        assert reply["error"]["data"]["retryAfterMs"] > 0
    assert new_pid != pid
    assert "tasks" in again["result"], again
    assert "items" in history["result"], history


def nats_pid(server) -> int:
    pid = server.proc.pid
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        for child in (int(p) for p in f.read().split()):
            with open(f"/proc/{child}/cmdline", "rb") as g:
                if b"nats-server" in g.read():
                    return child
    raise AssertionError("no nats-server child")


def test_a_killed_nats_server_is_started_again_and_relaying_resumes(server_factory):
    server = server_factory("--workers", "2")

    async def go():
        async with AsyncExitStack() as stack:
            made = await _clients_on_both_workers(server, stack)
            client, sid = _across(made)
            await client.result("session/subscribe", {"sessionId": sid})
            first = nats_pid(server)
            os.kill(first, signal.SIGKILL)
            answers = []
            deadline = asyncio.get_running_loop().time() + 30
            while True:  # while NATS is away a relayed request is answered unavailable, never lost
                reply = await client.call("session/history", {"sessionId": sid, "limit": 10})
                answers.append(reply)
                if "result" in reply or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert await client.result("turn/send", {"sessionId": sid, "content": "after nats"}) == {}
            done = await client.turn_done(sid, timeout=30)
            return first, nats_pid(server), answers, done

    first, second, answers, done = run(go())
    assert second != first
    assert "result" in answers[-1], answers[-1]
    for reply in answers[:-1]:
        assert reply["error"]["data"]["code"] == "unavailable", reply
    assert done["params"]["item"]["outcome"] == "replied"


def test_loop_watch_hears_both_workers_sessions_in_cursor_order_and_resumes_from_a_cursor(server_factory, tmp_path):
    """The connection's worker reads every worker's events from the shared store (woken by its own
    commits, and once a second for the others'): one watch gets the turns of sessions on both, in
    cursor order; a watch from a cursor replays exactly what followed it."""
    data = bot_data_dir(tmp_path)
    server = server_factory("--workers", "2", data_dir=str(data))

    async def events_of(c, n):
        got = []
        while len(got) < n:
            push = await c.push(lambda m: m["method"] == "loop/event", 15)
            if push["params"]["event"]["cursor"] != "0":
                got.append(push["params"]["event"])
        return got

    async def go():
        async with AsyncExitStack() as stack:
            watcher = await initialized(await stack.enter_async_context(open_client(server, BOT_TOKEN)))
            start = (await watcher.result("loop/watch", {}))["cursor"]
            sessions: list[tuple[object, str]] = []
            for _ in range(40):
                c = await initialized(await stack.enter_async_context(open_client(server, BOT_TOKEN)))
                sid = (await c.result("loop/create", {"containerId": "inbox"}))["sessionId"]
                sessions.append((c, sid))
                if len(sessions) >= 4 and len({owner(s) for _, s in sessions}) == 2:
                    break
            for c, sid in sessions:
                receipt = await c.result("loop/send", {"sessionId": sid, "text": "hi", "idempotencyKey": sid})
                assert (await c.result("loop/waitForTurn", {"sessionId": sid, "turnId": receipt["turnId"]}))[
                    "state"] == "completed"
            heard = await events_of(watcher, 3 * len(sessions))
            again = await initialized(await stack.enter_async_context(open_client(server, BOT_TOKEN)))
            assert (await again.result("loop/watch", {"cursor": heard[2]["cursor"]}))["cursor"] == heard[2]["cursor"]
            replayed = await events_of(again, len(heard) - 3)
            return sessions, start, heard, replayed

    sessions, start, heard, replayed = run(go())
    assert {owner(s) for _, s in sessions} == {0, 1}
    cursors = [int(e["cursor"]) for e in heard]
    assert cursors == sorted(cursors) and len(set(cursors)) == len(cursors) and cursors[0] > int(start)
    assert {e["sessionId"] for e in heard} == {s for _, s in sessions}
    assert sum(e["type"] == "turn.completed" for e in heard) == len(sessions)
    assert replayed == heard[3:]


def test_a_session_tree_split_over_workers_after_n_changed_is_archived_and_deleted_whole(server_factory, tmp_path):
    """A tree made by one process (root -> children -> grandchildren), served again by two workers:
    its sessions now sit on both (each by its shard), a child of the other worker has a grandchild
    back on the root's. Archive, unarchive, ``session/batch`` archive and delete of the root reach
    every session of it, whichever worker runs it and whichever worker the client's connection is on."""
    data = tmp_path / "tree-data"

    async def make_tree(server):
        async with open_client(server) as ws:
            c = await initialized(ws)
            root = (await c.result("session/create", {"name": "root"}))["session"]["id"]
            parent_of: dict[str, str] = {}
            for n in range(60):  # until the tree crosses from worker to worker and back
                crossing = [s for s, p in parent_of.items() if owner(s) != owner(p)]
                back = [s for s, p in parent_of.items() if p in crossing and owner(s) == owner(root)]
                if len(crossing) >= 2 and back and any(owner(s) == owner(root) for s in parent_of):
                    return root, parent_of
                under = next((s for s in crossing if not any(p == s for p in parent_of.values())), root) \
                    if crossing and not back else root
                child = (await c.result("session/create", {"name": f"n{n}", "parentId": under}))["session"]["id"]
                parent_of[child] = under
            raise AssertionError(f"no tree crossing workers in 60 sessions: {parent_of}")

    server = server_factory(data_dir=str(data))
    root, parent_of = run(make_tree(server))
    assert server.stop() == 0
    tree = [root, *parent_of]
    assert {owner(s) for s in tree} == {0, 1}

    async def listed(c, archived: bool) -> set[str]:
        out: set[str] = set()
        for parent in {root, *parent_of.values()}:
            page = await c.result("sessions/list", {"parentId": parent, "archived": archived, "limit": 200})
            out |= {s["id"] for s in page["sessions"]}
        page = await c.result("sessions/list", {"archived": archived, "limit": 200})
        return out | {s["id"] for s in page["sessions"]}

    async def go(server):
        async with AsyncExitStack() as stack:
            clients = [await initialized(await stack.enter_async_context(open_client(server))) for _ in range(4)]
            a, b = clients[0], clients[-1]
            # a long turn in a session of each worker below the root, stopped through the root
            busy = [next(s for s in parent_of if owner(s) == w) for w in (0, 1)]
            for sid in busy:
                await a.result("session/subscribe", {"sessionId": sid})
                await a.result("turn/send", {"sessionId": sid, "content": "!sleep 60000"})
                await a.push(lambda m, sid=sid: m["method"] == "item/started" and m["params"]["sessionId"] == sid
                             and m["params"]["item"]["kind"] == "turn", timeout=30)
            stop_all = await b.result("background/stopAll", {"sessionId": root})
            ended = [(await a.turn_done(sid, timeout=20))["params"] for sid in busy]
            await a.result("session/archive", {"sessionId": root})
            archived = await listed(b, True)
            await b.result("session/unarchive", {"sessionId": root})
            unarchived = await listed(a, True), await listed(a, False)
            batch = await b.result("session/batch", {"op": "archive", "ids": [root]})
            batch_archived = await listed(a, True)
            deleted = await a.result("session/delete", {"sessionId": root})
            after = {s["id"] for archived in (True, False)
                     for s in (await b.result("sessions/list", {"archived": archived, "limit": 200}))["sessions"]}
            gone = [await b.call("session/subscribe", {"sessionId": s}) for s in tree]
            return stop_all, ended, archived, unarchived, batch, batch_archived, deleted, after, gone

    server = server_factory("--workers", "2", data_dir=str(data))
    stop_all, ended, archived, (still_archived, active), batch, batch_archived, deleted, after, gone = \
        run(go(server))
    assert server.stop() == 0
    assert stop_all == {} and all(e["item"]["outcome"] != "replied" for e in ended), ended
    assert set(tree) <= archived, set(tree) - archived
    assert not set(tree) & still_archived and set(tree) <= active
    assert batch == {"failed": []} and set(tree) <= batch_archived
    assert deleted == {}
    assert not set(tree) & after
    assert all(r["error"]["data"]["code"] == "not-found" for r in gone), gone


def test_trees_crossing_both_ways_deleted_all_at_once_each_finish(server_factory, tmp_path):
    """Five trees rooted on each worker, each with children on the other (made by one process,
    served by two), all deleted at once: every worker's delete waits on the other's share of its
    tree, and each answers, with nothing left of any tree (their share-outs do not queue behind
    the deletes that wait for them)."""
    data = tmp_path / "crossing-data"

    async def make(server):
        async with open_client(server) as ws:
            c = await initialized(ws)
            trees: dict[str, list[str]] = {}
            for n in range(200):
                if sum(owner(r) == 0 for r in trees) >= 5 and sum(owner(r) == 1 for r in trees) >= 5:
                    break
                root = (await c.result("session/create", {"name": f"r{n}"}))["session"]["id"]
                if sum(owner(r) == owner(root) for r in trees) >= 5:
                    continue
                kids: list[str] = []
                while sum(owner(k) != owner(root) for k in kids) < 2:
                    kids.append((await c.result("session/create", {"name": f"k{n}", "parentId": root}))
                                ["session"]["id"])
                trees[root] = kids
            return trees

    server = server_factory(data_dir=str(data))
    trees = run(make(server))
    assert server.stop() == 0
    assert sorted(owner(r) for r in trees) == [0] * 5 + [1] * 5

    async def go(server):
        async with AsyncExitStack() as stack:
            clients = [await initialized(await stack.enter_async_context(open_client(server))) for _ in trees]
            answers = await asyncio.gather(*(c.call("session/delete", {"sessionId": root}, timeout=90)
                                             for c, root in zip(clients, trees, strict=True)))
            gone = [await clients[0].call("session/subscribe", {"sessionId": s})
                    for root, kids in trees.items() for s in (root, *kids)]
            return answers, gone

    server = server_factory("--workers", "2", data_dir=str(data))
    answers, gone = run(go(server))
    assert server.stop() == 0
    assert all(a.get("result") == {} for a in answers), answers
    assert all(r["error"]["data"]["code"] == "not-found" for r in gone), gone
