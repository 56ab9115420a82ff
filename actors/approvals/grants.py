"""Approval grants: an answer that also settles later calls (pure).

Like Codex's ``acceptForSession`` and ACP's ``allow_always`` / ``reject_always``, the owner can
answer an approval with a grant: *this tool* (or, for ``exec``, *commands starting with this
prefix*) for *the rest of this turn* or *this session*, until an expiry. The grant is recorded in
the answer itself (``Settlement.grant`` of ``tool.approval.settled``; its id is the approval's),
so the session's fold, a restart and ``replay`` all see it; ``approval.grant.revoked`` ends one.

Rules:

* only calls that need an approval are settled by grants; a call a grant settles is settled at
  once, with ``source: "grant"`` and the grant's id in its settlement, and no approval is asked;
* **deny beats allow**: when a denying and an approving grant both match, the call is denied;
  a denying grant applies in ``acceptCalls`` too (the owner said never), an approving one only
  matters in ``ask``;
* a command prefix is matched by shell words (``shlex``), never by characters: ``git status``
  approves ``git status -s`` but not ``git statusx``. An approving prefix matches only a simple
  command (no ``;``, ``&``, ``|``, redirection, substitution, subshell or newline: ``git status;
  rm -rf ~`` is asked about); a denying prefix matches any command of a list or pipeline.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from typing import Any, Literal

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.settings.texts import Text

#: Grants last at most this long (the answerer may ask for less).
MAX_GRANT_MS = 30 * 24 * 3600 * 1000
GrantScope = Literal["turn", "session"]  # as E.GrantTerms records it
DEFAULT_GRANT_MS: dict[GrantScope, int] = {"turn": 3600 * 1000, "session": 24 * 3600 * 1000}
MAX_PREFIX_CHARS = 1000
_COMPOUND = re.compile(r"[;&|<>`$(){}\n\r\\]")
_SEPARATORS = re.compile(r"&&|\|\||[;&|\n\r()]")


class Grant(msgspec.Struct, kw_only=True):
    """A grant in a session's state: the answer that made it and whether it was revoked."""

    id: str  # the approval whose answer made it
    decision: Literal["approve", "deny"]
    terms: E.GrantTerms
    turn_id: str
    at: int
    by: E.Speaker | None = None
    revoked: bool = False

    def active(self, now: int, current_turn: str | None) -> bool:
        if self.revoked or now >= self.terms.expires_at:
            return False
        return self.terms.scope == "session" or self.turn_id == current_turn


def terms_for(tool: str, scope: GrantScope, command_prefix: str | None, expires_in_ms: int | None,
              now: int) -> E.GrantTerms:
    """The terms of a grant asked for on an approval of ``tool``; raises ValueError naming the
    field that does not fit."""
    if scope not in ("turn", "session"):
        raise ValueError(Text("error.grant-scope"))
    if command_prefix is not None:
        if tool != "exec":
            raise ValueError(Text("error.grant-prefix-tool", tool=tool))
        if not command_prefix.strip() or len(command_prefix) > MAX_PREFIX_CHARS:
            raise ValueError(Text("error.grant-prefix-length", max=MAX_PREFIX_CHARS))
        if _words(command_prefix) is None:
            raise ValueError(Text("error.grant-prefix-words"))
    if expires_in_ms is not None and not 1 <= expires_in_ms <= MAX_GRANT_MS:
        raise ValueError(Text("error.grant-expiry", max=MAX_GRANT_MS))
    span = expires_in_ms if expires_in_ms is not None else DEFAULT_GRANT_MS[scope]
    return E.GrantTerms(scope=scope, tool=tool, command_prefix=command_prefix, expires_at=now + span)


def grant_of(e: E.ToolApprovalSettled) -> Grant | None:
    """The grant a settled approval made, if its answer made one."""
    s = e.settlement
    if s.grant is None or s.source != "answer" or s.state not in ("approved", "denied"):
        return None
    return Grant(id=e.approval_id, decision="approve" if s.state == "approved" else "deny", terms=s.grant,
                 turn_id=e.turn_id, at=s.at, by=s.by)


def _words(text: str) -> list[str] | None:
    try:
        return shlex.split(text)
    except ValueError:
        return None


def _starts_with(words: list[str] | None, prefix: list[str] | None) -> bool:
    return words is not None and prefix is not None and len(prefix) > 0 and words[: len(prefix)] == prefix


def matches(grant: Grant, tool: str, args: Any) -> bool:
    """Whether ``grant`` covers a call of ``tool`` with ``args`` (see the module doc)."""
    terms = grant.terms
    if terms.tool != tool:
        return False
    if terms.command_prefix is None:
        return True
    command = args.get("command") if isinstance(args, dict) else None
    if not isinstance(command, str):
        return False
    prefix = _words(terms.command_prefix)
    if grant.decision == "approve":
        return _COMPOUND.search(command) is None and _starts_with(_words(command), prefix)
    return any(_starts_with(_words(part), prefix) for part in _SEPARATORS.split(command))


def settling(grants: Iterable[Grant], tool: str, args: Any, now: int, current_turn: str | None,
             *, approving: bool) -> Grant | None:
    """The grant that settles a call now: a matching denying grant first (deny beats allow),
    else a matching approving one when ``approving`` (``ask`` mode), else None."""
    found: Grant | None = None
    for grant in grants:
        if not grant.active(now, current_turn) or not matches(grant, tool, args):
            continue
        if grant.decision == "deny":
            return grant
        if approving and found is None:
            found = grant
    return found


def settlement_by(grant: Grant, now: int) -> E.Settlement:
    """How a call ``grant`` settles is recorded: the grant's decision, naming it."""
    return E.Settlement(state="approved" if grant.decision == "approve" else "denied", source="grant", at=now,
                        grant_id=grant.id)


__all__ = ["DEFAULT_GRANT_MS", "MAX_GRANT_MS", "Grant", "grant_of", "matches", "settlement_by", "settling",
           "terms_for"]
