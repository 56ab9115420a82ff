"""The tool registry: what tools exist, what they accept, and how one call is run.

The agent's default loop lists the tool schemas for the model and executes each tool call
through this service (minus the actor).
Each :class:`ToolSpec` declares: a JSON schema of its parameters, whether it needs
approval (permission modes ``ask`` / ``acceptCalls`` / ``deny`` are applied by the session, not
here), whether it may move to the background, and its display kind for the protocol's tool-call
item (``command`` or ``file-change``).

Why :meth:`ToolRegistry.execute` never raises (except cancellation): a tool failing is a fact
the model must be told about (``tool.finished`` with ``status: failed``), not a crash of the
turn. Every error — bad arguments, a path outside the workspace, a missing file, a bug in a
tool — becomes ``ToolResult(is_error=True, output={"error": message})``. Cancellation is asyncio
task cancellation (a cancelled turn aborts its tool calls) and propagates.

Errors::

    SessionloopError (eventstore.errors)
    └── ToolError        a tool call cannot be carried out; the message is for the model
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from sessionloop.actors.events import ToolDisplay
from sessionloop.actors.model.storable import args_problem, refusal_of
from sessionloop.actors.tools.sandbox import DEFAULT_POLICY, Sandbox, default_sandbox
from sessionloop.actors.tools.workspace import ToolError, Workspace
from sessionloop.protocol.limits import MAX_INT, MAX_NESTING, MIN_INT
from sessionloop.protocol.nesting import nests_deeper

__all__ = ["ToolContext", "ToolError", "ToolRegistry", "ToolResult", "ToolSpec"]

log = logging.getLogger(__name__)

DisplayKind = Literal["command", "file-change"]


class ToolResult(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of one tool call: a JSON-able ``output`` for the model, plus facts for events."""

    output: Any = None
    is_error: bool = False
    exit_code: int | None = None

    @classmethod
    def error(cls, message: str) -> ToolResult:
        """The result of a failed call: ``{"error": message}``."""
        return cls(output={"error": message}, is_error=True)


def _noop_output(text: str) -> None:
    """Default ``on_output``: nobody streams this call's output."""


def _noop_before_image(path: str) -> None:
    """Default ``record_before_image``: no checkpoints (tests, ``rerun`` dry runs)."""


@dataclass
class ToolContext:
    """What a running tool may use besides its arguments.

    ``on_output(text)`` streams output (exec) to subscribers as it arrives.
    ``record_before_image(path)`` is called with the workspace-relative path *before* a tool
    changes a file (checkpoints: one before-image per file per turn); it may return an
    awaitable, which is awaited before the change, so the checkpoint can be persisted first.
    ``extras`` carries services that hooks like ``spawn_session`` need (the Session Loop API,
    the caller session); the core tools ignore it. ``exec`` runs its command in ``sandbox``
    under ``sandbox_policy`` (the policy recorded on the call's card).
    """

    workspace: Workspace
    turn_id: str = ""
    call_id: str = ""
    session_id: str | None = None
    on_output: Callable[[str], None] = _noop_output
    record_before_image: Callable[[str], Awaitable[None] | None] = _noop_before_image
    #: ``record_images([(path, existed, content)])``: before-images taken earlier (exec compares the
    #: workspace before and after the command, which cannot name its files in advance).
    record_images: Callable[[list[tuple[str, bool, bytes | None]]], Awaitable[None] | None] | None = None
    extras: Mapping[str, Any] = field(default_factory=dict)
    sandbox: Sandbox = field(default_factory=default_sandbox)
    sandbox_policy: str = DEFAULT_POLICY

    async def before_change(self, path: str) -> None:
        """Call ``record_before_image(path)`` and wait for it if it is asynchronous."""
        outcome = self.record_before_image(path)
        if inspect.isawaitable(outcome):
            await outcome


