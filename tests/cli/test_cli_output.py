"""How the terminal commands render items (cli/output.py)."""

from __future__ import annotations

from sessionloop.cli.output import turn_line
from sessionloop.protocol.schemas import TurnItem


def test_a_failed_turn_ends_the_transcript_with_a_marked_line_naming_the_reason_and_the_step() -> None:
    failed = TurnItem(item_id="t", at=1, turn_id="t", outcome="error", reason="rate limited\x1b[31m", step_id="t.2")
    assert turn_line(failed) == "[turn error] rate limited[31m (step t.2)"  # control characters removed
    assert turn_line(TurnItem(item_id="t", at=1, turn_id="t", outcome="error")) == "[turn error] no reason recorded"
    assert turn_line(TurnItem(item_id="t", at=1, turn_id="t", outcome="aborted")) == "[turn aborted]"
