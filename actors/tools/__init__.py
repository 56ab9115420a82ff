"""Tools the agent may call, confined to the session's workspace: a path outside it is refused.

``default_registry()`` holds the built-in tools; ``spawn_session`` is registered by the Session
Loop API through ``default_registry(extra=[...])`` or ``ToolRegistry.register``.
"""

from sessionloop.actors.tools.builtin import builtin_tools, default_registry, plan_from_output
from sessionloop.actors.tools.registry import ToolContext, ToolRegistry, ToolResult, ToolSpec
from sessionloop.actors.tools.workspace import ToolError, Workspace

__all__ = [
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "ToolResult",
    "ToolSpec",
    "Workspace",
    "builtin_tools",
    "default_registry",
    "plan_from_output",
]
