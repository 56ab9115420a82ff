"""The items of a session's timeline in order, and the pages cut from them (docs/protocol.md,
``session/history`` and ``session/subscribe``).

The ordered store of :class:`actors.views.items.ItemsProjection`, pure like it. Items are kept by
*ordinal*, the position at which an item first appeared; replacing an item keeps its place, and
only a turn's ``turn`` item moves (to after the turn's last item, when the turn ends). Whether an
item is archived (in history) or in flight is read from the projection's turn views
(:class:`TurnView`), which the projection keeps and this store only reads, except that the first
item of a turn marks where that turn's in-flight range starts.

Pages count messages (user messages, agent messages and notices); tool calls, reasoning and turn
items ride along with them, a turn's tool-call group is never split across two pages, and a
message's page takes the reasoning of its model call just before it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping
from typing import Final

import msgspec

from sessionloop.actors.errors import NotFound
from sessionloop.actors.settings.texts import Text
from sessionloop.protocol.schemas_items import (
    AgentMessageItem,
    NoticeItem,
    ReasoningItem,
    SessionItem,
    ToolCallItem,
    UserMessageItem,
)

__all__ = [
    "clamp_history_limit",
    "HISTORY_DEFAULT_LIMIT",
    "HISTORY_MAX_LIMIT",
    "Page",
    "reasoning_id",
    "Timeline",
    "TurnView",
]

HISTORY_DEFAULT_LIMIT: Final = 100  # session/history: limit defaults to 100, at most 200
HISTORY_MAX_LIMIT: Final = 200

#: a page of items and the cursor of the next older page (None when there is nothing older)
Page = tuple[list[SessionItem], str | None]

_MESSAGE_KINDS: Final = (UserMessageItem, AgentMessageItem, NoticeItem)


def clamp_history_limit(limit: int | None) -> int:
    """A ``session/history`` limit: 100 when not given, at most 200 (and at least one message)."""
    if limit is None:
        return HISTORY_DEFAULT_LIMIT
    return max(1, min(limit, HISTORY_MAX_LIMIT))


def reasoning_id(step_id: str) -> str:
    """The reasoning item of a model step (its agent message's id with ``.thinking``)."""
    # Same suffix as the fold's thinking step (session_model: ``<step>.thinking``).
    return f"{step_id}.thinking"


class TurnView(msgspec.Struct, kw_only=True):
    """What the items projection remembers of one turn."""

    turn_id: str
    source: str | None = None
    started_at: int = 0
    live: bool = True
    first: int | None = None  # ordinal of its first item: where its in-flight range starts
    calls: list[str] = []
    messages: list[str] = []  # agent-message item ids, in order
    completion_tokens: int = 0


class Timeline:
    """The timeline items of one session, in timeline order, and its history and snapshot pages.

    ``turns`` is the projection's own map of turn views, shared: it says which items are archived.
    """

    def __init__(self, turns: Mapping[str, TurnView]) -> None:
        self._turns = turns
        self._keys: list[int] = []  # ordinals, ascending; parallel to _items
        self._items: list[SessionItem] = []
        self._ordinal: dict[str, int] = {}
        self._next = 0

    def items(self) -> list[SessionItem]:
        """Every item, archived and in flight, in timeline order (a copy)."""
        return list(self._items)

    def item(self, item_id: str) -> SessionItem | None:
        """The current copy of one item, or None."""
        pos = self.position(item_id)
        return None if pos is None else self._items[pos]

    def has(self, item_id: str) -> bool:
        """Whether an item with this id is in the timeline."""
        return item_id in self._ordinal

    def clear(self) -> None:
        """Forget every item (a deleted session); ordinals go on from where they were."""
        self._keys, self._items, self._ordinal = [], [], {}

    def history_page(self, before: str | None = None, limit: int | None = None) -> Page:
        """One ``session/history`` page: archived items older than ``before``.

        ``limit`` counts messages (user messages, agent messages and notices: the archive's
        messages), default 100, max 200; tool calls, reasoning and turn items ride along with them.
        A turn's tool-call group is never split across pages, so a page may hold more messages
        than ``limit``. Returns ``(items, before)``; ``before`` is the opaque cursor of the next
        older page (the id of this page's first item), None when there is nothing older.

        Raises :class:`NotFound` when ``before`` no longer names an archived item (removed by a
        rewind, or never issued): ``session/history`` then answers ``not-found``.
        """
        end = len(self._items)
        if before is not None:
            pos = self.position(before)
            if pos is None or not self.archived(self._items[pos]):
                raise NotFound(Text("error.history-cursor", cursor=repr(before)), before=before)
            end = pos
        start = self._page_start(end, clamp_history_limit(limit))
        page = [item for item in self._items[start:end] if self.archived(item)]
        return page, self._cursor(start)

    def snapshot_page(self, limit: int | None = None) -> Page:
        """The items of a ``session/subscribe`` snapshot and its ``before`` cursor.

        The newest history page plus every item of the turn in flight, merged in timeline order
        (things said during the turn stay between its items).
        """
        end = len(self._items)
        start = self._page_start(end, clamp_history_limit(limit))
        low = min([start, *self._live_starts()])
        items = [
            item
            for pos, item in enumerate(self._items[low:end], start=low)
            if pos >= start or not self.archived(item)
        ]
        return items, self._cursor(start)

    # --- the ordered store ------------------------------------------------------------------------

    def position(self, item_id: str) -> int | None:
        ordinal = self._ordinal.get(item_id)
        if ordinal is None:
            return None
        pos = bisect_left(self._keys, ordinal)
        return pos if pos < len(self._keys) and self._keys[pos] == ordinal else None

    def put(self, item: SessionItem) -> SessionItem:
        """Insert a new item at the end, or replace the item with the same id in place."""
        pos = self.position(item.item_id)
        if pos is None:
            view = self._turns.get(item.turn_id) if item.turn_id is not None else None
            if view is not None and view.first is None:
                view.first = self._next
            self._ordinal[item.item_id] = self._next
            self._keys.append(self._next)
            self._items.append(item)
            self._next += 1
        else:
            self._items[pos] = item
        return item

    def move_to_end(self, item_id: str) -> None:
        pos = self.position(item_id)
        if pos is None:
            return
        item = self._items.pop(pos)
        del self._keys[pos]
        del self._ordinal[item_id]
        self.put(item)

    def remove(self, gone: Callable[[SessionItem], bool]) -> None:
        keep = [(key, item) for key, item in zip(self._keys, self._items, strict=True) if not gone(item)]
        for item in self._items:
            if gone(item):
                self._ordinal.pop(item.item_id, None)
        self._keys = [key for key, _ in keep]
        self._items = [item for _, item in keep]

    def archived(self, item: SessionItem) -> bool:
        view = self._turns.get(item.turn_id) if item.turn_id is not None else None
        return view is None or not view.live

    def _live_starts(self) -> list[int]:
        """Positions of the first item of each running turn."""
        # bisect: the first item may be gone (moved turn item), the next one then starts the range
        return [bisect_left(self._keys, view.first) for view in self._turns.values()
                if view.live and view.first is not None]

    # --- pages ------------------------------------------------------------------------------------

    def _is_message(self, pos: int) -> bool:
        item = self._items[pos]
        return isinstance(item, _MESSAGE_KINDS) and self.archived(item)

    def _page_start(self, end: int, limit: int) -> int:
        """Where the page of ``limit`` archived messages ending before ``end`` starts."""
        count, pos = 0, end
        while pos > 0:
            pos -= 1
            if self._is_message(pos):
                count += 1
                if count == limit:
                    break
        else:
            return 0
        start = self._keep_tool_group(self._with_reasoning(pos))
        return start if self._message_before(start) else 0  # leading odd items join the oldest page

    def _with_reasoning(self, pos: int) -> int:
        """A message's page also takes the reasoning of its model call, just before it."""
        item = self._items[pos]
        if pos > 0 and isinstance(item, AgentMessageItem):
            prev = self._items[pos - 1]
            if isinstance(prev, ReasoningItem) and prev.item_id == reasoning_id(item.item_id):
                return pos - 1
        return pos

    def _keep_tool_group(self, start: int) -> int:
        """A turn's tool-call group is never split across two pages: when ``start`` falls between the
        first and the last tool call of one turn, the page grows back to the message before the first
        call."""
        turn_id = self._items[start].turn_id
        if turn_id is None or not self._tool_call_from(start, turn_id):
            return start
        first_call: int | None = None
        pos = start - 1
        while pos >= 0 and self._items[pos].turn_id in (turn_id, None):
            if isinstance(self._items[pos], ToolCallItem) and self._items[pos].turn_id == turn_id:
                first_call = pos
            pos -= 1
        if first_call is None:
            return start
        pos = first_call - 1
        while pos >= 0 and self._items[pos].turn_id in (turn_id, None):
            if self._is_message(pos) and self._items[pos].turn_id == turn_id:
                return self._with_reasoning(pos)
            pos -= 1
        return first_call

    def _tool_call_from(self, start: int, turn_id: str) -> bool:
        pos = start
        while pos < len(self._items) and self._items[pos].turn_id in (turn_id, None):
            if isinstance(self._items[pos], ToolCallItem) and self._items[pos].turn_id == turn_id:
                return True
            pos += 1
        return False

    def _message_before(self, start: int) -> bool:
        return any(self._is_message(pos) for pos in range(start - 1, -1, -1))

    def _cursor(self, start: int) -> str | None:
        if start < len(self._items) and any(self.archived(self._items[p]) for p in range(start - 1, -1, -1)):
            return self._items[start].item_id
        return None
