"""The owner's web page: its login table and its static files, without I/O of their own (the
transport, ``transport_http.py``, answers the requests with them).

* :class:`LoginTable`: the page's login sessions. The owner gives the token once (typed into the
  page, sent as ``Authorization: Bearer`` to ``GET /api/login``, or a ``/?token=`` link); the
  server answers with a cookie holding a random value (never the token) that it keeps here with
  an expiry. A request carrying a live value is the owner on the ``webui`` surface. Kept in
  memory: a restart logs every page out. Bounded: past ``max_entries`` the oldest login goes.
* :func:`cookie_name`: one cookie per port (cookies ignore ports, so two servers on one host would
  overwrite each other's under one name).
* :func:`set_cookie` / :func:`clear_cookie`: the ``Set-Cookie`` values (HttpOnly,
  SameSite=Strict, Path=/), built with :mod:`http.cookies`.
* :class:`StaticFiles`: the page's files from the package's ``web/`` folder, read once, with
  their content types; :data:`PAGE_HEADERS` the headers every one of them is served with.
"""

from __future__ import annotations

import hashlib
import http.cookies
import importlib.resources
import secrets
from collections import OrderedDict

__all__ = ["COOKIE_PREFIX", "DEFAULT_LOGIN_TTL_S", "PAGE_HEADERS", "LoginTable", "StaticFiles", "clear_cookie",
           "cookie_name", "cookie_value", "set_cookie"]

COOKIE_PREFIX = "sessionloop_"
#: how long a page stays logged in without logging in again
DEFAULT_LOGIN_TTL_S = 12 * 3600.0
#: a cookie value is 43 characters (32 random bytes, URL-safe base64); longer ones are not looked up
MAX_COOKIE_VALUE = 128

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


def _key(value: str) -> bytes:
    # the table keeps digests: a dump of the process's memory shows no live cookie value
    return hashlib.sha256(value.encode()).digest()


class LoginTable:
    """Live login values and their expiry (monotonic seconds); the caller passes the clock."""

    def __init__(self, ttl_s: float = DEFAULT_LOGIN_TTL_S, max_entries: int = 1000) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._expiry: OrderedDict[bytes, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._expiry)

    def issue(self, now: float) -> str:
        """A new random value, live for ``ttl_s``."""
        self._expire(now)
        value = secrets.token_urlsafe(32)
        self._expiry[_key(value)] = now + self.ttl_s
        while len(self._expiry) > self.max_entries:
            self._expiry.popitem(last=False)
        return value

    def valid(self, value: str | None, now: float) -> bool:
        if not value or len(value) > MAX_COOKIE_VALUE:
            return False
        expiry = self._expiry.get(_key(value))
        if expiry is None:
            return False
        if expiry <= now:
            del self._expiry[_key(value)]
            return False
        return True

    def revoke(self, value: str | None) -> bool:
        if not value or len(value) > MAX_COOKIE_VALUE:
            return False
        return self._expiry.pop(_key(value), None) is not None

    def _expire(self, now: float) -> None:
        while self._expiry:
            key, expiry = next(iter(self._expiry.items()))
            if expiry > now:
                break
            del self._expiry[key]


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
