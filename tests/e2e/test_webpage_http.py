"""The owner's web page over HTTP (issue 22): its files and headers, the login cookie and what the
``/session`` upgrade makes of it, against a real ``sessionloop serve``."""

from __future__ import annotations

import asyncio
import gzip
import os
import re
import signal
import subprocess
import sys
from contextlib import AsyncExitStack

import httpx
import pytest
import websockets
from click.testing import CliRunner
from websockets.asyncio.client import connect

from sessionloop.cli.main import main
from tests.e2e.conftest import TOKEN, Client, ServerProcess
from tests.e2e.test_workers_wire import owner

pytestmark = pytest.mark.e2e

WEB_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "protocol", "web")


def base(server) -> str:
    return f"http://127.0.0.1:{server.port}"


def login(server) -> str:
    """Log in with the owner token: the login cookie's value."""
    r = httpx.get(f"{base(server)}/api/login", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 204, r.text
    return r.cookies[f"sessionloop_{server.port}"]


def socket(server, cookie: str | None, origin: str | None):
    headers = {}
    if cookie is not None:
        headers["Cookie"] = f"sessionloop_{server.port}={cookie}"
    return connect(server.url + "?surface=webui", additional_headers=headers, origin=origin)


def refused_status(server, cookie: str | None, origin: str | None) -> int:
    async def go() -> int:
        try:
            async with socket(server, cookie, origin):
                return 101
        except websockets.exceptions.InvalidStatus as e:
            return e.response.status_code

    return asyncio.run(go())


def test_the_page_is_served_at_the_root_with_strict_headers_and_no_inline_script(server):
    page = httpx.get(base(server) + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert not re.search(r"<script(?![^>]*\bsrc=)", page.text)  # every script is a file the CSP allows
    assert not re.search(r"\son[a-z]+=", page.text) and "<style" not in page.text
    for name, kind in (("app.js", "text/javascript"), ("app.css", "text/css"), ("icon.svg", "image/svg+xml")):
        r = httpx.get(f"{base(server)}/web/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind), name
        assert r.headers["x-content-type-options"] == "nosniff"
    assert httpx.get(f"{base(server)}/web/nothing.js").status_code == 404
    assert httpx.get(f"{base(server)}/web/../setup.cfg").status_code == 404


def test_the_page_is_under_50_kb_gzipped_with_no_build_step_and_no_cdn():
    names = sorted(os.listdir(WEB_DIR))
    assert {"index.html", "app.js", "app.css"} <= set(names)
    total = 0
    for name in names:
        with open(os.path.join(WEB_DIR, name), "rb") as f:
            data = f.read()
        assert b"http://" not in data.replace(b"http://www.w3.org/2000/svg", b"") and b"https://" not in data, name
        total += len(gzip.compress(data, 9))
    assert total < 50 * 1024, f"the page is {total} bytes gzipped"


def test_login_sets_a_strict_httponly_cookie_that_is_not_the_token_and_opens_the_socket_as_the_owner(server):
    r = httpx.get(f"{base(server)}/api/login", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 204
    set_cookie = r.headers["set-cookie"]
    assert set_cookie.startswith(f"sessionloop_{server.port}=")
    for attribute in ("HttpOnly", "SameSite=Strict", "Path=/", "Max-Age="):
        assert attribute in set_cookie
    value = r.cookies[f"sessionloop_{server.port}"]
    assert TOKEN not in set_cookie and len(value) >= 40
    assert httpx.get(f"{base(server)}/api/web", cookies={f"sessionloop_{server.port}": value}).json() == {
        "authenticated": True, "language": "en"}
    assert httpx.get(f"{base(server)}/api/web").json()["authenticated"] is False

    async def handshake() -> dict:
        async with socket(server, value, base(server)) as ws:
            client = Client(ws)
            return await client.result("initialize", {"protocolVersion": "0.2.0",
                                                      "client": {"name": "page", "version": "1"}})

    result = asyncio.run(handshake())
    assert result["identity"] == {"platform": "console", "userId": "owner"} and result["surface"] == "webui"


def test_the_cookie_needs_the_pages_origin_and_a_foreign_origin_is_refused(server):
    value = login(server)
    assert refused_status(server, value, base(server)) == 101
    assert refused_status(server, value, None) == 403  # a cookie without an Origin is not the page's
    assert refused_status(server, value, "http://127.0.0.1:1") == 403  # another port: same site, other origin
    assert refused_status(server, value, "http://evil.example") == 403
    assert refused_status(server, "not-a-login", base(server)) == 401
    assert refused_status(server, None, base(server)) == 401


def test_a_get_from_the_page_without_an_origin_needs_sec_fetch_site_same_origin(server):
    """A download link or a same-origin fetch carries no Origin: the browser's Sec-Fetch-Site says
    where it comes from. Another port of the same host says same-site and is refused."""
    value = login(server)
    url = f"{base(server)}/api/models/llm"
    cookies = {f"sessionloop_{server.port}": value}
    assert httpx.get(url, cookies=cookies, headers={"Sec-Fetch-Site": "same-origin"}).status_code == 200
    assert httpx.get(url, cookies=cookies, headers={"Sec-Fetch-Site": "same-site"}).status_code == 403
    assert httpx.get(url, cookies=cookies, headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
    assert httpx.get(url, cookies=cookies).status_code == 403  # no browser says where it comes from
    assert httpx.get(url + "?token=", cookies=cookies).status_code == 403  # an empty token is no token
    assert httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200  # a token needs neither


def test_logout_ends_the_login_and_clears_the_cookie(server):
    value = login(server)
    cookies = {f"sessionloop_{server.port}": value}
    for site in ("same-site", "cross-site"):  # a page on another port or site cannot log the page out
        refused = httpx.get(f"{base(server)}/api/logout", cookies=cookies, headers={"Sec-Fetch-Site": site})
        assert refused.status_code == 403
    assert refused_status(server, value, base(server)) == 101
    r = httpx.get(f"{base(server)}/api/logout", cookies=cookies, headers={"Sec-Fetch-Site": "same-origin"})
    assert r.status_code == 204 and "Max-Age=0" in r.headers["set-cookie"]
    assert refused_status(server, value, base(server)) == 401
    assert httpx.get(f"{base(server)}/api/web", cookies={f"sessionloop_{server.port}": value}).json()[
        "authenticated"] is False


def test_a_token_link_logs_in_and_redirects_to_the_page_without_the_token(server):
    r = httpx.get(f"{base(server)}/?token={TOKEN}")
    assert r.status_code == 303 and r.headers["location"] == "/"
    assert "HttpOnly" in r.headers["set-cookie"] and TOKEN not in r.headers["set-cookie"]
    assert refused_status(server, r.cookies[f"sessionloop_{server.port}"], base(server)) == 101
    wrong = httpx.get(f"{base(server)}/?token=wrong")
    assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
    assert httpx.get(f"{base(server)}/api/login", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_an_apps_token_does_not_log_in_to_the_owners_page(app_server):
    r = httpx.get(f"{base(app_server)}/api/login",
                  headers={"Authorization": "Bearer bot-token-for-the-end-to-end-tests"})
    assert r.status_code == 401 and "set-cookie" not in r.headers


def test_failed_logins_are_throttled_like_any_failed_authentication(server_factory):
    server = server_factory("--auth-failures", "3", "--auth-window", "60")
    codes = [httpx.get(f"{base(server)}/api/login", headers={"Authorization": "Bearer wrong"}).status_code
             for _ in range(4)]
    assert codes == [401, 401, 401, 429]
    assert httpx.get(f"{base(server)}/").status_code == 200  # the page itself needs no login


def test_serve_prints_a_login_link_with_a_new_token_and_the_link_logs_in(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SESSIONLOOP_TOKEN"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(tmp_path / "serve.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "sessionloop", "serve", "--data", str(tmp_path / "data"),
                                 "--port", "0", "--durability", "nosync"],
                                stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=root)
        try:
            lines = [proc.stdout.readline() for _ in range(3)]
            link = re.search(r"web page: (http://127\.0\.0\.1:\d+/\?token=\S+)", lines[2])
            assert link, lines
            r = httpx.get(link.group(1))
            assert r.status_code == 303 and "HttpOnly" in r.headers["set-cookie"]
        finally:
            proc.terminate()
            proc.wait(15)


def restarted(server_factory, server, sig: int, *extra: str):
    """``server`` stopped by ``sig`` and started again on its port with its data directory."""
    server.stop(sig)
    return server_factory("--port", str(server.port), *extra, data_dir=server.data_dir)


def authenticated(server, value: str) -> bool:
    return httpx.get(f"{base(server)}/api/web", cookies={f"sessionloop_{server.port}": value}).json()["authenticated"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_login_survives_a_restart_and_a_logout_does_too(server_factory, sig):
    server = server_factory()
    kept, ended = login(server), login(server)
    r = httpx.get(f"{base(server)}/api/logout", cookies={f"sessionloop_{server.port}": ended},
                  headers={"Sec-Fetch-Site": "same-origin"})
    assert r.status_code == 204
    again = restarted(server_factory, server, sig)
    assert again.epoch != server.epoch
    assert authenticated(again, kept) and refused_status(again, kept, base(again)) == 101
    assert not authenticated(again, ended) and refused_status(again, ended, base(again)) == 401
    with open(os.path.join(again.data_dir, "web-logouts")) as f:
        assert kept not in f.read()  # the file holds ids of ended logins, never a cookie


def test_a_new_owner_token_ends_every_login(server_factory):
    server = server_factory()
    value = login(server)
    server.stop()
    rotated = ServerProcess(server.data_dir, "--port", str(server.port), token="a-rotated-owner-token").start()
    try:
        assert not authenticated(rotated, value) and refused_status(rotated, value, base(rotated)) == 401
        r = httpx.get(f"{base(rotated)}/api/login", headers={"Authorization": "Bearer a-rotated-owner-token"})
        assert r.status_code == 204
    finally:
        rotated.stop()


def test_logout_closes_the_connections_the_login_opened_with_4003(server):
    value, other = login(server), login(server)

    async def go():
        async with socket(server, value, base(server)) as ws, socket(server, other, base(server)) as kept:
            await Client(ws).result("initialize", {"protocolVersion": "0.2.0", "client": {"name": "p", "version": "1"}})
            r = await asyncio.to_thread(httpx.get, f"{base(server)}/api/logout",
                                        cookies={f"sessionloop_{server.port}": value},
                                        headers={"Sec-Fetch-Site": "same-origin"})
            assert r.status_code == 204
            with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
            assert closed.value.rcvd.code == 4003
            await Client(kept).result("initialize", {"protocolVersion": "0.2.0",
                                                     "client": {"name": "p", "version": "1"}})

    asyncio.run(go())


def test_with_two_workers_a_login_opens_connections_on_both_and_a_logout_closes_them_on_both(server_factory):
    server = server_factory("--workers", "2")
    value = login(server)

    async def go() -> tuple[set[int], list[int]]:
        async with AsyncExitStack() as stack:
            sockets, workers = [], set()
            for n in range(40):
                ws = await stack.enter_async_context(socket(server, value, base(server)))
                client = Client(ws)
                await client.result("initialize", {"protocolVersion": "0.2.0",
                                                   "client": {"name": "p", "version": "1"}})
                sid = (await client.result("session/create", {"name": f"w{n}"}))["session"]["id"]
                workers.add(owner(sid))  # a session made on a connection runs on that connection's worker
                sockets.append(ws)
                if len(workers) == 2 and len(sockets) >= 4:
                    break
            r = await asyncio.to_thread(httpx.get, f"{base(server)}/api/logout",
                                        cookies={f"sessionloop_{server.port}": value},
                                        headers={"Sec-Fetch-Site": "same-origin"})
            assert r.status_code == 204
            codes = []
            for ws in sockets:
                with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
                    while True:
                        await asyncio.wait_for(ws.recv(), 10)
                codes.append(closed.value.rcvd.code)
            return workers, codes

    workers, codes = asyncio.run(go())
    assert workers == {0, 1} and set(codes) == {4003}
    for _ in range(8):  # whichever worker takes the request, the login is over
        assert not authenticated(server, value) and refused_status(server, value, base(server)) == 401


def test_a_restored_backup_keeps_the_logins_and_the_logouts(server, tmp_path):
    kept, ended = login(server), login(server)
    assert httpx.get(f"{base(server)}/api/logout", cookies={f"sessionloop_{server.port}": ended},
                     headers={"Sec-Fetch-Site": "same-origin"}).status_code == 204
    dest = str(tmp_path / "backup")
    result = CliRunner().invoke(main, ["backup", dest, "--data", server.data_dir])
    assert result.exit_code == 0, result.output
    restored = ServerProcess(dest).start()
    try:
        assert authenticated(restored, kept) and not authenticated(restored, ended)
    finally:
        restored.stop()
