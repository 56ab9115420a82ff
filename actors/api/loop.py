"""The Session Loop API for bots (docs/protocol.md, loop/*): create, send, wait_for_turn,
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
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.errors import CursorExpired, Forbidden, InvalidCommand, NotFound, RequestTimeout
from sessionloop.actors.session.commands import CallerOf, NewInput, NewSession, Quota
from sessionloop.actors.session.messages import Ask, Create, Receipt, Send, now_ms
from sessionloop.actors.session.queries import CallerFacts
from sessionloop.actors.settings.apps import AppManifest, clamp_mode
from sessionloop.actors.system.ids import new_id
from sessionloop.actors.system.ports import Commit
from sessionloop.actors.system.pubsub import LoopEvent, Reply, TurnOutcome, Watchers
from sessionloop.actors.tools.caller import CURRENT_CALL
from sessionloop.actors.views.traces import parse_traceparent
from sessionloop.eventstore import FeedCursorExpired, IdempotencyClaim, RecordedEvent, request_hash
from sessionloop.protocol.limits import (
    DEFAULT_WAIT_MS,
    LOOP_EVENTS_MAX_LIMIT,
    MAX_ATTACHMENT_BYTES,
    MAX_ATTACHMENTS,
    MAX_ID,
    MAX_IDEMPOTENCY_KEY,
    MAX_INT,
    MAX_NAME,
    MAX_PLACE_KEY,
    MAX_SPACE_ID,
    MAX_TEXT_CHARS,
    MAX_TITLE,
    MAX_TRACEPARENT,
    MAX_WAIT_MS,
    MIN_WAIT_MS,
    one_line,
)

if TYPE_CHECKING:
    from sessionloop.actors.api.host import Host

# the input bounds (MAX_*) are protocol.limits': one table for this API and the wire, where
# loop/* params are decoded with the same numbers before they get here
SESSION_QUOTA = 20  # unfinished turns per session
APP_QUOTA = 200  # unfinished turns per app
RETRY_AFTER_MS = 1000


class Room(msgspec.Struct, frozen=True, kw_only=True):
    """What a bot says of the room a session is (checked by :func:`_check_room`)."""

    chat: E.ChatInfo | None = None
    account: str | None = None
    place: E.PlaceRef | None = None


def _check_room(container_id: str | None, chat: Any, account: Any, place: Any) -> Room:
    """The room facts of ``create``, each checked naming the field; only a room has them."""
    if container_id is None:
        if chat is not None or account is not None or place is not None:
            raise InvalidCommand("chat, account and place describe a room: give them with container_id")
        return Room()
    info = None
    if chat is not None:
        given = _keys("chat", chat, ("type", "multiParty", "multi_party"))
        _string("chat.type", given.get("type"), limit=MAX_NAME)
        if not given.get("type"):
            raise InvalidCommand("chat.type is required (the platform's own name of the chat type)")
        multi = given.get("multiParty", given.get("multi_party", False))
        if not isinstance(multi, bool):
            raise InvalidCommand("chat.multiParty must be true or false")
        info = E.ChatInfo(type=given["type"], multi_party=multi)
    _string("account", account, optional=True, limit=MAX_NAME)
    where = None
    if place is not None:
        given = _keys("place", place, ("key", "name"))
        key = given.get("key")
        _string("place.key", key, limit=MAX_PLACE_KEY)
        if not key:
            raise InvalidCommand("place.key is required")
        _string("place.name", given.get("name", ""), limit=MAX_TITLE)
        where = E.PlaceRef(key=key, kind="window", name=given.get("name") or key)
    return Room(chat=info, account=account or None, place=where)


class LoopReceipt(Receipt, frozen=True, kw_only=True):
    """A send receipt with the cursors of that input. ``(epoch, seq)``: on the session
    protocol stream, the input's pushes are those of ``epoch`` with a seq above ``seq``.
    ``cursor``: ``list_events(after=cursor)`` starts right before the input's events (None for a
    rejected send, which wrote nothing)."""

    cursor: int | None = None


def loop_receipt(receipt: Receipt) -> LoopReceipt:
    return LoopReceipt(**msgspec.structs.asdict(receipt),
                       cursor=receipt.position - 1 if receipt.position else None)


def _string(field: str, value: Any, *, limit: int | None = None, optional: bool = False) -> Any:
    """``value`` if it is a string within ``limit`` characters; else InvalidCommand naming ``field``."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise InvalidCommand(f"{field} must be a string, not {type(value).__name__}")
    if limit is not None and len(value) > limit:
        raise InvalidCommand(f"{field} is {len(value)} characters; at most {limit}")
    return value


