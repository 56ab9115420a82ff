"""The owner's web page: its login cookies and its static files, without I/O of their own (the
transport, ``transport_http.py``, answers the requests with them; ``cli/web_logins.py`` keeps the
logouts of a data directory on disk).

* A login cookie is signed, not looked up: ``ID.ISSUED.EXPIRES.MAC`` (a random id, the issue and
  expiry times in Unix milliseconds, an HMAC-SHA256 over the rest under :func:`login_key`). Any
  process that has the key verifies it (every worker of ``serve --workers``, the server after a
  restart): :class:`LoginCookies`. The key derives from the data directory's secret *and the
  owner token*: a new owner token makes every cookie signed under the old one fail to verify.
* A logout is recorded in :class:`Logouts` (the ids of logged-out logins until their cookies
  would have expired anyway, and a ``notBefore`` time that ends every login issued before it):
  a value with its JSON form, which the I/O shell keeps where every process reads it.
* :class:`WebLogins` is what the transport asks: issue a cookie, the live login of a cookie value
  (signed, unexpired, not logged out), log one out, and whether a login is still live (so an open
  connection of a logged-out login is closed).
* :func:`cookie_name`: one cookie per port (cookies ignore ports, so two servers on one host would
  overwrite each other's under one name).
* :func:`set_cookie` / :func:`clear_cookie`: the ``Set-Cookie`` values (HttpOnly,
  SameSite=Strict, Path=/), built with :mod:`http.cookies`.
* :class:`StaticFiles`: the page's files from the package's ``web/`` folder, read once, with
  their content types; :data:`PAGE_HEADERS` the headers every one of them is served with.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.cookies
import importlib.resources
import re
import secrets
from typing import Protocol

import msgspec

__all__ = ["COOKIE_PREFIX", "DEFAULT_LOGIN_TTL_S", "MAX_LOGOUTS", "PAGE_HEADERS", "Login", "LoginCookies",
           "Logouts", "StaticFiles", "WebLogins", "clear_cookie", "cookie_name", "cookie_value", "login_key",
           "set_cookie"]

COOKIE_PREFIX = "sessionloop_"
#: how long a page stays logged in without logging in again
DEFAULT_LOGIN_TTL_S = 12 * 3600.0
#: the longest lifetime a cookie may claim (a valid MAC with a longer one was not made by this code)
MAX_LOGIN_TTL_S = 30 * 24 * 3600.0
#: a cookie value is about 95 characters; longer ones are not parsed
MAX_COOKIE_VALUE = 128
#: logouts kept one by one; past this, a logout ends every login issued until then instead
MAX_LOGOUTS = 10_000
_VALUE = re.compile(r"([A-Za-z0-9_-]{22})\.([0-9]{1,15})\.([0-9]{1,15})\.([A-Za-z0-9_-]{43})")

#: every file of the page: no inline script or style (the CSP says so), nothing framed, no sniffing
PAGE_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
                                "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-store",
}

_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}


def cookie_name(port: int) -> str:
    return f"{COOKIE_PREFIX}{port}"


def cookie_value(header: str | None, name: str) -> str | None:
    """The value of cookie ``name`` in a ``Cookie`` header, or None (a header that does not parse
    has none)."""
    if not header:
        return None
    jar: http.cookies.SimpleCookie = http.cookies.SimpleCookie()
    try:
        jar.load(header)
    except http.cookies.CookieError:
        return None
    morsel = jar.get(name)
    return morsel.value if morsel is not None and morsel.value else None


def _morsel(name: str, value: str, max_age: int) -> str:
    jar: http.cookies.SimpleCookie = http.cookies.SimpleCookie()
    jar[name] = value
    morsel = jar[name]
    morsel["httponly"] = True
    morsel["samesite"] = "Strict"
    morsel["path"] = "/"
    morsel["max-age"] = max_age
    return morsel.OutputString()


def set_cookie(name: str, value: str, ttl_s: float) -> str:
    return _morsel(name, value, int(ttl_s))


def clear_cookie(name: str) -> str:
    return _morsel(name, "", 0)


# --- signed logins ------------------------------------------------------------------------------------


def login_key(secret: bytes, owner_token: str) -> bytes:
    """The key login cookies are signed with, from the data directory's secret and the owner token:
    every process of one data directory and token derives the same key, and a new owner token
    (a rotation) gives a new key, under which no earlier cookie verifies."""
    return hmac.new(secret, b"sessionloop web login v1\x00" + owner_token.encode(), hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Login(msgspec.Struct, frozen=True):
    """A login as its cookie states it (verified): its random id, issued and expiry times (Unix ms)."""

    id: str
    issued_ms: int
    expires_ms: int


class LoginCookies:
    """Makes and verifies login cookie values under one key (sans-I/O: the caller passes the time).

    Raises ValueError for a key under 32 bytes or a lifetime outside (0, 30 days]."""

    def __init__(self, key: bytes, ttl_s: float = DEFAULT_LOGIN_TTL_S) -> None:
        if len(key) < 32:
            raise ValueError("a login key has at least 32 bytes")
        if not 0 < ttl_s <= MAX_LOGIN_TTL_S:
            raise ValueError(f"a login lasts more than 0 and at most {MAX_LOGIN_TTL_S:.0f} s")
        self._key = key
        self.ttl_s = ttl_s

    def _mac(self, body: str) -> str:
        return _b64(hmac.new(self._key, body.encode(), hashlib.sha256).digest())

    def issue(self, now_ms: int) -> tuple[Login, str]:
        """A new login, live for ``ttl_s`` from ``now_ms``, and its cookie value."""
        login = Login(_b64(secrets.token_bytes(16)), now_ms, now_ms + int(self.ttl_s * 1000))
        body = f"{login.id}.{login.issued_ms}.{login.expires_ms}"
        return login, f"{body}.{self._mac(body)}"

    def verify(self, value: str | None, now_ms: int) -> Login | None:
        """The login of a cookie value signed under this key and not expired at ``now_ms``, else
        None (whatever is wrong with it: the caller answers every such value alike)."""
        if not value or len(value) > MAX_COOKIE_VALUE:
            return None
        match = _VALUE.fullmatch(value)
        if match is None:
            return None
        if not hmac.compare_digest(self._mac(value[:value.rfind(".")]), match.group(4)):
            return None
        issued, expires = int(match.group(2)), int(match.group(3))
        if not issued < expires <= issued + MAX_LOGIN_TTL_S * 1000 or expires <= now_ms:
            return None
        return Login(match.group(1), issued, expires)


class Logouts(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The logins logged out: by id until they would have expired (``ids``: id -> expiry, Unix ms),
    and every login issued before ``not_before_ms``."""

    not_before_ms: int = 0
    ids: dict[str, int] = {}

    def ends(self, login: Login) -> bool:
        return login.issued_ms < self.not_before_ms or login.id in self.ids

    def with_logout(self, login: Login, now_ms: int, max_entries: int = MAX_LOGOUTS) -> Logouts:
        """These logouts and ``login``'s, without the ones expired at ``now_ms``. Past
        ``max_entries`` ids, every login issued until ``now_ms`` ends instead (what was logged out
        stays logged out; the owner logs in again everywhere)."""
        ids = {i: expiry for i, expiry in self.ids.items() if expiry > now_ms}
        if login.expires_ms > now_ms:
            ids[login.id] = login.expires_ms
        if len(ids) > max_entries:
            return Logouts(not_before_ms=max(self.not_before_ms, now_ms + 1))
        return Logouts(not_before_ms=self.not_before_ms, ids=ids)

    def encode(self) -> bytes:
        return msgspec.json.encode(self)

    @staticmethod
    def decode(data: bytes) -> Logouts:
        """Raises msgspec.DecodeError for what is not a logouts document."""
        return msgspec.json.decode(data, type=Logouts)


