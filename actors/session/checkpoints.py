"""Restoring files from checkpoints (``turn/rewind``: files go back to how they were before the turn).

Tools that change files record each file's before-image once per turn (``checkpoint.recorded``,
written before the change). Rewinding to before turn T restores, for every file any turn from T
on touched, the image recorded first: the state the file had when T began. A file that did not
exist then is removed. A file that cannot be written back is reported as a conflict, and
rewinding goes on with the others.
"""

from __future__ import annotations

from sessionloop.actors.session.state import SessionState
from sessionloop.actors.tools import ToolError, Workspace


def images_before(state: SessionState, turn_id: str) -> dict[str, tuple[bool, bytes | None]]:
    """path -> (existed, content) as the files were right before ``turn_id``."""
    order = {t: i for i, t in enumerate(state.turn_order)}
    start = order[turn_id]
    images: dict[str, tuple[bool, bytes | None]] = {}
    for c in state.checkpoints:
        if order.get(c.turn_id, -1) >= start and c.path not in images:
            images[c.path] = (c.existed, c.content)
    return images


def restore_before(state: SessionState, turn_id: str, workspace: Workspace) -> tuple[list[str], list[str], list[str]]:
    """Write the before-images back; returns (restored, removed, conflicts), each sorted."""
    restored: list[str] = []
    removed: list[str] = []
    conflicts: list[str] = []
    for path, (existed, content) in sorted(images_before(state, turn_id).items()):
        try:  # never through a link a command left in the workspace (Workspace.write_bytes)
            if existed:
                workspace.write_bytes(path, content or b"")
                restored.append(path)
            elif workspace.remove(path):
                removed.append(path)
        except (OSError, ToolError):
            conflicts.append(path)
    return restored, removed, conflicts
