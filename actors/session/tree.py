"""Operations on a session and every session below it (``session/archive``, ``session/unarchive``
and ``session/batch`` with those ops): which sessions a tree operation reaches is decided here,
not by the protocol layer. Deleting a tree has its own steps (:mod:`actors.session.deletion`).

Archiving is a command to each session of the tree (``commands.Archive``): each decides for itself
(nothing is written when it already is so) and the operation ends when every one has answered. A
session deleted meanwhile is not a failure; the first other refusal is the operation's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sessionloop.actors.errors import NotFound
from sessionloop.actors.session import commands as C
from sessionloop.actors.session.messages import Decide
from sessionloop.actors.system.pubsub import Reply

if TYPE_CHECKING:
    from sessionloop.actors.system.runtime import Runtime


def tree_of(root: str, below: Callable[[str], list[str]]) -> list[str]:
    """``root`` and every session below it, each after its parent."""
    return [root, *below(root)]


def archive_tree(rt: Runtime, root: str, below: Callable[[str], list[str]], archived: bool,
                 done: Callable[[BaseException | None], None]) -> None:
    """Archive (or unarchive) ``root`` and every session ``below(root)`` lists; ``done(error)`` once
    every one has answered (``error``: the first refusal other than not-found, else None). Never
    waits: the answers complete on the sessions' threads."""
    targets = tree_of(root, below)
    left = len(targets)
    first_error: BaseException | None = None

    def finished(r: Reply) -> None:
        nonlocal left, first_error
        _, error = r.outcome()
        if error is not None and not isinstance(error, NotFound):
            first_error = first_error or error
        left -= 1
        if left == 0:
            done(first_error)

    for session_id in targets:
        reply = Reply()
        reply.add_callback(finished)
        rt.tell(session_id, Decide(C.Archive(archived=archived), reply))