class WebLogins(Protocol):
    """What the transport asks of the page's logins (``transport_http.MemoryLogins``, one process;
    ``cli/web_logins.DataDirLogins``, every process of a data directory)."""

    @property
    def ttl_s(self) -> float: ...

    def issue(self) -> str:
        """A new login's cookie value."""
        ...

    def login(self, value: str | None) -> Login | None:
        """The live login of a cookie value: signed, unexpired, not logged out."""
        ...

    def logout(self, value: str | None) -> Login | None:
        """End the login of a cookie value for every process; the login ended, or None."""
        ...

    def live(self, login: Login) -> bool:
        """Whether a login verified before is still live (not expired, not logged out since)."""
        ...


class StaticFiles:
    """The page's files (``protocol/web/``), read once: ``get(path) -> (body, content type)``."""

    def __init__(self, package: str = "sessionloop.protocol", folder: str = "web") -> None:
        self._files: dict[str, tuple[bytes, str]] = {}
        root = importlib.resources.files(package).joinpath(folder)
        for entry in root.iterdir():
            suffix = entry.name[entry.name.rfind("."):] if "." in entry.name else ""
            if entry.is_file() and suffix in _TYPES:
                self._files[entry.name] = (entry.read_bytes(), _TYPES[suffix])

    def names(self) -> list[str]:
        return sorted(self._files)

    def get(self, name: str) -> tuple[bytes, str] | None:
        return self._files.get(name)
