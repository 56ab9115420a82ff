"""Apps: registered client identities, their manifests, and the ceiling a manifest puts on its
sessions' permissions (docs/bots.md, "1. Declare the app"; docs/security.md, "Who may change what").

A bot takes strangers' messages, so what its sessions may do is the owner's decision, written in
the app's manifest (``apps.toml``)::

    [apps.mybot]
    token = "…"                          # at least 32 characters
    permission_modes = ["ask", "deny"]   # the modes its sessions may run in (default: all three)
    sandbox = "workspace-write"          # the widest sandbox policy they may use (this is the default)

* an app asking for more (``loop/create`` with a ``permissionMode`` not listed;
  ``session/config/update`` on ``tools/permissionMode`` or ``tools/sandbox`` beyond the manifest)
  is refused ``forbidden`` and nothing changes;
* whatever the layers say (an owner's global ``acceptCalls``, a background session's default),
  an app's session runs within its manifest: :func:`clamp_mode` and :func:`clamp_policy` bring
  an effective value down to the nearest allowed one, never up.
"""

from __future__ import annotations

import threading

import msgspec

from sessionloop.actors.errors import InvalidCommand, NotFound
from sessionloop.actors.tools.sandbox import DEFAULT_POLICY, POLICIES, policy_at_most
from sessionloop.actors.webhooks.config import WebhookTarget

#: Permission modes from the most restrictive to the most permissive.
MODES: tuple[str, ...] = ("deny", "ask", "acceptCalls")


class AppManifest(msgspec.Struct, frozen=True, kw_only=True):
    """A registered client identity: what it may do and where it places sessions."""

    id: str
    platform: str = ""
    sessions: bool = True  # permissions.sessions
    containers: list[str] = []  # contributes.sessionContainers
    token: str | None = None
    name: str = ""  # the display name: the label of the app's room group (``RoomGroup.label``)
    permission_modes: list[str] = msgspec.field(default_factory=lambda: list(MODES))
    sandbox: str = DEFAULT_POLICY  # the widest sandbox policy its sessions may use
    #: where its sessions' events are announced (``[apps.<id>.webhook]``, actors/webhooks/)
    webhook: WebhookTarget | None = None

    def allows_mode(self, mode: str) -> bool:
        return mode in self.permission_modes

    def allows_policy(self, policy: str) -> bool:
        return policy in POLICIES and policy_at_most(policy, self.sandbox)


def check_manifest(manifest: AppManifest) -> None:
    """Raise InvalidCommand naming what does not fit in a manifest."""
    if not manifest.id or "\x00" in manifest.id:
        raise InvalidCommand("an app needs a non-empty id")
    unknown = [m for m in manifest.permission_modes if m not in MODES]
    if unknown or not manifest.permission_modes:
        raise InvalidCommand(f"app {manifest.id!r}: permission_modes must be a non-empty list of "
                             f"{', '.join(MODES)} (got {manifest.permission_modes!r})")
    if manifest.sandbox not in POLICIES:
        raise InvalidCommand(f"app {manifest.id!r}: sandbox must be one of {', '.join(POLICIES)} "
                             f"(got {manifest.sandbox!r})")


def clamp_mode(mode: str, manifest: AppManifest) -> str:
    """``mode`` if the manifest lists it, else the most permissive listed mode that is more
    restrictive than ``mode``, else the most restrictive listed one."""
    if manifest.allows_mode(mode):
        return mode
    rank = MODES.index(mode) if mode in MODES else 0
    below = [m for m in MODES[:rank] if manifest.allows_mode(m)]
    return below[-1] if below else next(m for m in MODES if manifest.allows_mode(m))


def clamp_policy(policy: str, manifest: AppManifest) -> str:
    """``policy``, or the manifest's ceiling when ``policy`` is wider."""
    return policy if manifest.allows_policy(policy) else manifest.sandbox


class AppRegistry:
    """The registered apps, by id (thread-safe)."""

    def __init__(self) -> None:
        self._apps: dict[str, AppManifest] = {}
        self._lock = threading.Lock()

    def register(self, manifest: AppManifest) -> None:
        check_manifest(manifest)
        with self._lock:
            self._apps[manifest.id] = manifest

    def register_all(self, manifests: list[AppManifest]) -> None:
        """Register (or replace) several apps at once: every manifest is checked first, so a
        bad one raises InvalidCommand and changes nothing; then all are in force together."""
        for manifest in manifests:
            check_manifest(manifest)
        with self._lock:
            self._apps.update((m.id, m) for m in manifests)

    def webhook_secrets(self) -> list[str]:
        """Every registered webhook's secret (what no log line may show)."""
        return [m.webhook.secret for m in list(self._apps.values()) if m.webhook is not None]

    def get(self, app_id: str) -> AppManifest:
        found = self._apps.get(app_id)
        if found is None:
            raise NotFound(f"app {app_id!r} is not registered")
        return found

    def find(self, app_id: str | None) -> AppManifest | None:
        return None if app_id is None else self._apps.get(app_id)

    def bounds_of(self, app_id: str | None) -> AppManifest | None:
        """The manifest that bounds a session made by ``app_id`` (None for the owner's): an app no
        longer registered (removed from apps.toml) leaves its sessions unable to run a tool that
        needs approval (``deny``) and with a read-only sandbox, until it is registered again."""
        if app_id is None:
            return None
        found = self._apps.get(app_id)
        return found if found is not None else AppManifest(id=app_id, permission_modes=["deny"], sandbox="read-only")

    def group_label(self, platform: str, instance: str | None) -> str:
        """A room group's label (the instance's display name; the platform's name for the rooms
        of no instance): the app's ``name``, else its id."""
        if instance is None:
            return platform
        app = self.find(instance)
        return app.name if app is not None and app.name else instance


__all__ = ["MODES", "AppManifest", "AppRegistry", "check_manifest", "clamp_mode", "clamp_policy"]
