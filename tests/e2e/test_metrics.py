"""SPEC §11a: the Prometheus metrics move by the right amounts on a real server."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import pytest

from tests.e2e.conftest import TOKEN, initialized, open_client

pytestmark = pytest.mark.e2e

STORE_KEYS = ("sessionloop_store_commit_batches", "sessionloop_store_commit_requests",
              "sessionloop_store_append_latency_seconds_count", "sessionloop_actors_passivations",
              "sessionloop_session_commits_total")


def scrape(server) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"^(\S+?)(\{[^}]*\})?\s+(\S+)$", line)
        if m:
            values[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return values


def settled(server) -> dict[str, float]:
    """A scrape once the store stopped moving: its histograms and its counters are read one after
    the other, so a commit landing in between (a passivation snapshot) would split them."""
    last = scrape(server)
    for _ in range(100):
        time.sleep(0.1)
        now = scrape(server)
        if all(now.get(k) == last.get(k) for k in STORE_KEYS):
            return now
        last = now
    raise AssertionError("the server kept committing")


def moved(after: dict[str, float], before: dict[str, float], key: str) -> float:
    return after[key] - before.get(key, 0)


def assert_store_histograms_agree_with_the_store(m: dict[str, float]) -> None:
    """One commit-duration and one batch-size observation per write transaction, batch sizes
    adding up to the write requests, cumulative buckets ending at the count."""
    batches, requests = m["sessionloop_store_commit_batches"], m["sessionloop_store_commit_requests"]
    assert m["sessionloop_store_commit_duration_seconds_count"] == batches
    assert m['sessionloop_store_commit_duration_seconds_bucket{le="+Inf"}'] == batches
    assert m["sessionloop_store_commit_batch_size_count"] == batches
    assert m["sessionloop_store_commit_batch_size_sum"] == requests
    assert m['sessionloop_store_commit_batch_size_bucket{le="+Inf"}'] == batches
    assert m['sessionloop_store_commit_batch_size_bucket{le="1.0"}'] <= batches
    assert m["sessionloop_store_append_latency_seconds_count"] <= requests
    assert m['sessionloop_store_append_latency_seconds_bucket{le="+Inf"}'] == m[
        "sessionloop_store_append_latency_seconds_count"]
    assert m["sessionloop_store_append_latency_seconds_sum"] > 0
    assert m["sessionloop_store_commit_duration_seconds_sum"] > 0


def test_counters_move_by_the_turns_events_and_frames_of_a_few_turns(server):
    before = scrape(server)

    async def go():
        async with open_client(server) as ws:
            c = await initialized(ws)
            sid = (await c.result("session/create", {}))["session"]["id"]
            await c.result("session/subscribe", {"sessionId": sid})
            for text in ("one", "two", "!error boom"):
                await c.result("turn/send", {"sessionId": sid, "content": text})
                await c.turn_done(sid)
            bad = await c.call("session/rename", {"sessionId": "nope", "title": "x"})
            during = scrape(server)
            return bad, during
    bad, during = asyncio.run(go())
    after = settled(server)
    def grew(name: str) -> float:
        return after[name] - before.get(name, 0)

    assert grew('sessionloop_turns_total{outcome="completed"}') == 2
    assert grew('sessionloop_turns_total{outcome="failed"}') == 1
    assert grew("sessionloop_turn_duration_seconds_count") == 3
    # session.created + per turn: input.accepted, turn.started, llm.started, llm.completed|failed, turn end;
    # and place.registered of the default workspace, which its first session registers (every append counts)
    assert after["sessionloop_events_appended_total"] - before.get("sessionloop_events_appended_total", 0) == \
        1 + 5 * 3 + 1
    assert after['sessionloop_frames_total{code="ok",method="turn/send"}'] == 3
    assert after['sessionloop_frames_total{code="not-found",method="session/rename"}'] == 1
    assert during["sessionloop_connections"] == 1 and after["sessionloop_connections"] == 0
    assert after["sessionloop_store_position"] >= 16
    assert after['sessionloop_store_info{durability="nosync",fsync_per_commit="false",shards="16"}'] == 1
    assert bad["error"]["data"]["code"] == "not-found"
    # the server froze its startup objects out of the collector's full passes (cli/serve.py)
    assert after["sessionloop_gc_frozen_objects"] > 10_000
    assert after["sessionloop_gc_young_threshold"] == 10_000  # actors/system/gc_policy.py, applied by serve
    # model calls by outcome: "one" and "two" answered, "!error boom" failed
    assert moved(after, before, 'sessionloop_model_call_duration_seconds_count{outcome="completed"}') == 2
    assert moved(after, before, 'sessionloop_model_call_duration_seconds_count{outcome="failed"}') == 1
    assert moved(after, before, 'sessionloop_model_call_duration_seconds_count{outcome="aborted"}') == 0
    # the store: histograms agree with its counters; every write request of this workload was an
    # acknowledged append (no snapshot, no epoch): the session's commits and the workspace's record
    assert_store_histograms_agree_with_the_store(after)
    commits = moved(after, before, "sessionloop_session_commits_total")
    assert commits >= 1 + 3  # the create, then each turn's input at least
    appends = moved(after, before, "sessionloop_store_append_latency_seconds_count")
    assert appends == moved(after, before, "sessionloop_store_commit_requests") >= commits
    assert moved(after, before, "sessionloop_store_commit_batch_size_sum") == appends
    assert moved(after, before, "sessionloop_store_commit_duration_seconds_count") == moved(
        after, before, "sessionloop_store_commit_batches") >= 1
    # one session activated and still live; no mailbox backlog at rest
    assert moved(after, before, "sessionloop_actors_activations") == 1
    assert moved(after, before, "sessionloop_actors_active") == 1
    assert moved(after, before, "sessionloop_actors_passivations") == 0
    assert "sessionloop_mailbox_depth" in before and after["sessionloop_mailbox_depth"] == 0


def test_a_waiting_approval_and_a_running_background_task_are_counted_while_they_last(server):
    """Permission mode ask (the default for an owner's session) with a present user: the exec
    call waits for an approval; with acceptCalls a background exec keeps a task running."""
    before = settled(server)

    async def go():
        async with open_client(server) as ws:
            c = await initialized(ws)
            assert await c.result("presence/update", {"active": True}) == {}
            await c.result("background/watch", {})
            ask = (await c.result("session/create", {}))["session"]["id"]
            await c.result("session/subscribe", {"sessionId": ask})
            await c.result("turn/send", {"sessionId": ask, "content": '!tool exec {"command": "echo hi"}'})
            pushed = await c.push(lambda m: m["method"] == "approval/requested"
                                  and m["params"]["approval"]["sessionId"] == ask)
            approval = pushed["params"]["approval"]
            waiting = scrape(server)
            await c.result("approval/respond", {"approvalId": approval["id"], "decision": "deny",
                                                "contentHash": approval["contentHash"]})
            await c.turn_done(ask)
            answered = settled(server)

            bg = (await c.result("session/create", {}))["session"]["id"]
            await c.result("session/subscribe", {"sessionId": bg})
            reply = await c.call("session/config/update", {"sessionId": bg, "plugin": "tools",
                                                           "key": "permissionMode", "value": "acceptCalls"})
            assert "result" in reply, reply
            args = json.dumps({"command": "sleep 30", "background": True})
            await c.result("turn/send", {"sessionId": bg, "content": f"!tool exec {args}"})
            card = await c.push(lambda m: m["method"] == "item/completed" and m["params"]["sessionId"] == bg
                                and m["params"]["item"]["kind"] == "tool-call" and m["params"]["item"].get("taskId"))
            task_id = card["params"]["item"]["taskId"]
            await c.turn_done(bg)
            await c.push(lambda m: m["method"] == "background/changed" and any(
                t["id"] == task_id and t["status"] == "running" for t in m["params"]["upserts"]))
            running = scrape(server)
            assert await c.result("background/stop", {"taskId": task_id}) == {}
            await c.push(lambda m: m["method"] == "background/changed" and any(
                t["id"] == task_id and t["status"] == "stopped" for t in m["params"]["upserts"]))
            return waiting, answered, running

    waiting, answered, running = asyncio.run(go())
    after = settled(server)
    assert moved(waiting, before, "sessionloop_approvals_pending") == 1
    assert answered["sessionloop_approvals_pending"] == before["sessionloop_approvals_pending"]
    assert moved(running, before, "sessionloop_background_tasks_running") == 1
    assert after["sessionloop_background_tasks_running"] == before["sessionloop_background_tasks_running"]
    assert after["sessionloop_approvals_pending"] == before["sessionloop_approvals_pending"]
    # the ask session: the model asked for exec, then answered the denial; the bg session: the
    # model asked for the background exec, then answered its card
    assert moved(after, before, 'sessionloop_model_call_duration_seconds_count{outcome="completed"}') == 4
    assert moved(after, before, 'sessionloop_turns_total{outcome="completed"}') == 2
    assert moved(after, before, "sessionloop_actors_active") == 2
    assert_store_histograms_agree_with_the_store(after)
    appends = moved(after, before, "sessionloop_store_append_latency_seconds_count")
    assert appends == moved(after, before, "sessionloop_store_commit_requests")  # all of them appends
    assert appends >= moved(after, before, "sessionloop_session_commits_total") >= 2 + 2 * 2


def test_sessions_beyond_the_live_limit_are_passivated_and_counted(server):
    """``serve`` keeps at most 4,000 session actors live (``HostOptions.max_live``): creating
    4,100 sessions passivates at least the 100 oldest, each saving a snapshot first."""
    before = settled(server)
    created, conns = 4100, 20

    async def creator() -> None:
        async with open_client(server) as ws:
            c = await initialized(ws)
            for _ in range(created // conns):
                reply = await c.call("session/create", {})
                while "error" in reply and reply["error"]["data"]["code"] == "rejected":  # 100 requests/s
                    await asyncio.sleep(reply["error"]["data"]["retryAfterMs"] / 1000)
                    reply = await c.call("session/create", {})
                assert "result" in reply, reply

    async def go() -> None:
        await asyncio.gather(*(creator() for _ in range(conns)))

    asyncio.run(go())
    after = settled(server)
    activated = moved(after, before, "sessionloop_actors_activations")
    passivated = moved(after, before, "sessionloop_actors_passivations")
    assert activated == created
    assert passivated >= created - 4000
    assert after["sessionloop_actors_active"] == after["sessionloop_actors_activations"] - after[
        "sessionloop_actors_passivations"] <= 4000
    assert after["sessionloop_mailbox_depth"] == 0
    # the store: an append per created session (and the workspace's record on a fresh store),
    # and per passivated session a snapshot, a write request that is not an append
    assert moved(after, before, "sessionloop_session_commits_total") == created
    appends = moved(after, before, "sessionloop_store_append_latency_seconds_count")
    assert created <= appends <= created + 1
    assert moved(after, before, "sessionloop_store_commit_requests") == appends + passivated
    assert_store_histograms_agree_with_the_store(after)


def test_serve_max_live_bounds_the_live_sessions_and_a_passivated_one_answers_again(server_factory):
    """``serve --max-live 5``: twelve sessions, each with a turn, leave at most five actors live;
    the first (passivated) session takes a turn again, activated from the store."""
    server = server_factory("--max-live", "5")
    ids: list[str] = []

    async def go() -> None:
        async with open_client(server) as ws:
            c = await initialized(ws)
            for i in range(12):
                sid = (await c.result("session/create", {}))["session"]["id"]
                await c.result("session/subscribe", {"sessionId": sid})
                await c.result("turn/send", {"sessionId": sid, "content": f"hello {i}"})
                await c.turn_done(sid)
                await c.result("session/unsubscribe", {"sessionId": sid})
                ids.append(sid)
            m = settled(server)
            assert m["sessionloop_actors_activations"] == 12
            assert m["sessionloop_actors_active"] <= 5
            assert m["sessionloop_actors_passivations"] >= 7
            await c.result("session/subscribe", {"sessionId": ids[0]})
            await c.result("turn/send", {"sessionId": ids[0], "content": "again"})
            done = await c.turn_done(ids[0])
            assert done["params"]["item"]["outcome"] == "replied"
            history = await c.result("session/history", {"sessionId": ids[0]})
            assert "echo: hello 0" in json.dumps(history) and "echo: again" in json.dumps(history)

    asyncio.run(go())
    m = settled(server)
    assert m["sessionloop_actors_activations"] == 13
    assert m["sessionloop_actors_active"] <= 5
