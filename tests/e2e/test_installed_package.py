"""The installed distribution owns one top-level name, ``sessionloop``: a fresh venv, a plain
(non-editable) ``pip install`` of a copy of this checkout, then, from a directory holding its own
``protocol.py``, ``actors.py``, ``eventstore.py`` and ``cli/`` (each refuses to be imported),
``import sessionloop`` works, ``sessionloop serve`` serves a real client, and ``pip show -f``
lists no other top-level package.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import venv

import pytest
from websockets.asyncio.client import connect

from tests.conftest import REPO

pytestmark = pytest.mark.e2e

#: what the installed distribution may put at the top of site-packages (and the script in bin/)
OURS = re.compile(r"^(sessionloop/|sessionloop-[^/]+\.dist-info/|\.\./\.\./\.\./bin/sessionloop$)")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python, sessionloop script, pip show -f output) of a fresh venv with a plain install."""
    root = tmp_path_factory.mktemp("installed")
    source = root / "source"
    # a copy: pip builds in the source tree (build/, *.egg-info), which must not touch the checkout
    shutil.copytree(REPO, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "venv", "build", "*.egg-info", "__pycache__", ".hypothesis", "results"))
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    done = subprocess.run([python, "-m", "pip", "install", "-q", "--no-input", str(source)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    show = subprocess.run([python, "-m", "pip", "show", "-f", "sessionloop"], capture_output=True, text=True,
                          check=True).stdout
    stranger = root / "stranger"
    (stranger / "cli").mkdir(parents=True)
    for name in ("protocol.py", "actors.py", "eventstore.py", os.path.join("cli", "__init__.py")):
        (stranger / name).write_text(f"raise SystemExit('the user\\'s own {name} was imported')\n")
    return python, str(env_dir / "bin" / "sessionloop"), show, str(stranger)


def test_the_distribution_installs_exactly_one_top_level_name(installed) -> None:
    _, _, show, _ = installed
    files = show.split("Files:", 1)[1].split()
    assert any(f == "sessionloop/__init__.py" for f in files)
    assert any(f == "sessionloop/actors/api/host.py" for f in files) and any(f.startswith("sessionloop/cli/")
                                                                          for f in files)
    assert not any(f.startswith("sessionloop/actors/public/") for f in files)  # the root, not a subpackage
    assert [f for f in files if not OURS.match(f)] == []


def test_import_sessionloop_beside_a_users_own_protocol_and_cli(installed) -> None:
    python, _, _, stranger = installed
    code = ("import json, sessionloop; from sessionloop import *; "
            "print(json.dumps({'file': sessionloop.__file__, 'all': sessionloop.__all__, "
            "'host': sessionloop.Host.__module__, 'missing': [n for n in sessionloop.__all__ if n not in globals()]}))")
    done = subprocess.run([python, "-c", code], cwd=stranger, capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["file"].startswith(os.path.dirname(os.path.dirname(python)))  # the venv's copy, not the checkout
    assert {"Host", "HostOptions", "SessionLoop", "AsyncSessionLoop", "NotFound", "StoreLocked"} <= set(out["all"])
    assert out["missing"] == []
    assert out["host"] == "sessionloop.actors.api.host"


def test_sessionloop_serve_from_there_answers_a_real_client(installed, tmp_path) -> None:
    _, script, _, stranger = installed
    proc = subprocess.Popen([script, "serve", "--data", str(tmp_path / "data"), "--port", "0", "--token",
                             "installed-owner-token", "--durability", "nosync"], cwd=stranger,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    try:
        line = proc.stdout.readline()
        match = re.search(r"127\.0\.0\.1:(\d+)/session", line)
        assert match, (line, proc.stderr.read() if proc.poll() is not None else "")

        async def talk() -> dict:
            async with connect(f"ws://127.0.0.1:{match.group(1)}/session",
                               additional_headers={"Authorization": "Bearer installed-owner-token"}) as ws:
                await ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "0.2.0", "client": {"name": "installed-test", "version": "1"}}}))
                return json.loads(await asyncio.wait_for(ws.recv(), 10))

        reply = asyncio.run(talk())
        assert reply["result"]["protocolVersion"].startswith("0.2"), reply
    finally:
        proc.terminate()
        proc.wait(15)
