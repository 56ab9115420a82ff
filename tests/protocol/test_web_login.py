"""The web page's login cookies (protocol/web_login.py): signed values with an expiry under a key
from the data directory's secret and the owner token; logouts bounded; cookies HttpOnly,
SameSite=Strict, Path=/."""

from __future__ import annotations

import pytest

from sessionloop.protocol.web_login import (
    MAX_LOGIN_TTL_S,
    Login,
    LoginCookies,
    Logouts,
    StaticFiles,
    clear_cookie,
    cookie_value,
    login_key,
    set_cookie,
)

KEY = login_key(b"s" * 32, "the-owner-token")


def test_a_login_is_valid_until_it_expires_then_never_again():
    cookies = LoginCookies(KEY, ttl_s=60)
    login, value = cookies.issue(now_ms=1_000_000)
    assert cookies.verify(value, now_ms=1_059_999) == login
    assert cookies.verify(value, now_ms=1_060_000) is None
    assert login.expires_ms - login.issued_ms == 60_000


def test_ids_are_random_and_forged_altered_or_oversized_values_do_not_verify():
    cookies = LoginCookies(KEY)
    (a, va), (b, vb) = cookies.issue(0), cookies.issue(0)
    assert a.id != b.id and va != vb and 40 <= len(va) <= 128
    for bad in ("guess", "", None, va + "x" * 200, va[:-1] + ("A" if va[-1] != "A" else "B")):
        assert cookies.verify(bad, 1) is None
    ident, issued, expires, mac = va.split(".")
    assert cookies.verify(f"{ident}.{issued}.{int(expires) + 1000}.{mac}", 1) is None  # a longer life is not signed
    assert cookies.verify(f"{b.id}.{issued}.{expires}.{mac}", 1) is None  # nor another id


def test_a_cookie_verifies_under_the_same_secret_and_token_only():
    login, value = LoginCookies(KEY).issue(0)
    assert LoginCookies(login_key(b"s" * 32, "the-owner-token")).verify(value, 1) == login  # a restart, a worker
    assert LoginCookies(login_key(b"s" * 32, "a-new-owner-token")).verify(value, 1) is None  # the token rotated
    assert LoginCookies(login_key(b"t" * 32, "the-owner-token")).verify(value, 1) is None  # another data dir


def test_a_signed_value_claiming_more_than_the_longest_life_is_refused():
    cookies = LoginCookies(KEY, ttl_s=MAX_LOGIN_TTL_S)
    _, value = cookies.issue(0)
    assert cookies.verify(value, 1) is not None
    with pytest.raises(ValueError):
        LoginCookies(KEY, ttl_s=MAX_LOGIN_TTL_S + 1)
    with pytest.raises(ValueError):
        LoginCookies(b"short")


def test_a_logout_ends_one_login_until_it_would_have_expired():
    cookies = LoginCookies(KEY, ttl_s=60)
    (a, _), (b, _) = cookies.issue(0), cookies.issue(30_000)
    logouts = Logouts().with_logout(a, now_ms=10)
    assert logouts.ends(a) and not logouts.ends(b)
    assert Logouts.decode(logouts.encode()) == logouts
    later = logouts.with_logout(b, now_ms=60_001)  # a's cookie has expired by then: its entry goes
    assert set(later.ids) == {b.id}


def test_past_the_bound_a_logout_ends_every_login_issued_until_then():
    cookies = LoginCookies(KEY)
    logins = [cookies.issue(i)[0] for i in range(4)]
    logouts = Logouts()
    for login in logins[:3]:
        logouts = logouts.with_logout(login, now_ms=100, max_entries=2)
    assert logouts.ids == {} and logouts.not_before_ms == 101
    assert all(logouts.ends(login) for login in logins)
    assert not logouts.ends(Login("later", 101, 10**9))  # a login after it is not ended


def test_the_cookies_are_httponly_samesite_strict_for_the_whole_site():
    made = set_cookie("sessionloop_8765", "abc", 3600)
    assert made.startswith("sessionloop_8765=abc")
    for attribute in ("HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=3600"):
        assert attribute in made
    assert "Max-Age=0" in clear_cookie("sessionloop_8765")


def test_a_cookie_header_is_read_by_name_and_a_broken_one_has_none():
    assert cookie_value("a=1; sessionloop_8765=abc; b=2", "sessionloop_8765") == "abc"
    assert cookie_value("sessionloop_9000=other", "sessionloop_8765") is None
    assert cookie_value(None, "sessionloop_8765") is None
    assert cookie_value('sessionloop_8765="unterminated', "sessionloop_8765") is None


def test_the_static_files_are_the_pages_own_with_their_types():
    files = StaticFiles()
    assert {"index.html", "app.js", "session.js", "app.css"} <= set(files.names())
    body, kind = files.get("session.js")
    assert kind.startswith("text/javascript") and b"session/subscribe" in body
    assert files.get("../transport.py") is None and files.get("web_login.py") is None
