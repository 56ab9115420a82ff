"""``sessionloop bench --spawn``: a ``sessionloop serve`` child on 127.0.0.1, port 0, in a
temporary data directory, with an owner token and the bot apps the workload needs (tokens made for
the run, never printed), the mock model's clock as the workload's ``[mock]`` says; stopped with
SIGTERM (then SIGKILL after 30 s) when the run ends, its directory removed."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections import deque
from typing import IO

from sessionloop.cli.loadtest.engine import Deployment
from sessionloop.cli.loadtest.workload import Workload

START_TIMEOUT_S = 60.0
_LISTENING = re.compile(r"listening on (ws://127\.0\.0\.1:\d+/session)")


class SpawnFailed(RuntimeError):
    """The server did not start; the message carries its last lines."""


def apps_toml(tokens: list[str], container: str) -> str:
    return "".join(f'[apps.bench{i + 1}]\ntoken = "{t}"\nname = "bench {i + 1}"\ncontainers = ["{container}"]\n\n'
                   for i, t in enumerate(tokens))


class Spawned:
    """The child server; a context manager whose value is the :class:`Deployment` to drive."""

    def __init__(self, workload: Workload, apps: int, durability: str = "sync", extra: tuple[str, ...] = ()) -> None:
        self.workload, self.apps, self.durability, self.extra = workload, apps, durability, extra
        self.dir = ""
        self.proc: subprocess.Popen[str] | None = None
        self.tail: deque[str] = deque(maxlen=40)

    def command(self, owner: str, apps_file: str) -> list[str]:
        m = self.workload.mock
        cmd = [sys.executable, "-m", "sessionloop", "serve", "--data", os.path.join(self.dir, "data"), "--port", "0",
               "--token", owner, "--apps", apps_file, "--durability", self.durability,
               "--mock-latency-ms", f"{m.latency_ms:g}", "--mock-latency-jitter", m.jitter,
               "--mock-latency-sigma", f"{m.sigma:g}", "--mock-stream-tokens-per-s", f"{m.stream_tokens_per_s:g}",
               "--mock-seed", str(self.workload.seed), *self.extra]
        return cmd

    def __enter__(self) -> Deployment:
        self.dir = tempfile.mkdtemp(prefix="sessionloop-bench-")
        owner = secrets.token_urlsafe(32)
        tokens = [secrets.token_urlsafe(32) for _ in range(self.apps)]
        apps_file = os.path.join(self.dir, "apps.toml")
        fd = os.open(apps_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(apps_toml(tokens, self.workload.sessions.container))
        self.proc = subprocess.Popen(self.command(owner, apps_file), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        url = self._wait_listening()
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._drain, args=(stream,), daemon=True).start()
        return Deployment(url=url, app_tokens=tokens, owner_token=owner, spawned=True)

    def _wait_listening(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        timer = threading.Timer(START_TIMEOUT_S, self.proc.kill)
        timer.start()
        try:
            for line in self.proc.stdout:
                self.tail.append(line.rstrip())
                match = _LISTENING.search(line)
                if match:
                    return match.group(1)
        finally:
            timer.cancel()
        err = self.proc.stderr.read() if self.proc.stderr is not None else ""
        self.__exit__()
        lines = "\n".join([*self.tail, *err.splitlines()[-20:]])
        raise SpawnFailed(f"sessionloop serve did not start (exit {self.proc.poll()}):\n{lines}")

    def _drain(self, stream: IO[str] | None) -> None:
        if stream is not None:
            for line in stream:
                self.tail.append(line.rstrip())

    def __exit__(self, *exc: object) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = ""


__all__ = ["SpawnFailed", "Spawned", "apps_toml"]
