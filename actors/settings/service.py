"""Session settings (docs/owners.md, "Settings"): the fields plugins declare with a ``session``
spec, the layers they are set on, and the effective values a session's agent runs with.

Theory of operation
-------------------
A *field* is declared by a plugin instance (here ``agent``, ``llm`` and ``tools``); a row's
identity is ``(plugin, key)``. Clients know no field: they render the declaration they are sent
(:meth:`SettingField.wire`, function members left out).

Layers, in the nominal order of ``session/config/layers`` (later ones win)::

    global < platform < platformType < place < session

The effective precedence for one session depends on its place (a window place is above the platform
layers, a workspace place only above global)::

    window place     global < platform < platformType < place < session
    workspace place  global < place < platform < platformType < session

A child session resolves platform, chat type and place through its root; its session layer is
its own. Where each layer lives:

* global, platform, platformType: the host configuration document ``<data>/config.toml``::

      [plugins.<plugin>]                                   global (the plugin's configuration)
      [sessionSettings.platform.<platform>.<plugin>]
      [sessionSettings.platformType.<platform>.<type>.<plugin>]

  written atomically (temp file, fsync, rename), keeping every other key (``name``...). A write
  takes effect in memory first and is then saved; a failed save is not undone but reported as
  ``unsaved``.
* place: ``place.registered`` / ``place.setting.changed`` events in stream ``place-<key>``;
* session: ``session.setting.changed`` events on the session (``state.settings``).

Places: ``window`` (an IM group or someone's private chat, from ``SessionCreated.place``) and
``workspace`` (the default workspace; a project workspace per folder, the session's ``cwd``). An
owner root without a recorded place is in a workspace; a room without one has no place layer.
A place is recorded (stream ``place-<key>``) when the first session in it is seen.

Invalid input (unknown field, bad value, a field that does not apply to the session or layer,
a session value for a ``narrowest: 'place'`` field, a bad layer, an unrecorded place key) raises
:class:`InvalidSetting` before anything changes; ``null`` deletes and skips the scope rules.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Literal

import msgspec
from msgspec import UNSET

from sessionloop.actors import events as E
from sessionloop.actors.errors import InvalidCommand
from sessionloop.actors.session.decide import ensure_usable
from sessionloop.actors.settings.context import (
    DEFAULT_WORKSPACE,
    DEFAULT_WORKSPACE_NAME,
    Chain,
    Ident,
    Layer,
    PlaceFacts,
    SessionContext,
    layer_chain,
    place_of,
    root_context,
    session_chain,
    settings_of,
)
from sessionloop.actors.settings.document import ConfigDocument, dump_toml, layer_path, setting_values
from sessionloop.actors.settings.texts import Text, language_of
from sessionloop.actors.system.ports import Commit
from sessionloop.actors.tools.sandbox import POLICIES
from sessionloop.eventstore.errors import WrongExpectedVersion
from sessionloop.protocol.limits import MAX_INT, MIN_INT
from sessionloop.protocol.schemas_types import (
    PlaceLayer,
    PlatformLayer,
    PlatformTypeLayer,
    SettingActual,
    SettingRow,
    SettingSource,
)

log = logging.getLogger("sessionloop.settings")

OWNER_PLATFORM = "console"  # the owner token's identity is {platform: 'console'}
Prominence = Literal["composer", "common", "advanced"]  # a row's prominence, as the wire has it
PROMINENCE_RANK: dict[str, int] = {"composer": 0, "common": 1, "advanced": 2}
COMPOSER_PER_GROUP = 2  # at most two composer rows per group (plugin); the rest fall back to common
_MISSING: Any = object()
#: the option source of the model field: the configured models (``GET /api/models/llm``)
MODEL_OPTIONS = "llm"


class InvalidSetting(InvalidCommand):
    """The peer asked for a write the rules refuse (the gateway answers ``invalidParams``)."""


# --- fields ---------------------------------------------------------------------------------------


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


def check_value(f: SettingField, value: Any) -> str | None:
    """Why ``value`` does not fit ``f`` (a sentence naming the field: a text object, English as a
    string), or None when it fits."""
    problem = _type_problem(f, value)
    if problem is None and f.check is not None:
        found = f.check(value)
        problem = None if found is None else f"{f.plugin}/{f.key}: {found}"
    return problem


def _type_problem(f: SettingField, value: Any) -> Any:
    name = f"{f.plugin}/{f.key}"
    if f.type in ("string", "text", "llm-ref"):
        if not isinstance(value, str):
            return Text("setting.expected-string", name=name)
        if f.type == "llm-ref" and not value.strip():
            return Text("setting.expected-model", name=name)
        if f.max_length is not None and len(value) > f.max_length:
            return Text("setting.max-length", name=name, max=f.max_length)
        return None
    if f.type == "boolean":
        return None if isinstance(value, bool) else Text("setting.expected-boolean", name=name)
    if f.type == "enum":
        return None if isinstance(value, str) and value in f.options else \
            Text("setting.expected-enum", name=name, options=", ".join(f.options))
    if f.type in ("integer", "number"):
        expected = Text(f"setting.expected-{f.type}", name=name)
        numeric = isinstance(value, int) or (f.type == "number" and isinstance(value, float))
        # an int is never checked with math.isfinite: it overflows on 10**400 (the Python API
        # passes any int; the wire refuses ones outside int64 before they get here)
        if isinstance(value, bool) or not numeric or (isinstance(value, float) and not math.isfinite(value)):
            return expected
        if f.minimum is not None and value < f.minimum:
            return Text("setting.at-least", name=name, min=f"{f.minimum:g}")
        if f.maximum is not None and value > f.maximum:
            return Text("setting.at-most", name=name, max=f"{f.maximum:g}")
        if isinstance(value, int) and not MIN_INT <= value <= MAX_INT:  # the store holds int64
            return Text(f"setting.{f.type}-range", name=name)
        return None
    return Text("setting.unknown-type", name=name, type=repr(f.type))


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


def resolve(f: SettingField, chain: Chain) -> tuple[Any, SettingSource] | None:
    """The effective value of ``f`` and its source: the highest layer with a valid value, then
    the field's default, else None (the row then shows the plugin's ``actual`` value, else nothing)."""
    for source, values in reversed(chain):
        value = values.get(f.ident, _MISSING)
        if value is not _MISSING and check_value(f, value) is None:
            return value, source
    if f.default is not UNSET:
        return f.default, "default"
    return None


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


def make_row(f: SettingField, prominence: Prominence, own: Any, resolved: tuple[Any, SettingSource] | None,
             actual: SettingActual | None) -> SettingRow:
    return SettingRow(plugin=f.plugin, key=f.key, field=f.wire(), prominence=prominence,
                      value=UNSET if own is _MISSING else own,
                      effective=resolved[0] if resolved is not None else UNSET,
                      source=resolved[1] if resolved is not None else None,
                      actual=actual if resolved is None else None)


def session_setting_events(f: SettingField | None, plugin: str, key: str, kind: str, current: Any, value: Any,
                           now: int) -> list[E.Event]:
    """Decide a write to one session's layer (pure). Raises InvalidSetting, changing nothing."""
    if f is None:
        raise InvalidSetting(Text("setting.no-such", field="params.key", name=f"{plugin}/{key}"))
    if value is not None:
        if f.narrowest == "place":
            raise InvalidSetting(Text("setting.place-narrowest", field="params.key", name=f"{plugin}/{key}"))
        if not f.applies(frozenset({kind})):
            raise InvalidSetting(Text("setting.not-for-kind", field="params.key", name=f"{plugin}/{key}", kind=kind))
        problem = check_value(f, value)
        if problem is not None:
            raise InvalidSetting(Text("setting.field-problem", field="params.value", problem=problem))
    if value is None:
        return [] if current is _MISSING else [E.SessionSettingChanged(at=now, plugin=plugin, key=key, deleted=True)]
    if current is not _MISSING and current == value and type(current) is type(value):
        return []
    return [E.SessionSettingChanged(at=now, plugin=plugin, key=key, value=value)]


