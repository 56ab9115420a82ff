"""The ``session/config/*`` methods and the ``session/config/changed`` push (docs/protocol.md, session settings),
over the settings service of :mod:`actors.settings.service`.

:func:`install_settings` is the one entry point: the protocol service calls it at the end of its
construction, with the runtime's settings service (made by the composition root, ``Host.open``);
it adds the handlers and subscribes the push (``SettingsService.watch``), and the service closes
that subscription when it closes.

Handlers follow ``gateway_methods``: ``(conn, request_id, params) -> None``, answering later and
never waiting. A session's rows are computed on its actor (they need its state); a write to its
own layer is a ``SetSetting`` command to the actor, then the rows. Layer reads and writes touch files and
the store, so they run on the gateway's pool. Layers, layer rows and overrides are the owner's:
an app connection gets ``forbidden`` (an app may read and set its own sessions' rows).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Literal

from sessionloop.actors.errors import NotFound
from sessionloop.actors.gateway.methods import Client, Handler, _as_rpc, answer, in_background
from sessionloop.actors.session import commands as C
from sessionloop.actors.session.messages import Ask, Decide
from sessionloop.actors.settings.apps import MODES
from sessionloop.actors.settings.context import DEFAULT_WORKSPACE
from sessionloop.actors.settings.service import SettingsService
from sessionloop.actors.settings.texts import Text
from sessionloop.actors.settings.watch import Watch
from sessionloop.actors.system.pubsub import Reply
from sessionloop.actors.tools.sandbox import POLICIES
from sessionloop.actors.views.summary import summary_from_record
from sessionloop.eventstore.errors import SessionloopError
from sessionloop.protocol.errors import RpcError
from sessionloop.protocol.frames import RequestId
from sessionloop.protocol.schemas import (
    ConfigLayersResult,
    ConfigRows,
    ConfigUpdateParams,
    Empty,
    LayerGetParams,
    LayerName,
    LayerRows,
    LayerUpdateParams,
    OverrideEntry,
    OverrideGroup,
    OverridesParams,
    OverridesResult,
    SessionIdParams,
)
from sessionloop.protocol.schemas_types import (
    AncestorRef,
    GlobalLayer,
    PlaceLayer,
    PlatformLayer,
    PlatformTypeLayer,
    SessionTarget,
    SettingLayerInfo,
)

if TYPE_CHECKING:
    from sessionloop.actors.gateway.service import SessionProtocolService

log = logging.getLogger("sessionloop.gateway")

LayerKind = Literal["global", "platform", "platformType", "place", "session"]
#: the settings layers, from the widest to the session's own (the order a client shows them in)
LAYER_NAMES: tuple[LayerKind, ...] = ("global", "platform", "platformType", "place", "session")
PUSH_DELAY_S = 0.05  # coalesce a burst of changes (a bot creating sessions) into one push


def install_settings(service: SessionProtocolService) -> Watch:
    """Add the ``session/config/*`` handlers over the runtime's settings service to
    ``service.handlers``, and push ``session/config/changed`` to its connections when settings
    change, until the returned watch is closed (the service closes it when it closes)."""
    settings = service.settings
    service.handlers.update(settings_handlers(service, settings))
    return settings.watch(_Broadcast(service))


class _Broadcast:
    """``session/config/changed`` to every connection of one protocol service, at most one per
    ``PUSH_DELAY_S`` (the notification has no parameters: clients re-read what they show)."""

    def __init__(self, service: SessionProtocolService) -> None:
        self.service = service
        self.scheduled = False
        self.lock = threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            if self.scheduled:
                return
            self.scheduled = True
        try:
            self.service.rt.worker.later(PUSH_DELAY_S, self._flush)
        except RuntimeError:  # the worker loop is closed: shutting down
            pass

    def _flush(self) -> None:
        try:
            self.service.slow.submit(self.push)
        except RuntimeError:
            pass

    def push(self) -> None:
        with self.lock:
            self.scheduled = False
        self.service.notify_all("session/config/changed", Empty())


def settings_handlers(service: SessionProtocolService, settings: SettingsService) -> dict[str, Handler]:
    h = _SettingsHandlers(service, settings)
    return {
        "session/config/get": h.get,
        "session/config/update": h.update,
        "session/config/layers": h.layers,
        "session/config/layer/get": h.layer_get,
        "session/config/layer/update": h.layer_update,
        "session/config/overrides": h.overrides,
    }


class _SettingsHandlers:
    def __init__(self, service: SessionProtocolService, settings: SettingsService) -> None:
        self.svc = service
        self.rt = service.rt
        self.settings = settings

    def _record(self, conn: Client, session_id: str) -> Any:
        record = self.svc.index.get(session_id)
        if record is None or not conn.visible(record):
            raise NotFound(Text("error.session-not-found", session=session_id))
        return record

    @staticmethod
    def _owner(conn: Client, method: str) -> None:
        if not conn.peer.is_owner:
            raise RpcError.forbidden(Text("error.owner-only", method=method))

    # --- one session ----------------------------------------------------------------------------

    def get(self, conn: Client, request_id: RequestId, params: SessionIdParams | ConfigUpdateParams) -> None:
        self._record(conn, params.session_id)
        self.settings.refresh_host_config()
        platform = conn.peer.platform

        def rows(found: tuple[Any, str | None]) -> ConfigRows:
            items, used = found
            return ConfigRows(items=items, platform=used)

        self.rt.tell(params.session_id, Ask(C.SettingRows(platform=platform), answer(conn, request_id, rows)))

    def update(self, conn: Client, request_id: RequestId, params: ConfigUpdateParams) -> None:
        """A write: the session's own layer, through a ``SetSetting`` command (InvalidSetting -> invalidParams,
        nothing written); then the rows as ``session/config/get`` gives them. An app may not raise
        its session's permission mode or sandbox policy beyond its manifest: ``forbidden``."""
        self._record(conn, params.session_id)
        self._within_manifest(conn, params.plugin, params.key, params.value)

        def applied(r: Reply) -> None:
            _, error = r.outcome()
            if error is not None:  # the refusal (InvalidSetting -> invalidParams), NotFound...
                conn.error(request_id, _as_rpc(error))
                return
            try:
                self.get(conn, request_id, params)
            except SessionloopError as e:  # deleted meanwhile
                conn.error(request_id, e)

        reply = Reply()
        reply.add_callback(applied)
        self.rt.tell(params.session_id, Decide(C.SetSetting(plugin=params.plugin, key=params.key, value=params.value),
                                                reply))

    def _within_manifest(self, conn: Client, plugin: str, key: str, value: Any) -> None:
        app = self.rt.apps.find(conn.peer.app_id)
        if app is None or plugin != "tools" or not isinstance(value, str):
            return  # the owner; another field; a delete or a value of the wrong type (invalidParams)
        if key == "permissionMode" and value in MODES and not app.allows_mode(value):
            raise RpcError.forbidden(Text("error.app-mode-forbidden", app=repr(app.id), mode=repr(value),
                                          allowed=", ".join(app.permission_modes)))
        if key == "sandbox" and value in POLICIES and not app.allows_policy(value):
            raise RpcError.forbidden(Text("error.app-sandbox-forbidden", app=repr(app.id), policy=repr(value),
                                          allowed=app.sandbox))

    # --- layers ---------------------------------------------------------------------------------

    def layers(self, conn: Client, request_id: RequestId, params: Empty) -> None:
        self._owner(conn, "session/config/layers")
        self.settings.refresh_host_config()
        order = [LayerName(name=name, label=Text(f"layer.{name}")) for name in LAYER_NAMES]
        in_background(self.svc, conn, request_id,
                      lambda: ConfigLayersResult(layers=layer_infos(self.settings), order=order))

    def layer_get(self, conn: Client, request_id: RequestId, params: LayerGetParams) -> None:
        self._owner(conn, "session/config/layer/get")
        self.settings.refresh_host_config()
        in_background(self.svc, conn, request_id, lambda: LayerRows(items=self.settings.layer_rows(params.layer)))

    def layer_update(self, conn: Client, request_id: RequestId, params: LayerUpdateParams) -> None:
        self._owner(conn, "session/config/layer/update")

        def work() -> LayerRows:
            unsaved = self.settings.update_layer(params.layer, params.plugin, params.key, params.value)
            return LayerRows(items=self.settings.layer_rows(params.layer), unsaved=unsaved)

        in_background(self.svc, conn, request_id, work)

    def overrides(self, conn: Client, request_id: RequestId, params: OverridesParams) -> None:
        self._owner(conn, "session/config/overrides")
        in_background(self.svc, conn, request_id, lambda: self._overrides(params.plugin))

    def _overrides(self, plugin: str) -> OverridesResult:
        items = []
        for (_, key), entries in self.settings.overrides(plugin).items():
            wire = []
            for target, value in entries:
                if isinstance(target, str):
                    session = self._session_target(target)
                    if session is None:
                        continue
                    wire.append(OverrideEntry(target=session, value=value))
                else:
                    wire.append(OverrideEntry(target=target, value=value))
            if wire:
                items.append(OverrideGroup(key=key, entries=wire))
        return OverridesResult(items=items)

    def _session_target(self, session_id: str) -> SessionTarget | None:
        """A session's own layer as a target: its title, and for a child session its parents."""
        record = self.svc.index.get(session_id)
        if record is None:
            return None
        parent = None
        if record.parent_id is not None:
            up = self.svc.index.get(record.parent_id)
            parent = AncestorRef(id=record.parent_id,
                                 title=summary_from_record(up).title if up is not None else record.parent_id)
        return SessionTarget(session_id=session_id, title=summary_from_record(record).title, parent=parent)


def layer_infos(settings: SettingsService) -> list[SettingLayerInfo]:
    """The layers that can be set: global; each platform; each platform chat type (declared or written,
    with its display name when declared); every place, workspaces first, the default one first.
    A place's label has no platform; a window carries its platform and type instead."""
    platforms, types = settings.known_platforms()
    out = [SettingLayerInfo(layer=GlobalLayer())]
    out += [SettingLayerInfo(layer=PlatformLayer(platform=p)) for p in platforms]
    out += [SettingLayerInfo(layer=PlatformTypeLayer(platform=p, type=t), label=label)
            for (p, t), label in types.items()]
    for key in settings.ordered_places():
        place = settings.place(key)
        if place is None:
            continue
        if place.kind == "workspace":
            label = Text("place.default-workspace") if key == DEFAULT_WORKSPACE else \
                Text("place.workspace", name=place.name)
            out.append(SettingLayerInfo(layer=PlaceLayer(key=key), label=label))
            continue
        kind = types.get((place.platform, place.type)) if place.platform and place.type else None
        kind = kind or place.type
        out.append(SettingLayerInfo(layer=PlaceLayer(key=key), label=f"{kind} {place.name}" if kind else place.name,
                                    platform=place.platform, type=place.type))
    return out


__all__ = ["install_settings", "layer_infos", "settings_handlers"]
