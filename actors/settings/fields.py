"""The session-setting fields (docs/owners.md, "Settings"): what a plugin declares with a
``session`` spec, the fields of this host (:func:`default_fields`), which sessions a field or a
layer's rows are for, and the order and prominence rows are listed in.

A field's identity is ``(plugin, key)``. Clients know no field: they render the declaration they
are sent (:meth:`SettingField.wire`, function members left out). Whether a value fits a field is
decided with the writes, in :mod:`actors.settings.decide`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Literal

from msgspec import UNSET

from sessionloop.actors.settings.context import Ident, Layer
from sessionloop.actors.settings.texts import Text
from sessionloop.actors.tools.sandbox import POLICIES
from sessionloop.protocol.schemas_types import PlaceLayer, PlatformTypeLayer, SettingActual

Prominence = Literal["composer", "common", "advanced"]  # a row's prominence, as the wire has it
PROMINENCE_RANK: dict[str, int] = {"composer": 0, "common": 1, "advanced": 2}
COMPOSER_PER_GROUP = 2  # at most two composer rows per group (plugin); the rest fall back to common
#: "no value on this layer" (``None`` is a value a write sends to delete one)
MISSING: Any = object()
#: the option source of the model field: the configured models (``GET /api/models/llm``)
MODEL_OPTIONS = "llm"

#: Effective values the agent runtime takes through ``Runtime.agent_config`` (values dict names).
AGENT_VALUES: dict[Ident, str] = {
    ("agent", "maxSteps"): "max_steps",
    ("agent", "systemPrompt"): "system_prompt",
    ("agent", "contextChars"): "context_chars",
    ("tools", "permissionMode"): "permission_mode",
    ("tools", "sandbox"): "sandbox",
}


@dataclass(frozen=True)
class SettingField:
    """A field a plugin declares with a ``session`` spec (sent as its wire schema field plus that spec)."""

    plugin: str
    key: str
    type: str  # string | text | integer | number | boolean | enum | llm-ref
    title: str
    description: str = ""
    default: Any = UNSET
    options: tuple[str, ...] = ()  # enum values
    minimum: float | None = None
    maximum: float | None = None
    max_length: int | None = None
    prominence: Prominence = "advanced"
    order: int | None = None
    applies_to: tuple[str, ...] | None = None  # session kinds: owner | room | task; None: all
    narrowest: str | None = None  # 'place': cannot be set on one session
    #: ``dynamicOptions``: the option source clients fetch with ``GET /api/models/<source>``
    dynamic_options: str | None = None
    #: the key of the row (same plugin) whose effective value the options depend on
    depends_on: str | None = None
    actual: Callable[[Any], SettingActual | None] | None = dc_field(default=None, compare=False)
    #: a further check of a value (why it does not fit, or None): ``llm/model`` must be configured
    check: Callable[[Any], str | None] | None = dc_field(default=None, compare=False)

    @property
    def ident(self) -> Ident:
        return (self.plugin, self.key)

    def wire(self) -> dict[str, Any]:
        """The declaration as sent in ``SettingRow.field`` (function members left out)."""
        out: dict[str, Any] = {"type": self.type, "title": self.title}
        if self.description:
            out["description"] = self.description
        if self.default is not UNSET:
            out["default"] = self.default
        if self.options:
            out["options"] = list(self.options)
        for name, value in (("minimum", self.minimum), ("maximum", self.maximum), ("maxLength", self.max_length),
                            ("dynamicOptions", self.dynamic_options), ("dependsOn", self.depends_on)):
            if value is not None:
                out[name] = value
        session: dict[str, Any] = {"prominence": self.prominence}
        if self.order is not None:
            session["order"] = self.order
        if self.applies_to is not None:
            session["appliesTo"] = list(self.applies_to)
        if self.narrowest is not None:
            session["narrowest"] = self.narrowest
        out["session"] = session
        return out

    def applies(self, kinds: frozenset[str] | None) -> bool:
        return kinds is None or self.applies_to is None or bool(kinds.intersection(self.applies_to))


def default_fields(rt: Any) -> list[SettingField]:
    """The fields of the agent runtime (``agent``), the model provider (``llm``) and the tool
    policy (``tools``); defaults are the host's options."""
    opts = rt.options

    def model_actual(state: Any) -> SettingActual | None:
        # the model in use without a setting: the one the session was created with, else the
        # default; as an entry id <name>/<model id>, the form the option list uses
        created = state.created if state is not None else None
        resolved = rt.models.resolve(created.model if created is not None else None)
        return SettingActual(value=resolved.entry_id, label=Text("settings.follow", model=resolved.model_id))

    def prompt_actual(state: Any) -> SettingActual | None:
        # shown when no layer sets a prompt: the built-in one this session is sent (a layer's
        # row: the one of a session with the host's defaults)
        if state is not None and state.created is not None:
            prompt = rt.agent_config(state).system_prompt
        else:
            prompt = rt.default_prompt(None, opts.sandbox_policy, opts.permission_mode or "ask")
        return SettingActual(value=prompt or "", label=Text("settings.builtin-prompt"))

    def permission_actual(state: Any) -> SettingActual | None:
        return SettingActual(value=rt.default_permission(state)) if state is not None else None

    def opt(value: Any) -> Any:
        return UNSET if value is None else value

    def title(plugin: str, key: str) -> Text:  # titles and descriptions: the catalogue's field.*
        return Text(f"field.{plugin}.{key}.title")

    def about(plugin: str, key: str) -> Text:
        return Text(f"field.{plugin}.{key}.description")

    return [
        SettingField("llm", "model", "llm-ref", title("llm", "model"), about("llm", "model"), prominence="composer",
                     order=1, dynamic_options=MODEL_OPTIONS, actual=model_actual,
                     check=lambda value: rt.models.check(value)),  # rt.models at call time: reloads swap it
        SettingField("tools", "permissionMode", "enum", title("tools", "permissionMode"),
                     about("tools", "permissionMode"),
                     # no default: unset, each session keeps the mode it was created with (actual)
                     options=("ask", "acceptCalls", "deny"),
                     prominence="composer", order=2, actual=permission_actual),
        # maxSteps defaults to 20 and may be unlimited; JSON has no Infinity: 0 is unlimited
        # (actors.session.decide.UNLIMITED_STEPS), and no finite maximum caps it
        SettingField("agent", "maxSteps", "integer", title("agent", "maxSteps"), about("agent", "maxSteps"),
                     default=opts.max_steps, minimum=0, prominence="common", order=3),
        SettingField("agent", "systemPrompt", "text", title("agent", "systemPrompt"), about("agent", "systemPrompt"),
                     default=opt(opts.system_prompt), max_length=100_000, prominence="common", order=4,
                     actual=prompt_actual),
        SettingField("agent", "contextChars", "integer", title("agent", "contextChars"),
                     about("agent", "contextChars"),
                     default=opt(opts.context_chars), minimum=1000, maximum=100_000_000, order=5),
        SettingField("tools", "sandbox", "enum", title("tools", "sandbox"), about("tools", "sandbox"),
                     default=opts.sandbox_policy, options=POLICIES, prominence="common", order=7),
        SettingField("tools", "execYieldSeconds", "number", title("tools", "execYieldSeconds"),
                     about("tools", "execYieldSeconds"),
                     default=opts.exec_yield_s, minimum=0, maximum=3600, order=6,
                     applies_to=("owner", "task"), narrowest="place"),
    ]


