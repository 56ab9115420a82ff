"""The owner's web page in a real browser (issue 22): Debian's chromium driven by Playwright for
Python (``executable_path=/usr/bin/chromium``, no browser download) against a real ``sessionloop
serve``. Screenshots go to the test's artifacts directory (``SESSIONLOOP_ARTIFACTS``, else a
temporary one under pytest's base temp)."""

from __future__ import annotations

import asyncio
import os
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.e2e.conftest import TOKEN, initialized, open_client
from tests.e2e.test_workers_wire import owner

pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
WAIT_MS = 15000


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    where = os.environ.get("SESSIONLOOP_ARTIFACTS")
    if where:
        os.makedirs(where, exist_ok=True)
        return where
    return str(tmp_path_factory.mktemp("webpage-artifacts"))


class Pages:
    """Pages of one browser context (one cookie jar) on one server; the page errors they saw."""

    def __init__(self, browser: Browser, server, artifacts: str) -> None:
        self.context = browser.new_context(viewport={"width": 1200, "height": 800})
        self.context.set_default_timeout(WAIT_MS)
        self.server = server
        self.artifacts = artifacts
        self.errors: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}/"

    def open(self, url: str | None = None) -> Page:
        page = self.context.new_page()
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.goto(url or self.url)
        return page

    def logged_in(self) -> Page:
        page = self.open()
        page.fill("#token", TOKEN)
        page.press("#token", "Enter")
        expect(page.locator("#new-session")).to_be_visible()
        return page

    def shot(self, page: Page, name: str) -> str:
        path = os.path.join(self.artifacts, f"{name}.png")
        page.screenshot(path=path)
        assert os.path.getsize(path) > 0
        return path


@pytest.fixture
def pages(browser, server, artifacts):
    p = Pages(browser, server, artifacts)
    yield p
    p.context.close()
    assert p.errors == []  # no script error on any page


def new_session(page: Page) -> str:
    page.click("#new-session")
    expect(page.locator("#input")).to_be_focused()
    return page.evaluate("window.__sl.cur.id")


