"""The commit-path metrics: counted per thread without locks, added up exactly at scrape time."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sessionloop.actors.system.metrics import _TallyBoard
from tests.actors.gateway_harness import wait_until


def scraped(host) -> dict[str, float]:
    values = {}
    for line in host.rt.metrics.render().decode().splitlines():
        m = re.match(r"^(\S+?)(\{[^}]*\})?\s+(\S+)$", line)
        if m and not line.startswith("#"):
            values[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return values


def settled(host) -> dict[str, float]:
    """A scrape taken once the store stopped moving (passivation snapshots commit on their own),
    so the store's histograms and its own counters are read at one point."""
    last = scraped(host)
    for _ in range(100):
        time.sleep(0.1)
        now = scraped(host)
        if all(now[k] == last[k] for k in ("sessionloop_store_commit_batches", "sessionloop_store_commit_requests",
                                           "sessionloop_store_append_latency_seconds_count")):
            return now
        last = now
    raise AssertionError("the store kept committing")


@pytest.mark.parametrize("threads", [0, 4])
def test_turn_and_commit_counts_from_many_threads_add_up_exactly(open_host, threads):
    """Also with a thread per actor (0), whose threads end when their sessions passivate."""
    host = open_host(permission_mode="acceptCalls", dispatcher_threads=threads, idle_timeout_s=0.05)
    sessions = [host.create() for _ in range(30)]

    def work(s):
        s.run("plain")
        s.run('!tool list_files {"path": "."}\nx')
        s.run("!error boom")

    with ThreadPoolExecutor(10) as pool:
        list(pool.map(work, sessions))
    m = settled(host)
    assert m['sessionloop_turns_total{outcome="completed"}'] == 60
    assert m['sessionloop_turns_total{outcome="failed"}'] == 30
    assert m["sessionloop_turn_duration_seconds_count"] == 90
    assert m['sessionloop_turn_duration_seconds_bucket{le="+Inf"}'] == 90
    assert m['sessionloop_model_call_duration_seconds_count{outcome="completed"}'] == 30 * (1 + 2)
    assert m['sessionloop_model_call_duration_seconds_count{outcome="failed"}'] == 30  # "!error boom"
    assert m['sessionloop_model_call_duration_seconds_count{outcome="aborted"}'] == 0
    # every event in the (new) store was appended by this host: sessions' commits and the place they live in
    assert m["sessionloop_events_appended_total"] == host.store.head_position
    assert m["sessionloop_session_commits_total"] >= 30 * 4
    # the store's histograms: one observation per write transaction, per request, per append
    info = host.store.info()
    assert (m["sessionloop_store_commit_duration_seconds_count"] == m["sessionloop_store_commit_batches"]
            == info["batches"])
    assert m["sessionloop_store_commit_batch_size_count"] == info["batches"]
    assert m["sessionloop_store_commit_batch_size_sum"] == m["sessionloop_store_commit_requests"] == info["requests"]
    assert m['sessionloop_store_commit_batch_size_bucket{le="+Inf"}'] == info["batches"]
    assert m['sessionloop_store_commit_batch_size_bucket{le="512.0"}'] == info["batches"]  # max_batch
    # every append here is a session commit or the registration of the place the sessions live in
    # (one append per place; the epoch and passivation snapshots are not appends)
    places = host.store.list_streams("place", None, 100).streams
    assert [host.store.stream_version(p) for p in places] == [1]
    assert m["sessionloop_store_append_latency_seconds_count"] == m["sessionloop_session_commits_total"] + len(places)
    assert m["sessionloop_store_append_latency_seconds_count"] < info["requests"]  # + epoch (and snapshots)
    assert 0 < m["sessionloop_store_commit_duration_seconds_sum"] < 60


def test_failed_and_aborted_model_calls_are_counted_with_their_duration(open_host):
    """A model error after a known delay, and a call aborted while it runs: each counted by outcome,
    the failed one with its duration (the LlmFailed event has none: it comes from the step's times)."""
    host = open_host(permission_mode="acceptCalls")
    s = host.create()
    assert s.run("!sleep 300\n!error boom").state == "failed"
    receipt = s.send("!sleep 30000\nnever")
    wait_until(lambda: any(type(e.event).__name__ == "LlmStarted" and e.event.turn_id == receipt.turn_id
                           for e in s.events()), what="the model call")
    assert s.cancel(receipt.turn_id)
    assert s.wait(receipt.turn_id, 10).code == "aborted"
    m = scraped(host)
    assert m['sessionloop_model_call_duration_seconds_count{outcome="failed"}'] == 1
    assert 0.3 <= m['sessionloop_model_call_duration_seconds_sum{outcome="failed"}'] < 10
    assert m['sessionloop_model_call_duration_seconds_bucket{le="0.1",outcome="failed"}'] == 0
    assert m['sessionloop_model_call_duration_seconds_bucket{le="0.5",outcome="failed"}'] == 1
    assert m['sessionloop_model_call_duration_seconds_count{outcome="aborted"}'] == 1
    assert m['sessionloop_model_call_duration_seconds_count{outcome="completed"}'] == 0
    assert m['sessionloop_turns_total{outcome="aborted"}'] == 1


def test_ended_threads_tallies_are_folded_not_kept(open_host):
    board = _TallyBoard()

    def bump():
        board.mine().commits += 1

    for _ in range(50):
        t = threading.Thread(target=bump)
        t.start()
        t.join()
    bump()  # this thread registers last and folds every ended one
    assert len(board._live) <= 2  # noqa: SLF001 - this thread (and at most the last one, if alive)
    assert board.totals().commits == 51
