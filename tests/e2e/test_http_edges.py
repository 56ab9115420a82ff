"""The HTTP edges of a real server that strangers can reach (SPEC §7): ambiguous headers, the
Origin rule against DNS rebinding, who may read /metrics, password guessing, and app tokens."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.conftest import REPO
from tests.e2e.conftest import APPS, TOKEN, initialized

pytestmark = pytest.mark.e2e

AUTH = ("Authorization", f"Bearer {TOKEN}")
BOT = "bot-token-for-the-end-to-end-tests"  # an app token of APPS


def get(server, path: str, headers: list[tuple[str, str]] | None = None, source: str | None = None,
        **params: str) -> httpx.Response:
    """A plain GET (no upgrade: the answers under test all come before it), from ``source``."""
    transport = httpx.HTTPTransport(local_address=source) if source else None
    with httpx.Client(transport=transport, timeout=10) as client:
        return client.get(f"http://127.0.0.1:{server.port}{path}", headers=headers or [], params=params)


def log_of(server) -> str:
    server.log.flush()
    with open(server.log.name) as f:
        return f.read()


def upgrade_status(url: str, headers: dict[str, str]) -> int:
    """101 when the server upgrades (and serves ``initialize``), else the status it refused with."""
    async def go() -> int:
        try:
            async with connect(url, additional_headers=headers) as ws:
                await initialized(ws)
                return 101
        except InvalidStatus as e:
            return e.response.status_code
    return asyncio.run(go())


@pytest.mark.parametrize("path", ["/session", "/metrics", "/api/session-file"])
@pytest.mark.parametrize("name, values", [
    ("Authorization", [f"Bearer {TOKEN}", "Bearer wrong"]),
    ("Authorization", [f"Bearer {TOKEN}", f"Bearer {TOKEN}"]),
    ("Origin", ["http://127.0.0.1:1", "http://evil.example"]),
])
def test_a_request_with_two_authorization_or_two_origin_headers_is_answered_400_not_500(server, path, name, values):
    before = log_of(server)
    headers = [(name, v) for v in values] + ([AUTH] if name != "Authorization" else [])
    reply = get(server, path, headers)
    assert reply.status_code == 400, (reply.status_code, reply.text)
    assert reply.text == f"more than one {name} header\n"
    assert "Traceback" not in log_of(server)[len(before):]


def test_a_dns_rebinding_page_whose_host_and_origin_agree_is_refused_403_and_the_own_address_is_accepted(server):
    """A page at http://evil.example:PORT whose name resolves to 127.0.0.1 sends a Host header and
    an Origin that agree with each other; neither is the server's listen address."""
    port = server.port
    evil = {"Authorization": f"Bearer {TOKEN}", "Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
    reply = get(server, "/session", list(evil.items()))
    assert (reply.status_code, reply.text) == (403, "forbidden origin\n")
    assert upgrade_status(server.url, evil) == 403
    for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}", f"HTTP://LOCALHOST:{port}"):
        assert upgrade_status(server.url, {"Authorization": f"Bearer {TOKEN}", "Origin": origin}) == 101, origin
    # the same host on another port is another origin; no Origin at all (a terminal, a bot) passes
    other_port = {"Authorization": f"Bearer {TOKEN}", "Origin": f"http://127.0.0.1:{port + 1}"}
    assert upgrade_status(server.url, other_port) == 403
    assert upgrade_status(server.url, {"Authorization": f"Bearer {TOKEN}"}) == 101


def test_allowed_origins_are_the_listed_ones_and_the_host_header_no_longer_vouches_for_an_origin(server_factory):
    server = server_factory("--allow-origin", "https://console.example/")
    port = server.port
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert upgrade_status(server.url, {**auth, "Origin": "https://console.example"}) == 101
    # the old rule let any Origin in whose host:port equalled the Host header
    assert upgrade_status(server.url, {**auth, "Host": "console.example", "Origin": "http://console.example"}) == 403
    rebound = {**auth, "Host": f"127.0.0.2:{port}", "Origin": f"http://127.0.0.2:{port}"}
    assert upgrade_status(server.url, rebound) == 403