def send(page: Page, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")


def agent_text(page: Page) -> str:
    return page.locator(".msg.agent").last.inner_text()


def test_log_in_create_a_session_send_and_see_the_answer_stream_in(pages):
    page = pages.open()
    expect(page.locator("#token")).to_be_focused()  # the page asks for the token, nothing else
    page.fill("#token", "wrong")
    page.press("#token", "Enter")
    expect(page.locator(".login [role=alert]")).to_have_text("That token was not accepted.")
    page.fill("#token", TOKEN)
    page.press("#token", "Enter")
    sid = new_session(page)
    assert page.locator(f".row[data-id='{sid}']").get_attribute("aria-current") == "true"
    send(page, "!sleep 2000\nhello from the web page, streamed a few characters at a time")
    final = "echo: hello from the web page, streamed a few characters at a time"
    # a part of the answer while the turn runs: the deltas arrived before the completed copy
    page.wait_for_function("(final) => { const m = [...document.querySelectorAll('.msg.agent')].pop();"
                           " return m && m.textContent.length > 6 && m.textContent.length < final.length; }", arg=final)
    partial = agent_text(page)
    assert final.startswith(partial) and partial != final
    assert page.get_attribute(".timeline", "aria-live") == "polite"  # screen readers hear the stream
    pages.shot(page, "streaming")
    expect(page.locator(".msg.agent").last).to_have_text(final)
    expect(page.locator(".turn").last).to_contain_text("replied")
    assert page.evaluate("window.__sl.perf.deltas") > 3
    pages.shot(page, "replied")
    # the list shows it, live, and a reload keeps the login and the open session
    page.reload()
    expect(page.locator(".msg.agent").last).to_have_text(final)


def test_approve_a_tool_call_from_a_second_page(pages):
    first = pages.logged_in()
    sid = new_session(first)
    second = pages.open(f"{pages.url}#{sid}")  # the same browser: logged in by its cookie
    expect(second.locator("#input")).to_be_visible()
    send(first, '!tool write_file {"path": "from-the-page.txt", "content": "approved"}')
    card = second.locator(".approval")
    expect(card).to_contain_text("write_file")
    expect(card).to_contain_text("from-the-page.txt")
    expect(card.locator("[data-expires]")).to_contain_text("expires in")
    expect(first.locator(".approval")).to_be_visible()  # every present owner page gets the card
    pages.shot(second, "approval")
    card.locator("button.approve").click()
    expect(first.locator(".tool .st-completed")).to_be_visible()
    expect(first.locator(".tool")).to_contain_text("approved (answer)")
    expect(first.locator(".approval")).to_have_count(0)  # settled: gone from the first page too
    expect(first.locator(".msg.agent").last).to_have_text("done: 1 tool calls")


def test_deny_with_a_note_by_keyboard(pages):
    page = pages.logged_in()
    new_session(page)
    send(page, '!tool write_file {"path": "denied.txt", "content": "no"}')
    note = page.locator(".approval input")
    note.fill("not this file")
    note.press("Tab")  # to the grant
    page.keyboard.press("Tab")  # to Approve
    page.keyboard.press("Tab")  # to Deny
    expect(page.locator(".approval button.deny")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator(".tool .st-denied")).to_be_visible()
    expect(page.locator(".tool")).to_contain_text("denied (answer)")


def test_an_approval_with_a_turn_grant_answers_the_turns_later_calls(pages):
    page = pages.logged_in()
    new_session(page)
    send(page, '!tool write_file {"path": "one.txt", "content": "1"}\n'
               '!tool write_file {"path": "two.txt", "content": "2"}')
    card = page.locator(".approval").first
    card.locator("select.grant").select_option("turn")
    card.locator("button.approve").click()
    expect(page.locator(".msg.agent").last).to_have_text("done: 2 tool calls")
    expect(page.locator(".tool .st-completed")).to_have_count(2)
    expect(page.locator(".approval")).to_have_count(0)


def test_attach_a_file_send_it_and_download_it_with_the_login_cookie(pages, tmp_path):
    page = pages.logged_in()
    new_session(page)
    path = tmp_path / "notes.txt"
    path.write_text("attached from the page")
    page.set_input_files("input[type=file]", str(path))
    expect(page.locator(".files")).to_contain_text("notes.txt")
    send(page, "with a file")
    link = page.locator(".msg.user a.att")
    expect(link).to_have_text("notes.txt")
    body = page.evaluate("async (href) => { const r = await fetch(href); return [r.status, await r.text()]; }",
                         link.get_attribute("href"))
    assert body == [200, "attached from the page"]
    expect(page.locator(".files")).to_have_text("")


def test_continue_after_the_tool_limit_and_compress(pages):
    page = pages.logged_in()
    sid = new_session(page)
    page.evaluate("(id) => window.__sl.rpc.call('session/config/update',"
                  " {sessionId: id, plugin: 'agent', key: 'maxSteps', value: 1})", sid)
    send(page, '!tool list_files {"path": "."}')
    notice = page.locator("[data-kind=notice]", has_text="tool-limit")
    notice.locator("button").click()
    expect(page.locator(".msg.agent").last).to_have_text("done: 1 tool calls")
    page.click("text=Compress")
    expect(page.locator("[data-kind=notice]", has_text="compress")).to_be_visible()


def test_abort_a_long_turn(pages):
    page = pages.logged_in()
    new_session(page)
    send(page, "!sleep 60000\na turn that would take a minute")
    expect(page.locator(".turn").last).to_have_text("turn running")
    page.click("#abort")
    expect(page.locator(".turn").last).to_contain_text("aborted")
    expect(page.locator("#abort")).to_have_count(0)


def test_rewind_a_turn_with_its_chat(pages):
    page = pages.logged_in()
    new_session(page)
    send(page, "first message")
    expect(page.locator(".msg.agent").last).to_have_text("echo: first message")
    send(page, '!tool write_file {"path": "rewound.txt", "content": "x"}')
    page.locator(".approval button.approve").click()
    expect(page.locator(".msg.agent").last).to_have_text("done: 1 tool calls")
    page.fill("#input", "a draft")
    page.locator(".turn").last.locator("button.rewind-all").click()
    expect(page.locator("#status")).to_contain_text("Rewound: 0 restored, 1 removed")
    expect(page.locator(".msg.user")).to_have_count(1)  # the session resubscribed: the turn is gone
    expect(page.locator("#input")).to_have_value("a draft")  # and what was typed stayed
    expect(page.locator(".msg.user")).to_have_text("first message")
    expect(page.locator(".tool")).to_have_count(0)


def test_stop_a_background_task(pages):
    page = pages.logged_in()
    new_session(page)
    send(page, '!tool exec {"command": "echo started; sleep 60", "background": true}')
    page.locator(".approval button.approve").click()
    task = page.locator(".tasks li")
    expect(task).to_contain_text("running")
    pages.shot(page, "background-task")
    task.locator("button.stop-task").click()
    expect(task).to_contain_text("stopped")
    expect(task.locator("button.stop-task")).to_have_count(0)


def test_the_list_archives_unarchives_deletes_and_searches(pages):
    page = pages.logged_in()
    sid = new_session(page)
    other = new_session(page)
    row = page.locator(f".row[data-id='{sid}']")
    row.click()
    row.locator("button", has_text="Archive").click()
    expect(page.locator(f".row[data-id='{sid}']")).to_have_count(0)
    page.click("button[aria-pressed]")  # the archived ones
    expect(page.locator(f".row[data-id='{sid}']")).to_be_visible()
    page.locator(f".row[data-id='{sid}'] button", has_text="Unarchive").click()
    expect(page.locator(f".row[data-id='{sid}']")).to_have_count(0)
    page.click("button[aria-pressed]")
    expect(page.locator(f".row[data-id='{sid}']")).to_be_visible()
    page.fill("input[type=search]", other)
    expect(page.locator(".row")).to_have_count(1)
    page.fill("input[type=search]", "")
    page.on("dialog", lambda d: d.accept())
    page.locator(f".row[data-id='{other}']").click()
    page.locator(f".row[data-id='{other}'] button", has_text="Delete").click()
    expect(page.locator(f".row[data-id='{other}']")).to_have_count(0)
    expect(page.locator(".empty")).to_be_visible()  # the open session went with it


def test_a_token_link_logs_in_and_logout_returns_to_the_login(pages):
    page = pages.open(f"{pages.url}?token={TOKEN}")
    expect(page.locator("#new-session")).to_be_visible()
    assert "token" not in page.url  # the redirect took it out of the address bar and the history
    page.click("#logout")
    expect(page.locator("#token")).to_be_visible()
    page.reload()
    expect(page.locator("#token")).to_be_visible()  # the cookie is gone for good


def fill_session(server, turns: int) -> str:
    """A session with ``turns`` answered turns, made over a plain WebSocket client."""

    async def go() -> str:
        async with open_client(server) as ws:
            client = await initialized(ws)
            sid = (await client.result("session/create", {"name": "long"}))["session"]["id"]
            await client.result("session/subscribe", {"sessionId": sid})
            for i in range(turns):
                await client.result("turn/send", {"sessionId": sid, "content": f"message {i}"})
                await client.turn_done(sid)
            return sid

    with ThreadPoolExecutor(1) as pool:  # Playwright's sync API keeps an event loop in this thread
        return pool.submit(asyncio.run, go()).result()


def test_history_pages_upward(pages):
    sid = fill_session(pages.server, 70)  # 140 stored messages: more than the snapshot's page
    page = pages.logged_in()
    page.locator(f".row[data-id='{sid}']").click()
    expect(page.locator(".msg.agent").last).to_have_text("echo: message 69")
    shown = page.locator(".msg.user").count()
    assert 0 < shown < 70
    expect(page.locator(".msg.user").first).not_to_have_text("message 0")
    page.click("#older")
    expect(page.locator(".msg.user").first).to_have_text("message 0")
    expect(page.locator(".msg.user")).to_have_count(70)
    expect(page.locator("#older")).to_have_count(0)  # nothing older left


def test_the_page_speaks_chinese_when_the_server_does(browser, server_factory, artifacts):
    server = server_factory("--language", "zh")
    p = Pages(browser, server, artifacts)
    try:
        page = p.logged_in()
        expect(page.locator("#new-session")).to_have_text("新会话")
        assert page.evaluate("document.documentElement.lang") == "zh"
        p.shot(page, "zh")
    finally:
        p.context.close()
    assert p.errors == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_the_page_reconnects_after_a_restart_without_a_new_login_and_the_timeline_continues(
        browser, server_factory, artifacts, sig):
    server = server_factory()
    p = Pages(browser, server, artifacts)
    try:
        page = p.logged_in()
        sid = new_session(page)
        send(page, "before the restart")
        expect(page.locator(".msg.agent").last).to_have_text("echo: before the restart")
        epoch = page.evaluate("window.__sl.cur.epoch")
        page.fill("#input", "a draft typed before")
        server.stop(sig)
        expect(page.locator("#status")).to_contain_text("reconnecting")
        again = server_factory("--port", str(server.port), data_dir=server.data_dir)
        # a new epoch: the page subscribed again for a fresh snapshot, on its own, with its cookie
        page.wait_for_function("(e) => window.__sl.rpc && window.__sl.cur && window.__sl.cur.epoch !== e", arg=epoch)
        assert page.evaluate("window.__sl.cur.epoch") == again.epoch
        assert page.evaluate("window.__sl.cur.id") == sid
        expect(page.locator("#token")).to_have_count(0)
        expect(page.locator("#input")).to_have_value("a draft typed before")
        send(page, "after the restart")
        expect(page.locator(".msg.agent").last).to_have_text("echo: after the restart")
        assert page.locator(".msg.user").all_inner_texts() == ["before the restart", "after the restart"]
        assert page.locator(".msg.agent").all_inner_texts() == ["echo: before the restart", "echo: after the restart"]
        ids = page.eval_on_selector_all("[data-item]", "els => els.map((e) => e.dataset.item)")
        assert len(ids) == len(set(ids))  # nothing twice on the timeline
        p.shot(page, f"reconnected-{signal.Signals(sig).name}")
    finally:
        p.context.close()
    assert p.errors == []


def test_a_page_logged_in_against_two_workers_works_on_every_connection_and_logout_ends_them_all(
        browser, server_factory, artifacts):
    server = server_factory("--workers", "2")
    p = Pages(browser, server, artifacts)
    try:
        first = p.logged_in()
        opened, workers = [first], set()
        for n in range(16):
            page = opened[-1] if n == 0 else p.open()
            sid = new_session(page)
            send(page, f"hello from page {n}")
            expect(page.locator(".msg.agent").last).to_have_text(f"echo: hello from page {n}")
            workers.add(owner(sid))  # the session was made on the worker this page's socket reached
            if n % 2:  # a reload is a new connection, to either worker: the same session, the same login
                page.reload()
                expect(page.locator(".msg.agent").last).to_have_text(f"echo: hello from page {n}")
                send(page, "after the reload")
                expect(page.locator(".msg.agent").last).to_have_text("echo: after the reload")
            if n:
                opened.append(page)
            if workers == {0, 1} and len(opened) >= 3:
                break
        assert workers == {0, 1}, "every page landed on one worker"
        first.click("#logout")
        for page in opened:  # on either worker: their sockets are closed 4003 and they ask for the token
            expect(page.locator("#token")).to_be_visible()
        opened[-1].reload()
        expect(opened[-1].locator("#token")).to_be_visible()
    finally:
        p.context.close()
    assert p.errors == []


def rows_of(server, method: str, params: dict) -> dict[str, tuple]:
    """(value, effective, source) of each row ``method`` answers, asked over a plain WebSocket client."""

    async def go():
        async with open_client(server) as ws:
            client = await initialized(ws)
            rows = await client.result(method, params)
            return {f"{r['plugin']}/{r['key']}": (r.get("value"), r.get("effective"), r.get("source"))
                    for r in rows["items"]}

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, go()).result()


