"""Tree operations (``actors/session/tree.py``): archiving reaches a session and every session below
it, each deciding for itself, and ends once every one answered."""

from __future__ import annotations

import threading

from sessionloop.actors.session.tree import archive_tree, tree_of


def archived(host) -> dict[str, bool]:
    return {info.id: info.archived for info in host.list()}


def run_archive(host, root: str, below, flag: bool) -> BaseException | None:
    ended = threading.Event()
    outcome: list[BaseException | None] = []

    def done(error: BaseException | None) -> None:
        outcome.append(error)
        ended.set()

    archive_tree(host.rt, root, below, flag, done)
    assert ended.wait(10), "the archive never ended"
    return outcome[0]


def test_the_tree_is_the_root_then_the_sessions_below_it() -> None:
    assert tree_of("a", lambda sid: ["b", "c"] if sid == "a" else []) == ["a", "b", "c"]


def test_archiving_a_tree_archives_the_root_and_its_children_and_leaves_the_rest(open_host) -> None:
    host = open_host()
    root, other = host.create(title="root"), host.create(title="other")
    child = host.create(title="child", parent_id=root.id)
    grandchild = host.create(title="grandchild", parent_id=child.id)
    assert run_archive(host, root.id, host.index.descendants, True) is None
    assert archived(host) == {root.id: True, child.id: True, grandchild.id: True, other.id: False}
    assert run_archive(host, root.id, host.index.descendants, False) is None
    assert not any(archived(host).values())


def test_a_session_of_the_tree_that_is_gone_is_not_a_failure(open_host) -> None:
    host = open_host()
    root = host.create(title="root")
    assert run_archive(host, root.id, lambda sid: ["no-such-session"] if sid == root.id else [], True) is None
    assert archived(host) == {root.id: True}
