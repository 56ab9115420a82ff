"""The Session Loop API for bots (seeds 000/001, SPEC §5): create, send, wait_for_turn,
on_did_receive_event, list_events — per app, idempotent, FIFO, quota-guarded.

    loop = host.sessions(app="mybot")
    s = loop.create(container_id="inbox", title="Chat with Alice",
                    initial_message={"text": "Hello", "idempotency_key": "welcome-alice"})
    receipt = loop.send(s.session_id, "What is the weather?", idempotency_key="msg-123")
    result = loop.wait_for_turn(s.session_id, receipt.turn_id, timeout_ms=60_000)

An app sees, sends to and waits on only the sessions it created: another app's session id is
``not-found`` (not ``forbidden``), so ids do not leak. Acknowledged inputs are durable (the
receipt is returned after the commit), and the idempotency key is recorded in that same commit:
a repeat returns the original receipt, after a restart too, and never starts a second turn.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from eventstore import IdempotencyClaim, RecordedEvent, request_hash
from eventstore import events as E

from .caller import CURRENT_CALL
from .errors import Forbidden, InvalidCommand, NotFound, RequestTimeout
from .pubsub import Reply, TurnOutcome
from .session import Create, Query, Receipt, Send, now_ms

if TYPE_CHECKING:
    from .host import Host

MAX_KEY = 512
MAX_TEXT = 100_000
MAX_ATTACHMENTS = 10
MAX_ATTACHMENT_BYTES = 20 * 1024 * 1024
SESSION_QUOTA = 20  # unfinished turns per session (seed 000, 配额)
APP_QUOTA = 200  # unfinished turns per app
RETRY_AFTER_MS = 1000


class AppManifest(msgspec.Struct, frozen=True, kw_only=True):
    """A registered client identity (the seeds' "minitool"): what it may do and where it places
    sessions."""

    id: str
    platform: str = ""
    sessions: bool = True  # permissions.sessions
    containers: list[str] = []  # contributes.sessionContainers
    token: str | None = None


class CreateResult(msgspec.Struct, frozen=True, kw_only=True):
    session_id: str
    turn_id: str | None = None


class TurnResult(msgspec.Struct, frozen=True, kw_only=True):
    state: str  # completed | failed | timeout
    turn_id: str
    output_text: str | None = None
    code: str | None = None


class LoopEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One event of the app's feed (seed 000 event types). ``cursor`` is stable: pass the last one
    back as ``after`` to resume."""

    cursor: int
    session_id: str
    type: str
    at: int
    turn_id: str | None = None
    data: dict[str, Any] = {}


class EventsPage(msgspec.Struct, frozen=True, kw_only=True):
    events: list[LoopEvent]
    next_cursor: int | None = None


def feed_event(recorded: RecordedEvent) -> LoopEvent | None:
    """The seed-000 view of a stored event, or None for events bots do not see."""
    e, sid = recorded.event, recorded.stream[len("session-"):]
    base = {"cursor": recorded.position, "session_id": sid, "at": recorded.at}
    if isinstance(e, E.TurnStarted):
        return LoopEvent(type="turn.started", turn_id=e.turn_id, data={"source": e.source}, **base)
    if isinstance(e, E.LlmCompleted):
        if not e.text:
            return None
        return LoopEvent(type="assistant.message", turn_id=e.turn_id, data={"text": e.text, "model": e.model}, **base)
    if isinstance(e, E.ToolStarted):
        return LoopEvent(type="tool.started", turn_id=e.turn_id, data={"callId": e.call_id, "tool": e.tool}, **base)
    if isinstance(e, E.ToolFinished):
        return LoopEvent(type="tool.finished", turn_id=e.turn_id,
                         data={"callId": e.call_id, "status": e.status, "exitCode": e.exit_code}, **base)
    if isinstance(e, E.TurnCompleted):
        return LoopEvent(type="turn.completed", turn_id=e.turn_id,
                         data={"outputText": e.output_text, "outcome": e.outcome}, **base)
    if isinstance(e, E.TurnLimitReached):
        return LoopEvent(type="turn.completed", turn_id=e.turn_id,
                         data={"outputText": "", "outcome": "silent", "code": "tool-limit"}, **base)
    if isinstance(e, (E.TurnFailed, E.TurnAborted)):
        code = e.code if isinstance(e, E.TurnFailed) else "aborted"
        return LoopEvent(type="turn.failed", turn_id=e.turn_id, data={"code": code, "reason": e.reason}, **base)
    return None


class AppRegistry:
    def __init__(self) -> None:
        self._apps: dict[str, AppManifest] = {}
        self._lock = threading.Lock()

    def register(self, manifest: AppManifest) -> None:
        if not manifest.id or "\x00" in manifest.id:
            raise InvalidCommand("an app needs a non-empty id")
        with self._lock:
            self._apps[manifest.id] = manifest

    def get(self, app_id: str) -> AppManifest:
        found = self._apps.get(app_id)
        if found is None:
            raise NotFound(f"app {app_id!r} is not registered")
        return found


class Watchers:
    """``on_did_receive_event`` callbacks per app, fed from committed events (and live deltas)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_app: dict[str, dict[int, Callable[[LoopEvent], None]]] = {}
        self._next = 0

    def add(self, app_id: str, cb: Callable[[LoopEvent], None]) -> Callable[[], None]:
        with self._lock:
            self._next += 1
            key = self._next
            self._by_app.setdefault(app_id, {})[key] = cb

        def unsubscribe() -> None:
            with self._lock:
                self._by_app.get(app_id, {}).pop(key, None)

        return unsubscribe

    def any(self, app_id: str) -> bool:
        return bool(self._by_app.get(app_id))

    def emit(self, app_id: str, event: LoopEvent) -> None:
        for cb in list(self._by_app.get(app_id, {}).values()):
            try:
                cb(event)
            except Exception:  # a bot's callback must not fail the session that published
                import logging

                logging.getLogger("sessionloop.loop").exception("on_did_receive_event callback failed")


class SessionLoop:
    """One app's handle on its sessions (``host.sessions(app=...)``); thread-safe."""

    def __init__(self, host: Host, app: AppManifest) -> None:
        self.host = host
        self.rt = host.rt
        self.app = app
        if not app.sessions:
            raise Forbidden(f"app {app.id!r} lacks permissions.sessions in its manifest")

    # --- create -------------------------------------------------------------------------------

    def _plan_create(self, container_id: str | None, space: dict[str, Any] | None, title: str, activity: str,
                     permission_mode: str | None, initial_message: dict[str, Any] | None,
                     context: str | None) -> tuple[E.SessionCreated, E.InputAccepted | None, IdempotencyClaim | None]:
        from .host import new_id

        if (container_id is None) == (space is None):
            raise InvalidCommand("give exactly one placement: container_id or space={'spaceId': ...}, not both")
        if container_id is not None and container_id not in self.app.containers:
            raise InvalidCommand(f"container {container_id!r} is not declared in the manifest of app {self.app.id!r}")
        space_id = None
        if space is not None:
            space_id = space.get("spaceId", space.get("space_id")) if isinstance(space, dict) else None
            if not isinstance(space_id, str) or not space_id:
                raise InvalidCommand("space must be {'spaceId': '<id>'}")
        if activity not in ("interactive", "background"):
            raise InvalidCommand("activity must be 'interactive' or 'background'")
        if permission_mode not in (None, "ask", "acceptCalls", "deny"):
            raise InvalidCommand("permission_mode must be 'ask', 'acceptCalls' or 'deny'")
        parent = self._caller(context)
        mode = permission_mode or ("acceptCalls" if activity == "background" else "ask")
        kind = "task" if parent is not None else ("room" if container_id is not None else "owner")
        session_id = new_id()
        now = now_ms()
        created = E.SessionCreated(
            at=now, session_id=session_id, title=title, kind=kind, app_id=self.app.id,  # type: ignore[arg-type]
            platform=self.app.platform or None, instance=self.app.id if container_id is not None else None,
            container_id=container_id, space_id=space_id, activity=activity,  # type: ignore[arg-type]
            permission_mode=mode,  # type: ignore[arg-type]
            parent_id=parent.session_id if parent is not None else None,
            cwd=parent.created.cwd if parent is not None and parent.created is not None else "",
            model=parent.created.model if parent is not None and parent.created is not None else None,
        )
        if parent is not None and parent.created is not None and permission_mode is None:
            created = msgspec.structs.replace(created, permission_mode=parent.created.permission_mode)
        initial, claim = None, None
        if initial_message is not None:
            text, key = self._check_message(initial_message.get("text"), initial_message.get(
                "idempotency_key", initial_message.get("idempotencyKey")), [])
            initial = E.InputAccepted(at=now, input_id=new_id(), turn_id=new_id(), text=text, idempotency_key=key)
            body = {"text": text, "container": container_id, "space": space_id, "title": title, "activity": activity}
            claim = IdempotencyClaim(f"app:{self.app.id}:create", key, request_hash(body))
        return created, initial, claim

    def _caller(self, context: str | None) -> Any:
        if context is None:
            return None
        if context != "caller":
            raise InvalidCommand("context must be 'caller' (or omitted)")
        call = CURRENT_CALL.get()
        if call is None:
            raise InvalidCommand("context='caller' can only be used inside a tool's execution")
        return self.rt.ask(call.session_id, lambda r: Query(lambda a: a.state, r))

    def _check_message(self, text: Any, key: Any, attachments: list[Any]) -> tuple[str, str]:
        if not isinstance(key, str) or not key:
            raise InvalidCommand("idempotency_key is required (use a stable id from the external source)")
        if len(key) > MAX_KEY:
            raise InvalidCommand(f"idempotency_key is {len(key)} characters; at most {MAX_KEY}")
        if not isinstance(text, str):
            raise InvalidCommand("text must be a string")
        if len(text) > MAX_TEXT:
            raise InvalidCommand(f"text is {len(text)} characters; at most {MAX_TEXT}")
        if len(attachments) > MAX_ATTACHMENTS:
            raise InvalidCommand(f"{len(attachments)} attachments; at most {MAX_ATTACHMENTS}")
        total = 0
        for i, ref in enumerate(attachments):
            if ref.size > MAX_ATTACHMENT_BYTES:
                raise InvalidCommand(f"attachment {i} is {ref.size} bytes; at most 20 MB each")
            total += ref.size
        if total > MAX_ATTACHMENT_BYTES:
            raise InvalidCommand(f"attachments total {total} bytes; at most 20 MB together")
        return text, key

    def create(self, *, container_id: str | None = None, space: dict[str, Any] | None = None, title: str = "",
               activity: str = "interactive", permission_mode: str | None = None,
               initial_message: dict[str, Any] | None = None, context: str | None = None) -> CreateResult:
        """Create a session (seed 000). With ``initial_message`` its first input is accepted in the
        same commit: if anything fails, no session exists afterwards."""
        created, initial, claim = self._plan_create(container_id, space, title, activity, permission_mode,
                                                     initial_message, context)
        made = self.rt.ask(created.session_id, lambda r: Create(created, initial, r, claim))
        return CreateResult(session_id=made.session_id, turn_id=made.turn_id)

    async def acreate(self, **kwargs: Any) -> CreateResult:
        created, initial, claim = self._plan_create(
            kwargs.get("container_id"), kwargs.get("space"), kwargs.get("title", ""),
            kwargs.get("activity", "interactive"), kwargs.get("permission_mode"), kwargs.get("initial_message"),
            kwargs.get("context"))
        reply = Reply()
        self.rt.tell(created.session_id, Create(created, initial, reply, claim))
        made = await asyncio.wait_for(reply.future(), self.rt.options.request_timeout_s)
        return CreateResult(session_id=made.session_id, turn_id=made.turn_id)

    # --- send ---------------------------------------------------------------------------------

    def _owned(self, session_id: str) -> None:
        record = self._record(session_id)
        if record is None or record.app_id != self.app.id or record.deleted:
            raise NotFound(f"session {session_id} not found")

    def _record(self, session_id: str) -> Any:
        from .summary_records import decode_summary_record

        try:
            meta = self.rt.store.stream_meta(f"session-{session_id}")
        except Exception:
            return None
        return decode_summary_record(meta) if meta is not None else None

    def _send_message(self, session_id: str, text: str, idempotency_key: str, attachments: list[Any] | None,
                      reply: Reply) -> Send:
        from .host import new_id

        refs = list(attachments or [])
        text, key = self._check_message(text, idempotency_key, refs)
        self._owned(session_id)
        accepted = E.InputAccepted(at=now_ms(), input_id=new_id(), turn_id=new_id(), text=text, attachments=refs,
                                   idempotency_key=key, speaker=E.Speaker(platform=self.app.platform or self.app.id,
                                                                          app_id=self.app.id))
        body = {"text": text, "attachments": [r.sha256 for r in refs]}
        claim = IdempotencyClaim(f"app:{self.app.id}:{session_id}", key, request_hash(body))
        return Send(accepted, claim, reply, self._quota)

    def _quota(self, state: Any) -> Receipt | None:
        """Seed 000 配额: 20 unfinished turns per session, 200 per app -> ``rejected`` (not stored).

        Runs on the session's thread. The app's count is shared by all its sessions, so the slot
        is taken atomically here (``app_reserve``); the session's own accounting then counts the
        input as already there, and a failed or duplicate append gives the slot back."""
        rejected = Receipt(state="rejected", retry_after_ms=RETRY_AFTER_MS, epoch=self.rt.epoch)
        if state.unfinished_turns() >= SESSION_QUOTA:
            return rejected
        if not self.rt.app_reserve(self.app.id, APP_QUOTA):
            return rejected
        return None

    def send(self, session_id: str, text: str, idempotency_key: str, attachments: list[Any] | None = None) -> Receipt:
        """Queue ``text`` (strict FIFO per session). A repeated key returns the original receipt
        (``state='duplicate'``, same turn id); a repeated key with another body is a conflict."""
        reply = Reply()
        self.rt.tell(session_id, self._send_message(session_id, text, idempotency_key, attachments, reply))
        return reply.result(self.rt.options.request_timeout_s)  # type: ignore[no-any-return]

    async def asend(self, session_id: str, text: str, idempotency_key: str,
                    attachments: list[Any] | None = None) -> Receipt:
        reply = Reply()
        self.rt.tell(session_id, self._send_message(session_id, text, idempotency_key, attachments, reply))
        return await asyncio.wait_for(reply.future(), self.rt.options.request_timeout_s)  # type: ignore[no-any-return]

    # --- results ------------------------------------------------------------------------------

    @staticmethod
    def clamp_timeout_ms(timeout_ms: int | float | None) -> float:
        """Seed 000: default 60 s, clamped to 1-600 s; returned in seconds."""
        ms = 60_000 if timeout_ms is None else timeout_ms
        return min(600.0, max(1.0, ms / 1000))

    def _watch(self, session_id: str, turn_id: str) -> Reply:
        from .host import Session

        self._owned(session_id)
        reply = Reply()
        Session(self.host, session_id).watch_turn(turn_id, reply)
        return reply

    def wait_for_turn(self, session_id: str, turn_id: str, timeout_ms: int | float | None = 60_000) -> TurnResult:
        """The turn's exact final result; ``timeout`` ends only this wait, never the turn."""
        reply = self._watch(session_id, turn_id)
        try:
            outcome = reply.result(self.clamp_timeout_ms(timeout_ms))
        except RequestTimeout:
            self.rt.results.cancel_wait(turn_id, reply.set)
            return TurnResult(state="timeout", turn_id=turn_id)
        return _turn_result(outcome)

    async def await_turn(self, session_id: str, turn_id: str, timeout_ms: int | float | None = 60_000) -> TurnResult:
        reply = self._watch(session_id, turn_id)
        try:
            outcome = await asyncio.wait_for(reply.future(), self.clamp_timeout_ms(timeout_ms))
        except asyncio.TimeoutError:
            self.rt.results.cancel_wait(turn_id, reply.set)
            return TurnResult(state="timeout", turn_id=turn_id)
        return _turn_result(outcome)

    def on_did_receive_event(self, callback: Callable[[LoopEvent], None]) -> Callable[[], None]:
        """Call ``callback`` for every event of this app's sessions (``assistant.delta`` live
        only); returns the function that unsubscribes."""
        return self.host.loop_watchers.add(self.app.id, callback)

    def list_events(self, session_id: str | None = None, after: int | None = None, limit: int = 100) -> EventsPage:
        """History and reconnection only (seed 000: never sleep-and-poll this; use wait_for_turn).
        Retention: 7 days and 10,000 events per app."""
        if session_id is not None:
            self._owned(session_id)
        if not 1 <= limit <= 1000:
            raise InvalidCommand("limit must be between 1 and 1000")
        cursor = after or 0
        out: list[LoopEvent] = []
        while len(out) < limit:
            batch = self.rt.store.read_feed(self.app.id, cursor, limit * 2)
            if not batch:
                break
            for recorded in batch:
                cursor = recorded.position
                event = feed_event(recorded)
                if event is None or (session_id is not None and event.session_id != session_id):
                    continue
                out.append(event)
                if len(out) == limit:
                    break
        return EventsPage(events=out, next_cursor=out[-1].cursor if len(out) == limit else None)


class AsyncSessionLoop:
    """The same API for asyncio bots: ``await loop.send(...)``, ``await loop.wait_for_turn(...)``."""

    def __init__(self, sync: SessionLoop) -> None:
        self._sync = sync

    async def create(self, **kwargs: Any) -> CreateResult:
        return await self._sync.acreate(**kwargs)

    async def send(self, session_id: str, text: str, idempotency_key: str,
                   attachments: list[Any] | None = None) -> Receipt:
        return await self._sync.asend(session_id, text, idempotency_key, attachments)

    async def wait_for_turn(self, session_id: str, turn_id: str, timeout_ms: int | float | None = 60_000) -> TurnResult:
        return await self._sync.await_turn(session_id, turn_id, timeout_ms)

    def on_did_receive_event(self, callback: Callable[[LoopEvent], None]) -> Callable[[], None]:
        return self._sync.on_did_receive_event(callback)

    async def list_events(self, session_id: str | None = None, after: int | None = None, limit: int = 100) -> EventsPage:
        return await asyncio.get_running_loop().run_in_executor(
            None, lambda: self._sync.list_events(session_id, after, limit))


def _turn_result(outcome: TurnOutcome) -> TurnResult:
    if outcome.state == "completed":
        return TurnResult(state="completed", turn_id=outcome.turn_id, output_text=outcome.output_text,
                          code=outcome.code)
    return TurnResult(state="failed", turn_id=outcome.turn_id, code=outcome.code or "error")


# --- the spawn_session tool (SPEC §4: starts a child session with context='caller') ------------

MAX_SPAWN_DEPTH = 5


def spawn_session_spec() -> Any:
    """``spawn_session {task, title?, timeoutMs?}``: run ``task`` in a new background child session
    that inherits the caller's cwd, model and permission policy, and answer with its result."""
    from .tools import ToolSpec

    return ToolSpec(
        name="spawn_session",
        description="Run a task in a child session (background) and return its answer.",
        parameters={"type": "object", "required": ["task"], "properties": {
            "task": {"type": "string"}, "title": {"type": "string"}, "timeoutMs": {"type": "integer"}}},
        handler=_spawn,
        needs_approval=False,
    )


async def _spawn(args: dict[str, Any], ctx: Any) -> dict[str, Any]:
    from .host import Session
    from .tools import ToolError

    rt = ctx.extras["runtime"]
    host = rt.host
    call = CURRENT_CALL.get()
    if call is None:
        raise ToolError("spawn_session runs only as a tool call")
    reply = Reply()
    rt.tell(call.session_id, Query(lambda a: a.state, reply))
    parent = await reply.future()
    if _depth(rt, parent) >= MAX_SPAWN_DEPTH:
        raise ToolError(f"child sessions may nest at most {MAX_SPAWN_DEPTH} deep")
    created = parent.created
    key = f"spawn:{call.session_id}:{call.call_id}"
    timeout_ms = args.get("timeoutMs", 300_000)
    if created is not None and created.app_id is not None:
        loop = SessionLoop(host, host.apps.get(created.app_id))
        placement = {"container_id": created.container_id} if created.container_id else \
            {"space": {"spaceId": created.space_id or "default"}}
        made = await loop.acreate(**placement, title=args.get("title", ""), activity="background", context="caller",
                                  initial_message={"text": args["task"], "idempotency_key": key})
        result = await loop.await_turn(made.session_id, made.turn_id or "", timeout_ms)
    else:
        child = await _owner_child(rt, parent, args, key)
        outcome = await _await_outcome(host, child.session_id, child.turn_id, timeout_ms)
        made, result = child, outcome
    if result.state != "completed":
        return {"sessionId": made.session_id, "state": result.state, "code": result.code}
    return {"sessionId": made.session_id, "state": "completed", "outputText": result.output_text}


def _depth(rt: Any, state: Any) -> int:
    depth, parent_id = 0, state.created.parent_id if state.created is not None else None
    seen: set[str] = set()
    while parent_id is not None and parent_id not in seen and depth < MAX_SPAWN_DEPTH + 1:
        seen.add(parent_id)
        depth += 1
        meta = rt.store.stream_meta(f"session-{parent_id}")
        if meta is None:
            break
        from .summary_records import decode_summary_record

        parent_id = decode_summary_record(meta).parent_id
    return depth


async def _owner_child(rt: Any, parent: Any, args: dict[str, Any], key: str) -> Any:
    from .host import new_id

    created = parent.created
    now = now_ms()
    session_id = new_id()
    event = E.SessionCreated(at=now, session_id=session_id, title=args.get("title", ""), kind="task",
                             parent_id=parent.session_id, activity="background",
                             permission_mode=created.permission_mode if created is not None else "acceptCalls",
                             cwd=created.cwd if created is not None else "",
                             model=created.model if created is not None else None)
    initial = E.InputAccepted(at=now, input_id=new_id(), turn_id=new_id(), text=args["task"], idempotency_key=key)
    claim = IdempotencyClaim(f"owner:{parent.session_id}:spawn", key, request_hash({"task": args["task"]}))
    reply = Reply()
    rt.tell(session_id, Create(event, initial, reply, claim))
    return await reply.future()


async def _await_outcome(host: Any, session_id: str, turn_id: str, timeout_ms: int) -> TurnResult:
    from .host import Session

    reply = Reply()
    Session(host, session_id).watch_turn(turn_id, reply)
    try:
        outcome = await asyncio.wait_for(reply.future(), SessionLoop.clamp_timeout_ms(timeout_ms))
    except asyncio.TimeoutError:
        return TurnResult(state="timeout", turn_id=turn_id)
    return _turn_result(outcome)