def session_rows(server, sid: str) -> dict[str, tuple]:
    return rows_of(server, "session/config/get", {"sessionId": sid})


def test_the_session_settings_show_their_layers_change_and_show_the_servers_refusal(pages):
    page = pages.logged_in()
    sid = new_session(page)
    page.click(".settings summary")
    steps = page.locator("[data-setting='agent/maxSteps']")
    expect(steps.locator(".effective")).to_have_text("20")
    expect(steps.locator(".source")).to_have_text("from the default")
    model = page.locator("[data-setting='llm/model']")
    expect(model.locator(".effective")).to_contain_text("Follow the service preference")  # the row's actual
    # this session's permission mode, from its own layer
    mode = page.locator("[data-setting='tools/permissionMode']")
    mode.locator("select").select_option("deny")
    expect(mode.locator(".effective")).to_have_text("deny")
    expect(mode.locator(".source")).to_have_text("from This session")
    assert session_rows(pages.server, sid)["tools/permissionMode"] == ("deny", "deny", "session")
    model.locator("select").select_option(label="mock")
    expect(model.locator(".source")).to_have_text("from This session")
    # refused by the server: the row says why, as the server words it, and nothing changed
    steps.locator("input").fill("-1")
    steps.locator("input").press("Enter")
    expect(steps.locator("[role=alert]")).to_have_text("params.value: agent/maxSteps: at least 0")
    budget = page.locator("[data-setting='agent/contextChars']")
    budget.locator("input").fill("500")
    budget.locator("input").press("Enter")
    expect(budget.locator("[role=alert]")).to_have_text("params.value: agent/contextChars: at least 1000")
    rows = session_rows(pages.server, sid)
    assert rows["agent/maxSteps"] == (None, 20, "default") and rows["agent/contextChars"][0] is None
    expect(steps.locator("input")).to_have_value("-1")  # what was tried stays in view beside the refusal
    expect(steps.locator(".effective")).to_have_text("20")
    # a place-wide setting has no row on the session's own layer
    expect(page.locator("[data-setting='tools/execYieldSeconds']")).to_have_count(0)
    pages.shot(page, "settings-refused")
    # on a layer instead: the global one, then this session's place
    page.locator(".settings select.target").select_option(label="Global (plugin configuration)")
    steps = page.locator("[data-setting='agent/maxSteps']")
    steps.locator("input").fill("7")
    steps.locator("input").press("Enter")
    expect(steps.locator(".source")).to_have_text("from Global (plugin configuration)")
    expect(steps.locator(".effective")).to_have_text("7")
    page.locator(".settings select.target").select_option(label="Place: Default workspace")
    exec_yield = page.locator("[data-setting='tools/execYieldSeconds']")
    exec_yield.locator("input").fill("5")
    exec_yield.locator("input").press("Enter")
    expect(exec_yield.locator(".source")).to_have_text("from Place")
    expect(exec_yield.locator(".effective")).to_have_text("5")
    place = rows_of(pages.server, "session/config/layer/get", {"layer": {"scope": "place", "key": "workspace:default"}})
    assert place["tools/execYieldSeconds"][0] == 5
    assert rows_of(pages.server, "session/config/layer/get", {"layer": {"scope": "global"}})["agent/maxSteps"][0] == 7
    # back on this session: its own permission mode reset, so it inherits again
    page.locator(".settings select.target").select_option(label="This session")
    mode = page.locator("[data-setting='tools/permissionMode']")
    mode.locator("button.reset").click()
    expect(mode.locator(".source")).to_have_text("not set on any layer")
    expect(mode.locator("button.reset")).to_have_count(0)
    assert session_rows(pages.server, sid)["tools/permissionMode"][0] is None
    pages.shot(page, "settings")