# --- the service ----------------------------------------------------------------------------------

#: Effective values the agent runtime takes through ``Runtime.agent_config`` (values dict names).
AGENT_VALUES: dict[Ident, str] = {
    ("agent", "maxSteps"): "max_steps",
    ("agent", "systemPrompt"): "system_prompt",
    ("agent", "contextChars"): "context_chars",
    ("tools", "permissionMode"): "permission_mode",
    ("tools", "sandbox"): "sandbox",
}
_ROOT_CACHE = 10_000


class SettingsService:
    """The session settings service of one runtime (``runtime.settings``, made by the composition root).

    Thread-safe. Session actor threads resolve (:meth:`resolve_config`, a runtime config
    resolver) and report commits (:meth:`committed`, a runtime listener); the gateway's pool reads
    rows and writes layers. Reads hold a short lock; writers are serialised by a second lock, and
    store appends and file writes never run on an actor thread.
    """

    def __init__(self, rt: Any, index: Any, submit: Callable[[Callable[[], None]], Any]) -> None:
        self.rt = rt
        self.index = index
        self._submit = submit
        self._lock = threading.RLock()
        self._write_lock = threading.Lock()
        self._scan_lock = threading.Lock()
        self.fields: dict[Ident, SettingField] = {}
        self.platform_types: dict[str, dict[str, str | None]] = {}
        self.doc = ConfigDocument(os.path.join(rt.data_dir, "config.toml"))
        #: bumped when something every session's options depend on changed (``Runtime.config_generation``)
        self.generation = 0
        #: the language human text is rendered in (``Runtime.language``): config.toml's, else the host's option
        self.language = language_of(rt.options.language)
        self._apply_language()
        self.default_name = DEFAULT_WORKSPACE_NAME  # recorded as data; shown in the server's language
        self.places: dict[str, PlaceFacts] = {
            DEFAULT_WORKSPACE: PlaceFacts(key=DEFAULT_WORKSPACE, kind="workspace", name=self.default_name)}
        self.registered: set[str] = set()
        self.place_values: dict[str, dict[Ident, Any]] = {}
        self._roots: dict[str, SessionContext] = {}
        self._session_values: dict[str, dict[Ident, tuple[int, Any]]] = {}
        self._scanned = False
        self.on_change: list[Callable[[], None]] = []
        self._seen_platforms: set[tuple[str | None, str | None]] = {(OWNER_PLATFORM, None)}
        for f in default_fields(rt):
            self.fields[f.ident] = f
        #: option sources by name (what ``GET /api/models/<source>`` answers), ``answer(dependency) -> options``
        self.option_sources: dict[str, Callable[[str | None], list[dict[str, Any]]]] = {
            MODEL_OPTIONS: lambda dependency: rt.models.options()}
        if self.doc.problem is not None:  # at start there is nothing older to keep
            log.warning("%s: %s; no settings are read from it (fix the file, then send the server SIGHUP)",
                        self.doc.path, self.doc.problem)
        else:
            problem = self._document_values_problem(self.doc.doc)
            if problem is not None:  # kept and shown (a row shows an invalid global value as it is), never in force
                log.warning("%s: %s; that value is not used (fix the file, then send the server SIGHUP)",
                            self.doc.path, problem)
        self._load_places()

    # --- declarations -------------------------------------------------------------------------

    def declare(self, fields: Iterable[SettingField]) -> None:
        """Register fields (a plugin came up); values already stored for them apply again."""
        with self._lock:
            for f in fields:
                if not f.plugin or "/" in f.plugin or not f.key or f.prominence not in PROMINENCE_RANK:
                    raise ValueError(f"bad session field declaration {f.plugin!r}/{f.key!r}")
                self.fields[f.ident] = f
        self._changed(generation=True)

    def withdraw(self, plugin: str) -> None:
        """A plugin went away: its rows are no longer listed; its values are kept."""
        with self._lock:
            for ident in [i for i in self.fields if i[0] == plugin]:
                del self.fields[ident]
        self._changed(generation=True)

    def declare_platform(self, platform: str, types: Mapping[str, str | None]) -> None:
        """An adapter's platform and the chat types it declares, with their display names."""
        with self._lock:
            self.platform_types.setdefault(platform, {}).update(types)
        self._changed(generation=False)

    def declare_options(self, source: str, answer: Callable[[str | None], list[dict[str, Any]]]) -> None:
        """An option source (one a plugin contributes). ``answer(dependency)`` lists
        the options of the fields declaring ``dynamicOptions=source``; ``dependency`` is what the
        client sends for a field with ``dependsOn``: the effective value of the row it depends
        on (that row's actual when unset), else None."""
        if not source or len(source) > 64 or not all(c.isalnum() or c in "_.-" for c in source):
            raise ValueError(f"bad option source name {source!r}")
        with self._lock:
            self.option_sources[source] = answer
        self._changed(generation=False)

    def option_list(self, source: str, dependency: str | None) -> list[dict[str, Any]] | None:
        """The options of ``source`` (``GET /api/models/<source>``), or None for an unknown one."""
        with self._lock:
            answer = self.option_sources.get(source)
        return None if answer is None else answer(dependency)

    def changed_elsewhere(self) -> None:
        """Something fields depend on changed outside the layers (the configured models were
        reloaded): sessions re-resolve, clients are told to re-read (``session/config/changed``)."""
        self._changed(generation=True)

    def plugins(self) -> set[str]:
        with self._lock:
            return {plugin for plugin, _ in self.fields}

    def field(self, plugin: str, key: str) -> SettingField | None:
        with self._lock:
            return self.fields.get((plugin, key))

    # --- places -------------------------------------------------------------------------------

    def _load_places(self) -> None:
        store, after = self.rt.store, None
        while True:
            page = store.list_streams("place", after, 500)
            for stream in page.streams:
                self._fold_place(stream[len("place-"):], [r.event for r in store.read_stream(stream)])
            if page.next_after is None:
                break
            after = page.next_after
        for rec in self.index.records():
            if rec.parent_id is None and rec.platform:
                self._seen_platforms.update({(rec.platform, None),
                                             (rec.platform, rec.chat.type if rec.chat is not None else None)})
            if rec.parent_id is None and rec.place is not None:
                chat = rec.chat.type if rec.chat is not None else None
                self.know_place(PlaceFacts(key=rec.place.key, kind=rec.place.kind, name=rec.place.name or rec.place.key,
                                           platform=rec.platform if rec.place.kind == "window" else None,
                                           type=chat if rec.place.kind == "window" else None), register=False)

    def _fold_place(self, key: str, events: Iterable[Any]) -> None:
        with self._lock:
            for e in events:
                if isinstance(e, E.PlaceRegistered):
                    known = self.places.get(key)
                    self.places[key] = PlaceFacts(key=key, kind=e.kind, name=e.name or key,
                                                  platform=known.platform if known else None,
                                                  type=known.type if known else None)
                    self.registered.add(key)
                elif isinstance(e, E.PlaceSettingChanged):
                    values = self.place_values.setdefault(key, {})
                    if e.deleted:
                        values.pop((e.plugin, e.key), None)
                    else:
                        values[(e.plugin, e.key)] = e.value

    def know_place(self, facts: PlaceFacts | None, register: bool = True) -> bool:
        """Remember a place a session is in, and record it (stream ``place-<key>``) off this
        thread; True when the list of layers changed (a new place, or a window's platform)."""
        if facts is None:
            return False
        with self._lock:
            known = self.places.get(facts.key)
            grew = known is None or bool((facts.platform and not known.platform) or (facts.type and not known.type))
            if known is None:
                self.places[facts.key] = facts
            elif grew:
                self.places[facts.key] = msgspec.structs.replace(
                    known, platform=known.platform or facts.platform, type=known.type or facts.type)
            needed = register and facts.key not in self.registered
        if needed:
            self._submit(lambda: self._register(facts.key))
        return grew

    def _new_layers(self, created: E.SessionCreated) -> bool:
        """Whether a new root adds a layer to ``session/config/layers`` (place, platform, type)."""
        grew = self.know_place(place_of(created, self.default_name))
        ctx = root_context(created, self.default_name)
        seen = [(ctx.platform, None), (ctx.platform, ctx.chat_type)] if ctx.platform else []
        with self._lock:
            fresh = [pair for pair in seen if pair not in self._seen_platforms]
            self._seen_platforms.update(fresh)
        return grew or bool(fresh)

    def _register(self, key: str) -> None:
        with self._write_lock:
            with self._lock:
                facts = self.places.get(key)
                if facts is None or key in self.registered:
                    return
            try:
                self.rt.store.append(f"place-{key}", [E.PlaceRegistered(at=_now(), key=key, kind=facts.kind,
                                                                        name=facts.name)], expected_version=0)
            except WrongExpectedVersion:
                pass  # recorded meanwhile (another service on this runtime)
            except Exception:
                log.exception("could not record place %s", key)
                return
            with self._lock:
                self.registered.add(key)

    # --- session context ------------------------------------------------------------------------

    def context_of(self, state: Any) -> SessionContext | None:
        """The session's kind and its root's platform, chat type and place; None before creation."""
        created = state.created
        if created is None:
            return None
        if created.parent_id is None:
            ctx = root_context(created, self.default_name)
            self.know_place(ctx.place)
            return ctx
        root = self._root_context(self._root_of(created.parent_id))
        if root is None:  # the root's events are gone: only global and the session's own layer
            return SessionContext(kind=created.kind, root_id=created.session_id)
        return msgspec.structs.replace(root, kind=created.kind)

    def _root_of(self, session_id: str) -> str:
        seen = {session_id}
        rec = self.index.get(session_id)
        while rec is not None and rec.parent_id is not None and rec.parent_id not in seen:
            seen.add(rec.parent_id)
            session_id = rec.parent_id
            rec = self.index.get(session_id)
        return session_id

    def _root_context(self, root_id: str) -> SessionContext | None:
        with self._lock:
            cached = self._roots.get(root_id)
        if cached is not None:
            return cached
        first = self.rt.store.read_stream(f"session-{root_id}", 1, 1)
        if not first or not isinstance(first[0].event, E.SessionCreated):
            return None
        ctx = root_context(first[0].event, self.default_name)
        self.know_place(ctx.place)
        with self._lock:
            if len(self._roots) >= _ROOT_CACHE:
                self._roots.clear()
            self._roots[root_id] = ctx
        return ctx

    # --- reading ----------------------------------------------------------------------------------

    def layer_values(self, layer: Layer) -> Mapping[Ident, Any]:
        """The values written on ``layer`` (call with the lock held)."""
        if isinstance(layer, PlaceLayer):
            return self.place_values.get(layer.key, {})
        if isinstance(layer, PlatformLayer):
            return self.doc.values(["sessionSettings", "platform", layer.platform])
        if isinstance(layer, PlatformTypeLayer):
            return self.doc.values(["sessionSettings", "platformType", layer.platform, layer.type])
        return self.doc.values(["plugins"])

    def refresh_host_config(self) -> bool:
        """Pick up an edit of the configuration document made by someone else: True when a new
        version is in force. An edit that is not a configuration document, or holds a value one
        of the fields refuses, is refused (logged once; the values read before stay in force)."""
        with self._lock:
            changed = self.doc.refresh(self._document_values_problem)
        if changed:
            self._apply_language()
            self._changed(generation=True)  # the next decision of every session reads the new values
        return changed

    def _apply_language(self) -> None:
        """The global layer's language, in which human text is rendered: config.toml's
        ``language``, else the host's option (``serve --language``). Frames encoded from now on
        use it (``Runtime.language``)."""
        with self._lock:
            chosen = self.doc.doc.get("language")
        self.language = language_of(chosen if chosen is not None else self.rt.options.language)

    def reload_host_config(self) -> str:
        """``serve``'s SIGHUP: re-read the configuration document now; one line saying what came of it."""
        path = self.doc.path
        if self.refresh_host_config():
            return f"{path} reloaded"
        if self.doc.problem is not None:
            return f"{path} refused: {self.doc.problem}; the settings read before stay in force"
        return f"{path} unchanged"

    def app_name(self) -> str | None:
        """The document's ``name`` (the ``appName`` of a handshake), re-read if the file changed."""
        self.refresh_host_config()
        with self._lock:
            name = self.doc.doc.get("name")
        return name if isinstance(name, str) and name else None

    def _document_values_problem(self, doc: dict[str, Any]) -> str | None:
        """The first value of a declared field the field refuses, as ``<where in the file>: <why>``."""
        with self._lock:
            for where, plugin, key, value in setting_values(doc):
                f = self.fields.get((plugin, key))
                problem = check_value(f, value) if f is not None else None
                if problem is not None:
                    return f"{where}: {problem.split(': ', 1)[-1]}"
        return None

    def effective(self, state: Any) -> dict[Ident, tuple[Any, SettingSource] | None]:
        """The effective value and source of every field that applies to the session."""
        ctx = self.context_of(state)
        if ctx is None:
            return {}
        own = settings_of(state)
        kinds = frozenset({ctx.kind})
        with self._lock:
            chain = session_chain(ctx, ctx.platform, self.layer_values, own)
            return {f.ident: resolve(f, chain) for f in self.fields.values() if f.applies(kinds)}

    def session_rows(self, state: Any, connection_platform: str | None) -> tuple[list[SettingRow], str | None]:
        """``session/config/get``: the rows for this session and the platform its platform layer
        used (the birth or entry platform, else the asking connection's)."""
        ctx = self.context_of(state)
        assert ctx is not None, "ensure_usable first"
        platform = ctx.platform or connection_platform
        own = settings_of(state)
        kinds = frozenset({ctx.kind})
        with self._lock:
            chain = session_chain(ctx, platform, self.layer_values, own)
            prominence = effective_prominence(self.fields.values())
            fields = [f for f in self.fields.values() if f.applies(kinds) and f.narrowest != "place"]
        rows = [self._row(f, prominence, own.get(f.ident, _MISSING), resolve(f, chain), state)
                for f in sorted_fields(fields, prominence)]
        return rows, platform

    def _row(self, f: SettingField, prominence: Mapping[Ident, Prominence], own: Any,
             resolved: tuple[Any, SettingSource] | None,
             state: Any) -> SettingRow:
        actual = None
        if resolved is None and f.actual is not None:
            try:
                actual = f.actual(state)
            except Exception:  # a plugin's actual() must not fail the whole answer
                log.exception("actual() of %s/%s failed", f.plugin, f.key)
        return make_row(f, prominence[f.ident], own, resolved, actual)

    def check_layer(self, layer: Layer) -> PlaceFacts | None:
        """Raise InvalidSetting for a layer that cannot be read or written; a place's facts."""
        names = [("platform", getattr(layer, "platform", None)), ("type", getattr(layer, "type", None))]
        for name, value in names:
            if value is not None and (not value.strip() or any(ord(c) < 0x20 for c in value)):
                raise InvalidSetting(Text(f"setting.bad-{name}", field=f"params.layer.{name}"))
        if not isinstance(layer, PlaceLayer):
            return None
        with self._lock:
            place = self.places.get(layer.key)
        if place is None:
            raise InvalidSetting(Text("setting.no-place", field="params.layer.key", key=repr(layer.key)))
        return place

    def layer_rows(self, layer: Layer) -> list[SettingRow]:
        """``session/config/layer/get``: the rows of one layer, effective up to that layer."""
        place = self.check_layer(layer)
        kinds = layer_kinds(layer, place.kind if place is not None else None)
        with self._lock:
            chain = layer_chain(layer, place, self.layer_values)
            own = dict(self.layer_values(layer))
            prominence = effective_prominence(self.fields.values())
            fields = [f for f in self.fields.values() if f.applies(kinds)]
        return [self._row(f, prominence, own.get(f.ident, _MISSING), resolve(f, chain), None)
                for f in sorted_fields(fields, prominence)]

    # --- writing ----------------------------------------------------------------------------------

    def session_events(self, state: Any, plugin: str, key: str, value: Any, now: int) -> list[E.Event]:
        """The events of a write to one session's layer (the session decides a ``SetSetting`` command with it)."""

        ensure_usable(state)
        current = state.settings.get(f"{plugin}/{key}", _MISSING)
        return session_setting_events(self.field(plugin, key), plugin, key, state.created.kind, current, value, now)

    def update_layer(self, layer: Layer, plugin: str, key: str, value: Any) -> str | None:
        """Write (or with ``None`` delete) a value on a layer; the ``unsaved`` sentence if the
        configuration document could not be written. Raises InvalidSetting (nothing changed),
        or a store error for a place (nothing changed either)."""
        with self._write_lock:
            self.refresh_host_config()
            place = self.check_layer(layer)
            f = self.field(plugin, key)
            if f is None:
                raise InvalidSetting(Text("setting.no-such", field="params.key", name=f"{plugin}/{key}"))
            if value is not None:
                if not f.applies(layer_kinds(layer, place.kind if place is not None else None)):
                    raise InvalidSetting(Text("setting.not-for-layer", field="params.key", name=f"{plugin}/{key}"))
                problem = check_value(f, value)
                if problem is not None:
                    raise InvalidSetting(Text("setting.field-problem", field="params.value", problem=problem))
            if place is not None:
                self._write_place(place, f, value)
                return None
            return self._write_document(layer, f, value)

    def _write_document(self, layer: Layer, f: SettingField, value: Any) -> str | None:
        with self._lock:
            current = self.layer_values(layer).get(f.ident, _MISSING)
            if _same(current, value):
                return None
            self.doc.put([*layer_path(layer, f.plugin), f.key], value)
            rendered = dump_toml(self.doc.doc)
        self._changed(generation=True)  # in effect first, then saved
        return self.doc.save(rendered)

    def _write_place(self, place: PlaceFacts, f: SettingField, value: Any) -> None:
        key, now = place.key, _now()
        with self._lock:
            current = self.place_values.get(key, {}).get(f.ident, _MISSING)
            registered = key in self.registered
        if _same(current, value):
            return
        events: list[E.Event] = [] if registered else [
            E.PlaceRegistered(at=now, key=key, kind=place.kind, name=place.name)]
        events.append(E.PlaceSettingChanged(at=now, plugin=f.plugin, key=f.key, value=value,
                                            deleted=value is None))
        self.rt.store.append(f"place-{key}", events)
        self._fold_place(key, events)
        self._changed(generation=True)

    # --- the agent's side -----------------------------------------------------------------------

    def resolve_config(self, state: Any, values: dict[str, Any]) -> None:
        """Called by ``Runtime.agent_config`` (this service is ``runtime.settings``): the
        effective layered values replace the host's options for the next decision (values from no
        layer leave the host's choice alone)."""
        try:
            effective = self.effective(state)
        except Exception:  # resolving must never fail the session
            log.exception("resolving the settings of %s failed", state.session_id)
            return
        for ident, name in AGENT_VALUES.items():
            found = effective.get(ident)
            if found is not None and found[1] != "default":
                values[name] = found[0]
        model = effective.get(("llm", "model"))
        if model is not None and model[1] != "default":
            values["model"] = model[0]  # a configured model, by name or entry id (actors.model.registry)
        yield_s = effective.get(("tools", "execYieldSeconds"))
        if yield_s is not None and yield_s[1] != "default":
            values["exec_yield_s"] = float(yield_s[0])

    def committed(self, commit: Commit) -> None:
        """A commit listener (``actors.system.ports``): places of new roots, the overrides index, and
        ``session/config/changed`` when what clients show of settings changed: a session's own
        value; a session created in a new place or platform (the layer list grows); a session
        with own values deleted (overrides shrink). A session that changes neither pushes
        nothing: clients only re-read settings, layers and quick switches on the push."""
        changed = False
        for i, e in enumerate(commit.events):
            if isinstance(e, E.SessionSettingChanged):
                self._note(commit.session_id, e, commit.result.first_position + i)
                changed = True
            elif isinstance(e, E.SessionCreated) and e.parent_id is None:
                changed = self._new_layers(e) or changed
            elif isinstance(e, E.SessionDeleted):
                with self._lock:
                    self._session_values.pop(commit.session_id, None)
                changed = changed or bool(commit.state.settings)
        if changed:
            self._changed(generation=False)

    def _changed(self, generation: bool) -> None:
        if generation:
            with self._lock:
                self.generation += 1  # session actors drop their cached AgentConfig
        for callback in list(self.on_change):
            try:
                callback()
            except Exception:
                log.exception("a session/config/changed listener failed")

    # --- overrides ----------------------------------------------------------------------------

    def _note(self, session_id: str, e: E.SessionSettingChanged, position: int) -> None:
        with self._lock:
            values = self._session_values.setdefault(session_id, {})
            known = values.get((e.plugin, e.key))
            if known is None or known[0] < position:
                values[(e.plugin, e.key)] = (position, _MISSING if e.deleted else e.value)

    def _scan_sessions(self) -> None:
        """Index every session's own values once, from the log (lazy: only overrides needs it;
        commits after the service started are noted as they happen, newer positions win)."""
        with self._scan_lock:
            if self._scanned:
                return
            for recorded in self.rt.store.iter_all():
                e = recorded.event
                if isinstance(e, E.SessionSettingChanged) and recorded.stream.startswith("session-"):
                    self._note(recorded.stream[len("session-"):], e, recorded.position)
            self._scanned = True

    def overrides(self, plugin: str) -> dict[Ident, list[tuple[Layer | str, Any]]]:
        """Where ``plugin``'s fields are set beyond global: layers, then sessions (by id)."""
        if plugin not in self.plugins():
            raise InvalidSetting(Text("setting.no-plugin", field="params.plugin", plugin=repr(plugin)))
        self._scan_sessions()
        with self._lock:
            fields = sorted_fields([f for f in self.fields.values() if f.plugin == plugin],
                                   effective_prominence(self.fields.values()))
            layers = self._written_layers()
            sessions = {sid: {i: v for i, (_, v) in vals.items() if v is not _MISSING}
                        for sid, vals in self._session_values.items()}
            found: dict[Ident, list[tuple[Layer | str, Any]]] = {}
            for f in fields:
                entries: list[tuple[Layer | str, Any]] = []
                for layer in layers:
                    value = self.layer_values(layer).get(f.ident, _MISSING)
                    if value is not _MISSING:
                        entries.append((layer, value))
                for sid in sorted(sessions):
                    if f.ident in sessions[sid] and self.index.get(sid) is not None:
                        entries.append((sid, sessions[sid][f.ident]))
                if entries:
                    found[f.ident] = entries
        return found

    def _written_layers(self) -> list[Layer]:
        platforms = self.doc.table(["sessionSettings", "platform"]) or {}
        types = self.doc.table(["sessionSettings", "platformType"]) or {}
        out: list[Layer] = [PlatformLayer(platform=p) for p in sorted(platforms)]
        out += [PlatformTypeLayer(platform=p, type=t) for p in sorted(types)
                if isinstance(types[p], dict) for t in sorted(types[p])]
        out += [PlaceLayer(key=k) for k in self.ordered_places()]
        return out

    # --- listings -------------------------------------------------------------------------------

    def ordered_places(self) -> list[str]:
        """Every place key: workspaces first (the default one first), then windows."""
        with self._lock:
            places = list(self.places.values())
        places.sort(key=lambda p: (p.kind != "workspace", p.key != DEFAULT_WORKSPACE, p.platform or "",
                                   p.type or "", p.name, p.key))
        return [p.key for p in places]

    def known_platforms(self) -> tuple[list[str], dict[tuple[str, str], str | None]]:
        """Platforms (adapters' and the owner's, those of sessions, those written in the
        configuration) and chat types (declared by adapters, seen on rooms, or written)."""
        platforms: set[str] = {OWNER_PLATFORM}
        types: dict[tuple[str, str], str | None] = {}
        for rec in self.index.records():
            if rec.parent_id is None and rec.platform:
                platforms.add(rec.platform)
                if rec.chat is not None:
                    types.setdefault((rec.platform, rec.chat.type), None)
        with self._lock:
            platforms.update(self.doc.table(["sessionSettings", "platform"]) or {})
            written = self.doc.table(["sessionSettings", "platformType"]) or {}
            for p, ts in written.items():
                if isinstance(ts, dict):
                    platforms.add(p)
                    for t in ts:
                        types.setdefault((p, t), None)
            for p, declared in self.platform_types.items():
                platforms.add(p)
                for t, label in declared.items():
                    types[(p, t)] = label or types.get((p, t))
        return sorted(platforms), dict(sorted(types.items()))

    def place(self, key: str) -> PlaceFacts | None:
        with self._lock:
            return self.places.get(key)


def _same(current: Any, value: Any) -> bool:
    if value is None:
        return current is _MISSING
    return current is not _MISSING and current == value and type(current) is type(value)


def _now() -> int:
    return int(time.time() * 1000)


__all__ = [
    "AGENT_VALUES", "MODEL_OPTIONS", "InvalidSetting", "SettingField", "SettingsService", "check_value",
    "default_fields", "effective_prominence", "resolve", "session_setting_events", "sorted_fields",
]
