"""A ``sessionloop serve`` subprocess for the benchmarks that go over the wire (fan-out, bots):
started on port 0, its port read from the first line it prints, its output drained so it never
blocks on a full pipe (the last lines kept for the report), stopped with SIGTERM."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from typing import Any

from sessionloop.cli.natsproc import NatsCluster, NatsServer
from sessionloop.eventstore.jetstream_log import JetStreamLog

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ServerProc:
    def __init__(self, data_dir: str, token: str, serve_args: list[str], cpus: str | None) -> None:
        cmd = [sys.executable, "-m", "sessionloop", "serve", "--data", data_dir, "--port", "0", "--token", token,
               *serve_args]
        if cpus is not None:
            cmd = ["taskset", "-c", cpus, *cmd]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        match = re.search(r"127\.0\.0\.1:(\d+)/session", line)
        if not match:
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r} {self.proc.stderr.read()}")  # type: ignore[union-attr]
        self.port = int(match.group(1))
        self.tail: list[str] = []
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._drain, args=(stream,), daemon=True).start()

    def _drain(self, stream: Any) -> None:
        for line in stream:
            self.tail = (self.tail + [line.rstrip()])[-40:]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)


# --- the log of serve --cluster (bench_bots --log, bench_failover) ------------------------------------------


def start_log(kind: str, work_dir: str) -> tuple[NatsServer | NatsCluster | None, list[str]]:
    """``--log``: the event log the server follows (``serve --cluster``) and the arguments that say so."""
    if kind == "lmdb":
        return None, []
    if kind == "r1":
        one = NatsServer(log_path=os.path.join(work_dir, "nats.log"), store_dir=os.path.join(work_dir, "js"))
        one.start()
        return one, ["--cluster", one.url, "--node-id", "bench"]
    three = NatsCluster(work_dir, size=3)
    three.start()
    three.wait_ready()
    return three, ["--cluster", ",".join(three.urls), "--node-id", "bench", "--log-replicas", "3"]


async def log_messages(nats: NatsServer | NatsCluster) -> int:
    """The messages in the log's stream now."""
    log = await JetStreamLog.connect(nats.urls if isinstance(nats, NatsCluster) else nats.url,
                                     replicas=3 if isinstance(nats, NatsCluster) else 1)
    try:
        return int((await log.jetstream.stream_info(log.stream)).state.messages)
    finally:
        await log.close()


def stop_log(nats: NatsServer | NatsCluster | None, work_dir: str) -> None:
    if nats is not None:
        nats.stop()
    shutil.rmtree(work_dir, ignore_errors=True)
