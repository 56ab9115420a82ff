"""sessions/list rules (seed 004, 列表的规则): sections, children, filters, search, sort, pages, groups."""

from __future__ import annotations

from typing import Any

import pytest

from sessionloop.protocol.errors import INVALID_PARAMS, RpcError
from sessionloop.protocol.listing import DEFAULT_LIMIT, completed_unread, compute_room_groups, list_sessions
from sessionloop.protocol.schemas import SessionsListParams
from sessionloop.protocol.schemas_types import SessionSummary


def s(session_id: str, updated: int = 0, **changes: Any) -> SessionSummary:
    kind = changes.pop("kind", "room" if changes.get("section") == "rooms" else "owner")
    base: dict[str, Any] = {
        "id": session_id, "title": session_id.upper(), "child_count": 0, "kind": kind, "section": "owner",
        "created_at": 0, "updated_at": updated, "running": False, "error": False, "unread": False,
        "attention": False, "archived": False, "background": 0,
    }  # fmt: skip
    return SessionSummary(**{**base, **changes})


def room(
    session_id: str, updated: int = 0, platform: str = "onebot", instance: str | None = "ob-1", **kw: Any
) -> SessionSummary:
    return s(session_id, updated, section="rooms", platform=platform, instance=instance, **kw)


def ids(summaries: list[SessionSummary], **params: Any) -> list[str]:
    return [x.id for x in list_sessions(summaries, SessionsListParams(**params)).sessions]


# --- sections and sort ----------------------------------------------------------------------------


def test_without_a_section_both_are_listed_owner_first() -> None:
    rows = [room("r-new", 100), s("o-old", 1), room("r-old", 2), s("o-new", 50)]
    assert ids(rows) == ["o-new", "o-old", "r-new", "r-old"]


def test_a_section_lists_only_that_section() -> None:
    rows = [room("r1", 5), s("o1", 1)]
    assert ids(rows, section="owner") == ["o1"]
    assert ids(rows, section="rooms") == ["r1"]


def test_the_owner_section_puts_attention_error_unread_and_running_first_then_newest() -> None:
    rows = [
        s("plain-new", 100),
        s("running", 1, running=True),
        s("unread", 2, unread=True),
        s("error", 3, error=True),
        s("attention", 4, attention=True),
        s("plain-old", 10),
        s("attention-and-error-old", 0, attention=True, error=True),
    ]
    assert ids(rows) == [
        "attention-and-error-old",
        "attention",
        "error",
        "unread",
        "running",
        "plain-new",
        "plain-old",
    ]


def test_rooms_sort_by_last_activity_only() -> None:
    rows = [room("quiet", 1, attention=True, error=True), room("busy", 9)]
    assert ids(rows, section="rooms") == ["busy", "quiet"]


def test_ties_in_activity_are_broken_by_id_so_pages_are_stable() -> None:
    assert ids([s("b", 5), s("a", 5), s("c", 5)]) == ["a", "b", "c"]


# --- children -------------------------------------------------------------------------------------


def test_without_parent_id_only_roots_are_listed() -> None:
    rows = [s("root", 1), s("child", 9, kind="task", parent_id="root")]
    assert ids(rows) == ["root"]


def test_parent_id_lists_direct_children_newest_first_whatever_the_section() -> None:
    rows = [
        room("r", 1),
        s("c-old", 1, kind="task", section="rooms", parent_id="r", attention=True),
        s("c-new", 5, kind="task", section="rooms", parent_id="r"),
        s("grandchild", 9, kind="task", section="rooms", parent_id="c-new"),
    ]
    assert ids(rows, parent_id="r", section="owner") == ["c-new", "c-old"]


def test_an_unknown_parent_is_not_found() -> None:
    with pytest.raises(RpcError) as info:
        list_sessions([s("a")], SessionsListParams(parent_id="ghost"))
    assert info.value.data["code"] == "not-found"