def effective_prominence(fields: Iterable[SettingField]) -> dict[Ident, Prominence]:
    """At most two composer items per group (plugin); the rest fall back to common."""
    out: dict[Ident, Prominence] = {}
    used: dict[str, int] = {}
    for f in sorted(fields, key=lambda f: (f.order is None, f.order or 0)):
        prominence: Prominence = f.prominence
        if prominence == "composer":
            used[f.plugin] = used.get(f.plugin, 0) + 1
            if used[f.plugin] > COMPOSER_PER_GROUP:
                prominence = "common"
        out[f.ident] = prominence
    return out


def sorted_fields(fields: Iterable[SettingField], prominence: Mapping[Ident, str]) -> list[SettingField]:
    """Row order: composer, common, then advanced; by declared order, those without one last."""
    return sorted(fields, key=lambda f: (PROMINENCE_RANK[prominence[f.ident]], f.order is None, f.order or 0))


def layer_kinds(layer: Layer, place_kind: str | None) -> frozenset[str] | None:
    """Which sessions a layer's rows are for: a platformType layer's apply to rooms and tasks, a
    window place's to rooms, a workspace place's to owner sessions; None: every field."""
    if isinstance(layer, PlatformTypeLayer):
        return frozenset({"room", "task"})
    if isinstance(layer, PlaceLayer):
        return frozenset({"room"}) if place_kind == "window" else frozenset({"owner"})
    return None


__all__ = [
    "AGENT_VALUES", "COMPOSER_PER_GROUP", "MISSING", "MODEL_OPTIONS", "PROMINENCE_RANK", "Prominence", "SettingField",
    "default_fields", "effective_prominence", "layer_kinds", "sorted_fields",
]
