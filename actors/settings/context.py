"""Places and session context for session settings: what resolution needs to know of
a session, and the layers it resolves through.

A session resolves through its root: :class:`SessionContext` holds its own kind and its root's
platform, chat type and place (:class:`PlaceFacts`). :func:`place_of` finds a root's place (the
recorded window or workspace; else an owner session's workspace, its folder or the default
workspace; a room without a recorded place has none). :func:`session_chain` and
:func:`layer_chain` list the layers a session, or a layer, resolves through, lowest first;
:func:`settings_of` reads a session's own layer from its state. The shared types ``Ident``,
``Layer`` and ``Chain`` live here so that :mod:`actors.settings.fields`, :mod:`actors.settings.service`
and :mod:`actors.settings.document` can import them without an import cycle.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Literal

import msgspec

from sessionloop.actors import events as E
from sessionloop.actors.settings.texts import DEFAULT_LANGUAGE, text
from sessionloop.protocol.schemas_types import (
    GlobalLayer,
    PlaceLayer,
    PlatformLayer,
    PlatformTypeLayer,
    SettingSource,
)

Ident = tuple[str, str]  # (plugin, key)
Chain = list[tuple[SettingSource, Mapping[Ident, Any]]]  # (source, values), lowest first
Layer = GlobalLayer | PlatformLayer | PlatformTypeLayer | PlaceLayer
PlaceKind = Literal["window", "workspace"]  # as the place.registered event records it

DEFAULT_WORKSPACE = "workspace:default"
#: the default workspace's recorded name: English data; whatever is recorded, it is shown as
#: the catalogue's ``place.default-workspace`` (by key) in the server's language
DEFAULT_WORKSPACE_NAME = text(DEFAULT_LANGUAGE, "place.default-workspace")


# --- places and session context -------------------------------------------------------------------


class PlaceFacts(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    kind: PlaceKind
    name: str
    platform: str | None = None  # windows: the platform and chat type of their sessions
    type: str | None = None


class SessionContext(msgspec.Struct, frozen=True, kw_only=True):
    """What resolution needs of a session: its own kind, and its root's platform, chat type and
    place (a child session resolves through its root)."""

    kind: str
    root_id: str
    platform: str | None = None
    chat_type: str | None = None
    place: PlaceFacts | None = None


def place_of(created: E.SessionCreated, default_name: str = DEFAULT_WORKSPACE_NAME) -> PlaceFacts | None:
    """A root's place: the recorded one; else an owner session's workspace (its folder, or the
    default workspace); a room without a recorded place has none."""
    platform = created.platform
    chat_type = created.chat.type if created.chat is not None else None
    if created.place is not None:
        p = created.place
        if p.kind == "window":
            return PlaceFacts(key=p.key, kind="window", name=p.name or p.key, platform=platform, type=chat_type)
        return PlaceFacts(key=p.key, kind="workspace", name=p.name or p.key)
    if created.kind != "owner":
        return None
    if created.cwd:
        folder = os.path.abspath(created.cwd)
        return PlaceFacts(key=f"workspace:{folder}", kind="workspace", name=os.path.basename(folder) or folder)
    return PlaceFacts(key=DEFAULT_WORKSPACE, kind="workspace", name=default_name)


def root_context(created: E.SessionCreated, default_name: str = DEFAULT_WORKSPACE_NAME) -> SessionContext:
    """The context a root gives itself and its children. Platform: the birth platform, else the
    platform it entered from (its creator's); chat type from its chat window."""
    platform = created.platform or (created.created_by.platform if created.created_by is not None else None)
    return SessionContext(kind=created.kind, root_id=created.session_id, platform=platform or None,
                          chat_type=created.chat.type if created.chat is not None else None,
                          place=place_of(created, default_name))


def session_chain(ctx: SessionContext, platform: str | None, layer_values: Callable[[Layer], Mapping[Ident, Any]],
                  own: Mapping[Ident, Any] | None) -> Chain:
    """The layers a session resolves through, lowest first: a workspace place right above global, a
    window place above platform and platformType; platform only with a platform, platformType only
    with a platform and a chat type."""
    chain: Chain = [("global", layer_values(GlobalLayer()))]
    place = ctx.place
    if place is not None and place.kind == "workspace":
        chain.append(("place", layer_values(PlaceLayer(key=place.key))))
    if platform:
        chain.append(("platform", layer_values(PlatformLayer(platform=platform))))
        if ctx.chat_type:
            chain.append(("platformType", layer_values(PlatformTypeLayer(platform=platform, type=ctx.chat_type))))
    if place is not None and place.kind == "window":
        chain.append(("place", layer_values(PlaceLayer(key=place.key))))
    if own is not None:
        chain.append(("session", own))
    return chain


def layer_chain(layer: Layer, place: PlaceFacts | None,
                layer_values: Callable[[Layer], Mapping[Ident, Any]]) -> Chain:
    """The layers up to and including ``layer``: what a layer's row resolves to."""
    chain: Chain = [("global", layer_values(GlobalLayer()))]
    if isinstance(layer, PlatformLayer):
        chain.append(("platform", layer_values(layer)))
    elif isinstance(layer, PlatformTypeLayer):
        chain.append(("platform", layer_values(PlatformLayer(platform=layer.platform))))
        chain.append(("platformType", layer_values(layer)))
    elif isinstance(layer, PlaceLayer):
        if place is not None and place.kind == "window" and place.platform:
            chain.append(("platform", layer_values(PlatformLayer(platform=place.platform))))
            if place.type:
                chain.append(("platformType", layer_values(PlatformTypeLayer(platform=place.platform,
                                                                              type=place.type))))
        chain.append(("place", layer_values(layer)))
    return chain


def settings_of(state: Any) -> dict[Ident, Any]:
    """A session's own layer, from ``state.settings`` (keys ``plugin/key``)."""
    out: dict[Ident, Any] = {}
    for name, value in state.settings.items():
        plugin, _, key = name.partition("/")
        out[(plugin, key)] = value
    return out


__all__ = ["PlaceFacts", "SessionContext", "layer_chain", "place_of", "root_context", "session_chain"]
