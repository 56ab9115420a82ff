"""Fields computed over the session tree (seed 004, 按会话树算的字段)."""

from __future__ import annotations

from typing import Any

from sessionloop.protocol.listing import SessionNode, apply_tree_fields, compute_tree_fields, with_ancestors
from sessionloop.protocol.schemas_types import AncestorRef, SessionSummary, TokenCount


def node(session_id: str, parent: str | None = None, **kw: Any) -> SessionNode:
    return SessionNode(id=session_id, title=session_id.title(), parent_id=parent, **kw)


def test_attention_of_a_child_marks_every_ancestor() -> None:
    fields = compute_tree_fields(
        [node("root"), node("mid", "root"), node("leaf", "mid", attention=True), node("other", "root")]
    )
    assert [fields[x].attention for x in ("root", "mid", "leaf", "other")] == [True, True, True, False]


def test_background_is_own_tasks_plus_one_per_busy_descendant() -> None:
    fields = compute_tree_fields(
        [
            node("root", background=2, running=True),
            node("a", "root", running=True),
            node("b", "root", background=3),
            node("c", "b", running=True, background=1),
            node("idle", "root"),
        ]
    )
    assert fields["root"].background == 2 + 3  # own 2; a, b, c busy (one each); its own turn not counted
    assert fields["b"].background == 3 + 1
    assert fields["c"].background == 1
    assert fields["idle"].background == 0


def test_tokens_add_up_over_the_subtree_and_are_absent_when_nothing_was_counted() -> None:
    fields = compute_tree_fields(
        [
            node("root", tokens=TokenCount(input=10, output=1)),
            node("a", "root"),
            node("b", "a", tokens=TokenCount(input=5, output=5)),
            node("quiet"),
        ]
    )
    assert fields["root"].tokens == TokenCount(input=15, output=6)
    assert fields["a"].tokens == TokenCount(input=5, output=5)
    assert fields["quiet"].tokens is None


def test_ancestors_run_from_the_root_down_and_roots_have_none() -> None:
    fields = compute_tree_fields([node("leaf", "mid"), node("mid", "root"), node("root")])
    assert fields["leaf"].ancestors == [
        AncestorRef(id="root", title="Root"),
        AncestorRef(id="mid", title="Mid"),
    ]
    assert fields["root"].ancestors is None
    assert fields["leaf"].root_id == "root"


def test_child_count_counts_direct_children_only() -> None:
    fields = compute_tree_fields([node("root"), node("a", "root"), node("b", "root"), node("c", "a")])
    assert (fields["root"].child_count, fields["a"].child_count, fields["c"].child_count) == (2, 1, 0)


def test_children_take_the_section_of_their_root() -> None:
    fields = compute_tree_fields([node("room", kind="room"), node("task", "room", kind="task"), node("mine")])
    assert (fields["room"].section, fields["task"].section, fields["mine"].section) == (
        "rooms",
        "rooms",
        "owner",
    )


def test_a_missing_parent_makes_a_root() -> None:
    fields = compute_tree_fields([node("orphan", "deleted")])
    assert fields["orphan"].ancestors is None and fields["orphan"].root_id == "orphan"


def test_a_cycle_is_cut_instead_of_looping_forever() -> None:
    fields = compute_tree_fields([node("a", "b"), node("b", "a"), node("self", "self")])
    assert set(fields) == {"a", "b", "self"}
    assert fields["self"].ancestors is None
    assert sorted(f.child_count for k, f in fields.items() if k != "self") == [0, 1]


def test_a_very_deep_tree_does_not_hit_the_recursion_limit() -> None:
    depth = 3000
    nodes = [node("n0")] + [node(f"n{i}", f"n{i - 1}") for i in range(1, depth)]
    nodes.append(node("deepest", f"n{depth - 1}", attention=True))
    fields = compute_tree_fields(nodes)
    assert fields["n0"].attention and len(fields["deepest"].ancestors or []) == depth


def test_apply_tree_fields_replaces_only_tree_fields() -> None:
    summary = SessionSummary(
        id="r", title="R", child_count=0, kind="owner", section="owner", created_at=1, updated_at=2,
        running=True, error=False, unread=True, attention=False, archived=False, background=0,
    )  # fmt: skip
    fields = compute_tree_fields([node("r", kind="room"), node("k", "r", attention=True, running=True)])
    applied = apply_tree_fields(summary, fields["r"])
    assert (applied.section, applied.attention, applied.background, applied.child_count) == (
        "rooms",
        True,
        1,
        1,
    )
    assert applied.running and applied.unread and applied.title == "R"


def test_a_change_is_pushed_with_every_ancestor() -> None:
    fields = compute_tree_fields([node("root"), node("mid", "root"), node("leaf", "mid"), node("x")])
    assert with_ancestors(["leaf", "x", "mid"], fields) == ["leaf", "mid", "root", "x"]
    assert with_ancestors(["unknown"], fields) == ["unknown"]
