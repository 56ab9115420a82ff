"""Session settings (docs/owners.md, "Settings"): the service that holds the fields plugins
declare with a ``session`` spec, the layers they are set on, and resolves the rows clients are
shown and the effective values a session's agent runs with.

Theory of operation
-------------------
A *field* is declared by a plugin instance (here ``agent``, ``llm`` and ``tools``); a row's
identity is ``(plugin, key)``. Clients know no field: they render the declaration they are sent
(:meth:`SettingField.wire`, function members left out). The declarations are in
:mod:`actors.settings.fields`; whether a write is allowed and the events it records are decided in
:mod:`actors.settings.decide` (this service reads what a decision needs, calls it and appends);
the place read model is :mod:`actors.settings.places`.

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
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec
from msgspec import UNSET

from sessionloop.actors import events as E
from sessionloop.actors.session.decide import ensure_usable
from sessionloop.actors.settings.context import (
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
from sessionloop.actors.settings.decide import (
    InvalidSetting,
    check_layer_write,
    check_value,
    decide_session_setting,
    same_value,
)
from sessionloop.actors.settings.document import ConfigDocument, dump_toml, layer_path, setting_values
from sessionloop.actors.settings.fields import (
    AGENT_VALUES,
    MISSING,
    MODEL_OPTIONS,
    PROMINENCE_RANK,
    Prominence,
    SettingField,
    default_fields,
    effective_prominence,
    layer_kinds,
    sorted_fields,
)
from sessionloop.actors.settings.places import Places
from sessionloop.actors.settings.texts import Text, language_of
from sessionloop.actors.settings.watch import ChangeWatchers, Watch
from sessionloop.actors.system.ports import Commit
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


def resolve(f: SettingField, chain: Chain) -> tuple[Any, SettingSource] | None:
    """The effective value of ``f`` and its source: the highest layer with a valid value, then
    the field's default, else None (the row then shows the plugin's ``actual`` value, else nothing)."""
    for source, values in reversed(chain):
        value = values.get(f.ident, MISSING)
        if value is not MISSING and check_value(f, value) is None:
            return value, source
    if f.default is not UNSET:
        return f.default, "default"
    return None


def make_row(f: SettingField, prominence: Prominence, own: Any, resolved: tuple[Any, SettingSource] | None,
             actual: SettingActual | None) -> SettingRow:
    return SettingRow(plugin=f.plugin, key=f.key, field=f.wire(), prominence=prominence,
                      value=UNSET if own is MISSING else own,
                      effective=resolved[0] if resolved is not None else UNSET,
                      source=resolved[1] if resolved is not None else None,
                      actual=actual if resolved is None else None)


# --- the service ----------------------------------------------------------------------------------

_ROOT_CACHE = 10_000


#: the events a commit listener of settings acts on (``SettingsService.committed``)
_SETTINGS_EVENTS = frozenset({E.SessionSettingChanged, E.SessionCreated, E.SessionDeleted})


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
        self._places = Places(rt.store, submit, self._lock, self._write_lock, self.default_name)
        self._roots: dict[str, SessionContext] = {}
        self._session_values: dict[str, dict[Ident, tuple[int, Any]]] = {}
        self._scanned = False
        self._watchers = ChangeWatchers()  # told of every change (``watch``)
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
        self._load_layers()

    # --- declarations -------------------------------------------------------------------------

    def watch(self, callback: Callable[[], None]) -> Watch:
        """Call ``callback()`` after every change a client would re-read settings for (a value, a
        layer, a place, the fields or their options), until the returned watch is closed."""
        return self._watchers.watch(callback)

    @property
    def watching(self) -> int:
        """How many callbacks are subscribed (``watch``)."""
        return len(self._watchers)

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

    def _load_layers(self) -> None:
        """The recorded places, the places and platforms of the root sessions already listed."""
        records = self.index.records()
        self._places.load(records)
        for rec in records:
            if rec.parent_id is None and rec.platform:
                self._seen_platforms.update({(rec.platform, None),
                                             (rec.platform, rec.chat.type if rec.chat is not None else None)})

    def know_place(self, facts: PlaceFacts | None, register: bool = True) -> bool:
        """Remember a place a session is in, and record it (stream ``place-<key>``) off this
        thread; True when the list of layers changed (a new place, or a window's platform)."""
        return self._places.know(facts, register)

    def _new_layers(self, created: E.SessionCreated) -> bool:
        """Whether a new root adds a layer to ``session/config/layers`` (place, platform, type)."""
        grew = self.know_place(place_of(created, self.default_name))
        ctx = root_context(created, self.default_name)
        seen = [(ctx.platform, None), (ctx.platform, ctx.chat_type)] if ctx.platform else []
        with self._lock:
            fresh = [pair for pair in seen if pair not in self._seen_platforms]
            self._seen_platforms.update(fresh)
        return grew or bool(fresh)

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
            return self._places.values_of(layer.key)
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
        rows = [self._row(f, prominence, own.get(f.ident, MISSING), resolve(f, chain), state)
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
        place = self._places.get(layer.key)
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
        return [self._row(f, prominence, own.get(f.ident, MISSING), resolve(f, chain), None)
                for f in sorted_fields(fields, prominence)]

    # --- writing ----------------------------------------------------------------------------------

    def session_events(self, state: Any, plugin: str, key: str, value: Any, now: int) -> list[E.Event]:
        """The events of a write to one session's layer (the session decides a ``SetSetting`` command with it)."""

        ensure_usable(state)
        current = state.settings.get(f"{plugin}/{key}", MISSING)
        return decide_session_setting(self.field(plugin, key), plugin, key, state.created.kind, current, value, now)

    def update_layer(self, layer: Layer, plugin: str, key: str, value: Any) -> str | None:
        """Write (or with ``None`` delete) a value on a layer; the ``unsaved`` sentence if the
        configuration document could not be written. Raises InvalidSetting (nothing changed),
        or a store error for a place (nothing changed either)."""
        with self._write_lock:
            self.refresh_host_config()
            place = self.check_layer(layer)
            f = self.field(plugin, key)
            if place is not None:
                if self._places.write(place, f, plugin, key, value, _now()):
                    self._changed(generation=True)
                return None
            f = check_layer_write(f, plugin, key, layer_kinds(layer, None), value)
            return self._write_document(layer, f, value)

    def _write_document(self, layer: Layer, f: SettingField, value: Any) -> str | None:
        with self._lock:
            current = self.layer_values(layer).get(f.ident, MISSING)
            if same_value(current, value):
                return None
            self.doc.put([*layer_path(layer, f.plugin), f.key], value)
            rendered = dump_toml(self.doc.doc)
        self._changed(generation=True)  # in effect first, then saved
        return self.doc.save(rendered)

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
        events = commit.events
        for e in events:
            if type(e) in _SETTINGS_EVENTS:
                break
        else:  # most commits: a turn's events
            return
        changed = False
        for i, e in enumerate(events):
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
        self._watchers.notify()

    # --- overrides ----------------------------------------------------------------------------

    def _note(self, session_id: str, e: E.SessionSettingChanged, position: int) -> None:
        with self._lock:
            values = self._session_values.setdefault(session_id, {})
            known = values.get((e.plugin, e.key))
            if known is None or known[0] < position:
                values[(e.plugin, e.key)] = (position, MISSING if e.deleted else e.value)

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
            sessions = {sid: {i: v for i, (_, v) in vals.items() if v is not MISSING}
                        for sid, vals in self._session_values.items()}
            found: dict[Ident, list[tuple[Layer | str, Any]]] = {}
            for f in fields:
                entries: list[tuple[Layer | str, Any]] = []
                for layer in layers:
                    value = self.layer_values(layer).get(f.ident, MISSING)
                    if value is not MISSING:
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
        return self._places.ordered()

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
        return self._places.get(key)


def _now() -> int:
    return int(time.time() * 1000)


__all__ = ["OWNER_PLATFORM", "SettingsService", "make_row", "resolve"]
