"""Deleting sessions (``session/delete`` and ``session/batch`` delete): a session and every
session below it lose their running work, their history and their files.

A delete takes the child sessions along and "clears their message history and long-term
memory"; a background task removed by a session's deletion is in ``background/changed``
``removes``. How one tree is deleted (:meth:`Deletions.delete_tree`, on a thread that may wait,
never an actor's):

1. **Freeze** every session of the tree (root first, each after its parent): its running turn is
   aborted (model call and tool runs cancelled, a foreground command killed with its task), its
   queued inputs are dropped, and until it is purged it takes no new input (``turn/send``,
   ``loop/send`` and a task's notice answer not-found), so no new turn, tool or child starts.
   Children that appeared meanwhile are frozen too.
2. **Stop** the tree's background tasks (their processes are killed and waited for) and settle
   its pending approvals (``turn-ended``: their cards close).
3. **Purge** each session, every child before its parent: one store transaction takes the
   session's stream, approval streams and task streams out of the store and leaves a tombstone
   (``session.deleted``, no content, the listing record reduced to ids and ``deleted``), see
   ``eventstore/purge.py`` and ``SessionBehaviour.on_purge``. The listing drops it
   (``sessions/changed`` ``removes``), the task registry drops its tasks (``background/changed``
   ``removes``).
4. **Files**: the session's attachments nobody else refers to (``actors/system/blobs.py``) and its own
   workspace ``<workspaces>/<id>`` are deleted (a directory the session was given, ``cwd``, is not
   the server's to delete; a child made with ``context: 'caller'`` works in its parent's).

Crash safety (a SIGKILL at any moment): until a session's purge commits, the session is all
there (its turn may have been stopped: that is what a delete does first). The purge commits in one
transaction with the flag ``files-pending``; the files are deleted after it and the flag is then
cleared, so a restart finds every purge whose files are not gone yet and finishes them
(:meth:`Deletions.finish_pending`) before the server serves. A tree is deleted children first:
a crash leaves the root with fewer children, never a child whose parent is gone.

The decision what a delete writes is pure (``decide.decide_stop_for_delete``, ``decide_delete``,
``views.summary.tombstone_record``); the session actor persists it. The tree is
:func:`actors.session.tree.tree_of`: the root and every session below it.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pykka

from sessionloop.actors.errors import NotFound
from sessionloop.actors.session.messages import Freeze, Purge, Thaw
from sessionloop.actors.session.purge import FILES_PENDING
from sessionloop.actors.session.tree import tree_of
from sessionloop.actors.system.pubsub import Reply

if TYPE_CHECKING:
    from sessionloop.actors.system.runtime import Runtime

log = logging.getLogger("sessionloop.deletion")

_PLAIN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
WAIT_S = 15.0  # per step; a background task is killed within a few seconds (SIGTERM, then SIGKILL)
ROUNDS = 3  # freezing and stopping are repeated until nothing new appeared, at most this often


class Deletions:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    def delete_tree(self, root: str, below: Callable[[str], list[str]],
                    elsewhere: Callable[[list[str]], None] | None = None) -> list[str]:
        """Delete ``root`` and every session ``below(root)`` lists (each after its parent); the
        ids deleted. Raises NotFound when ``root`` does not exist or was deleted; blocks (run it
        on a worker thread).

        One of several workers (``serve --workers``) acts on the sessions it runs; the tree's
        others are another worker's: ``elsewhere(ids)`` has their workers delete them (each with
        what is below it there), in the tree's children-first order, or they are left alone when
        ``elsewhere`` is None (this delete is a worker's share of another's tree)."""
        owns = self.rt.owns
        frozen: list[str] = []
        deleted: list[str] = []
        try:
            tree = self._freeze(root, below, frozen)
            if elsewhere is None:
                tree = [sid for sid in tree if owns(sid)]
            self._stop_work([sid for sid in tree if owns(sid)])
            for mine, group in itertools.groupby(reversed(tree), owns):  # children before their parents
                run = list(group)
                if not mine:
                    assert elsewhere is not None
                    elsewhere(run)
                    deleted.extend(run)
                    continue
                self._purge_run(root, run, deleted)
        except BaseException:
            self._thaw([sid for sid in frozen if sid not in deleted])
            raise
        return deleted

    def _purge_run(self, root: str, run: list[str], deleted: list[str]) -> None:
        """Purge each of ``run`` (this process's sessions, children first), adding it to ``deleted``."""
        for session_id in run:
            try:
                self._ask(session_id, Purge)
            except NotFound:
                if session_id == root:
                    raise
                continue  # deleted meanwhile
            deleted.append(session_id)
            self.rt.faults.hit("after-purge")
            self.clean_files(session_id)

    def _freeze(self, root: str, below: Callable[[str], list[str]], frozen: list[str]) -> list[str]:
        """Freeze the tree, again for children that appeared meanwhile; the tree (each session
        after its parent). ``frozen`` collects the sessions frozen."""
        asked: set[str] = set()
        for _ in range(ROUNDS):
            tree = tree_of(root, below)
            new = [sid for sid in tree if sid not in asked]
            if not new:
                return tree
            for session_id in new:
                asked.add(session_id)
                if not self.rt.owns(session_id):  # another worker's: it freezes it when it deletes it
                    continue
                try:
                    self._ask(session_id, lambda r: Freeze("the session was deleted", r))
                except NotFound:
                    if session_id == root:
                        raise
                    continue  # deleted meanwhile
                frozen.append(session_id)
        return tree_of(root, below)

    def _thaw(self, session_ids: list[str]) -> None:
        """A delete that failed: the sessions it froze and did not purge take input again (a
        turn it aborted stays aborted: that happened)."""
        for session_id in session_ids:
            try:
                self._ask(session_id, Thaw)
            except Exception as e:  # noqa: BLE001 - the error the delete answers is the one that matters
                log.warning("could not thaw session %s after a failed delete: %s", session_id, e)

    def _stop_work(self, tree: list[str]) -> None:
        tasks = self.rt.tasks_service
        for _ in range(ROUNDS):
            waits = tasks.stop_session(tree)
            if not waits:
                break
            for reply in waits:
                _wait(reply, "a background task")
        self.rt.approvals.settle_sessions(tree)

    def _ask(self, session_id: str, make: Callable[[Reply], Any]) -> Any:
        return self.rt.ask(session_id, make, WAIT_S)

    # --- files -------------------------------------------------------------------------------

    def clean_files(self, session_id: str) -> None:
        """Delete what a purged session left on disk (idempotent), then clear its
        ``files-pending`` flag."""
        self.rt.blobs.release_session(session_id)
        path = self.own_workspace(session_id)
        if path is not None and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)  # never follows a link inside it (rmtree.avoids_symlink_attacks)
        self.rt.store.set_flags(f"session-{session_id}", {FILES_PENDING: False})

    def own_workspace(self, session_id: str) -> str | None:
        """``<workspaces>/<id>``: the directory the server made for the session (a session given a
        ``cwd`` never has one there)."""
        if not _PLAIN_ID.match(session_id):
            return None
        return os.path.join(os.path.realpath(self.rt.workspace_root), session_id)

    def finish_pending(self) -> int:
        """At start: delete the files of purges a crash interrupted; how many were finished."""
        finished = 0
        for stream in self.rt.store.flagged(FILES_PENDING):
            if not stream.startswith("session-") or not self.rt.store.owns(stream):
                continue
            try:
                self.clean_files(stream[len("session-"):])
                finished += 1
            except Exception:  # one session's files must not keep the host from starting
                log.exception("could not finish deleting the files of %s", stream)
        if finished:
            log.warning("finished deleting the files of %d sessions whose deletion a stop interrupted", finished)
        return finished


def _wait(reply: Reply, what: str) -> None:
    try:
        reply.result(WAIT_S)
    except NotFound:
        pass
    except pykka.ActorDeadError:
        pass
    except Exception as e:  # noqa: BLE001 - the delete goes on: the purge seals the stream either way
        log.warning("deleting: %s did not stop cleanly: %s", what, e)