def test_metrics_need_the_owner_token_and_app_tokens_get_403(app_server):
    assert get(app_server, "/metrics").status_code == 401
    assert get(app_server, "/metrics", [("Authorization", "Bearer wrong")]).status_code == 401
    app = get(app_server, "/metrics", [("Authorization", f"Bearer {BOT}")])
    assert (app.status_code, app.text) == (403, "/metrics needs the owner token\n")
    for reply in (get(app_server, "/metrics", [AUTH]), get(app_server, "/metrics", token=TOKEN)):
        assert reply.status_code == 200 and "sessionloop_connections" in reply.text
    assert get(app_server, "/healthz").json()["status"] == "ok"  # liveness probes need no token


def test_metrics_public_serves_metrics_without_a_token(server_factory):
    server = server_factory("--metrics-public")
    reply = get(server, "/metrics")
    assert reply.status_code == 200 and "sessionloop_connections" in reply.text
    assert get(server, "/session").status_code == 401  # only /metrics became public


def test_an_address_guessing_tokens_gets_429_after_its_failures_and_another_address_is_unaffected(server_factory):
    """--auth-failures 5 per --auth-window 5 s. 300 guesses from 127.0.0.1, 20 at a time: in no
    5 s are more than five of them checked (401), every other one is 429 with Retry-After, and so
    is the right token from that address meanwhile; 127.0.0.2 authenticates at once; after
    Retry-After 127.0.0.1 may authenticate again."""
    window = 5.0
    server = server_factory("--auth-failures", "5", "--auth-window", str(window))

    async def burst() -> list[tuple[float, httpx.Response]]:
        gate = asyncio.Semaphore(20)
        async with httpx.AsyncClient(timeout=10) as client:
            async def guess(i: int) -> tuple[float, httpx.Response]:
                async with gate:
                    reply = await client.get(f"http://127.0.0.1:{server.port}/session",
                                             headers={"Authorization": f"Bearer guess-{i}"})
                    return time.monotonic(), reply
            return await asyncio.gather(*(guess(i) for i in range(300)))

    start = time.monotonic()
    guesses = sorted(asyncio.run(burst()), key=lambda g: g[0])
    checked = [t for t, r in guesses if r.status_code == 401]
    assert {r.status_code for _, r in guesses} == {401, 429}
    assert all(sum(1 for u in checked if t <= u < t + window) <= 5 for t in checked), [t - start for t in checked]
    assert all(1 <= int(r.headers["Retry-After"]) <= window for _, r in guesses if r.status_code == 429)
    throttled = get(server, "/metrics", [AUTH], source="127.0.0.1")
    assert throttled.status_code == 429  # the right token too: a throttled address is not checked at all
    assert get(server, "/metrics", [AUTH], source="127.0.0.2").status_code == 200
    assert get(server, "/session", [("Authorization", "Bearer guess")], source="127.0.0.2").status_code == 401
    time.sleep(int(throttled.headers["Retry-After"]))  # the window itself is under test: nothing to wait on
    assert get(server, "/metrics", [AUTH], source="127.0.0.1").status_code == 200
    assert "Traceback" not in log_of(server)
    print(f"\nauth throttle: {len(guesses)} guesses in {guesses[-1][0] - start:.2f} s, {len(checked)} checked")


def serve_with_apps(tmp_path, apps: str) -> subprocess.CompletedProcess[str]:
    data = tmp_path / "data"
    os.makedirs(data, exist_ok=True)
    (data / "apps.toml").write_text(apps)
    return subprocess.run([sys.executable, "-m", "sessionloop", "serve", "--data", str(data), "--port", "0",
                           "--token", TOKEN], capture_output=True, text=True, timeout=60, cwd=REPO)


def test_an_app_token_shorter_than_32_characters_stops_serve_with_one_line_naming_the_app(tmp_path):
    apps = APPS + '\n[apps.shortbot]\ntoken = "only-31-characters-long-token.."\nplatform = "x"\n'
    assert len("only-31-characters-long-token..") == 31
    done = serve_with_apps(tmp_path, apps)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and done.stdout == ""
    assert len(lines) == 1 and "[apps.shortbot]" in lines[0] and "31 characters" in lines[0], done.stderr
    assert "only-31" not in done.stderr  # the token itself is never printed
