"""The default system prompt (issue "Real models in production": a prompt that tells the model its
tools and its workspace, replaced by the ``agent/systemPrompt`` setting).

:func:`default_system_prompt` is pure: it names each tool of the registry and whether it waits
for the user's approval (their descriptions and parameters travel with the request's tool
schemas, so they are not repeated: the prompt stays short beside small context budgets), the
workspace — relatively: paths are relative to it, and a project folder is named by its last
component only, never by the server's absolute
paths (the data directory must not leak to the model) — the sandbox policy ``exec`` runs
under, and what the permission mode does to tools that need approval.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from sessionloop.actors.tools.sandbox import UNSANDBOXED

#: what a command may do under each sandbox policy (actors.tools.sandbox)
SANDBOX_SENTENCES: dict[str, str] = {
    "read-only": "Commands (exec) run in a sandbox where they can read files but write nothing, "
                 "and have no network.",
    "workspace-write": "Commands (exec) run in a sandbox: they may write only inside the workspace, "
                       "and have no network.",
    "workspace-write+network": "Commands (exec) run in a sandbox: they may write only inside the workspace, "
                               "and may use the network.",
    "danger-full-access": "Commands (exec) run without a sandbox, with the server user's files and network.",
    UNSANDBOXED: "Commands (exec) run without a sandbox (the operator's choice), as the server's user.",
}

#: what happens to a tool that needs approval, by permission mode
MODE_SENTENCES: dict[str, str] = {
    "ask": "Tools marked (needs approval) wait for the user to approve the call; a denied call comes back "
           "as an error: do not repeat it unchanged.",
    "acceptCalls": "Tool calls run without asking the user.",
    "deny": "Tools marked (needs approval) are refused in this session: use the other tools.",
}


class ToolLine:
    """What the prompt says of one tool."""

    __slots__ = ("name", "needs_approval")

    def __init__(self, name: str, needs_approval: bool) -> None:
        self.name = name
        self.needs_approval = needs_approval


def workspace_label(cwd: str | None) -> str:
    """How the prompt names the workspace: a project folder by its last component, else the
    session's own directory. Never an absolute path."""
    if cwd:
        base = os.path.basename(os.path.normpath(cwd))
        if base and base not in (".", "..", os.sep):
            return f'the project folder "{base}"'
    return "a directory of your own for this session"


def default_system_prompt(tools: Sequence[ToolLine], *, cwd: str | None, sandbox: str,
                          permission_mode: str) -> str:
    """The system prompt of a session that sets none (pure)."""
    names = ", ".join(f"{t.name} (needs approval)" if t.needs_approval else t.name for t in tools)
    lines = [
        ("You are an agent working on the user's requests. Call a tool when you need to look at or change "
         "something; answer in plain text when you are done."),
        f"Tools: {names}." if tools else "You have no tools.",
        (f"Workspace: {workspace_label(cwd)}. Tool paths are relative to it (\".\" is its top); a path "
         "outside it is refused."),
        SANDBOX_SENTENCES.get(sandbox, f"Commands (exec) run under the sandbox policy {sandbox}."),
    ]
    sentence = MODE_SENTENCES.get(permission_mode)
    if sentence is not None:
        lines.append(sentence)
    lines.append("A failed tool call returns an error that says why: read it before trying again.")
    return "\n".join(lines)


__all__ = ["MODE_SENTENCES", "SANDBOX_SENTENCES", "ToolLine", "default_system_prompt", "workspace_label"]
