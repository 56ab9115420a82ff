"""A delete killed by SIGKILL leaves each session either whole or gone (seed 004 session/delete,
actors/session/deletion.py "Crash safety"): the crash points ``purge`` (inside a session's purge
transaction, its records deleted, nothing committed) and ``after-purge`` (the purge committed,
its attachments and workspace not yet deleted).

A real ``sessionloop serve`` that SIGKILLs itself at the point, restarted on the same data
directory; the store is audited (``EventStore.audit``: every index agrees with the log) and the
data directory's files are looked at. A tree is purged children first, so a crash between two
purges leaves the root with fewer children, never a child whose parent is gone.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import signal
from typing import Any

import msgspec
import pytest
from websockets.exceptions import ConnectionClosed

from sessionloop.actors import events as E
from sessionloop.actors.events import open_store
from tests.e2e.conftest import Client, ServerProcess, initialized, open_client
from tests.reliability.harness import SERVE_ARGS, _check_stream

pytestmark = pytest.mark.e2e

SECRET = "kept until the purge commits 91c2"


class Tree(msgspec.Struct):
    root: str
    child: str
    root_blob: str
    child_blob: str


def serve(data: str, crash_at: str | None = None) -> ServerProcess:
    return ServerProcess(data, *SERVE_ARGS, env={"SESSIONLOOP_CRASH_AT": crash_at} if crash_at else None).start()


async def _session_with_files(c: Client, sid: str, text: str) -> str:
    """Turns with ``text``, an attachment and a file written to the workspace; the blob's id."""
    payload = f"attachment of {sid}: {SECRET}".encode()
    url = "data:application/octet-stream;base64," + base64.b64encode(payload).decode()
    await c.result("session/subscribe", {"sessionId": sid})
    reply = await c.call("session/config/update", {"sessionId": sid, "plugin": "tools", "key": "permissionMode",
                                                   "value": "acceptCalls"})
    assert "result" in reply, reply
    await c.result("turn/send", {"sessionId": sid, "content": text, "attachments": [{"data": url, "name": "a.bin"}]})
    await c.turn_done(sid)
    write = json.dumps({"path": "notes.txt", "content": text})
    await c.result("turn/send", {"sessionId": sid, "content": f"!tool write_file {write}"})
    await c.turn_done(sid)
    return hashlib.sha256(payload).hexdigest()


def make_tree(data: str) -> Tree:
    server = serve(data)

    async def go() -> Tree:
        async with open_client(server) as ws:
            c = await initialized(ws)
            root = (await c.result("session/create", {"name": "root"}))["session"]["id"]
            child = (await c.result("session/create", {"name": "child", "parentId": root}))["session"]["id"]
            root_blob = await _session_with_files(c, root, f"{SECRET} of the root")
            child_blob = await _session_with_files(c, child, f"{SECRET} of the child")
            return Tree(root, child, root_blob, child_blob)

    try:
        return asyncio.run(go())
    finally:
        server.stop()


def delete_until_it_dies(server: ServerProcess, sid: str) -> None:
    async def go() -> None:
        async with open_client(server) as ws:
            c = await initialized(ws)
            with pytest.raises((ConnectionClosed, TimeoutError)):
                await c.call("session/delete", {"sessionId": sid}, timeout=30)

    asyncio.run(go())
    assert server.proc is not None and server.proc.wait(15) == -signal.SIGKILL, "the server did not kill itself"


async def listing(c: Client, **params: Any) -> list[str]:
    return [s["id"] for s in (await c.result("sessions/list", {"limit": 200, **params}))["sessions"]]


def whole(data: str, sid: str, blob: str) -> None:
    """The session is all there: contiguous versions, its words, its attachment and workspace file."""
    store = open_store(os.path.join(data, "store"), readonly=True)
    try:
        events = store.read_stream(f"session-{sid}")
        _check_stream(sid, events)
        assert not store.purged(f"session-{sid}")
        assert any(isinstance(e.event, E.InputAccepted) and SECRET in e.event.text for e in events)
        assert store.audit() == []
    finally:
        store.close()
    assert os.path.exists(os.path.join(data, "blobs", blob[:2], blob))
    assert os.path.exists(os.path.join(data, "workspaces", sid, "notes.txt"))


def gone(data: str, sid: str, blob: str) -> None:
    """Only the tombstone is left, and no file of the session."""
    store = open_store(os.path.join(data, "store"), readonly=True)
    try:
        assert [type(e.event) for e in store.read_stream(f"session-{sid}")] == [E.SessionDeleted]
        assert store.flagged("files-pending") == []
        assert store.audit() == []
    finally:
        store.close()
    assert not os.path.exists(os.path.join(data, "blobs", blob[:2], blob))
    assert not os.path.exists(os.path.join(data, "workspaces", sid))


def test_a_sigkill_inside_the_first_purge_of_a_tree_leaves_every_session_of_it_whole_and_a_retry_deletes_it(tmp_path):
    data = str(tmp_path / "data")
    tree = make_tree(data)
    delete_until_it_dies(serve(data, "purge:1"), tree.root)
    whole(data, tree.root, tree.root_blob)
    whole(data, tree.child, tree.child_blob)
    server = serve(data)

    async def go() -> tuple[list[str], list[str], list[str]]:
        async with open_client(server) as ws:
            c = await initialized(ws)
            before = await listing(c), await listing(c, parentId=tree.root)
            assert await c.result("session/delete", {"sessionId": tree.root}) == {}
            return before[0], before[1], await listing(c)

    try:
        roots, children, after = asyncio.run(go())
    finally:
        server.stop()
    assert tree.root in roots and children == [tree.child]
    assert tree.root not in after
    gone(data, tree.root, tree.root_blob)
    gone(data, tree.child, tree.child_blob)


def test_a_sigkill_inside_the_roots_purge_after_its_childs_leaves_the_root_whole_without_the_child(tmp_path):
    data = str(tmp_path / "data")
    tree = make_tree(data)
    delete_until_it_dies(serve(data, "purge:2"), tree.root)
    gone(data, tree.child, tree.child_blob)  # purged, and its files deleted, before the root's purge began
    whole(data, tree.root, tree.root_blob)
    server = serve(data)

    async def go() -> tuple[list[str], list[str], dict[str, Any]]:
        async with open_client(server) as ws:
            c = await initialized(ws)
            snap = await c.result("session/subscribe", {"sessionId": tree.root})
            return await listing(c), await listing(c, parentId=tree.root), snap["session"]

    try:
        roots, children, summary = asyncio.run(go())
    finally:
        server.stop()
    assert tree.root in roots and tree.child not in roots
    assert children == [] and summary["childCount"] == 0


def test_a_sigkill_after_a_purge_committed_and_before_its_files_were_deleted_is_finished_at_the_restart(tmp_path):
    data = str(tmp_path / "data")
    tree = make_tree(data)
    delete_until_it_dies(serve(data, "after-purge:1"), tree.root)
    store = open_store(os.path.join(data, "store"), readonly=True)
    try:  # the kill came between the child's purge and the deletion of its files
        assert store.flagged("files-pending") == [f"session-{tree.child}"]
    finally:
        store.close()
    assert os.path.exists(os.path.join(data, "workspaces", tree.child, "notes.txt"))
    server = serve(data)  # the restart deletes them before it serves
    server.stop()
    gone(data, tree.child, tree.child_blob)
    whole(data, tree.root, tree.root_blob)
