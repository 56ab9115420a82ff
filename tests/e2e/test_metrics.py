"""SPEC §11a: the Prometheus metrics move by the right amounts on a real server."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from tests.e2e.conftest import initialized, open_client

pytestmark = pytest.mark.e2e


def scrape(server) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{server.port}/metrics").text
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"^(\S+?)(\{[^}]*\})?\s+(\S+)$", line)
        if m:
            values[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return values


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
    after = scrape(server)
    assert after['sessionloop_turns_total{outcome="completed"}'] - before.get('sessionloop_turns_total{outcome="completed"}', 0) == 2
    assert after['sessionloop_turns_total{outcome="failed"}'] - before.get('sessionloop_turns_total{outcome="failed"}', 0) == 1
    assert after["sessionloop_turn_duration_seconds_count"] - before.get("sessionloop_turn_duration_seconds_count", 0) == 3
    # session.created + per turn: input.accepted, turn.started, llm.started, llm.completed|failed, turn end
    assert after["sessionloop_events_appended_total"] - before.get("sessionloop_events_appended_total", 0) == 1 + 5 * 3
    assert after['sessionloop_frames_total{code="ok",method="turn/send"}'] == 3
    assert after['sessionloop_frames_total{code="not-found",method="session/rename"}'] == 1
    assert during["sessionloop_connections"] == 1 and after["sessionloop_connections"] == 0
    assert after["sessionloop_store_position"] >= 16
    assert after['sessionloop_store_info{durability="nosync",fsync_per_commit="false",shards="16"}'] == 1
    assert bad["error"]["data"]["code"] == "not-found"
    # the server froze its startup objects out of the collector's full passes (cli/serve.py)
    assert after["sessionloop_gc_frozen_objects"] > 10_000
    assert after["sessionloop_gc_young_threshold"] == 10_000  # actors/gc_policy.py, applied by serve