def test_a_child_whose_parent_is_not_visible_is_listed_as_a_root() -> None:
    assert ids([s("orphan", 1, kind="task", parent_id="invisible")]) == ["orphan"]


# --- rooms of one group ---------------------------------------------------------------------------


def test_instance_lists_only_rooms_of_that_adapter_instance() -> None:
    rows = [room("a", instance="ob-1"), room("b", instance="ob-2"), room("c", instance=None), s("o")]
    assert ids(rows, instance="ob-1") == ["a"]


def test_platform_lists_only_rooms_of_that_platform_without_an_instance() -> None:
    rows = [room("a", instance="ob-1"), room("b", instance=None), room("c", platform="tg", instance=None)]
    assert ids(rows, platform="onebot") == ["b"]


def test_instance_and_platform_together_are_invalid_params() -> None:
    with pytest.raises(ValueError):
        SessionsListParams(instance="ob-1", platform="onebot")


# --- archived and background ----------------------------------------------------------------------


def test_archived_sessions_are_left_out_by_default() -> None:
    rows = [s("live", 1), s("gone", 2, archived=True)]
    assert ids(rows) == ["live"]
    assert ids(rows, archived=False) == ["live"]


def test_archived_true_lists_only_archived_sessions_children_too() -> None:
    rows = [
        s("live", 1),
        s("gone", 2, archived=True),
        s("kid", 3, kind="task", parent_id="live", archived=True),
    ]
    assert ids(rows, archived=True) == ["gone"]
    assert ids(rows, parent_id="live", archived=True) == ["kid"]
    assert ids(rows, parent_id="live") == []


def test_background_lists_sessions_with_background_work_archived_or_not() -> None:
    rows = [s("idle", 1), s("busy", 2, background=2), s("busy-archived", 3, background=1, archived=True)]
    assert ids(rows, background=True) == ["busy-archived", "busy"]


def test_background_with_archived_is_invalid_params() -> None:
    with pytest.raises(ValueError):
        SessionsListParams(background=True, archived=True)


# --- search ---------------------------------------------------------------------------------------


def test_query_matches_title_and_id_ignoring_case() -> None:
    rows = [s("abc-123", title="Weekly Report"), s("zzz", title="Other")]
    assert ids(rows, query="weekly") == ["abc-123"]
    assert ids(rows, query="ABC-1") == ["abc-123"]
    assert ids(rows, query="  ") == ["abc-123", "zzz"]


def test_default_names_do_not_match_a_query() -> None:
    rows = [s("s1", title="New session"), s("s2", title="New session plan")]
    named = {"s2"}

    def terms(summary: SessionSummary) -> list[str]:
        return [summary.id, summary.title] if summary.id in named else [summary.id]

    result = list_sessions(rows, SessionsListParams(query="new session"), search_terms=terms)
    assert [x.id for x in result.sessions] == ["s2"]


def test_platform_and_group_number_match_a_room_of_any_account() -> None:
    rows = [
        room("onebot:10001:group:20001"),
        room("onebot:10002:group:20001"),
        room("onebot:10001:group:200011"),
        room("telegram:1:group:20001", platform="telegram"),
        room("onebot:10001:private:20001"),
    ]
    assert sorted(ids(rows, query="OneBot:20001")) == ["onebot:10001:group:20001", "onebot:10002:group:20001"]


# --- pages ----------------------------------------------------------------------------------------


def test_the_default_page_is_50_and_says_where_the_next_starts() -> None:
    rows = [s(f"s{i:03}", i) for i in range(120)]
    page = list_sessions(rows, SessionsListParams())
    assert len(page.sessions) == DEFAULT_LIMIT and page.next_cursor is not None


