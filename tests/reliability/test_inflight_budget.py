"""RELIABILITY oversize, server-wide: many large frames at once against a real ``sessionloop serve``.

Each connection's frames are bounded by ``--max-frame-mb``; what bounds all of them together is
``--max-inflight-mb`` (protocol/transport_flow.py ``InflightBudget``): a large frame takes room for its
payload when its header arrives, and waits (its sender held back by TCP) while there is none.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from sessionloop.cli.serve import DEFAULT_MAX_INFLIGHT_MB
from tests.conftest import REPO
from tests.e2e.conftest import TOKEN, initialized
from tests.reliability.harness import rss_kib
from tests.reliability.raw_ws import RawWebSocket, client_frame

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HELLO = {"protocolVersion": "0.2.0", "client": {"name": "budget", "version": "1"}}
TOO_LARGE = {"code": -32600, "message": "request too large"}
#: serve --help: "memory for incoming frames stays under about 2x this, plus 1 MiB per connection"
CEILING_FACTOR = 2


def big_request(rid: str, mib: int) -> str:
    """A request of ``mib`` MiB: above the application's limit, below the socket's (64 MiB)."""
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "sessions/list", "params": {"q": "x" * (mib * MIB)}})


async def rss_peak(pid: int, work: Any) -> tuple[Any, int]:
    """Run ``work`` while sampling the server's RSS every 10 ms: (its result, the peak in KiB)."""
    peak = rss_kib(pid)
    done = asyncio.ensure_future(work)
    while not done.done():
        peak = max(peak, rss_kib(pid))
        await asyncio.sleep(0.01)
    return done.result(), peak


def test_eight_clients_sending_60_mib_frames_at_once_keep_the_server_under_the_documented_ceiling(server_factory):
    """8 x 60 MiB at once took the server to 1.2 GB before the budget. With the default budget
    (128 MiB: two such frames at a time) every one is still received and answered, and the RSS
    grows by at most 2x the budget plus 1 MiB per connection."""
    server = server_factory()
    pid = server.proc.pid
    frame = big_request("big", 60)

    async def one(i: int) -> dict[str, Any]:
        async with connect(server.url, additional_headers=AUTH, max_size=None, write_limit=MIB) as ws:
            await ws.send(frame)
            return json.loads(await asyncio.wait_for(ws.recv(), 120))

    async def main() -> tuple[list[dict[str, Any]], int, int]:
        async with connect(server.url, additional_headers=AUTH) as ws:  # first-use code paths, page faults
            await initialized(ws)
        before = rss_kib(pid)
        replies, peak = await rss_peak(pid, asyncio.gather(*(one(i) for i in range(8))))
        return replies, before, peak

    started = time.monotonic()
    replies, before, peak = asyncio.run(main())
    growth = (peak - before) / 1024
    ceiling = CEILING_FACTOR * DEFAULT_MAX_INFLIGHT_MB + 8
    print(f"\ninflight budget: 8 x 60 MiB answered in {time.monotonic() - started:.1f} s; server RSS "
          f"{before // 1024} MiB -> peak {peak // 1024} MiB (+{growth:.0f}, ceiling +{ceiling})")
    assert replies == [{"jsonrpc": "2.0", "id": "big", "error": TOO_LARGE}] * 8
    assert growth <= ceiling, f"server RSS grew {growth:.0f} MiB for 8 x 60 MiB frames (ceiling {ceiling})"


def test_a_frame_that_finds_no_room_waits_then_is_closed_1013_while_small_requests_go_on(server_factory):
    """Budget 32 MiB, --inflight-wait 1. A raw client announces a 30 MiB frame and sends 1 MiB of
    it: its room is taken. A second client's 20 MiB frame finds none: it waits, then its
    connection is closed 1013 (try again later); small requests on a third connection are served
    throughout. Once the first frame is complete and answered, a 20 MiB frame passes again."""
    server = server_factory("--max-frame-mb", "32", "--max-inflight-mb", "32", "--inflight-wait", "1",
                            "--close-timeout", "2")

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        small = await connect(server.url, additional_headers=AUTH)
        c = await initialized(small)
        holder = await RawWebSocket.open(server.port, AUTH)
        assert "result" in await holder.request(1, "initialize", HELLO)
        held = client_frame(0x1, big_request("held", 30).encode())
        holder.writer.write(held[:MIB])
        await holder.writer.drain()
        assert "result" in await c.call("sessions/list", {})  # the server has read the header by now

        waiter = await connect(server.url, additional_headers=AUTH, max_size=None, write_limit=MIB)
        started = time.monotonic()
        send = asyncio.ensure_future(waiter.send(big_request("waits", 20)))
        try:
            await asyncio.wait_for(waiter.recv(), 15)
        except ConnectionClosed:
            pass
        out["refused"] = (waiter.close_code, waiter.close_reason, time.monotonic() - started)
        send.cancel()
        out["small_during"] = [await c.call("sessions/list", {}) for _ in range(3)]

        holder.writer.write(held[MIB:])  # the rest: it is received, then answered
        out["held"] = await holder.recv_frame(30)
        async with connect(server.url, additional_headers=AUTH, max_size=None, write_limit=MIB) as again:
            await again.send(big_request("again", 20))
            out["again"] = json.loads(await asyncio.wait_for(again.recv(), 30))
        holder.close()
        await small.close()
        return out

    out = asyncio.run(main())
    code, reason, after = out["refused"]
    print(f"\ninflight budget: the waiting frame was closed {code} after {after:.2f} s ({reason!r})")
    assert code == 1013 and reason == "try again later: the server is receiving too much data"
    assert 1.0 <= after <= 1.0 + 2 + 3  # the wait, then at most the close timeout (and some slack)
    assert all("result" in r for r in out["small_during"])
    opcode, payload = out["held"]
    assert opcode == 0x1 and json.loads(payload) == {"jsonrpc": "2.0", "id": "held", "error": TOO_LARGE}
    assert out["again"] == {"jsonrpc": "2.0", "id": "again", "error": TOO_LARGE}


def test_an_inflight_budget_below_the_frame_limit_stops_serve_with_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "sessionloop", "serve", "--data", str(tmp_path / "d"), "--port", "0",
                           "--token", TOKEN, "--max-frame-mb", "64", "--max-inflight-mb", "32"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "--max-inflight-mb 32 is below --max-frame-mb 64" in done.stderr
