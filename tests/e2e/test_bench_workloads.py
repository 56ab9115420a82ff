"""sessionloop bench as a load generator, end to end: each shipped workload (shortened) against
--spawn and against a separately started serve, the results file against its schema, the plot,
--fail-if, and bench compare flagging a slower run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import jsonschema
import pytest

from sessionloop.cli.loadtest import results
from tests.e2e.conftest import TOKEN

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA = json.load(open(os.path.join(ROOT, "docs", "bench-results.schema.json")))
PNG = b"\x89PNG\r\n\x1a\n"

#: each shipped workload, a few seconds long and light for a shared 2-core machine
SHORT = {
    "bots-steady": ["phases.0.seconds=1.5", "phases.1.seconds=3", "phases.2.seconds=1", "phases.0.users=6",
                    "phases.1.users=6", "sessions.duplicates=0.3", "sessions.watched=0.5", "sessions.turns=4",
                    "sessions.attachments=0.2", "mock.latency_ms=30", "messages.2.weight=4"],
    "burst": ["phases.0.seconds=1.5", "phases.1.seconds=1.5", "phases.2.seconds=1.5", "phases.0.rate=5",
              "phases.1.rate=30", "phases.2.rate=5", "sessions.duplicates=0.2"],
    "long-sessions": ["phases.0.seconds=3", "phases.0.users=2"],
    "approvals": ["phases.0.seconds=1", "phases.1.seconds=4", "phases.0.users=4", "phases.1.users=4",
                  "sessions.watched=1"],
}


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sessionloop", "bench", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def sets(name: str) -> list[str]:
    return [x for s in SHORT[name] for x in ("--set", s)]


def check_result(path: str, name: str) -> results.Result:
    with open(path) as f:
        jsonschema.validate(json.load(f), SCHEMA)
    r = results.load(path)
    o = r.overall.counts
    assert r.audit.ok, r.audit.examples
    assert o.turns > 0 and o.errors == 0, r.errors
    # every acknowledged send ended in exactly one turn, as the feed shows
    assert r.audit.acknowledged == o.acknowledged == o.turns == r.audit.turns_found
    assert o.completed + o.failed == o.turns
    assert o.deduplicated == o.duplicates_sent == r.audit.deduplicated
    assert [p.name for p in r.phases] == [p["name"] for p in tomllib.loads(r.workload_toml)["phases"]]
    assert sum(p.counts.turns for p in r.phases) == o.turns
    assert sum(s.turns for s in r.timeline) == o.turns
    assert r.overall.latency.count == o.turns and r.overall.latency.p50_ms > 0
    assert r.overrides == SHORT[name]
    return r


@pytest.mark.parametrize("name", sorted(SHORT))
def test_each_shipped_workload_runs_against_a_spawned_server(tmp_path, name):
    out, png = str(tmp_path / "r.json"), str(tmp_path / "r.png")
    done = bench("--spawn", "--workload", name, *sets(name), "--out", out, "--plot", png, "--no-progress")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "audit (event feed): ok" in done.stdout
    r = check_result(out, name)
    assert r.target.spawned and r.target.protocol_version
    o = r.overall.counts
    if name == "approvals":
        assert o.approvals > 0  # the virtual owner answered the write_file calls
        assert r.overall.first_delta.count > 0
    if name == "bots-steady":
        assert o.duplicates_sent > 0 and r.overall.first_delta.count > 0
        assert o.failed > 0  # the mix's !error turns fail, and are counted as failed turns, not errors
    if name == "burst":
        burst = {p.name: p for p in r.phases}["burst"]
        assert burst.turns_per_s > {p.name: p for p in r.phases}["before"].turns_per_s
    with open(png, "rb") as f:
        head = f.read(8)
    assert head == PNG and os.path.getsize(png) > 20_000


BOT_TOKENS = ("bench-bot-one-token-for-the-e2e-test", "bench-bot-two-token-for-the-e2e-test")


@pytest.mark.parametrize("name", sorted(SHORT))
def test_each_shipped_workload_runs_against_a_separately_started_server_with_two_apps(apps_server, tmp_path, name):
    apps = "".join(f'[apps.bot{i}]\ntoken = "{t}"\ncontainers = ["bench"]\n' for i, t in enumerate(BOT_TOKENS))
    server = apps_server(apps)
    out = str(tmp_path / "r.json")
    done = bench("--url", server.url, "--token", TOKEN, *(x for t in BOT_TOKENS for x in ("--app-token", t)),
                 "--workload", name, *sets(name), "--out", out, "--json", "--fail-if", "errors>0,turns<1000000")
    # the run itself is sound; the gate holds on turns<1000000 and so fails it, naming the condition
    assert done.returncode == 1, done.stdout + done.stderr
    assert "--fail-if: turns<1e+06" in done.stderr and "errors>0" not in done.stderr
    r = check_result(out, name)
    assert results.msgspec.json.decode(done.stdout, type=results.Result) == r  # --json prints the same result
    assert not r.target.spawned and r.target.url == server.url
    if name == "approvals":
        assert r.overall.counts.approvals > 0
    text = open(out).read()
    assert TOKEN not in text and not any(t in text for t in BOT_TOKENS)


def test_a_workload_needing_the_owner_is_refused_without_its_token(apps_server):
    server = apps_server('[apps.bot1]\ntoken = "bench-bot-one-token-for-the-e2e-test"\ncontainers = ["bench"]\n')
    done = bench("--url", server.url, "--app-token", "bench-bot-one-token-for-the-e2e-test", "--workload",
                 "approvals", "--no-progress")
    assert done.returncode == 1
    assert "give the owner token (--token)" in done.stderr


def test_compare_flags_a_slower_run_and_not_a_run_against_itself(tmp_path):
    a, b = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    base = sets("bots-steady")
    fast = bench("--spawn", *base, "--set", "mock.latency_ms=20", "--out", a, "--no-progress")
    slow = bench("--spawn", *base, "--set", "mock.latency_ms=300", "--out", b, "--no-progress")
    assert fast.returncode == 0 and slow.returncode == 0, fast.stderr + slow.stderr
    regressed = bench("compare", a, b, "--fail-on-regression")
    assert regressed.returncode == 1
    assert "p50_ms (all)" in regressed.stdout and "regression" in regressed.stdout
    assert "the workloads were changed differently (--set)" in regressed.stdout
    same = bench("compare", a, a, "--fail-on-regression")
    assert same.returncode == 0 and "\n0 regression(s)" in same.stdout
    png = str(tmp_path / "b.png")
    drawn = bench("plot", b, "-o", png)
    assert drawn.returncode == 0 and open(png, "rb").read(8) == PNG
