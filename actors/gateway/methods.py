"""The session protocol's methods (docs/protocol.md), each a translation into session actor messages.

Every handler is ``(conn, request_id, params) -> None`` and answers later through
``conn.result`` / ``conn.error``; it never waits. Work that reads many records or touches files
(listing, attachments, rewind) runs on the gateway's small thread pool, not on the gateway
actor's thread.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.errors import InvalidCommand, NotFound, SessionBusy
from sessionloop.actors.session import commands as C
from sessionloop.actors.session.messages import Ask, Cancel, Compact, Create, Decide, Send, Snapshot, Subscribe
from sessionloop.actors.session.rewind import rewind
from sessionloop.actors.session.tree import archive_tree, tree_of
from sessionloop.actors.settings.context import DEFAULT_WORKSPACE as DEFAULT_WORKSPACE_KEY
from sessionloop.actors.settings.context import DEFAULT_WORKSPACE_NAME
from sessionloop.actors.settings.texts import Text, message_of
from sessionloop.actors.system.blobs import kind_of, sniff_mime
from sessionloop.actors.system.ids import new_id
from sessionloop.actors.system.pubsub import Reply
from sessionloop.actors.views.summary import ListingRow, listing_key, summary_from_row
from sessionloop.actors.views.wire import wire_grant
from sessionloop.protocol.errors import RpcError
from sessionloop.protocol.frames import RequestId
from sessionloop.protocol.limits import MAX_ATTACHMENT_BYTES, MAX_ATTACHMENTS  # per attachment and in all
from sessionloop.protocol.listing import compute_room_groups, list_sessions
from sessionloop.protocol.peer import Peer
from sessionloop.protocol.schemas import (
    ApprovalRespondParams,
    BackgroundListResult,
    BackgroundOutputParams,
    BackgroundOutputResult,
    BatchFailure,
    Empty,
    GrantRevokeParams,
    GrantsListResult,
    HistoryParams,
    HistoryResult,
    OutgoingAttachment,
    PresenceParams,
    RewindResult,
    SessionBatchParams,
    SessionBatchResult,
    SessionCreateParams,
    SessionIdParams,
    SessionRenameParams,
    SessionResult,
    SessionsChanged,
    SessionsListParams,
    SessionsListResult,
    SubscribeResult,
    TaskIdParams,
    TurnAbortParams,
    TurnRewindParams,
    TurnSendParams,
)
from sessionloop.protocol.schemas_types import decode_data_url

if TYPE_CHECKING:
    from sessionloop.actors.gateway.service import SessionProtocolService

log = logging.getLogger("sessionloop.gateway")


class Client(Protocol):
    """What the method handlers need of a client connection (``service.ClientConnection``):
    who it is, what it sees, its subscriptions, and the frames it answers and is told with."""

    peer: Peer
    subscriptions: set[str]
    closed: bool
    tree_part: bool

    def result(self, request_id: RequestId, result: msgspec.Struct) -> None: ...

    def error(self, request_id: RequestId, error: BaseException) -> None: ...

    def notify(self, method: str, params: msgspec.Struct) -> None: ...

    def visible(self, record: Any) -> bool: ...

#: a method's handler: (connection, request id, the method's params Struct, decoded and
#: validated by the protocol layer) -> None; it answers later through ``conn.result``/``conn.error``
Handler = Callable[["Client", RequestId, Any], None]
EMPTY = Empty()
#: how long a worker waits for another to do its share of a tree operation (a delete stops work
#: and purges: several of the deletion's 15 s steps at worst)
TREE_PART_TIMEOUT_S = 60.0
#: recorded with an owner's session; its name is shown in the server's language (summary_records.place_name)
DEFAULT_WORKSPACE = E.PlaceRef(key=DEFAULT_WORKSPACE_KEY, kind="workspace", name=DEFAULT_WORKSPACE_NAME)


def answer(conn: Client, request_id: RequestId, convert: Callable[[Any], msgspec.Struct]) -> Reply:
    """A Reply whose completion answers the request (result converted, or the error)."""
    reply = Reply()

    def done(r: Reply) -> None:
        value, error = r.outcome()
        if error is not None:
            conn.error(request_id, _as_rpc(error))
            return
        try:
            conn.result(request_id, convert(value))
        except Exception as e:  # a conversion bug must still answer the request
            conn.error(request_id, e)

    reply.add_callback(done)
    return reply


def _as_rpc(error: BaseException) -> BaseException:
    if isinstance(error, InvalidCommand):
        return RpcError.invalid_params(message_of(error))  # a text object stays one
    return error


def in_background(svc: SessionProtocolService, conn: Client, request_id: RequestId,
                  work: Callable[[], msgspec.Struct]) -> None:
    def run() -> None:
        try:
            conn.result(request_id, work())
        except BaseException as e:
            conn.error(request_id, _as_rpc(e))

    (svc.parts if conn.tree_part else svc.slow).submit(run)


def _outcome_of(work: Callable[[], msgspec.Struct], done: Callable[[BaseException | None], None]) -> None:
    """Run ``work`` (on a pool thread) and tell ``done`` its error, or None."""
    try:
        work()
    except BaseException as e:
        done(e)
        return
    done(None)


def build_handlers(svc: SessionProtocolService) -> dict[str, Handler]:
    h = _Handlers(svc)
    return {
        "sessions/list": h.sessions_list,
        "sessions/watch": h.sessions_watch,
        "session/create": h.session_create,
        "session/rename": h.session_rename,
        "session/archive": lambda c, i, p: h.tree_op(c, i, p.session_id, "archive"),
        "session/unarchive": lambda c, i, p: h.tree_op(c, i, p.session_id, "unarchive"),
        "session/delete": lambda c, i, p: h.tree_op(c, i, p.session_id, "delete"),
        "session/batch": h.session_batch,
        "session/markSeen": h.mark_seen,
        "session/subscribe": h.subscribe,
        "session/unsubscribe": h.unsubscribe,
        "session/history": h.history,
        "turn/send": h.turn_send,
        "turn/continue": h.turn_continue,
        "turn/abort": h.turn_abort,
        "session/compress": h.compress,
        "turn/rewind": h.rewind,
        "plan/clear": h.plan_clear,
        "presence/update": h.presence,
        "approval/respond": h.approval_respond,
        "approval/grants/list": h.grants_list,
        "approval/grants/revoke": h.grants_revoke,
        "background/list": h.background_list,
        "background/watch": h.background_watch,
        "background/output": h.background_output,
        "background/stop": h.background_stop,
        "background/stopAll": h.background_stop_all,
    }


class _Handlers:
    def __init__(self, svc: SessionProtocolService) -> None:
        self.svc = svc
        self.rt = svc.rt
        self.index = svc.index

    # --- helpers ----------------------------------------------------------------------------

    def check(self, conn: Client, session_id: str) -> Any:
        """The listing record of a session this connection may see; NotFound otherwise (an app
        gets not-found, not forbidden, for another app's session: ids do not leak)."""
        record = self.index.get(session_id)
        if record is None or not conn.visible(record):
            raise NotFound(Text("error.session-not-found", session=session_id))
        return record

    def summary(self, session_id: str) -> Any:
        found = self.index.summaries_for([session_id])
        if not found:
            raise NotFound(Text("error.session-not-found", session=session_id))
        return found[0]

    def decide(self, conn: Client, request_id: RequestId, session_id: str, command: C.Command) -> None:
        """Tell the session ``command``; the request is answered (empty) after its commit."""
        self.check(conn, session_id)
        self.rt.tell(session_id, Decide(command, answer(conn, request_id, lambda _: EMPTY)))

    # --- listing -------------------------------------------------------------------------------

    def sessions_list(self, conn: Client, request_id: RequestId, params: SessionsListParams) -> None:
        def work() -> SessionsListResult:
            def terms(row: ListingRow) -> list[str]:
                record = row.record
                named = [t for t in (record.title, record.name) if t]
                # a room's window key (``platform:account:group:number``) answers ``platform:group``
                window = [row.place.key] if row.place is not None and row.place.kind == "window" else []
                return [row.id, *named, *window]  # default names do not match a search

            if params.parent_id is not None:
                self.check(conn, params.parent_id)
            return list_sessions(self.index.rows(conn.visible), params, search_terms=terms,
                                 group_label=self.rt.apps.group_label,
                                 materialize=summary_from_row, key=listing_key)

        in_background(self.svc, conn, request_id, work)

    def sessions_watch(self, conn: Client, request_id: RequestId, params: Empty) -> None:
        batcher = _ChangeBatcher(self, conn)
        self.index.watch(conn, batcher.add)
        conn.result(request_id, EMPTY)

    def changed(self, conn: Client, upserts: list[str], removes: list[str]) -> SessionsChanged:
        visible = [sid for sid in upserts if (rec := self.index.get(sid)) is not None and conn.visible(rec)]
        summaries = self.index.summaries_for(visible, conn.visible) if visible else []
        rooms = self.index.room_trees(conn.visible)
        return SessionsChanged(upserts=summaries, removes=removes,
                               groups=compute_room_groups(rooms, self.rt.apps.group_label))

    # --- session lifecycle -------------------------------------------------------------------------

    def session_create(self, conn: Client, request_id: RequestId, params: SessionCreateParams) -> None:
        if params.parent_id is not None:
            self.check(conn, params.parent_id)
        session_id = self.rt.new_session_id()
        speaker = E.Speaker(platform=conn.peer.platform, user_id=conn.peer.user_id, owner=conn.peer.is_owner)
        created = C.NewSession(
            name=params.name or "", kind="task" if params.parent_id else "owner",
            parent_id=params.parent_id, app_id=conn.peer.app_id, created_by=speaker,
            permission_mode=self.rt.options.permission_mode or "ask",
            # the summary's place: an owner's session lives in the default workspace
            place=None if params.parent_id else DEFAULT_WORKSPACE,
        )
        reply = answer(conn, request_id, lambda _: SessionResult(session=self.summary(session_id)))
        self.rt.tell(session_id, Create(created, None, reply))

    def session_rename(self, conn: Client, request_id: RequestId, params: SessionRenameParams) -> None:
        self.decide(conn, request_id, params.session_id, C.Rename(title=params.title))

    def tree_op(self, conn: Client, request_id: RequestId, session_id: str, op: str,
                done: Callable[[BaseException | None], None] | None = None) -> None:
        """archive / unarchive / delete a session and every session below it. Under ``serve
        --workers`` a tree can span workers (after N changed, a child's shard may be another
        worker's): this worker acts on its sessions of it and has each other worker act on its
        own (:meth:`_elsewhere`); a share-out that came from another worker acts here only."""
        self.check(conn, session_id)
        elsewhere = self._elsewhere(conn, f"session/{op}")

        def finished(error: BaseException | None) -> None:
            if done is not None:
                done(error)
            elif error is not None:
                conn.error(request_id, _as_rpc(error))
            else:
                conn.result(request_id, EMPTY)

        if op == "delete":
            def delete() -> msgspec.Struct:
                self.rt.deletions.delete_tree(session_id, self.index.descendants, elsewhere)
                return EMPTY

            in_background(self.svc, conn, request_id, delete)  # session/batch deletes by _delete_batch
            return
        archived = op == "archive"
        remote = [] if elsewhere is None else [sid for sid in tree_of(session_id, self.index.descendants)
                                               if not self.rt.owns(sid)]
        if not remote:
            archive_tree(self.rt, session_id, self._owned_below, archived, finished)
            return

        def across() -> msgspec.Struct:
            here = threading.Event()
            local: list[BaseException | None] = []

            def here_done(error: BaseException | None) -> None:
                local.append(error)
                here.set()

            archive_tree(self.rt, session_id, self._owned_below, archived, here_done)
            try:
                assert elsewhere is not None
                elsewhere(remote)
            finally:
                here.wait(self.rt.options.request_timeout_s)
            if not local:
                raise RpcError.unavailable(f"archiving session {session_id} took too long; retry", 1000)
            if local[0] is not None:
                raise local[0]
            return EMPTY

        self.svc.slow.submit(_outcome_of, across, finished)

    def _owned_below(self, session_id: str) -> list[str]:
        """The sessions below ``session_id`` that this process runs (all of them in one process)."""
        return [sid for sid in self.index.descendants(session_id) if self.rt.owns(sid)]

    def _elsewhere(self, conn: Client, method: str) -> Callable[[list[str]], None] | None:
        """How this worker has the other workers do ``method`` to their sessions of a tree, or None where
        nothing crosses (one process, or this request is another worker's share-out). The
        callable takes session ids in the order they are to be done (a delete: children first)
        and has each one's worker do it, one after another (blocks: call it on a pool thread);
        raises the first failure, naming the session."""
        relay = self.svc.relay
        if relay is None or conn.tree_part:
            return None
        owner = relay.placement.owner
        client = getattr(getattr(conn, "protocol", None), "client", None)

        def run(ids: list[str]) -> None:
            for sid in ids:
                relay.tree_part(owner(sid), conn.peer, client, method, sid, TREE_PART_TIMEOUT_S)

        return run

    def _delete_batch(self, conn: Client, ids: list[str]) -> SessionBatchResult:
        """``session/batch`` delete: each session with its children (``actors/session/deletion.py``), one
        after another on a pool thread. A session already deleted as the child of an earlier one
        of the batch is not a failure."""
        failures: list[BatchFailure] = []
        gone: set[str] = set()
        elsewhere = self._elsewhere(conn, "session/delete")
        for sid in dict.fromkeys(ids):
            if sid in gone:
                continue
            try:
                self.check(conn, sid)
                gone.update(self.rt.deletions.delete_tree(sid, self.index.descendants, elsewhere))
            except Exception as e:  # noqa: BLE001 - each id that failed is named with why
                failures.append(BatchFailure(session_id=sid, message=message_of(e)))
        return SessionBatchResult(failed=failures)

    def session_batch(self, conn: Client, request_id: RequestId, params: SessionBatchParams) -> None:
        failures: list[BatchFailure] = []
        left = {"n": len(params.ids)}
        if not params.ids:
            conn.result(request_id, SessionBatchResult(failed=[]))
            return
        if params.op == "delete":
            in_background(self.svc, conn, request_id, lambda: self._delete_batch(conn, list(params.ids)))
            return
        lock = threading.Lock()

        def one_done(session_id: str, error: BaseException | None) -> None:
            with lock:
                if error is not None:
                    failures.append(BatchFailure(session_id=session_id, message=message_of(error)))
                left["n"] -= 1
                last = left["n"] == 0
            if last:
                conn.result(request_id, SessionBatchResult(failed=failures))

        for sid in params.ids:
            try:
                self.tree_op(conn, request_id, sid, params.op, functools.partial(one_done, sid))
            except Exception as e:
                one_done(sid, e)

    def mark_seen(self, conn: Client, request_id: RequestId, params: SessionIdParams) -> None:
        self.decide(conn, request_id, params.session_id, C.MarkSeen())

    # --- subscription and history ------------------------------------------------------------------

    def subscribe(self, conn: Client, request_id: RequestId, params: SessionIdParams) -> None:
        session_id = params.session_id
        self.check(conn, session_id)
        summary = self.summary(session_id)
        svc = self.svc

        def result(snapshot: Snapshot) -> SubscribeResult:
            # on the session's thread, under its channel's lock: the reply goes before any push
            conn.subscriptions.add(session_id)
            return SubscribeResult(epoch=snapshot.epoch, seq=snapshot.seq, session=summary,
                                   items=[svc.decorate(session_id, it) for it in snapshot.items],
                                   approvals=self.rt.pending_approvals(session_id), before=snapshot.before)

        self.rt.tell(session_id, Subscribe(conn, answer(conn, request_id, result)))

    def unsubscribe(self, conn: Client, request_id: RequestId, params: SessionIdParams) -> None:
        self.check(conn, params.session_id)
        self.rt.channel(params.session_id).remove(conn)
        conn.subscriptions.discard(params.session_id)
        conn.result(request_id, EMPTY)

    def history(self, conn: Client, request_id: RequestId, params: HistoryParams) -> None:
        session_id = params.session_id
        self.check(conn, session_id)

        def page(found: tuple[list[Any], Any]) -> HistoryResult:
            items, before = found
            return HistoryResult(items=[self.svc.decorate(session_id, it) for it in items], before=before)

        self.rt.tell(session_id, Ask(C.HistoryPage(before=params.before, limit=params.limit),
                                     answer(conn, request_id, page)))

    # --- turns -------------------------------------------------------------------------------------

    def turn_send(self, conn: Client, request_id: RequestId, params: TurnSendParams) -> None:
        self.check(conn, params.session_id)
        if len(params.attachments) > MAX_ATTACHMENTS:
            raise RpcError.invalid_params(Text("error.too-many-attachments", field="params.attachments",
                                               max=MAX_ATTACHMENTS))
        if params.attachments:
            in_background(self.svc, conn, request_id, lambda: self._send_with_files(conn, request_id, params))
            return
        self._send(conn, request_id, params.session_id, params.text, [], traceparent=params.traceparent)

    def _send_with_files(self, conn: Client, request_id: RequestId, params: TurnSendParams) -> msgspec.Struct:
        refs = store_attachments(self.svc, params.attachments, params.session_id)
        reply = Reply()
        self.rt.tell(params.session_id, self._send_message(conn, params.session_id, params.text, refs, reply,
                                                           traceparent=params.traceparent))
        reply.result(self.rt.options.request_timeout_s)  # on the pool thread, not an actor's
        return EMPTY

    def _send(self, conn: Client, request_id: RequestId, session_id: str, text: str,
              refs: list[E.AttachmentRef], source: str | None = None, traceparent: str | None = None) -> None:
        reply = answer(conn, request_id, lambda _: EMPTY)
        self.rt.tell(session_id, self._send_message(conn, session_id, text, refs, reply, source, traceparent))

    def _send_message(self, conn: Client, session_id: str, text: str, refs: list[E.AttachmentRef],
                      reply: Reply, source: str | None = None, traceparent: str | None = None) -> Send:
        speaker = E.Speaker(platform=conn.peer.platform, user_id=conn.peer.user_id, owner=conn.peer.is_owner,
                            app_id=conn.peer.app_id)
        accepted = C.NewInput(input_id=new_id(), turn_id=new_id(), text=text, attachments=refs, speaker=speaker,
                              source=source, traceparent=traceparent)
        return Send(accepted, None, reply)

    def turn_continue(self, conn: Client, request_id: RequestId, params: SessionIdParams) -> None:
        self.check(conn, params.session_id)
        self._send(conn, request_id, params.session_id, "", [], source="continue")

    def turn_abort(self, conn: Client, request_id: RequestId, params: TurnAbortParams) -> None:
        self.check(conn, params.session_id)
        self.rt.tell(params.session_id, Cancel(params.turn_id, "stopped by the owner",
                                               answer(conn, request_id, lambda _: EMPTY)))

    def compress(self, conn: Client, request_id: RequestId, params: SessionIdParams) -> None:
        self.check(conn, params.session_id)
        reply = Reply()

        def done(r: Reply) -> None:
            _, error = r.outcome()
            if error is None:
                conn.result(request_id, EMPTY)
            elif isinstance(error, NotFound):
                conn.error(request_id, error)
            elif isinstance(error, SessionBusy):  # refused while a compaction (or a turn) runs
                conn.error(request_id, RpcError.internal_error(Text("error.compress-refused",
                                                                    error=message_of(error))))
            else:  # not compressed is internalError, the message says why (as the notice does)
                conn.error(request_id, RpcError.internal_error(Text("error.compress-failed",
                                                                    error=message_of(error))))

        reply.add_callback(done)
        self.rt.tell(params.session_id, Compact(reply))

    def rewind(self, conn: Client, request_id: RequestId, params: TurnRewindParams) -> None:
        self.check(conn, params.session_id)

        def work() -> RewindResult:
            result = rewind(self.rt, params.session_id, params.turn_id, params.scope)
            return RewindResult(turn_id=result["turnId"], restored=result["restored"], removed=result["removed"],
                                conflicts=result["conflicts"], deleted_messages=result.get("deletedMessages"),
                                chat_deleted=result.get("chatDeleted"))

        in_background(self.svc, conn, request_id, work)

    def plan_clear(self, conn: Client, request_id: RequestId, params: SessionIdParams) -> None:
        self.decide(conn, request_id, params.session_id, C.ClearPlan())

    # --- presence, approvals, background tasks -------------------------------------------------

    def presence(self, conn: Client, request_id: RequestId, params: PresenceParams) -> None:
        self.rt.approvals.update_presence(conn, params.active)
        conn.result(request_id, EMPTY)

    def approval_respond(self, conn: Client, request_id: RequestId, params: ApprovalRespondParams) -> None:
        self.rt.approvals.respond(conn, params.approval_id, params.decision, params.content_hash, params.note,
                                  answer(conn, request_id, lambda _: EMPTY), grant=params.grant)

    def grants_list(self, conn: Client, request_id: RequestId, params: SessionIdParams) -> None:
        """``approval/grants/list``: the session's grants that settle calls now (0.2.1)."""
        sid = params.session_id
        self.check(conn, sid)

        self.rt.tell(sid, Ask(C.ActiveGrants(), answer(
            conn, request_id, lambda grants: GrantsListResult(grants=[wire_grant(sid, g) for g in grants]))))

    def grants_revoke(self, conn: Client, request_id: RequestId, params: GrantRevokeParams) -> None:
        """``approval/grants/revoke``: the grant settles no more calls; who may answer approvals may
        revoke (the owner); not-found for a grant the session does not have or that already ended."""
        if not self.rt.approvals.eligible(conn):
            raise RpcError.forbidden(Text("error.grants-forbidden"))
        by = E.Speaker(platform=conn.peer.platform, user_id=conn.peer.user_id, owner=conn.peer.is_owner)

        self.decide(conn, request_id, params.session_id, C.RevokeGrant(grant_id=params.grant_id, by=by))

    def background_list(self, conn: Client, request_id: RequestId, params: Empty) -> None:
        def work() -> msgspec.Struct:
            tasks = [t for t in self.rt.tasks_service.listing() if self.rt.can_see(conn, t.session_id)]
            return BackgroundListResult(tasks=tasks)

        in_background(self.svc, conn, request_id, work)

    def background_watch(self, conn: Client, request_id: RequestId, params: Empty) -> None:
        self.rt.tasks_service.watch(conn)
        conn.result(request_id, EMPTY)

    def visible_task(self, conn: Client, task_id: str) -> Any:
        task = self.rt.tasks_service.get(task_id)
        if task is None or not self.rt.can_see(conn, task.session_id):
            raise NotFound(Text("error.task-not-found", task=task_id))
        return task

    def background_output(self, conn: Client, request_id: RequestId, params: BackgroundOutputParams) -> None:
        self.visible_task(conn, params.task_id)
        text, end, truncated = self.rt.tasks_service.output(params.task_id, params.after)
        conn.result(request_id, BackgroundOutputResult(text=text, end=end, truncated=truncated))

    def background_stop(self, conn: Client, request_id: RequestId, params: TaskIdParams) -> None:
        self.visible_task(conn, params.task_id)
        self.rt.tasks_service.stop(params.task_id, answer(conn, request_id, lambda _: EMPTY))

    def background_stop_all(self, conn: Client, request_id: RequestId, params: SessionIdParams) -> None:
        """Stop everything below a session: child sessions' turns and queued inputs, and
        the session's and its children's tasks; the session's own turn is turn/abort's business
        (but a share-out from another worker stops it too: there the session is below the root).
        Sessions below it that another worker runs are stopped by it (:meth:`_elsewhere`)."""
        self.check(conn, params.session_id)
        children = self.index.descendants(params.session_id)
        elsewhere = self._elsewhere(conn, "background/stopAll")
        stopped = [params.session_id, *children] if conn.tree_part else children
        here = [sid for sid in stopped if self.rt.owns(sid)]

        def work() -> msgspec.Struct:
            waits = []
            for sid in here:
                reply = Reply()
                self.rt.tell(sid, Cancel(None, "stopped with the background work of its parent", reply,
                                         drop_queue=True))
                waits.append(reply)
            waits += self.rt.tasks_service.stop_session([sid for sid in [params.session_id, *children]
                                                         if self.rt.owns(sid)])
            if elsewhere is not None:
                elsewhere([sid for sid in children if not self.rt.owns(sid)])
            for reply in waits:
                try:
                    reply.result(10)
                except NotFound:
                    pass
            return EMPTY

        in_background(self.svc, conn, request_id, work)


def store_attachments(svc: SessionProtocolService, attachments: list[OutgoingAttachment],
                      session_id: str) -> list[E.AttachmentRef]:
    """Decode, check and store outgoing attachments for ``session_id`` (base64 data URLs
    only; the type is sniffed from the bytes; at most 10, each and all together at most
    20 MB). Every one is checked before the first is stored."""
    refs: list[E.AttachmentRef] = []
    payloads: list[tuple[str, bytes]] = []
    total = 0
    for i, att in enumerate(attachments):
        decoded = decode_data_url(att.data)
        if decoded is None:
            raise RpcError.invalid_params(Text("error.not-data-url", field=f"params.attachments[{i}].data"))
        size = len(decoded.payload)
        total += size
        if size > MAX_ATTACHMENT_BYTES:
            raise RpcError.invalid_params(Text("error.attachment-too-large", field=f"params.attachments[{i}]",
                                               size=size))
        if total > MAX_ATTACHMENT_BYTES:
            raise RpcError.invalid_params(Text("error.attachments-too-large", field="params.attachments"))
        payloads.append((att.name, decoded.payload))
    for name, payload in payloads:
        mime = sniff_mime(payload)
        digest = svc.blobs.put(payload, session_id)
        refs.append(E.AttachmentRef(name=name, kind=kind_of(mime), mime=mime, size=len(payload), sha256=digest))
    return refs


class _ChangeBatcher:
    """Coalesces a connection's ``sessions/changed`` pushes to at most one per 50 ms: the protocol
    lets clients overwrite by id, so only the latest summary of each session matters."""

    def __init__(self, handlers: _Handlers, conn: Client) -> None:
        self.h = handlers
        self.conn = conn
        self.upserts: dict[str, None] = {}
        self.removes: dict[str, None] = {}
        self.scheduled = False
        self.lock = threading.Lock()

    def add(self, upserts: list[str], removes: list[str]) -> None:
        with self.lock:
            for sid in upserts:
                self.upserts[sid] = None
            for sid in removes:
                self.removes[sid] = None
                self.upserts.pop(sid, None)
            if self.scheduled:
                return
            self.scheduled = True
        self.h.rt.worker.later(0.05, lambda: self.h.svc.slow.submit(self.flush))

    def flush(self) -> None:
        with self.lock:
            upserts, removes = list(self.upserts), list(self.removes)
            self.upserts.clear()
            self.removes.clear()
            self.scheduled = False
        if self.conn.closed or (not upserts and not removes):
            return
        try:
            self.conn.notify("sessions/changed", self.h.changed(self.conn, upserts, removes))
        except Exception:
            log.exception("sessions/changed failed")
