"""The web page's login table and cookies (protocol/web_login.py): random values with an expiry,
bounded, revocable; cookies HttpOnly, SameSite=Strict, Path=/."""

from __future__ import annotations

from sessionloop.protocol.web_login import LoginTable, StaticFiles, clear_cookie, cookie_value, set_cookie


def test_a_login_is_valid_until_it_expires_then_never_again():
    table = LoginTable(ttl_s=60)
    value = table.issue(now=1000.0)
    assert table.valid(value, now=1059.9)
    assert not table.valid(value, now=1060.0)
    assert not table.valid(value, now=1000.0)  # an expired value is forgotten, not revived
    assert len(table) == 0


def test_values_are_random_and_unknown_or_oversized_ones_are_not_valid():
    table = LoginTable()
    a, b = table.issue(0.0), table.issue(0.0)
    assert a != b and len(a) >= 40
    assert not table.valid("guess", 0.0) and not table.valid("", 0.0) and not table.valid(None, 0.0)
    assert not table.valid(a + "x" * 200, 0.0)


def test_revoke_ends_one_login_only():
    table = LoginTable()
    a, b = table.issue(0.0), table.issue(0.0)
    assert table.revoke(a) and not table.revoke(a)
    assert not table.valid(a, 1.0) and table.valid(b, 1.0)


def test_the_table_is_bounded_and_drops_the_oldest_login():
    table = LoginTable(max_entries=3)
    values = [table.issue(float(i)) for i in range(5)]
    assert len(table) == 3
    assert [table.valid(v, 10.0) for v in values] == [False, False, True, True, True]


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
