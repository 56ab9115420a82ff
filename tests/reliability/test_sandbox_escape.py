"""The escape suite (SPEC §7): a stranger's bot drives a real server's ``exec`` like an attacker.

The route the adversarial test found: an app creates a background session (``acceptCalls``, so
no approval stands between a message and a command) and sends ``!tool exec`` lines through
``loop/send``; the mock model makes the call. Every attempt below must fail: read the owner token,
the signing secret, the apps file (in the data directory and outside it), the LMDB files, the
server's environment and command line; write outside the workspace (the host, the data
directory, another session's workspace); reach the server's port or any network; signal the
server; exhaust processes, memory, CPU, disk or output; and make the file tools (which run as the
server) follow a symlink swapped in between their check and their use. Each test asserts the
attack's effect is absent on the host, not only that the command failed.

One server serves the whole module, started without ``--token`` so it keeps its owner token in
its data directory as a real deployment does, with canaries in its environment and small limits.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sessionloop.actors import events as E
from sessionloop.actors.events import open_store
from tests.conftest import processes_with_arg, wait_no_process_with_arg
from tests.e2e.conftest import Client, ServerProcess, initialized, open_client

pytestmark = pytest.mark.e2e

APP_TOKEN = "stranger-bot-token-" + "x" * 24
CANARY_ENV = "SESSIONLOOP_CANARY_VALUE_7f3a"
API_KEY = "sk-canary-api-key-0d1e2f"
CONVERSATION = "conversation-canary-91c2"  # another session's message: in data.mdb


class World:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.outside = root / "outside"  # a host directory next to the data directory
        self.hidden = root / "operator-secrets"  # a path the operator hides with --sandbox-hide
        self.apps = root / "etc" / "apps.toml"  # the apps file outside the data directory
        self.server: ServerProcess | None = None

    @property
    def srv(self) -> ServerProcess:
        assert self.server is not None
        return self.server

    def token(self) -> str:
        return (self.data / "token").read_text().strip()

    def secret(self) -> bytes:
        return (self.data / "secret").read_bytes()


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    # not under /tmp: the sandbox has a /tmp of its own, which would hide everything there and
    # prove nothing about the masks; /var/tmp is seen (read-only) like the rest of the host
    root = Path(tempfile.mkdtemp(prefix="sessionloop-escape-", dir="/var/tmp"))
    try:
        yield from _world(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _world(root: Path) -> Iterator[World]:
    w = World(root)
    w.data.mkdir()
    w.outside.mkdir()
    w.hidden.mkdir()
    (w.hidden / "key.pem").write_text("operator-private-key")
    w.apps.parent.mkdir()
    w.apps.write_text(f'[apps.stranger]\ntoken = "{APP_TOKEN}"\nplatform = "im"\ncontainers = ["inbox"]\n')
    env = {"SESSIONLOOP_CANARY": CANARY_ENV, "OPENAI_API_KEY": API_KEY}
    w.server = ServerProcess(str(w.data), "--apps", str(w.apps), "--sandbox-hide", str(w.hidden),
                             "--exec-memory-mb", "256", "--exec-cpu-seconds", "2", "--exec-output-mb", "1",
                             "--exec-file-size-mb", "1", "--exec-processes", "64", env=env, token=None).start()
    # another session's conversation, so the store holds a stranger's text to steal
    asyncio.run(bot_turn(w, CONVERSATION))
    yield w
    w.srv.stop()


async def bot(w: World) -> tuple[Any, Client]:
    ws = await open_client(w.srv, APP_TOKEN).__aenter__()
    return ws, await initialized(ws)


async def bot_turn(w: World, text: str, session_id: str | None = None) -> tuple[str, str]:
    """One message from the stranger's bot into a background session (``acceptCalls``); waits
    for the turn. Returns (session id, turn id)."""
    ws, c = await bot(w)
    try:
        if session_id is None:
            made = await c.result("loop/create", {"containerId": "inbox", "activity": "background"})
            session_id = made["sessionId"]
        receipt = await c.result("loop/send", {"sessionId": session_id, "text": text,
                                               "idempotencyKey": uuid.uuid4().hex})
        done = await c.result("loop/waitForTurn", {"sessionId": session_id, "turnId": receipt["turnId"],
                                                   "timeoutMs": 60_000})
        assert done["state"] in ("completed", "failed"), done
        return session_id, receipt["turnId"]
    finally:
        await ws.close()


def tool_results(w: World, session_id: str, turn_id: str) -> list[E.ToolFinished]:
    store = open_store(str(w.data / "store"), readonly=True)
    try:
        return [r.event for r in store.read_stream(f"session-{session_id}")
                if isinstance(r.event, E.ToolFinished) and r.event.turn_id == turn_id]
    finally:
        store.close()


def tool(w: World, name: str, args: dict[str, Any], session_id: str | None = None) -> tuple[str, dict[str, Any]]:
    """Run one tool call through the bot; (session id, its recorded output)."""
    sid, turn = asyncio.run(bot_turn(w, f"!tool {name} {json.dumps(args)}", session_id))
    (finished,) = tool_results(w, sid, turn)
    return sid, finished.output


def sh(w: World, command: str, session_id: str | None = None) -> dict[str, Any]:
    """``exec`` ``command``; its output dict (``exitCode``, ``output``; ``error`` when refused)."""
    return tool(w, "exec", {"command": command}, session_id)[1]


def secrets_of(w: World) -> list[str]:
    return [w.token(), APP_TOKEN, CANARY_ENV, API_KEY, w.secret().hex(), "operator-private-key"]


def assert_no_secret(w: World, out: dict[str, Any]) -> None:
    text = json.dumps(out)
    for secret in secrets_of(w):
        assert secret not in text, f"a secret reached the tool output: {text[:500]}"


def server_alive(w: World) -> bool:
    return w.srv.proc is not None and w.srv.proc.poll() is None


# --- reading secrets ----------------------------------------------------------------------------


READS = {
    "the owner token by a relative path": "cat ../../token",
    "the owner token by its absolute path": "cat {data}/token",
    "the signing secret": "od -An -tx1 -v {data}/secret | tr -d ' \\n'",
    "the apps file kept outside the data directory": "cat {apps}",
    "the apps file's directory": "ls -la {apps_dir}; cat {apps_dir}/*",
    "the operator's hidden path": "cat {hidden}/key.pem; ls -la {hidden}",
    "the LMDB data file": "od -c {data}/store/data.mdb | head -c 100000",
    "the store with grep": "grep -a -r -o 'stranger-bot-token[x]*\\|conversation-canary-91c2' {data} 2>&1",
    "every data directory entry": "ls -laR {data} 2>&1",
    "the server's environment by its pid": "cat /proc/{pid}/environ | tr '\\0' '\\n'",
    "the server's command line by its pid": "cat /proc/{pid}/cmdline | tr '\\0' ' '",
    "any process's environment": "for e in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $e; done",
    "the command's own environment": "env",
    "the parent's open files": "ls -la /proc/1/fd /proc/{pid}/fd 2>&1; "
                               "for f in /proc/1/fd/*; do timeout 1 head -c 2000 $f; done 2>&1",
    "a symlink to the token": "ln -s {data}/token t; cat t",
    "a hard link to the token": "ln {data}/token h 2>&1; cat h",
    "the token through /proc/<pid>/root": "cat /proc/{pid}/root{data}/token",
}


@pytest.mark.parametrize("name", list(READS))
def test_a_command_cannot_read(world: World, name: str) -> None:
    command = READS[name].format(data=world.data, apps=world.apps, apps_dir=world.apps.parent,
                                 hidden=world.hidden, pid=world.srv.proc.pid)
    out = sh(world, command)
    assert "exitCode" in out, out  # it ran, in the sandbox
    assert_no_secret(world, out)
    assert CONVERSATION not in out["output"], "another session's conversation was read"


def test_a_command_does_not_see_another_sessions_workspace(world: World) -> None:
    first, _ = tool(world, "write_file", {"path": "private.txt", "content": "first session's words"})
    assert (world.data / "workspaces" / first / "private.txt").exists()
    out = sh(world, f"cat {world.data}/workspaces/{first}/private.txt 2>/dev/null; echo ---; ls ..")
    read, listing = out["output"].split("---\n")
    assert read == "" and first not in listing and len(listing.split()) == 1, out  # its own directory only


def test_the_file_tools_refuse_a_symlink_to_the_token(world: World) -> None:
    sid, _ = tool(world, "exec", {"command": "ln -s ../../token t && ln -s ../.. up && echo made"})
    _, read = tool(world, "read_file", {"path": "t"}, sid)
    _, through = tool(world, "read_file", {"path": "up/token"}, sid)
    for out in (read, through):
        assert "error" in out and "outside the workspace" in out["error"], out
        assert_no_secret(world, out)


def test_a_checkpoint_never_takes_a_symlinked_secret_into_the_log(world: World) -> None:
    # the second command changes the link: its before-image must not be the token's content
    sid = tool(world, "exec", {"command": f"ln -s {world.data}/token t"})[0]
    sh(world, "rm t; echo replaced > t", sid)
    store = open_store(str(world.data / "store"), readonly=True)
    try:
        images = [r.event for r in store.read_stream(f"session-{sid}") if isinstance(r.event, E.CheckpointRecorded)]
    finally:
        store.close()
    assert [c.path for c in images] == ["t", "t"]  # made, then changed: both recorded
    assert all(world.token().encode() not in (c.content or b"") for c in images), images


# --- writing outside the workspace --------------------------------------------------------------


WRITES = {
    "the host root": ("echo pwned > /pwned-by-sandbox", "/pwned-by-sandbox"),
    "/etc": ("echo pwned > /etc/pwned-by-sandbox", "/etc/pwned-by-sandbox"),
    "a host directory beside the data": ("echo pwned > {outside}/pwned", "{outside}/pwned"),
    "the data directory": ("echo pwned > {data}/pwned; mkdir -p {data}/store && echo x > {data}/store/pwned",
                           "{data}/pwned"),
    "over the owner token": ("echo attacker > {data}/token", None),
    "the host /tmp": ("echo pwned > /tmp/pwned-by-sandbox-{tag}", "/tmp/pwned-by-sandbox-{tag}"),
    "the host /dev/shm": ("echo pwned > /dev/shm/pwned-by-sandbox-{tag}", "/dev/shm/pwned-by-sandbox-{tag}"),
    "a cgroup of the host": ("echo $$ > /sys/fs/cgroup/pids/cgroup.procs; echo 1 > /proc/sys/kernel/sysrq", None),
}


@pytest.mark.parametrize("name", list(WRITES))
def test_a_command_cannot_write(world: World, name: str) -> None:
    token = world.token()
    tag = uuid.uuid4().hex[:8]
    command, target = WRITES[name]
    sh(world, command.format(data=world.data, outside=world.outside, tag=tag))
    if target is not None:
        assert not os.path.exists(target.format(data=world.data, outside=world.outside, tag=tag)), name
    assert world.token() == token and server_alive(world)


def test_a_command_cannot_write_another_sessions_workspace(world: World) -> None:
    first, _ = tool(world, "write_file", {"path": "notes.txt", "content": "mine"})
    sh(world, f"echo theirs > {world.data}/workspaces/{first}/notes.txt")
    assert (world.data / "workspaces" / first / "notes.txt").read_text() == "mine"


def test_a_command_cannot_remount_unmount_or_make_a_user_namespace(world: World) -> None:
    out = sh(world, f"mount -o remount,rw / 2>&1; umount {world.data} 2>&1; unshare -U true 2>&1; "
                    f"cat {world.data}/token 2>&1; echo end")
    assert out["output"].rstrip().endswith("end")
    assert_no_secret(world, out)
    assert not os.path.exists("/pwned-by-sandbox")


def test_read_only_policy_leaves_even_the_workspace_unwritten(world: World) -> None:
    async def go() -> tuple[str, dict[str, Any]]:
        ws = await open_client(world.srv, world.token()).__aenter__()
        try:
            c = await initialized(ws)
            sid = (await c.result("session/create", {}))["session"]["id"]
            for key, value in (("permissionMode", "acceptCalls"), ("sandbox", "read-only")):
                await c.result("session/config/update", {"sessionId": sid, "plugin": "tools", "key": key,
                                                         "value": value})
            await c.result("session/subscribe", {"sessionId": sid})
            await c.result("turn/send", {"sessionId": sid, "content": "!tool exec " + json.dumps(
                {"command": "echo x > inside.txt; echo rc=$?"})})
            push = await c.push(lambda m: m["method"] == "item/completed" and m["params"]["sessionId"] == sid
                                and m["params"]["item"]["kind"] == "tool-call", 30)
            return sid, push["params"]["item"]
        finally:
            await ws.close()
    sid, item = asyncio.run(go())
    assert item["display"]["sandbox"] == "read-only", item  # the card names the policy
    assert "rc=2" in json.dumps(item["result"]) or "Read-only" in json.dumps(item["result"]), item
    assert not (world.data / "workspaces" / sid / "inside.txt").exists()


# --- network and signals ------------------------------------------------------------------------


def test_a_command_cannot_reach_the_servers_port(world: World) -> None:
    out = sh(world, f"python3 -c \"import socket; s=socket.create_connection(('127.0.0.1', {world.srv.port}), 2); "
                    "print('CONNECTED')\" 2>&1")
    assert "CONNECTED" not in out["output"] and "refused" in out["output"].lower(), out


def test_a_command_has_no_network_but_its_own_loopback(world: World) -> None:
    out = sh(world, "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '; "
                    "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), 2)\" 2>&1 | tail -1")
    interfaces = out["output"].split()
    assert interfaces[0] == "lo" and "unreachable" in out["output"].lower(), out


@pytest.mark.parametrize("command", ["kill -9 {pid}", "kill -9 -1", "pkill -9 -f sessionloop; killall -9 python3"])
def test_a_command_cannot_signal_the_server(world: World, command: str) -> None:
    sh(world, command.format(pid=world.srv.proc.pid) + " 2>&1; true")
    time.sleep(0.2)
    assert server_alive(world)
    sh(world, "true")  # and still serves


# --- resources ----------------------------------------------------------------------------------


def test_a_fork_bomb_is_held_to_the_process_limit(world: World) -> None:
    before = len(os.listdir("/proc"))
    out = sh(world, "bomb() { bomb | bomb & }; bomb; sleep 1; echo survived")
    assert "Cannot fork" in out["output"] or "Resource temporarily unavailable" in out["output"], out["output"][-500:]
    assert server_alive(world)
    deadline = time.monotonic() + 10
    while len(os.listdir("/proc")) > before + 20 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(os.listdir("/proc")) <= before + 20, "the bomb's processes outlived the command"


def test_memory_beyond_the_limit_is_refused(world: World) -> None:
    out = sh(world, "python3 -c \"b = bytearray(1024 * 1024 * 1024); print('ALLOCATED')\" 2>&1")
    assert "MemoryError" in out["output"] and "ALLOCATED" not in out["output"], out


def test_cpu_beyond_the_limit_kills_the_process(world: World) -> None:
    start = time.monotonic()
    out = sh(world, "python3 -c 'while True: pass'")
    assert out["exitCode"] in (128 + signal.SIGXCPU, 128 + signal.SIGKILL), out
    assert time.monotonic() - start < 30


def test_a_file_beyond_the_size_limit_is_cut_off(world: World) -> None:
    sid, out = tool(world, "exec", {"command": "head -c 5000000 /dev/zero > big; echo rc=$?"})
    assert (world.data / "workspaces" / sid / "big").stat().st_size <= 1024 * 1024
    assert "rc=153" in out["output"] or "File size limit" in out["output"], out


def test_output_flooding_is_cut_at_the_output_limit(world: World) -> None:
    start = time.monotonic()
    out = sh(world, "yes flood")
    assert out.get("outputLimited") is True and "output limit" in out["output"], (
        {k: out[k] for k in out if k != "output"})
    assert len(out["output"]) <= 16_100 and time.monotonic() - start < 30
    assert server_alive(world)


def test_a_server_killed_with_sigkill_takes_its_running_commands_with_it(tmp_path: Path) -> None:
    server = ServerProcess(str(tmp_path / "data")).start()
    marker = f"30.{os.getpid()}{time.monotonic_ns() % 10**6:06d}"
    try:
        async def go() -> None:
            ws = await open_client(server).__aenter__()
            c = await initialized(ws)
            sid = (await c.result("session/create", {}))["session"]["id"]
            await c.result("session/config/update", {"sessionId": sid, "plugin": "tools", "key": "permissionMode",
                                                     "value": "acceptCalls"})
            await c.result("turn/send", {"sessionId": sid,
                                         "content": "!tool exec " + json.dumps({"command": f"sleep {marker}"})})
            await ws.close()
        asyncio.run(go())
        deadline = time.monotonic() + 10
        while not processes_with_arg(marker) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert processes_with_arg(marker), "the command never started"
    finally:
        server.stop(signal.SIGKILL)
    assert wait_no_process_with_arg(marker), "a command outlived its server's SIGKILL"


# --- the file tools against a symlink swapped between check and use ----------------------------


def test_the_file_tools_never_follow_a_symlink_swapped_in_between_check_and_use(world: World) -> None:
    """A background command flips ``d`` between a real directory and a link to the data directory
    as fast as it can while the file tools (run by the server) read ``d/token`` and write ``d/x``:
    the check may see the directory and the use the link; no call ever reads the token or writes
    into the data directory."""
    flip = ("python3 -c \"import os, time\n"
            "os.makedirs('d', exist_ok=True); open('d/token', 'w').write('decoy')\n"
            "end = time.time() + 60\n"
            "while time.time() < end:\n"
            f"    os.rename('d', 'd.real'); os.symlink({str(world.data)!r}, 'd'); time.sleep(0.001)\n"
            "    os.unlink('d'); os.rename('d.real', 'd'); time.sleep(0.002)\n\"")
    sid, started = tool(world, "exec", {"command": flip, "background": True})
    assert started.get("status") == "running", started
    calls = []
    for i in range(40):
        calls.append("!tool read_file " + json.dumps({"path": "d/token"}))
        calls.append("!tool write_file " + json.dumps({"path": "d/x", "content": f"w{i}"}))
    outcomes: dict[str, int] = {}
    for _ in range(10):  # until the race has gone both ways (three batches at least)
        if len(outcomes) == 2 and sum(outcomes.values()) >= 3 * len(calls):
            break
        _, turn = asyncio.run(bot_turn(world, "\n".join(calls), sid))
        for finished in tool_results(world, sid, turn):
            out = finished.output if isinstance(finished.output, dict) else {"o": finished.output}
            assert_no_secret(world, out)
            key = "error" if "error" in out else "ok"
            outcomes[key] = outcomes.get(key, 0) + 1
    assert not (world.data / "x").exists(), "a write went through the swapped link into the data directory"
    assert outcomes.get("ok", 0) > 0 and outcomes.get("error", 0) > 0, outcomes  # the race was really run


# --- the data directory, and where no sandbox can be made ---------------------------------------


def test_the_data_directory_and_the_store_are_the_servers_users_only(world: World) -> None:
    modes = {p: os.stat(world.data / p).st_mode & 0o777
             for p in (".", "store", "store/data.mdb", "store/lock.mdb", "token", "secret")}
    assert modes == {".": 0o700, "store": 0o700, "store/data.mdb": 0o600, "store/lock.mdb": 0o600,
                     "token": 0o600, "secret": 0o600}, {p: oct(m) for p, m in modes.items()}


def server_log(server: ServerProcess) -> str:
    server.log.flush()
    with open(server.log.name) as f:
        return f.read()


def owner_exec(server: ServerProcess, command: str) -> dict[str, Any]:
    """An owner session in acceptCalls runs ``command``; its tool-call item when completed."""
    async def go() -> dict[str, Any]:
        ws = await open_client(server).__aenter__()
        try:
            c = await initialized(ws)
            sid = (await c.result("session/create", {}))["session"]["id"]
            await c.result("session/config/update", {"sessionId": sid, "plugin": "tools", "key": "permissionMode",
                                                     "value": "acceptCalls"})
            await c.result("session/subscribe", {"sessionId": sid})
            await c.result("turn/send", {"sessionId": sid, "content": "!tool exec " + json.dumps({"command": command})})
            push = await c.push(lambda m: m["method"] == "item/completed" and m["params"]["sessionId"] == sid
                                and m["params"]["item"]["kind"] == "tool-call", 30)
            return push["params"]["item"]
        finally:
            await ws.close()
    return asyncio.run(go())


def test_where_no_sandbox_can_be_made_exec_refuses_naming_the_cause_and_runs_nothing(tmp_path: Path) -> None:
    server = ServerProcess(str(tmp_path / "data"), "--bwrap", str(tmp_path / "no-such-bwrap")).start()
    try:
        item = owner_exec(server, "touch ran")
        log = server_log(server)
    finally:
        server.stop()
    assert item["status"] == "failed" and "exec is unavailable: bubblewrap cannot be started" in json.dumps(item), item
    assert not (tmp_path / "data" / "workspaces").exists() or not list((tmp_path / "data" / "workspaces").glob("*/ran"))
    assert "WARNING" in log and "exec is unavailable" in log, log


def test_sandbox_none_runs_commands_unsandboxed_warns_at_start_and_records_the_policy_none(tmp_path: Path) -> None:
    server = ServerProcess(str(tmp_path / "data"), "--sandbox", "none").start()
    try:
        item = owner_exec(server, f"touch {tmp_path}/outside && echo ran")
        log = server_log(server)
    finally:
        server.stop()
    assert item["display"]["sandbox"] == "none" and item["status"] == "completed", item
    assert (tmp_path / "outside").exists()  # what the operator chose: no sandbox
    assert "WARNING" in log and "--sandbox none" in log, log
