"""Replay of every fixture session is identical to the live projection (issue 7, SPEC §9).

The fixtures (``tests/fixtures/sessions/*.jsonl``, written by ``regenerate.py`` there from real
hosts and the mock model) are imported with ``sessionloop import``; then each is replayed (its
events folded into state, timeline and protocol items) and compared with what a live host serves
for it: the session actor's state, and the ``session/subscribe`` snapshot and ``session/history``
pages a client receives from the real gateway.
"""

from __future__ import annotations

import glob
import json
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from sessionloop.actors.api.host import Host
from sessionloop.actors.gateway.service import SessionProtocolService
from sessionloop.actors.replay.live import serve_live_view
from sessionloop.actors.replay.timeline import build_timeline
from sessionloop.actors.replay.values import fold_events, plain
from sessionloop.actors.replay.verify import verify
from sessionloop.actors.settings.texts import enc_hook
from sessionloop.actors.views.items import ItemsProjection
from sessionloop.cli.main import main
from tests.actors.gateway_harness import MemoryClient
from tests.fixtures.sessions.regenerate import FIXTURES

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "fixtures", "sessions")
FILES = sorted(glob.glob(os.path.join(HERE, "*.jsonl")))
NAMES = [os.path.basename(f).removesuffix(".jsonl") for f in FILES]
PAGE = 2  # messages per session/history page: small, so every fixture is paged with cursors


def lines(name: str) -> list[dict[str, Any]]:
    with open(os.path.join(HERE, f"{name}.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def session_id(name: str) -> str:
    return str(lines(name)[0]["event"]["session_id"])


def import_fixture(name: str, data_dir: str) -> None:
    result = CliRunner().invoke(main, ["import", os.path.join(HERE, f"{name}.jsonl"), "--data", data_dir],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output


_ENGLISH = msgspec.json.Encoder(enc_hook=enc_hook(lambda: "en"))  # the host's language


def wire(item: Any) -> Any:
    """An item as a client reads it off the wire (its text objects rendered, as the gateway's)."""
    return json.loads(_ENGLISH.encode(item))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Host, SessionProtocolService]]:
    """Every fixture imported into one data directory, then a live host and its gateway on it."""
    data_dir = str(tmp_path_factory.mktemp("fixtures") / "data")
    for name in NAMES:
        import_fixture(name, data_dir)
    host = Host.open(data_dir, durability="nosync")
    service = host.protocol()
    yield host, service
    service.close()
    host.close()


def test_the_fixture_files_are_the_ones_the_script_writes_and_hold_what_they_were_made_for() -> None:
    assert NAMES == sorted(FIXTURES)
    seen: Counter[str] = Counter()
    for name in NAMES:
        for line in lines(name):
            event = line["event"]
            seen[event["type"]] += 1
            if event["type"] == "tool.finished":
                seen[f"tool {event['status']}"] += 1
            if event["type"] == "agent.context.compacted":
                seen["compacted auto" if event.get("auto") else "compacted manual"] += 1
    for kind in ("llm.completed", "tool.started", "tool completed", "tool failed", "tool denied", "llm.failed",
                 "turn.failed", "turn.aborted", "turn.limit-reached", "compacted manual", "compacted auto",
                 "agent.context.trimmed", "session.forked", "plan.updated", "turn.rewound", "notice.posted"):
        assert seen[kind] > 0, f"no {kind} in the fixtures: run tests/fixtures/sessions/regenerate.py"


@pytest.mark.parametrize("name", NAMES)
def test_replay_of_a_fixture_session_is_identical_to_the_live_projection(name: str, live: Any) -> None:
    host, service = live
    sid = session_id(name)
    stream = f"session-{sid}"
    events = host.store.read_stream(stream)
    assert [e.version for e in events] == [line["version"] for line in lines(name)]

    # replay: the timeline and the fold of the imported events
    timeline = build_timeline(sid, events)
    assert timeline.events == len(events) and timeline.turns
    rebuilt = ItemsProjection(sid)
    rebuilt.apply_all(r.event for r in events)

    # the live actor's state is the fold
    assert plain(host.session(sid).snapshot()) == plain(fold_events(sid, events))

    # what a client of the live host receives: the subscribe snapshot and every history page
    client = MemoryClient(service)
    try:
        snapshot = client.result("session/subscribe", {"sessionId": sid})
        items, before = rebuilt.snapshot_items()
        assert snapshot["items"] == [wire(service.decorate(sid, i)) for i in items]
        assert snapshot.get("before") == before
        cursor: str | None = None
        pages = 0
        while True:
            params: dict[str, Any] = {"sessionId": sid, "limit": PAGE}
            if cursor is not None:
                params["before"] = cursor
            page = client.result("session/history", params)
            items, cursor = rebuilt.history_page(cursor, PAGE)
            assert page["items"] == [wire(service.decorate(sid, i)) for i in items], f"page {pages}"
            assert page.get("before") == cursor
            pages += 1
            if cursor is None:
                break
        assert pages > 1
    finally:
        client.close()

    # and verify, against the live host, finds no difference
    report = verify(sid, events, host.store.load_snapshot(stream), host.store.stream_meta(stream),
                    live=serve_live_view(service, sid))
    assert report.difference is None, report.difference
    assert report.compared == "live" and report.history_items > 0


@pytest.mark.parametrize("name", NAMES)
def test_replay_verify_of_an_imported_fixture_compares_with_a_live_host(name: str, tmp_path: Any) -> None:
    data_dir = str(tmp_path / "data")
    import_fixture(name, data_dir)
    result = CliRunner().invoke(main, ["replay", session_id(name), "--data", data_dir, "--verify", "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["compared"] == "live" and "difference" not in report
    assert report["events"] == len(lines(name)) and report["historyPages"] >= 1