def _traceparent(value: Any) -> str | None:
    """A W3C traceparent (the caller's span, which the turn's span continues), or None."""
    _string("traceparent", value, limit=MAX_TRACEPARENT, optional=True)
    if value is not None and parse_traceparent(value) is None:
        raise InvalidCommand("traceparent is not a W3C traceparent (version-traceid-parentid-flags in lowercase "
                             "hex, e.g. 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01)")
    return value


def _keys(field: str, value: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidCommand(f"{field} must be a dict, not {type(value).__name__}")
    unknown = [k for k in value if k not in allowed]
    if unknown:
        raise InvalidCommand(f"{field} has unknown keys {unknown!r}; allowed: {', '.join(allowed)}")
    return value


def _either(field: str, value: dict[str, Any], snake: str, camel: str) -> Any:
    if snake in value and camel in value and value[snake] != value[camel]:
        raise InvalidCommand(f"{field}: {snake} and {camel} differ; give one")
    return value.get(snake, value.get(camel))


def _integer(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidCommand(f"{field} must be an integer, not {type(value).__name__}")
    return value


class CreateResult(msgspec.Struct, frozen=True, kw_only=True):
    session_id: str
    turn_id: str | None = None


class TurnResult(msgspec.Struct, frozen=True, kw_only=True):
    state: str  # completed | failed | timeout
    turn_id: str
    output_text: str | None = None
    code: str | None = None
    message: str | None = None  # a failed turn's reason, one line


class EventsPage(msgspec.Struct, frozen=True, kw_only=True):
    events: list[LoopEvent]
    next_cursor: int | None = None


class _EventBase(TypedDict):
    """What every event of the feed has besides its type, turn and data."""

    cursor: int
    session_id: str
    at: int


class LoopFeed:
    """A commit listener (``actors.system.ports``): the watchers of the committing session's app
    (``on_did_receive_event``, ``loop/watch``) hear its committed events as feed events; an answer
    taken in place has its ``assistant.delta`` events just before its outcome."""

    def __init__(self, watchers: Watchers) -> None:
        self.watchers = watchers

    def committed(self, commit: Commit) -> None:
        created = commit.state.created
        app = created.app_id if created is not None else None
        if app is None or not self.watchers.any(app):
            return
        live, result, stream = commit.loop_deltas, commit.result, commit.stream
        for i, event in enumerate(commit.events):
            if live is not None and isinstance(event, (E.LlmCompleted, E.LlmFailed)):
                for data in live.get(event.step_id, ()):
                    self.watchers.emit(app, LoopEvent(cursor=0, session_id=commit.session_id, type="assistant.delta",
                                                      at=now_ms(), turn_id=event.turn_id, data=data,
                                                      before=result.first_position + i))
            loop_event = feed_event(RecordedEvent(stream, result.first_version + i, result.first_position + i,
                                                  result.at, event))
            if loop_event is not None:
                self.watchers.emit(app, loop_event)


def feed_event(recorded: RecordedEvent) -> LoopEvent | None:
    """The feed's view of a stored event, or None for events bots do not see."""
    e, sid = recorded.event, recorded.stream[len("session-"):]
    base: _EventBase = {"cursor": recorded.position, "session_id": sid, "at": recorded.at}
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


def read_feed(store: Any, app: str, after: int, limit: int, *, strict: bool) -> list[RecordedEvent]:
    """``store.read_feed``, its FeedCursorExpired as the API's CursorExpired."""
    try:
        return store.read_feed(app, after, limit, strict=strict)
    except FeedCursorExpired as e:
        raise CursorExpired(e.after, e.oldest) from None


class SessionLoop:
    """One app's handle on its sessions (``host.sessions(app=...)``); thread-safe."""

    def __init__(self, host: Host, app: AppManifest) -> None:
        self.host = host
        self.rt = host.rt
        self.app = app
        if not app.sessions:
            raise Forbidden(f"app {app.id!r} lacks permissions.sessions in its manifest")
        #: the quota on every send: 20 unfinished turns per session, 200 per app -> ``rejected`` (not stored)
        self._quota = Quota(app_id=app.id, per_session=SESSION_QUOTA, per_app=APP_QUOTA, retry_after_ms=RETRY_AFTER_MS)

    # --- create -------------------------------------------------------------------------------

    def _check_create(self, container_id: Any, space: Any, title: Any, activity: Any, permission_mode: Any,
                      initial_message: Any, context: Any) -> tuple[str | None, str | None, tuple[str, str] | None]:
        """Every argument of ``create`` checked before anything is read or written; returns the
        space id and the initial message's ``(text, key)``."""
        _string("container_id", container_id, optional=True)
        if (container_id is None) == (space is None):
            raise InvalidCommand("give exactly one placement: container_id or space={'spaceId': ...}, not both")
        if container_id is not None and container_id not in self.app.containers:
            raise InvalidCommand(f"container {container_id!r} is not declared in the manifest of app {self.app.id!r}")
        space_id = None
        if space is not None:
            placed = _keys("space", space, ("spaceId", "space_id"))
            space_id = _either("space", placed, "space_id", "spaceId")
            if not isinstance(space_id, str) or not space_id:
                raise InvalidCommand("space must be {'spaceId': '<id>'}")
            _string("space.spaceId", space_id, limit=MAX_SPACE_ID)
        _string("title", title, limit=MAX_TITLE)
        if not isinstance(activity, str) or activity not in ("interactive", "background"):
            raise InvalidCommand("activity must be 'interactive' or 'background'")
        if permission_mode is not None and (not isinstance(permission_mode, str)
                                            or permission_mode not in ("ask", "acceptCalls", "deny")):
            raise InvalidCommand("permission_mode must be 'ask', 'acceptCalls' or 'deny'")
        if context is not None and context != "caller":
            raise InvalidCommand("context must be 'caller' (or omitted)")
        message = None
        if initial_message is not None:
            given = _keys("initial_message", initial_message, ("text", "idempotency_key", "idempotencyKey"))
            message = self._check_message(given.get("text"), _either(
                "initial_message", given, "idempotency_key", "idempotencyKey"), [], "initial_message.")
        return container_id, space_id, message

    def _plan_create(self, container_id: str | None, space_id: str | None, title: str, activity: str,
                     permission_mode: str | None, message: tuple[str, str] | None,
                     caller: CallerFacts | None, room: Room) -> tuple[str, NewSession, NewInput | None,
                                                                      IdempotencyClaim | None]:

        if permission_mode is not None and not self.app.allows_mode(permission_mode):
            raise Forbidden(f"app {self.app.id!r} may not create sessions in permission mode {permission_mode!r}: "
                            f"its manifest allows {', '.join(self.app.permission_modes)}")
        # a default (the caller's, or the activity's) within the manifest: never above it (actors.settings.apps)
        mode = permission_mode or clamp_mode(caller.permission_mode if caller is not None else
                                             "acceptCalls" if activity == "background" else "ask", self.app)
        kind = "task" if caller is not None else ("room" if container_id is not None else "owner")
        session_id = self.rt.new_session_id()
        created = NewSession(
            title=title, kind=kind, app_id=self.app.id,  # type: ignore[arg-type]
            platform=self.app.platform or None, instance=self.app.id if container_id is not None else None,
            container_id=container_id, space_id=space_id, activity=activity,  # type: ignore[arg-type]
            permission_mode=mode,  # type: ignore[arg-type]
            parent_id=caller.created.session_id if caller is not None else None,
            cwd=caller.cwd if caller is not None else "",
            model=caller.model if caller is not None else None,
            chat=room.chat, account=room.account, place=room.place,
        )
        initial, claim = None, None
        if message is not None:
            text, key = message
            initial = NewInput(input_id=new_id(), turn_id=new_id(), text=text, idempotency_key=key)
            body = {"text": text, "container": container_id, "space": space_id, "title": title, "activity": activity}
            claim = IdempotencyClaim(f"app:{self.app.id}:create", key, request_hash(body))
        return session_id, created, initial, claim

    @staticmethod
    def _calling_session(context: str | None) -> str | None:
        """The session whose tool is running now, for ``context='caller'``; else an error."""
        if context is None:
            return None
        call = CURRENT_CALL.get()
        if call is None:
            raise InvalidCommand("context='caller' can only be used inside a tool's execution")
        return call.session_id

    def _check_message(self, text: Any, key: Any, attachments: list[Any], where: str = "") -> tuple[str, str]:
        if key is None or key == "":
            raise InvalidCommand(f"{where}idempotency_key is required (use a stable id from the external source)")
        _string(f"{where}idempotency_key", key, limit=MAX_IDEMPOTENCY_KEY)
        _string(f"{where}text", text, limit=MAX_TEXT_CHARS)
        if len(attachments) > MAX_ATTACHMENTS:
            raise InvalidCommand(f"{len(attachments)} attachments; at most {MAX_ATTACHMENTS}")
        total = 0
        for i, ref in enumerate(attachments):
            if not isinstance(ref, E.AttachmentRef):
                raise InvalidCommand(f"attachments[{i}] must be an AttachmentRef, not {type(ref).__name__}")
            if ref.size > MAX_ATTACHMENT_BYTES:
                raise InvalidCommand(f"attachment {i} is {ref.size} bytes; at most 20 MB each")
            total += ref.size
        if total > MAX_ATTACHMENT_BYTES:
            raise InvalidCommand(f"attachments total {total} bytes; at most 20 MB together")
        return text, key

    def create(self, *, container_id: str | None = None, space: dict[str, Any] | None = None, title: str = "",
               activity: str = "interactive", permission_mode: str | None = None,
               initial_message: dict[str, Any] | None = None, context: str | None = None,
               chat: dict[str, Any] | None = None, account: str | None = None,
               place: dict[str, Any] | None = None) -> CreateResult:
        """Create a session. With ``initial_message`` its first input is accepted in the
        same commit: if anything fails, no session exists afterwards. With ``context='caller'``
        (only inside a tool's execution) it is a child of the calling session and works in its
        directory with its model and permission policy. A room (``container_id``) may say what
        it is: ``chat={"type": "group", "multiParty": True}``, the bot's ``account`` in it, and
        its window ``place={"key": "im:bot1:group:20001", "name": "Team"}``."""
        container_id, space_id, message = self._check_create(container_id, space, title, activity,
                                                              permission_mode, initial_message, context)
        room = _check_room(container_id, chat, account, place)
        calling = self._calling_session(context)
        caller = self.rt.ask(calling, lambda r: Ask(CallerOf(), r)) if calling is not None else None
        session_id, created, initial, claim = self._plan_create(container_id, space_id, title, activity,
                                                                permission_mode, message, caller, room)
        made = self.rt.ask(session_id, lambda r: Create(created, initial, r, claim))
        return CreateResult(session_id=made.session_id, turn_id=made.turn_id)

    async def acreate(self, *, container_id: str | None = None, space: dict[str, Any] | None = None,
                      title: str = "", activity: str = "interactive", permission_mode: str | None = None,
                      initial_message: dict[str, Any] | None = None, context: str | None = None,
                      chat: dict[str, Any] | None = None, account: str | None = None,
                      place: dict[str, Any] | None = None) -> CreateResult:
        container_id, space_id, message = self._check_create(container_id, space, title, activity,
                                                              permission_mode, initial_message, context)
        room = _check_room(container_id, chat, account, place)
        calling = self._calling_session(context)
        caller = None
        if calling is not None:  # asked without blocking the loop the calling tool runs on
            asked = Reply()
            self.rt.tell(calling, Ask(CallerOf(), asked))
            caller = await asyncio.wait_for(asked.future(), self.rt.options.request_timeout_s)
        session_id, created, initial, claim = self._plan_create(container_id, space_id, title, activity,
                                                                permission_mode, message, caller, room)
        reply = Reply()
        self.rt.tell(session_id, Create(created, initial, reply, claim))
        made = await asyncio.wait_for(reply.future(), self.rt.options.request_timeout_s)
        return CreateResult(session_id=made.session_id, turn_id=made.turn_id)

    # --- send ---------------------------------------------------------------------------------

    def _owned(self, session_id: Any) -> None:
        _string("session_id", session_id)
        if not session_id or len(session_id) > MAX_ID:
            raise NotFound(f"session {session_id[:64]!r} not found")
        record = self._record(session_id)
        if record is None or record.app_id != self.app.id or record.deleted:
            raise NotFound(f"session {session_id} not found")

    def _record(self, session_id: str) -> Any:
        """The session's listing record from the host's in-memory index (kept current by every
        commit before its reply: a session a create answered is there), not a read of the store."""
        return self.host.index.get(session_id)

    def _send_message(self, session_id: str, text: str, idempotency_key: str, attachments: list[Any] | None,
                      reply: Reply, traceparent: str | None = None) -> Send:

        if attachments is not None and not isinstance(attachments, (list, tuple)):
            raise InvalidCommand(f"attachments must be a list, not {type(attachments).__name__}")
        refs = list(attachments or [])
        text, key = self._check_message(text, idempotency_key, refs)
        traceparent = _traceparent(traceparent)
        self._owned(session_id)
        accepted = NewInput(input_id=new_id(), turn_id=new_id(), text=text, attachments=refs, idempotency_key=key,
                              speaker=E.Speaker(platform=self.app.platform or self.app.id, app_id=self.app.id),
                              traceparent=traceparent)
        # the traceparent is not part of the body: a retry from a new span of the sender's is
        # the same message (a duplicate, with the first send's trace), not a conflict
        body = {"text": text, "attachments": [r.sha256 for r in refs]}
        claim = IdempotencyClaim(f"app:{self.app.id}:{session_id}", key, request_hash(body))
        return Send(accepted, claim, reply, self._quota)

    def send(self, session_id: str, text: str, idempotency_key: str,
             attachments: list[Any] | None = None, *, traceparent: str | None = None) -> LoopReceipt:
        """Queue ``text`` (strict FIFO per session). A repeated key returns the original receipt
        (``state='duplicate'``, same turn id); a repeated key with another body is a conflict.
        ``traceparent`` (W3C): the turn's span is a child of that span (``serve --otlp-endpoint``)."""
        reply = Reply()
        self.rt.tell(session_id, self._send_message(session_id, text, idempotency_key, attachments, reply,
                                                    traceparent))
        return loop_receipt(reply.result(self.rt.options.request_timeout_s))

    async def asend(self, session_id: str, text: str, idempotency_key: str,
                    attachments: list[Any] | None = None, *, traceparent: str | None = None) -> LoopReceipt:
        reply = Reply()
        self.rt.tell(session_id, self._send_message(session_id, text, idempotency_key, attachments, reply,
                                                    traceparent))
        return loop_receipt(await asyncio.wait_for(reply.future(), self.rt.options.request_timeout_s))

    # --- results ------------------------------------------------------------------------------

    @staticmethod
    def clamp_timeout_ms(timeout_ms: int | float | None) -> float:
        """Default 60 s, clamped to 1-600 s; returned in seconds. Any int or float
        but NaN is clamped: it is compared in milliseconds and never converted to a float
        before, so an integer beyond float range (``10**310``) clamps to 600 s instead of
        overflowing."""
        if timeout_ms is not None and (isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float))
                                       or (isinstance(timeout_ms, float) and math.isnan(timeout_ms))):
            raise InvalidCommand(f"timeout_ms must be a number of milliseconds, not {timeout_ms!r:.40}")
        ms = DEFAULT_WAIT_MS if timeout_ms is None else min(MAX_WAIT_MS, max(MIN_WAIT_MS, timeout_ms))
        return ms / 1000

    def _watch(self, session_id: str, turn_id: str) -> Reply:
        self._owned(session_id)
        _string("turn_id", turn_id)
        if not turn_id or len(turn_id) > MAX_ID:  # no turn has such an id
            raise NotFound(f"turn {turn_id[:64]!r} not found in session {session_id}")
        reply = Reply()
        self.host.session(session_id).watch_turn(turn_id, reply)
        return reply

    def wait_for_turn(self, session_id: str, turn_id: str, timeout_ms: int | float | None = 60_000) -> TurnResult:
        """The turn's exact final result; ``timeout`` ends only this wait, never the turn."""
        timeout = self.clamp_timeout_ms(timeout_ms)  # a bad timeout is refused before the wait starts
        reply = self._watch(session_id, turn_id)
        try:
            outcome = reply.result(timeout)
        except RequestTimeout:
            return TurnResult(state="timeout", turn_id=turn_id)
        finally:  # after a timeout or an unknown turn no waiter stays behind
            self.rt.results.cancel_wait(turn_id, reply.set)
        return turn_result(outcome)

    async def await_turn(self, session_id: str, turn_id: str, timeout_ms: int | float | None = 60_000) -> TurnResult:
        timeout = self.clamp_timeout_ms(timeout_ms)
        reply = self._watch(session_id, turn_id)
        try:
            outcome = await asyncio.wait_for(reply.future(), timeout)
        except TimeoutError:
            return TurnResult(state="timeout", turn_id=turn_id)
        finally:
            self.rt.results.cancel_wait(turn_id, reply.set)
        return turn_result(outcome)

    def on_did_receive_event(self, callback: Callable[[LoopEvent], None]) -> Callable[[], None]:
        """Call ``callback`` for every event of this app's sessions (``assistant.delta`` live
        only); returns the function that unsubscribes."""
        if not callable(callback):
            raise InvalidCommand(f"callback must be callable, not {type(callback).__name__}")
        return self.host.loop_watchers.add(self.app.id, callback)

    def list_events(self, session_id: str | None = None, after: int | None = None, limit: int = 100) -> EventsPage:
        """History and reconnection only (never sleep-and-poll this; use wait_for_turn).
        Retention: 7 days and 10,000 events per app. ``after`` is an event's ``cursor`` or a
        receipt's ``cursor`` (the events of that input on); None or 0 reads from the oldest retained.
        A cursor retention already passed raises CursorExpired (with the oldest cursor that
        reads without a gap), never a page with a hole in it."""
        if after is not None and not 0 <= _integer("after", after) <= MAX_INT:
            raise InvalidCommand("after must be a cursor (an integer from 0 to 2**63 - 1)")
        if not 1 <= _integer("limit", limit) <= LOOP_EVENTS_MAX_LIMIT:
            raise InvalidCommand(f"limit must be between 1 and {LOOP_EVENTS_MAX_LIMIT}")
        if session_id is not None:
            self._owned(session_id)
        cursor = after or 0
        out: list[LoopEvent] = []
        while len(out) < limit:
            batch = read_feed(self.rt.store, self.app.id, cursor, limit * 2, strict=bool(after))
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

    async def create(self, *, container_id: str | None = None, space: dict[str, Any] | None = None,
                     title: str = "", activity: str = "interactive", permission_mode: str | None = None,
                     initial_message: dict[str, Any] | None = None, context: str | None = None,
                     chat: dict[str, Any] | None = None, account: str | None = None,
                     place: dict[str, Any] | None = None) -> CreateResult:
        return await self._sync.acreate(container_id=container_id, space=space, title=title, activity=activity,
                                        permission_mode=permission_mode, initial_message=initial_message,
                                        context=context, chat=chat, account=account, place=place)

    async def send(self, session_id: str, text: str, idempotency_key: str,
                   attachments: list[Any] | None = None, *, traceparent: str | None = None) -> LoopReceipt:
        return await self._sync.asend(session_id, text, idempotency_key, attachments, traceparent=traceparent)

    async def wait_for_turn(self, session_id: str, turn_id: str, timeout_ms: int | float | None = 60_000) -> TurnResult:
        return await self._sync.await_turn(session_id, turn_id, timeout_ms)

    def on_did_receive_event(self, callback: Callable[[LoopEvent], None]) -> Callable[[], None]:
        return self._sync.on_did_receive_event(callback)

    async def list_events(
        self, session_id: str | None = None, after: int | None = None, limit: int = 100
    ) -> EventsPage:
        return await asyncio.get_running_loop().run_in_executor(
            None, lambda: self._sync.list_events(session_id, after, limit))


def turn_result(outcome: TurnOutcome) -> TurnResult:
    if outcome.state == "completed":
        return TurnResult(state="completed", turn_id=outcome.turn_id, output_text=outcome.output_text,
                          code=outcome.code)
    return TurnResult(state="failed", turn_id=outcome.turn_id, code=outcome.code or "error",
                      message=one_line(outcome.reason or outcome.code or "error"))
