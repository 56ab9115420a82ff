"""``sessionloop serve`` re-reads config.toml and apps.toml on SIGHUP (a real server subprocess,
real WebSocket clients, a real signal): hand edits take effect without any settings request or
restart, a bad edit is refused with one log line and what was read before stays in force, and
an app removed from apps.toml (or whose token changed) loses access and its open connections.
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import threading
import time
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.e2e.conftest import Client, ServerProcess, initialized, open_client

pytestmark = pytest.mark.e2e

WAIT_S = 15.0
TOKEN_A = "app-a-token-for-the-reload-tests-" + "a" * 8
TOKEN_B = "app-b-token-for-the-reload-tests-" + "b" * 8
TOKEN_B2 = "app-b-rotated-token-for-reload-tests-" + "c" * 8
TOKEN_C = "app-c-token-for-the-reload-tests-" + "d" * 8


def app(app_id: str, token: str, modes: str = '["deny", "ask", "acceptCalls"]') -> str:
    return (f'[apps.{app_id}]\ntoken = "{token}"\nplatform = "im"\ncontainers = ["inbox"]\n'
            f"permission_modes = {modes}\n\n")


_stdout_lines: dict[int, queue.Queue[str]] = {}


def _lines(server: ServerProcess) -> queue.Queue[str]:
    """The server's stdout lines, read by a thread of their own (``select`` on the pipe misses a
    line the text wrapper already holds in its buffer: two lines written together)."""
    assert server.proc is not None and server.proc.stdout is not None
    lines = _stdout_lines.get(server.proc.pid)
    if lines is None:
        lines = _stdout_lines[server.proc.pid] = queue.Queue()
        stdout = server.proc.stdout

        def read() -> None:
            for line in stdout:
                lines.put(line)

        threading.Thread(target=read, daemon=True).start()
    return lines


def reload(server: ServerProcess) -> str:
    """SIGHUP, then the line the server says about it on stdout."""
    assert server.proc is not None
    lines = _lines(server)
    os.kill(server.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.1)
        except queue.Empty:
            assert server.proc.poll() is None, "the server stopped on SIGHUP"
            continue
        if line.startswith("sessionloop reload (SIGHUP): "):
            return line.strip()
    raise AssertionError("no reload line within the wait")


def log_lines(server: ServerProcess, fragment: str) -> list[str]:
    server.log.flush()
    with open(server.log.name) as f:
        return [line for line in f if fragment in line]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- config.toml -----------------------------------------------------------------------------------


async def model_calls_of_a_loop_turn(server: ServerProcess) -> int:
    """The steps a ``!loop`` turn got before its tool-limit notice (the effective maxSteps)."""
    async with open_client(server) as ws:
        c = await initialized(ws)
        sid = (await c.result("session/create", {}))["session"]["id"]
        await c.result("session/subscribe", {"sessionId": sid})
        await c.result("turn/send", {"sessionId": sid, "content": "!loop"})
        notice = await c.push(lambda m: m["method"] == "item/completed" and m["params"]["sessionId"] == sid
                              and m["params"]["item"]["kind"] == "notice"
                              and m["params"]["item"].get("topic") == "tool-limit")
        await c.turn_done(sid)
        text = notice["params"]["item"]["text"]
        return int(text.split("Stopped after ")[1].split()[0])


async def effective_max_steps(server: ServerProcess) -> tuple[Any, Any]:
    async with open_client(server) as ws:
        c = await initialized(ws)
        rows = (await c.result("session/config/layer/get", {"layer": {"scope": "global"}}))["items"]
        row = next(r for r in rows if (r["plugin"], r["key"]) == ("agent", "maxSteps"))
        return row.get("value"), row.get("effective")


def write_config(server: ServerProcess, text: str) -> None:
    path = os.path.join(server.data_dir, "config.toml")
    with open(path, "w") as f:
        f.write(text)
    os.utime(path, ns=(time.time_ns(), time.time_ns()))


def test_a_hand_edit_of_config_toml_is_in_force_after_sighup_without_any_settings_request(server_factory, tmp_path):
    data = tmp_path / "data"
    os.makedirs(data)
    (data / "config.toml").write_text("[plugins.agent]\nmaxSteps = 3\n")
    server = server_factory(data_dir=str(data))
    assert run(model_calls_of_a_loop_turn(server)) == 3
    write_config(server, "[plugins.agent]\nmaxSteps = 2\n")
    line = reload(server)
    assert f"{server.data_dir}/config.toml reloaded" in line, line
    assert run(model_calls_of_a_loop_turn(server)) == 2  # no session/config/* call in between


def test_a_bad_config_toml_edit_is_refused_with_one_log_line_and_the_values_before_stay(server_factory, tmp_path):
    data = tmp_path / "data"
    os.makedirs(data)
    (data / "config.toml").write_text("[plugins.agent]\nmaxSteps = 2\n")
    server = server_factory(data_dir=str(data))
    path = f"{server.data_dir}/config.toml"
    for bad, why in (("[plugins.agent\nmaxSteps = 4\n", "not valid TOML"),
                     ('[plugins.agent]\nmaxSteps = "many"\n', "plugins.agent.maxSteps: expected an integer"),
                     ("plugins = 4\n", "plugins: expected a table")):
        write_config(server, bad)
        line = reload(server)
        assert f"{path} refused: {why}" in line and "the settings read before stay in force" in line, line
        assert len(log_lines(server, f"{path} refused: {why}")) == 1
        assert run(model_calls_of_a_loop_turn(server)) == 2
        assert run(effective_max_steps(server)) == (2, 2)  # a settings request re-reads it: still refused
    write_config(server, "[plugins.agent]\nmaxSteps = 4\n")
    assert f"{path} reloaded" in reload(server)
    assert run(model_calls_of_a_loop_turn(server)) == 4


# --- apps.toml -------------------------------------------------------------------------------------


async def held_open(server: ServerProcess, token: str) -> tuple[Any, Client]:
    ws = await open_client(server, token)
    return ws, await initialized(ws)


async def refused_status(server: ServerProcess, token: str) -> int:
    with pytest.raises(InvalidStatus) as info:
        async with open_client(server, token):
            pass
    return int(info.value.response.status_code)


async def create_mode(c: Client, mode: str) -> str:
    reply = await c.call("loop/create", {"containerId": "inbox", "permissionMode": mode})
    return "ok" if "result" in reply else reply["error"]["data"]["code"]


async def closed_with(ws: Any) -> int | None:
    try:
        await asyncio.wait_for(ws.recv(), WAIT_S)
    except ConnectionClosed:
        pass
    return ws.close_code


def test_an_apps_toml_reload_adds_removes_and_rotates_apps_closing_the_connections_it_revokes(server_factory,
                                                                                            tmp_path):
    data = tmp_path / "data"
    os.makedirs(data)
    (data / "apps.toml").write_text(app("a", TOKEN_A) + app("b", TOKEN_B) + app("c", TOKEN_C))
    server = server_factory(data_dir=str(data))

    async def go() -> dict[str, Any]:
        ws_a, _ = await held_open(server, TOKEN_A)
        ws_b, _ = await held_open(server, TOKEN_B)
        ws_c, c = await held_open(server, TOKEN_C)
        before = await create_mode(c, "acceptCalls")
        (data / "apps.toml").write_text(app("b", TOKEN_B2) + app("c", TOKEN_C, '["deny", "ask"]')
                                        + app("d", TOKEN_A[::-1]))
        line = await asyncio.to_thread(reload, server)
        codes = (await closed_with(ws_a), await closed_with(ws_b))
        after = await create_mode(c, "acceptCalls")  # c's connection stays, under its new manifest
        statuses = [await refused_status(server, t) for t in (TOKEN_A, TOKEN_B)]
        async with open_client(server, TOKEN_B2) as ws:
            rotated = await create_mode(await initialized(ws), "ask")
        async with open_client(server, TOKEN_A[::-1]) as ws:
            added = await create_mode(await initialized(ws), "ask")
        await ws_c.close()
        return {"line": line, "codes": codes, "before": before, "after": after, "statuses": statuses,
                "rotated": rotated, "added": added}

    out = run(go())
    assert out["line"].endswith("apps.toml reloaded: 3 app(s); added d; removed a; token changed b; manifest "
                                "changed c; 2 connection(s) of revoked apps closed"), out["line"]
    assert out["codes"] == (4001, 4001)
    assert (out["before"], out["after"]) == ("ok", "forbidden")
    assert out["statuses"] == [401, 401]
    assert (out["rotated"], out["added"]) == ("ok", "ok")
    for token in (TOKEN_A, TOKEN_B, TOKEN_B2, TOKEN_C):
        assert not log_lines(server, token)  # no token in any log line


def test_a_bad_apps_toml_edit_is_refused_naming_the_app_never_the_token_and_the_apps_before_stay(server_factory,
                                                                                              tmp_path):
    data = tmp_path / "data"
    os.makedirs(data)
    (data / "apps.toml").write_text(app("b", TOKEN_B))
    server = server_factory(data_dir=str(data))
    short = "short-token-" + "x" * 19
    assert len(short) == 31
    path = f"{server.data_dir}/apps.toml"
    for bad, why in ((app("b", TOKEN_B) + app("d", short), "[apps.d] token has 31 characters, at least 32"),
                     (app("b", TOKEN_B) + app("e", TOKEN_B), "[apps.e] has the same token as b"),
                     (app("b", TOKEN_B, '["root"]'), "[apps.b]: app 'b': permission_modes must be"),
                     ("[apps.b\n", "not valid TOML")):
        (data / "apps.toml").write_text(bad)

        async def go() -> tuple[str, str, int]:
            ws_b, b = await held_open(server, TOKEN_B)
            line = await asyncio.to_thread(reload, server)
            still = await create_mode(b, "acceptCalls")  # the open connection and its manifest stay
            await ws_b.close()
            return line, still, await refused_status(server, short)

        line, still, status = run(go())
        assert f"{path} refused: " in line and why in line and "the apps read before stay in force" in line, line
        assert (still, status) == ("ok", 401)
        assert len(log_lines(server, "apps file refused: ")) >= 1 and not log_lines(server, short)
