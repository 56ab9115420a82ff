"""Presence and approvals: one actor per pending approval, and approval grants."""
