"""The ``spawn_session`` tool: an agent starts a child session with ``context='caller'`` (it
inherits the caller's workspace directory, model and permission policy) and gets the child's answer.

A child of a bot's session is made through that app's Session Loop API (so its quota, its feed
and its manifest bound it); a child of an owner's session is created directly, idempotent per tool
call (a retried call finds the child it made). Children nest at most ``MAX_SPAWN_DEPTH`` deep; the
task and title a model gives get the bounds a client's fields get (the model may be an attacker).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from sessionloop.actors import events as E
from sessionloop.actors.api.loop import SessionLoop, TurnResult, turn_result
from sessionloop.actors.session.commands import CallerOf, NewInput, NewSession
from sessionloop.actors.session.messages import Ask, Create
from sessionloop.actors.session.queries import CallerFacts
from sessionloop.actors.system.ids import new_id
from sessionloop.actors.system.pubsub import Reply
from sessionloop.actors.tools import ToolError, ToolSpec
from sessionloop.actors.tools.caller import CURRENT_CALL
from sessionloop.actors.views.summary import decode_summary_record
from sessionloop.eventstore import IdempotencyClaim, request_hash
from sessionloop.protocol.limits import MAX_TEXT_CHARS, MAX_TITLE

if TYPE_CHECKING:
    from sessionloop.actors.api.host import Host

MAX_SPAWN_DEPTH = 5


def spawn_session_spec(host: Host) -> Any:
    """``spawn_session {task, title?, timeoutMs?}``: run ``task`` in a new background child session
    of ``host`` that inherits the caller's cwd, model and permission policy, and answer with its result."""

    async def spawn(args: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return await _spawn(host, args, ctx)

    return ToolSpec(
        name="spawn_session",
        description="Run a task in a child session (background) and return its answer.",
        parameters={"type": "object", "required": ["task"], "properties": {
            "task": {"type": "string"}, "title": {"type": "string"}, "timeoutMs": {"type": "integer"}}},
        handler=spawn,
        needs_approval=False,
    )


async def _spawn(host: Host, args: dict[str, Any], ctx: Any) -> dict[str, Any]:
    rt = host.rt
    call = CURRENT_CALL.get()
    if call is None:
        raise ToolError("spawn_session runs only as a tool call")
    # the model may be an attacker: its arguments get the bounds a client's get
    for field, limit in (("task", MAX_TEXT_CHARS), ("title", MAX_TITLE)):
        if len(args.get(field, "")) > limit:
            raise ToolError(f"field '{field}' is {len(args[field])} characters; at most {limit}")
    reply = Reply()
    rt.tell(call.session_id, Ask(CallerOf(), reply))
    parent: CallerFacts = await reply.future()
    if _depth(rt, parent.created) >= MAX_SPAWN_DEPTH:
        raise ToolError(f"child sessions may nest at most {MAX_SPAWN_DEPTH} deep")
    created = parent.created
    key = f"spawn:{call.session_id}:{call.call_id}"
    timeout_ms = args.get("timeoutMs", 300_000)
    if created.app_id is not None:
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


def _depth(rt: Any, created: E.SessionCreated) -> int:
    depth, parent_id = 0, created.parent_id
    seen: set[str] = set()
    while parent_id is not None and parent_id not in seen and depth < MAX_SPAWN_DEPTH + 1:
        seen.add(parent_id)
        depth += 1
        meta = rt.store.stream_meta(f"session-{parent_id}")
        if meta is None:
            break

        parent_id = decode_summary_record(meta).parent_id
    return depth


async def _owner_child(rt: Any, parent: CallerFacts, args: dict[str, Any], key: str) -> Any:
    """A child of an owner session: in the parent's directory, with its model and policy."""

    parent_id = parent.created.session_id
    session_id = rt.new_session_id()
    new = NewSession(title=args.get("title", ""), kind="task", parent_id=parent_id, activity="background",
                     permission_mode=parent.permission_mode,  # type: ignore[arg-type]
                     cwd=parent.cwd, model=parent.model)
    initial = NewInput(input_id=new_id(), turn_id=new_id(), text=args["task"], idempotency_key=key)
    claim = IdempotencyClaim(f"owner:{parent_id}:spawn", key, request_hash({"task": args["task"]}))
    reply = Reply()
    rt.tell(session_id, Create(new, initial, reply, claim))
    return await reply.future()


async def _await_outcome(host: Any, session_id: str, turn_id: str, timeout_ms: int) -> TurnResult:
    reply = Reply()
    host.session(session_id).watch_turn(turn_id, reply)
    try:
        outcome = await asyncio.wait_for(reply.future(), SessionLoop.clamp_timeout_ms(timeout_ms))
    except TimeoutError:
        return TurnResult(state="timeout", turn_id=turn_id)
    return turn_result(outcome)
