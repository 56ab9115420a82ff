"""``sessionloop bench`` at a small size: the report's fields and the lost/duplicated check, not speed."""

from __future__ import annotations

import asyncio
import gc
import json
import time

import pytest
from click.testing import CliRunner, Result
from hypothesis import given
from hypothesis import strategies as st

from sessionloop.actors import events as E
from sessionloop.actors.api.host import Host
from sessionloop.cli import bench_check, bench_cmd, bench_config, bench_observers, bench_ws
from sessionloop.cli.main import main
from sessionloop.eventstore import RecordedEvent

FIELDS = {"turns": int, "tool_turns": int, "seconds": float, "turns_per_s": float, "events": int,
          "events_per_s": float, "events_per_turn": float, "p50_ms": float, "p95_ms": float, "p99_ms": float,
          "max_ms": float, "cpu_ms_per_turn": float, "peak_rss_mib": float, "check": dict, "observers": dict}


@pytest.fixture(autouse=True)
def own_gc_settings():
    """An in-process bench applies the server's GC settings to its process (actors/system/gc_policy.py);
    here that process is pytest's, so they are put back after each test."""
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def bench(*args: str) -> Result:
    return CliRunner().invoke(main, ["bench", *args], catch_exceptions=False)


def report_of(result: Result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def check_report(report: dict, turns: int, tool_turns: int) -> None:
    for name, kind in FIELDS.items():
        assert isinstance(report[name], kind), (name, report[name])
    assert report["turns"] == turns and report["tool_turns"] == tool_turns
    assert report["check"] == {"ok": True, "turns_verified": turns, "lost": 0, "duplicated": 0, "wrong": 0,
                               "errors": 0, "problems": []}
    # at least input, turn start, model step and turn end per turn, plus the tool's two
    assert report["events"] >= 4 * turns + 2 * tool_turns
    assert report["turns_per_s"] > 0 and report["events_per_s"] > report["turns_per_s"]
    assert 0 < report["p50_ms"] <= report["p95_ms"] <= report["p99_ms"] <= report["max_ms"]
    assert report["peak_rss_mib"] > 10
    seen = report["observers"]
    if seen["mode"] != "none":  # every answer reached the observers as deltas that make its text
        assert seen["ok"] and seen["problems"] == [] and seen["answers_streamed"] == turns, seen
        assert seen["deltas"] >= turns


def test_inprocess_small_run_reports_every_field_and_checks_the_log() -> None:
    report = report_of(bench("--sessions", "5", "--turns", "2", "--durability", "nosync", "--json"))
    check_report(report, turns=10, tool_turns=5)
    assert report["params"]["via"] == "inprocess" and report["params"]["durability"] == "nosync"
    assert report["observers"]["mode"] == "subscriber" and report["params"]["observe"] == "subscriber"
    assert report["params"]["sessions"] == 5 and report["params"]["turns"] == 2
    # the process hosting the sessions ran with the server's GC settings, as `serve` does
    assert gc.get_threshold()[0] >= 10_000 and gc.get_freeze_count() > 0


def test_ws_small_run_over_real_websocket_connections() -> None:
    report = report_of(bench("--sessions", "5", "--turns", "2", "--via", "ws", "--per-connection", "2",
                             "--concurrency", "3", "--json"))
    check_report(report, turns=10, tool_turns=5)
    assert report["connections"] == 3 and report["params"]["durability"] == "sync"
    assert report["observers"]["mode"] == "subscriber (WebSocket)"


@pytest.mark.parametrize("mode", ["watcher", "none"])
def test_inprocess_runs_with_a_bot_watching_or_nobody_watching(mode: str) -> None:
    report = report_of(bench("--sessions", "4", "--turns", "2", "--durability", "nosync", "--observe", mode,
                             "--no-progress", "--json"))
    check_report(report, turns=8, tool_turns=4)
    assert report["observers"]["mode"] == mode


def test_the_stream_check_names_a_lost_delta_a_stray_one_and_a_seq_that_went_back() -> None:
    check = bench_observers.StreamCheck()
    pushes = bench_observers.PushCheck(check)

    def push(method: str, seq: int, **params: object) -> None:
        pushes.push({"method": method, "params": {"sessionId": "s", "seq": seq, **params}})

    item = {"kind": "agent-message", "itemId": "a", "text": ""}
    push("item/started", 1, item=item)
    push("item/delta", 2, itemId="a", text="echo: ")
    push("item/completed", 3, item={**item, "text": "echo: hi"})  # the delta "hi" never came
    push("item/delta", 4, itemId="b", text="x")  # no item/started for b
    push("item/started", 4, item={**item, "itemId": "c"})  # seq 4 twice
    push("item/completed", 5, item={**item, "itemId": "d", "text": "whole"})  # never streamed
    report = check.report("subscriber", turns=2)
    assert not report["ok"] and report["answers_streamed"] == 0
    assert report["problems"] == [
        "session s: deltas 'echo: ' != answer 'echo: hi'", "session s: a delta of b before its item/started",
        "session s: seq 4 after 4", "session s: answer d completed without being streamed",
        "0 answers seen streamed whole, 2 turns ended"]


def test_an_answer_the_observers_did_not_get_whole_fails_with_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    real = bench_cmd.observer_report

    def tampered(*args: object) -> dict:
        report = real(*args)  # type: ignore[arg-type]
        return {**report, "ok": False, "broken": 1, "problems": ["session s: deltas 'ech' != answer 'echo: hi'"]}

    monkeypatch.setattr(bench_cmd, "observer_report", tampered)
    result = bench("--sessions", "2", "--turns", "1", "--durability", "nosync", "--no-progress")
    assert result.exit_code == 1
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert errors == ["Error: stream check FAILED: 1 problems seen by the observers "
                      "(first: session s: deltas 'ech' != answer 'echo: hi')"], result.stderr


def test_ws_honours_the_servers_rate_limit_and_loses_nothing() -> None:
    """500 sends on one connection exceed the server's 100 requests/s (burst 200): the client waits
    ``retryAfterMs`` and sends again; a refused send is not a turn, so nothing counts as lost."""
    report = report_of(bench("--sessions", "5", "--turns", "100", "--via", "ws", "--per-connection", "5",
                             "--durability", "nosync", "--tool-ratio", "0", "--no-progress", "--json"))
    assert report["connections"] == 1 and report["rejected_and_retried"] > 0
    assert report["turns"] == 500 and report["check"]["ok"]


def test_table_output_and_tool_ratio() -> None:
    result = bench("--sessions", "4", "--turns", "3", "--tool-ratio", "0", "--durability", "nosync")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for label in ("turns/s", "events/s", "p50 turn latency", "p95 turn latency", "p99 turn latency",
                  "peak RSS (MiB)", "ok: 12 turns, none lost or duplicated"):
        assert label in out, out
    assert "tool ratio 0," in out


def test_duration_stops_sending_new_turns() -> None:
    result = bench("--sessions", "3", "--duration", "0.3", "--llm-latency", "20", "--durability", "nosync",
                   "--tool-ratio", "1", "--json")
    report = report_of(result)
    assert report["params"]["turns"] is None and report["params"]["duration_s"] == 0.3
    assert 3 <= report["turns"] < 100 and report["tool_turns"] == report["turns"]
    assert report["check"]["ok"] and report["seconds"] < 5


def test_a_lost_or_duplicated_turn_fails_with_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    real = bench_cmd.iter_log

    def tampered(store, after):
        dropped = duplicated = False
        for rec in real(store, after):
            if isinstance(rec.event, E.TurnCompleted) and not dropped:
                dropped = True  # this turn's end is lost
                continue
            yield rec
            if isinstance(rec.event, E.TurnStarted) and not duplicated:
                duplicated = True  # this turn started twice
                yield RecordedEvent(rec.stream, rec.version, rec.position, rec.at, rec.event)

    monkeypatch.setattr(bench_cmd, "iter_log", tampered)
    result = bench("--sessions", "3", "--turns", "2", "--durability", "nosync", "--no-progress")
    assert result.exit_code == 1
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("Error: event log check FAILED: 1 lost, 1 duplicated")


def test_check_log_counts_client_side_losses_and_duplicates() -> None:
    """A turn whose end never reached the client is lost; one reported twice is duplicated."""
    sid, turns = "s1", ["t1", "t2"]
    log = []
    for n, t in enumerate(turns):
        for ev in (E.InputAccepted(at=1, input_id=f"i{n}", turn_id=t, text=bench_config.PLAIN_TEXT),
                   E.TurnStarted(at=1, turn_id=t),
                   E.TurnCompleted(at=1, turn_id=t, output_text=bench_config.PLAIN_ANSWER)):
            log.append(RecordedEvent(f"session-{sid}", len(log) + 1, len(log) + 1, 1, ev))
    rec = bench_check.Record([bench_check.SessionRecord(sid, sent=[False, False], seen=["t1", "t1"])])
    check = bench_check.check_log(rec, log)
    assert not check["ok"] and check["lost"] == 1 and check["duplicated"] == 1 and check["wrong"] == 0
    rec = bench_check.Record([bench_check.SessionRecord(sid, sent=[False, False, False], seen=["t1", "t2"])])
    assert bench_check.check_log(rec, log)["lost"] == 1  # a third input never accepted


def test_help_has_an_example_and_bad_options_fail_clearly() -> None:
    result = bench("--help")
    assert result.exit_code == 0 and "Example:" in result.output and "sessionloop bench --sessions" in result.output
    result = bench("--tool-ratio", "2")
    assert result.exit_code == 2 and "must be between 0 and 1" in result.output
    result = bench("--via", "ws", "--observe", "none")
    assert result.exit_code == 2 and "the WebSocket clients are the subscribers" in result.output


def test_a_refused_send_ends_the_drivers_wait_with_not_accepted_at_once(tmp_path) -> None:
    """The in-process driver waits for the turn's end from before the send; a refusal (here: a
    session that does not exist) must end that wait with the error, not a timeout."""


    host = Host.open(str(tmp_path / "data"), durability="nosync")
    try:
        send = bench_cmd.inprocess_sender(host, ["no-such-session"])
        started = time.perf_counter()
        with pytest.raises(bench_ws.NotAccepted, match="no-such-session|not found|does not exist"):
            asyncio.run(asyncio.wait_for(send(0, False), 10))
        assert time.perf_counter() - started < 5
        assert not host.rt.results._waiters
    finally:
        host.close()


@given(ratio=st.sampled_from([0.0, 0.1, 0.25, 1 / 3, 0.5, 0.75, 1.0]), sessions=st.integers(1, 60),
       turns=st.integers(1, 12))
def test_tool_turns_are_spread_over_every_round_and_every_session(ratio: float, sessions: int, turns: int) -> None:
    grid = [[bench_config.is_tool_turn(ratio, s, t) for t in range(turns)] for s in range(sessions)]
    for t in range(turns):  # each round of sends: its share, within one
        assert abs(sum(grid[s][t] for s in range(sessions)) - sessions * ratio) <= 1
    for s in range(sessions):  # each session: its share, within one
        assert abs(sum(grid[s]) - turns * ratio) <= 1
    if ratio == 0.5:  # half and half: the sends of a round and the turns of a session alternate
        assert all(grid[s][t] != grid[s][t + 1] for s in range(sessions) for t in range(turns - 1))
        assert all(grid[s][t] != grid[s + 1][t] for s in range(sessions - 1) for t in range(turns))
