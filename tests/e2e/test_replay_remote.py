"""``sessionloop replay SESSION --verify --url``: the events read beside a running server,
compared with what that server answers over the wire (SPEC §9: verify against the live system)."""

from __future__ import annotations

import asyncio
import json

import pytest
from click.testing import CliRunner

from sessionloop.cli.main import main
from tests.e2e.conftest import TOKEN, initialized, open_client

pytestmark = pytest.mark.e2e


async def a_session_with_turns(server) -> str:
    async with open_client(server) as ws:
        c = await initialized(ws)
        sid = (await c.result("session/create", {}))["session"]["id"]
        await c.result("session/subscribe", {"sessionId": sid})
        await c.result("turn/send", {"sessionId": sid, "content": "hello",
                                     "attachments": [{"data": "data:text/plain;base64,aGVsbG8=", "name": "a.txt"}]})
        await c.turn_done(sid)
        await c.result("turn/send", {"sessionId": sid, "content": '!tool list_files {"path": "."}'})
        await c.turn_done(sid)
        return sid


def verify(server, sid: str, data_dir: str) -> tuple[int, dict]:
    out = CliRunner().invoke(main, ["replay", sid, "--data", data_dir, "--verify", "--json",
                                    "--url", server.url, "--token", TOKEN])
    return out.exit_code, json.loads(out.stdout)


def test_verify_asks_the_running_server_over_the_wire_and_agrees_with_the_events(server):
    sid = asyncio.run(a_session_with_turns(server))
    code, report = verify(server, sid, server.data_dir)
    assert code == 0, report
    assert report["compared"] == "live" and report["remoteUrl"] == server.url
    assert report["liveEpoch"] == server.epoch and report["historyPages"] >= 1 and report["snapshotItems"] > 0
    assert "difference" not in report


def test_verify_reports_a_server_that_does_not_serve_the_session(server_factory, tmp_path):
    first = server_factory(data_dir=str(tmp_path / "a"))
    other = server_factory(data_dir=str(tmp_path / "b"))
    sid = asyncio.run(a_session_with_turns(first))
    code, report = verify(other, sid, first.data_dir)  # the events of one, the answers of another
    assert code == 1
    assert report["difference"]["check"] == "live subscribe" and report["difference"]["path"] == "error"


def test_url_needs_verify_and_an_answering_server(server):
    sid = asyncio.run(a_session_with_turns(server))
    out = CliRunner().invoke(main, ["replay", sid, "--data", server.data_dir, "--url", server.url])
    assert out.exit_code != 0 and "--url only applies to --verify" in out.output
    out = CliRunner().invoke(main, ["replay", sid, "--data", server.data_dir, "--verify", "--url",
                                    "ws://127.0.0.1:9/session", "--token", TOKEN])
    assert out.exit_code != 0 and "cannot connect to ws://127.0.0.1:9/session" in out.output