def test_following_cursors_lists_every_session_exactly_once() -> None:
    rows = [s(f"o{i}", i % 7, attention=i % 5 == 0, unread=i % 3 == 0) for i in range(57)]
    rows += [room(f"r{i}", i % 4) for i in range(23)]
    seen: list[str] = []
    cursor = None
    while True:
        page = list_sessions(rows, SessionsListParams(limit=9, cursor=cursor))
        seen += [x.id for x in page.sessions]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == ids(rows, limit=200)
    assert len(seen) == len(set(seen)) == 80


def test_the_last_page_has_no_next_cursor() -> None:
    page = list_sessions([s("a"), s("b")], SessionsListParams(limit=2))
    assert len(page.sessions) == 2 and page.next_cursor is None


def test_a_cursor_survives_sessions_changing_between_pages() -> None:
    rows = [s(f"s{i}", i) for i in range(10)]
    first = list_sessions(rows, SessionsListParams(limit=3))
    rows = [s("s-brand-new", 100), *rows[:-1]]  # a newer one appears, the newest one is deleted
    second = list_sessions(rows, SessionsListParams(limit=3, cursor=first.next_cursor))
    assert [x.id for x in second.sessions] == ["s6", "s5", "s4"]


@pytest.mark.parametrize(
    "cursor", ["", "!!!", "not a cursor", "eyJhIjoxfQ", "WzIsMCwwLDAsMCwwLCJ4Il0", "x" * 5000]
)
def test_a_bad_cursor_is_invalid_params(cursor: str) -> None:
    with pytest.raises(RpcError) as info:
        list_sessions([s("a")], SessionsListParams(cursor=cursor))
    assert info.value.rpc_code == INVALID_PARAMS and "cursor" in info.value.message


# --- room groups ----------------------------------------------------------------------------------


def test_groups_are_by_platform_then_instance_with_the_instance_less_group_last() -> None:
    rows = [
        room("a", platform="telegram", instance="tg-1"),
        room("b", platform="onebot", instance=None),
        room("c", platform="onebot", instance="ob-2"),
        room("d", platform="onebot", instance="ob-1"),
    ]
    groups = compute_room_groups(rows)
    assert [(g.platform, g.instance) for g in groups] == [
        ("onebot", "ob-1"),
        ("onebot", "ob-2"),
        ("onebot", None),
        ("telegram", "tg-1"),
    ]


def test_groups_count_rooms_accounts_and_rooms_needing_attention() -> None:
    rows = [
        room("a", account="bot-1", attention=True),
        room("b", account="bot-2"),
        room("c", account="bot-1", attention=True),
        room("old", account="bot-3", archived=True, attention=True),
        s("kid", kind="task", section="rooms", parent_id="a", platform="onebot", instance="ob-1"),
    ]
    (group,) = compute_room_groups(rows, lambda platform, instance: f"OneBot ({instance})")
    assert (group.rooms, group.accounts, group.attention, group.label) == (3, 2, 2, "OneBot (ob-1)")


def test_groups_ignore_section_query_and_paging() -> None:
    rows = [room("r1"), room("r2"), s("o1")]
    result = list_sessions(rows, SessionsListParams(section="owner", query="o1", limit=1))
    assert [x.id for x in result.sessions] == ["o1"]
    assert [(g.instance, g.rooms) for g in result.groups] == [("ob-1", 2)]


def test_default_group_labels_are_instance_or_platform() -> None:
    labels = [g.label for g in compute_room_groups([room("a"), room("b", instance=None)])]
    assert labels == ["ob-1", "onebot"]


# --- completed unread -----------------------------------------------------------------------------


def test_completed_unread_is_a_reply_after_the_last_mark_seen_in_the_owner_section() -> None:
    assert completed_unread("owner", last_reply_at=10, seen_at=5)
    assert completed_unread("owner", last_reply_at=10, seen_at=None)
    assert not completed_unread("owner", last_reply_at=5, seen_at=5)
    assert not completed_unread("owner", last_reply_at=None, seen_at=None)
    assert not completed_unread("rooms", last_reply_at=10, seen_at=5)