ToolHandler = Callable[[dict[str, Any], ToolContext], Awaitable["ToolResult | Any"]]
Describer = Callable[[dict[str, Any], Workspace], "ToolDisplay | None"]


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its schema, policy flags, display, and the coroutine that runs it.

    ``display_result_key`` names the output key that completes the display once the call
    finished (``exitCode`` for ``exec``). ``describe(args, workspace)`` builds the display shown
    when the call starts and in its approval card.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    handler: ToolHandler
    needs_approval: bool = False
    can_background: bool = False
    display_kind: DisplayKind | None = None
    display_result_key: str | None = None
    describe: Describer | None = None
    #: runs a command in the session's sandbox: its display names the policy
    sandboxed: bool = False

    def schema(self) -> dict[str, Any]:
        """The schema the model is given: ``{"name", "description", "parameters"}``."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def display(self, args: dict[str, Any], workspace: Workspace) -> ToolDisplay | None:
        """The display of a call with ``args``; None when the tool has none or it cannot be built."""
        if self.describe is None:
            return None
        try:
            return self.describe(args, workspace)
        except (ToolError, OSError, ValueError, TypeError) as e:
            log.debug("no display for %s: %s", self.name, e)
            return None

    def display_after(self, display: ToolDisplay | None, result: ToolResult) -> ToolDisplay | None:
        """``display`` completed with the result (the exit code of a command)."""
        if display is None or self.display_result_key is None:
            return display
        exit_code = result.exit_code
        if exit_code is None and isinstance(result.output, dict):
            value = result.output.get(self.display_result_key)
            exit_code = value if isinstance(value, int) else None
        return msgspec.structs.replace(display, exit_code=exit_code)


# --- argument validation ------------------------------------------------------------------------

_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


def _where(path: str) -> str:
    return f"field '{path}'" if path else "the arguments"


def _check(value: Any, schema: Mapping[str, Any], path: str) -> None:
    """Check ``value`` against the subset of JSON Schema tools use (type, enum, properties,
    required, items, additionalProperties); raise ToolError naming the field by its ``path``."""
    expected = schema.get("type")
    if expected is not None:
        names = [expected] if isinstance(expected, str) else list(expected)
        for n in names:
            accepts = _TYPES.get(n)
            if accepts is None or accepts(value):  # an unknown type name accepts anything
                break
        else:
            raise ToolError(f"{_where(path)} must be {' or '.join(names)}, got {_json_type(value)}")
    if isinstance(value, int) and not isinstance(value, bool) and not MIN_INT <= value <= MAX_INT:
        # JSON integers are unbounded; the store (msgpack) and every tool's arithmetic are not
        raise ToolError(f"{_where(path)} must be an integer from -2**63 to 2**63-1")
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(repr(c) for c in schema["enum"])
        raise ToolError(f"{_where(path)} must be one of {choices}, got {value!r}")
    if isinstance(value, dict):
        _check_object(value, schema, path)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            _check(item, schema["items"], f"{path}[{i}]")


def _check_object(value: dict[str, Any], schema: Mapping[str, Any], path: str) -> None:
    properties: Mapping[str, Any] = schema.get("properties") or {}
    prefix = f"{path}." if path else ""
    for key in schema.get("required") or []:
        if key not in value:
            raise ToolError(f"missing required field '{prefix}{key}'")
    for key, item in value.items():
        if key in properties:
            _check(item, properties[key], f"{prefix}{key}")
        elif schema.get("additionalProperties") is False:
            raise ToolError(f"unknown field '{prefix}{key}'")


def _json_type(value: Any) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _TYPES[name](value):
            return name
    return type(value).__name__


# --- the registry -------------------------------------------------------------------------------


class ToolRegistry:
    """The tools one session may call, by name (the agent loop's tool service)."""

    def __init__(self, tools: Iterable[ToolSpec] = ()) -> None:
        self._tools: dict[str, ToolSpec] = {}
        self._schemas: list[dict[str, Any]] | None = None  # built once per set of tools
        for spec in tools:
            self.register(spec)

    def register(self, spec: ToolSpec, *, replace: bool = False) -> None:
        """Add a tool. A second tool with the same name is our own misuse: ValueError."""
        if spec.name in self._tools and not replace:
            raise ValueError(f"a tool named {spec.name!r} is already registered")
        self._tools[spec.name] = spec
        self._schemas = None

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        return list(self._tools)

    def get(self, name: str) -> ToolSpec:
        """The tool called ``name``; ToolError (for the model) when there is none."""
        spec = self._tools.get(name)
        if spec is None:
            raise ToolError(f"unknown tool {name!r}; available: {', '.join(sorted(self._tools))}")
        return spec

    def schemas(self) -> list[dict[str, Any]]:
        """Every tool's schema, in registration order, for :class:`ModelRequest.tools`.

        Built once per set of tools (every model call asks): the list is shared, read only."""
        if self._schemas is None:
            self._schemas = [spec.schema() for spec in self._tools.values()]
        return self._schemas

    def validate(self, name: str, args: Any) -> dict[str, Any]:
        """The arguments of a call to ``name`` checked against its schema.

        Accepts a JSON string (a model's unparsed arguments) or a dict; raises ToolError naming
        the field that is missing or has the wrong type (an integer outside int64 is the wrong
        type), or with the sentence of arguments that could not be stored.
        """
        spec = self.get(name)
        if args is None:
            args = {}
        if isinstance(args, str):
            too_deep = ToolError(f"the arguments of {name} nest too deeply (more than {MAX_NESTING} levels)")
            if nests_deeper(args, MAX_NESTING):  # msgspec's own limit depends on the Python (protocol/nesting.py)
                raise too_deep
            try:
                args = msgspec.json.decode(args) if args.strip() else {}
            except msgspec.DecodeError as e:
                raise ToolError(f"the arguments of {name} are not valid JSON: {e}") from e
            except RecursionError as e:  # not after the check above; kept total
                raise too_deep from e
            problem = args_problem(args)  # decoded here, so never checked on the way to the store
            if problem is not None:
                raise ToolError(problem)
        refused = refusal_of(args)
        if refused is not None:  # the model's arguments could not be stored (actors/model/storable.py)
            raise ToolError(refused)
        if not isinstance(args, dict):
            raise ToolError(f"the arguments of {name} must be a JSON object, got {_json_type(args)}")
        _check(args, spec.parameters, "")
        return args

    async def execute(self, name: str, args: Any, ctx: ToolContext) -> ToolResult:
        """Validate and run one call. Never raises except :class:`asyncio.CancelledError`."""
        try:
            checked = self.validate(name, args)
            outcome = await self.get(name).handler(checked, ctx)
        except asyncio.CancelledError:
            raise
        except ToolError as e:
            return ToolResult.error(str(e))
        except Exception as e:  # a bug in a tool must not take the turn down with it
            log.exception("tool %s failed", name)
            return ToolResult.error(f"{name} failed: {type(e).__name__}: {e}")
        if isinstance(outcome, ToolResult):
            return outcome
        return ToolResult(output=outcome)
