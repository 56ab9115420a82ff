"""The session protocol, sans I/O (docs/protocol.md): frames, schemas, handshake, connections.

Nothing here opens a socket, starts a thread, reads a clock or imports an actor: the transport
feeds received text to a :class:`Connection` and carries out what it returns (frames to send,
requests to dispatch to the gateway, a close), and the gateway answers through the same object.
Peer errors come back as error frames; only our own misuse raises (:class:`ProtocolMisuse`).

Modules: :mod:`~protocol.errors` (codes, :class:`RpcError`), :mod:`~protocol.frames` (two-stage
decode, frame builders), :mod:`~protocol.schemas` (+ ``schemas_types``, ``schemas_loop``: every
params/result/notification Struct and the ``METHODS`` / ``NOTIFICATIONS`` registry),
:mod:`~protocol.handshake` (version rule), :mod:`~protocol.connection` (the state machine),
:mod:`~protocol.listing` (``sessions/list`` rules, tree fields), :mod:`~protocol.file_handles`
(HMAC handles), :mod:`~protocol.sanitize` (``sanitize_for_card``).
"""

from __future__ import annotations

from sessionloop.protocol.connection import (
    CLOSE_GOING_AWAY,
    CLOSE_UNSUPPORTED_VERSION,
    Close,
    Connection,
    Dispatch,
    Limits,
    Output,
    Send,
    ServerInfo,
    State,
    TokenBucket,
    truncate_close_reason,
)
from sessionloop.protocol.errors import ProtocolMisuse, RpcError, from_domain_error
from sessionloop.protocol.file_handles import derive_epoch_key, issue, new_epoch_key, resolve
from sessionloop.protocol.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    decode_params,
    decode_request,
    error_frame,
    notification_frame,
    result_frame,
)
from sessionloop.protocol.handshake import SESSION_PROTOCOL_VERSION, negotiate
from sessionloop.protocol.listing import (
    SessionNode,
    TreeFields,
    apply_tree_fields,
    completed_unread,
    compute_room_groups,
    compute_tree_fields,
    list_sessions,
    with_ancestors,
)
from sessionloop.protocol.registry import METHODS, NOTIFICATIONS, MethodSpec
from sessionloop.protocol.sanitize import sanitize_for_card

__all__ = [
    "CLOSE_GOING_AWAY",
    "CLOSE_UNSUPPORTED_VERSION",
    "DEFAULT_MAX_FRAME_BYTES",
    "METHODS",
    "NOTIFICATIONS",
    "SESSION_PROTOCOL_VERSION",
    "Close",
    "Connection",
    "Dispatch",
    "Limits",
    "MethodSpec",
    "Output",
    "ProtocolMisuse",
    "RpcError",
    "Send",
    "ServerInfo",
    "SessionNode",
    "State",
    "TokenBucket",
    "TreeFields",
    "apply_tree_fields",
    "completed_unread",
    "compute_room_groups",
    "compute_tree_fields",
    "decode_params",
    "decode_request",
    "derive_epoch_key",
    "error_frame",
    "from_domain_error",
    "issue",
    "list_sessions",
    "negotiate",
    "new_epoch_key",
    "notification_frame",
    "resolve",
    "result_frame",
    "sanitize_for_card",
    "truncate_close_reason",
    "with_ancestors",
]
