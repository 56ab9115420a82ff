"""Replay-based debugging: timelines, verification and re-runs of a session from its log."""
