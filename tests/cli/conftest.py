"""A real ``sessionloop serve`` subprocess for the client commands, and ways to run the CLI against it.

One server per test module (starting one takes a moment); tests create their own sessions, so they
do not see each other's state except in ``sessions ls`` (where they look for their own rows).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from click.testing import CliRunner, Result

from sessionloop.cli.main import main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START_TIMEOUT_S = 20.0
APP_ID = "clibot"
APP_TOKEN = "cli-test-app-token-of-the-cli-tests"


@dataclass
class RunningServer:
    url: str
    token: str
    app_token: str
    data_dir: str
    proc: subprocess.Popen[bytes]

    @property
    def env(self) -> dict[str, str]:
        """Environment that points the CLI at this server."""
        return {"SESSIONLOOP_URL": self.url, "SESSIONLOOP_TOKEN": self.token}


def _wait_for_listening_line(path: str, proc: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        with open(path) as f:
            first = f.readline()
        if first.endswith("\n"):
            return first
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    with open(path) as f:
        raise RuntimeError(f"sessionloop serve did not start (exit {proc.poll()}): {f.read()!r}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """``sessionloop serve --port 0 --durability nosync`` on loopback; its owner token from DATA/token,
    and one app (``DATA/apps.toml``) for the Session Loop API path of ``send``."""
    base = tmp_path_factory.mktemp("cli-server")
    data_dir, out_path = str(base / "data"), str(base / "serve.out")
    os.makedirs(data_dir)
    with open(os.path.join(data_dir, "apps.toml"), "w") as f:
        f.write(f'[apps.{APP_ID}]\ntoken = "{APP_TOKEN}"\nplatform = "{APP_ID}"\n')
    with open(out_path, "wb") as out, open(str(base / "serve.err"), "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sessionloop", "serve", "--data", data_dir, "--port", "0", "--durability", "nosync"],
            stdout=out, stderr=err, cwd=REPO,
        )
    try:
        first = _wait_for_listening_line(out_path, proc)
        match = re.search(r"(ws://127\.0\.0\.1:\d+/session)", first)
        assert match, first
        with open(os.path.join(data_dir, "token")) as f:
            token = f.read().strip()
        yield RunningServer(url=match.group(1), token=token, app_token=APP_TOKEN, data_dir=data_dir, proc=proc)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class Cli:
    """Runs ``sessionloop`` in this process (click's CliRunner) with the server in the environment."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def __call__(self, *args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
        runner = CliRunner()
        return runner.invoke(main, list(args), input=input, env={**self.env, **(env or {})}, catch_exceptions=False)


@pytest.fixture
def cli(server: RunningServer) -> Cli:
    return Cli(server.env)


@pytest.fixture
def process_env(server: RunningServer) -> dict[str, str]:
    """The environment of a ``sessionloop`` subprocess aimed at the server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONLOOP_")}
    return {**env, **server.env, "PYTHONPATH": REPO}


@pytest.fixture
def run_cli_process(server: RunningServer, tmp_path):
    """Run ``sessionloop ARGS`` as a real subprocess (cwd: an empty directory, no token file)."""

    def run(*args: str, input: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 20) -> subprocess.CompletedProcess[str]:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONLOOP_")}
        full_env.update(env if env is not None else server.env)
        full_env["PYTHONPATH"] = REPO
        return subprocess.run([sys.executable, "-m", "sessionloop", *args], input=input, capture_output=True,
                              text=True, env=full_env, cwd=str(tmp_path), timeout=timeout, check=False)

    return run
