"""What an app's webhook is (``[apps.<id>.webhook]`` in ``apps.toml``) and how the server delivers
(``HostOptions.webhooks``, ``serve --webhook-*``); docs/webhooks.md.

    [apps.mybot.webhook]
    url = "https://bots.example/hooks/sessionloop"
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"    # whsec_ + base64 of 24 to 64 random bytes
    events = ["turn.completed", "turn.failed", "approval.requested"]

Every value is checked when the file is read (:func:`parse_webhook`): a refusal names the app and
what is wrong, never the secret.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import urllib.parse
from typing import Any

import msgspec

from sessionloop.actors.errors import InvalidCommand

__all__ = [
    "EVENT_TYPES",
    "MAX_URL_CHARS",
    "WebhookOptions",
    "WebhookTarget",
    "parse_networks",
    "parse_webhook",
]

#: the event types a webhook may ask for (``actors/webhooks/events.py`` maps stored events to them)
EVENT_TYPES: tuple[str, ...] = ("turn.started", "turn.completed", "turn.failed", "approval.requested",
                                "assistant.message", "tool.started", "tool.finished")
MAX_URL_CHARS = 2048
_SECRET_PREFIX = "whsec_"


class WebhookTarget(msgspec.Struct, frozen=True, kw_only=True):
    """One app's webhook: where, the signing key, and which event types it is sent."""

    url: str
    secret: str  # whsec_<base64>: the key is the decoded bytes
    events: list[str]

    def key(self) -> bytes:
        return base64.b64decode(self.secret[len(_SECRET_PREFIX):] + "==")

    def __repr__(self) -> str:  # never the secret
        return f"WebhookTarget(url={self.url!r}, events={self.events!r})"


class WebhookOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How the server delivers (every app's webhook alike).

    A failed delivery is tried again after ``retry_first_s``, then each wait doubles up to
    ``retry_max_delay_s``; an entry whose next attempt would come more than ``retry_window_s``
    after it was committed (or replayed) becomes a dead letter instead. ``allow_networks``:
    CIDR blocks of private, loopback or link-local addresses the operator allows as targets
    (none by default). ``concurrency`` deliveries run at once, at most ``per_target`` of them to
    one app; ``timeout_s`` bounds each attempt."""

    enabled: bool = True
    allow_networks: list[str] = []
    retry_first_s: float = 5.0
    retry_max_delay_s: float = 3600.0
    retry_window_s: float = 86_400.0
    timeout_s: float = 10.0
    concurrency: int = 32
    per_target: int = 8
    poll_s: float = 0.05

    def delay_after(self, attempts: int) -> float:
        """Seconds to wait after the ``attempts``-th failed attempt (1-based)."""
        return float(min(self.retry_first_s * 2 ** min(attempts - 1, 40), self.retry_max_delay_s))


def parse_networks(values: list[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """``allow_networks`` as networks; raises ValueError naming the value that is not a CIDR block."""
    out = []
    for value in values:
        try:
            out.append(ipaddress.ip_network(value, strict=False))
        except ValueError as e:
            raise ValueError(f"webhook allowed network {value!r} is not an address or CIDR block: {e}") from e
    return out


def parse_webhook(app_id: str, table: Any) -> WebhookTarget:
    """The ``[apps.<id>.webhook]`` table checked; raises InvalidCommand naming what is wrong."""
    where = f"app {app_id!r}: webhook"
    if not isinstance(table, dict):
        raise InvalidCommand(f"{where} must be a table with url, secret and events")
    unknown = sorted(set(table) - {"url", "secret", "events"})
    if unknown:
        raise InvalidCommand(f"{where} has unknown keys: {', '.join(unknown)} (it takes url, secret, events)")
    url, secret, events = table.get("url"), table.get("secret"), table.get("events")
    _check_url(where, url)
    _check_secret(where, secret)
    if not isinstance(events, list) or not events or not all(isinstance(e, str) for e in events):
        raise InvalidCommand(f"{where}: events must be a non-empty list of {', '.join(EVENT_TYPES)}")
    wrong = [e for e in events if e not in EVENT_TYPES]
    if wrong:
        raise InvalidCommand(f"{where}: unknown event types {', '.join(map(repr, wrong))} "
                             f"(known: {', '.join(EVENT_TYPES)})")
    assert isinstance(url, str) and isinstance(secret, str)
    return WebhookTarget(url=url, secret=secret, events=list(dict.fromkeys(events)))


def _check_url(where: str, url: Any) -> None:
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise InvalidCommand(f"{where}: url must be an http or https URL of at most {MAX_URL_CHARS} characters")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a port out of range)
    except ValueError as e:
        raise InvalidCommand(f"{where}: url is not a URL ({e})") from e
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidCommand(f"{where}: url must be http:// or https:// with a host (got scheme {parts.scheme!r})")
    if parts.username is not None or parts.password is not None:
        raise InvalidCommand(f"{where}: url must not carry a user or password (sign with the secret instead)")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise InvalidCommand(f"{where}: url must not contain spaces or control characters")


def _check_secret(where: str, secret: Any) -> None:
    if not isinstance(secret, str) or not secret.startswith(_SECRET_PREFIX):
        raise InvalidCommand(f"{where}: secret must be 'whsec_' followed by base64 (e.g. python -c \"import "
                             "base64, secrets; print('whsec_' + base64.b64encode(secrets.token_bytes(32)).decode())\")")
    try:
        key = base64.b64decode(secret[len(_SECRET_PREFIX):] + "==", validate=False)
        base64.b64decode(secret[len(_SECRET_PREFIX):].rstrip("=") + "=" * (-len(secret[6:].rstrip("=")) % 4),
                         validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidCommand(f"{where}: the secret after 'whsec_' is not base64") from e
    if not 24 <= len(key) <= 64:
        raise InvalidCommand(f"{where}: the secret must hold 24 to 64 bytes (it holds {len(key)})")
