"""Accounts in a real headless Chromium against `pagedchat serve --auth local`: the sign-in page leads to the chat,
two devices of one account see the same chats, sign-out ends the sign-in on the server, an invite link made on
the account page signs its invitee up once, and the page makes and revokes API keys and pending invites. Every page
is checked for console errors (a CSP violation fails the test). Screenshots land in test-artifacts/."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import pytest

from bench.common.servers import stop_server
from tests.e2e.browser_helpers import REPLY_TIMEOUT_MS, expect, last_reply, screenshot, send
from tests.e2e.conftest import Server, server_env, start_server
from tests.e2e.test_browser import CHROMIUM, CHROMIUM_ARGS, NARROW, WIDE
from tests.e2e.zygote import CHEAP_PASSWORD_HASHES_ENV

pytestmark = pytest.mark.browser
USER, PASSWORD = "uma", "uma's password 1"


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One headless Chromium for the module (Debian's; skipped without it)."""
    if not CHROMIUM.exists():
        pytest.skip(f"no browser: {CHROMIUM} is missing (`apt-get install chromium`)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def accounts_server(tmp_path_factory, tiny_model) -> Iterator[Server]:
    tmp_path = tmp_path_factory.mktemp("accounts-server")
    env = server_env(
        tmp_path,
        tiny_model,
        PAGEDCHAT_AUTH="local",
        **{CHEAP_PASSWORD_HASHES_ENV: "1"},  # what accounts may do is tested here, not what a hash costs
        PAGEDCHAT_FIRST_ADMIN=USER,
        PAGEDCHAT_FIRST_ADMIN_PASSWORD=PASSWORD,
        PAGEDCHAT_DEFAULT_MAX_TOKENS="8",
    )
    running = start_server(tmp_path, env)
    yield running
    stop_server(running)


@pytest.fixture
def device(chromium, accounts_server) -> Iterator[Callable[[], Any]]:
    """New browser contexts (devices: their own cookies); afterwards, fail on any console error they logged."""
    contexts: list[Any] = []
    problems: list[str] = []

    def new_device(refusal_expected: bool = False) -> Any:
        """`refusal_expected`: the page's 404 for a used invite is not a problem."""
        context = chromium.new_context(viewport=WIDE, base_url=accounts_server.base_url)
        contexts.append(context)
        page = context.new_page()
        page.on(
            "console",
            lambda m: (
                problems.append(f"{page.url}: {m.text}")
                if m.type == "error"
                and "status of 401" not in m.text  # the wrong password's answer
                and not (refusal_expected and "status of 404" in m.text)
                else None
            ),
        )
        page.on("pageerror", lambda error: problems.append(f"{page.url}: page error: {error}"))
        return page

    yield new_device
    for context in contexts:
        context.close()
    assert problems == []


def sign_in(page: Any, password: str = PASSWORD) -> None:
    """From any page: the sign-in form, then the chat."""
    page.goto("/")
    page.wait_for_selector("#login-form")
    page.fill("#username", USER)
    page.fill("#password", password)
    page.click("#sign-in")


def test_the_sign_in_page_leads_to_the_chat(device):
    page = device()
    page.goto("/")
    assert page.url.endswith("/login")  # the chat page sent the browser to sign in
    expect(page.locator("h1")).to_have_text("Sign in")
    screenshot(page, "accounts-sign-in.png")
    page.fill("#username", USER)
    page.fill("#password", "not the password")
    page.click("#sign-in")
    expect(page.locator("#login-error")).to_have_text("wrong username or password")
    page.fill("#password", PASSWORD)
    page.click("#sign-in")
    page.wait_for_selector("body[data-ready=true]")
    expect(page.locator("#account-link")).to_have_text(USER)
    page.click("#account-link")
    expect(page.locator("#user-rows tr")).to_have_count(1)  # the admin's accounts table
    expect(page.locator("#user-rows td").first).to_have_text(USER)
    screenshot(page, "accounts-account-page.png")


def test_the_account_pages_forms_fit_a_laptop_and_a_phone(device):
    """The invite and create-account rows: every field wide enough to type in, every button inside the card, no
    sideways scrolling (the rows once squeezed the username to 22 px and pushed the buttons off the card)."""
    page = device()
    sign_in(page)
    page.wait_for_selector("body[data-ready=true]")
    page.goto("/account")
    expect(page.locator("#user-rows tr")).to_have_count(1)
    for viewport in (WIDE, NARROW):
        page.set_viewport_size(viewport)
        layout = page.evaluate(
            """() => {
                const card = document.querySelector(".account-card").getBoundingClientRect();
                const box = (n) => n.getBoundingClientRect();
                const controls = [...document.querySelectorAll("#invite-form > *, #create-form > *")];
                return {
                    narrowest: Math.min(...["invite-username", "create-username", "create-password"].map(
                        (id) => box(document.getElementById(id)).width)),
                    outside: controls.filter((n) => box(n).right > card.right || box(n).left < card.left)
                        .map((n) => n.id || n.textContent),
                    scrollWidth: document.documentElement.scrollWidth,
                };
            }"""
        )
        assert layout["narrowest"] >= 120, (viewport, layout)
        assert layout["outside"] == [], (viewport, layout)
        assert layout["scrollWidth"] <= viewport["width"], (viewport, layout)
    screenshot(page, "accounts-account-page-phone.png", full_page=True)


def test_two_devices_of_one_account_share_their_chats(device):
    laptop, phone = device(), device()
    for page in (laptop, phone):
        sign_in(page)
        page.wait_for_selector("body[data-ready=true]")
    send(laptop, "Sent from the laptop")
    expect(last_reply(laptop)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    phone.reload()
    phone.wait_for_selector("body[data-ready=true]")
    expect(phone.locator(".session-open")).to_have_text(["Sent from the laptop"])
    phone.click(".session-open")
    expect(phone.locator(".msg-user .msg-body")).to_have_text(["Sent from the laptop"])
    send(phone, "And this from the phone")
    expect(last_reply(phone)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    laptop.reload()
    laptop.wait_for_selector("body[data-ready=true]")
    laptop.click(".session-open")
    expect(laptop.locator(".msg-user .msg-body")).to_have_text(
        ["Sent from the laptop", "And this from the phone"]
    )
    screenshot(laptop, "accounts-two-devices.png")


def test_sign_out_ends_the_sign_in_on_the_server(device, chromium, accounts_server):
    page = device()
    sign_in(page)
    page.wait_for_selector("body[data-ready=true]")
    cookies = page.context.cookies()
    page.click("#sign-out")
    page.wait_for_url("**/login")
    page.go_back()
    page.wait_for_selector("#login-form")  # back to the chat: the sign-in page again
    assert urlsplit(page.url).path == "/login"
    copy = chromium.new_context(base_url=accounts_server.base_url)  # a copy of the old cookie
    try:
        copy.add_cookies(cookies)
        stale = copy.new_page()
        stale.goto("/")
        assert urlsplit(stale.url).path == "/login"
    finally:
        copy.close()


def test_next_after_signing_in_never_leaves_the_site(device, accounts_server):
    """`/login?next=/<tab>/host/phish`: a browser drops the tab and reads `//host/phish`, another site (here: the same
    server under another origin, so that a landing there would show). The sign-in leads to this site's `/`, from the
    form and when already signed in."""
    other = urlsplit(accounts_server.base_url.replace("127.0.0.1", "localhost")).netloc
    own = urlsplit(accounts_server.base_url).netloc
    page = device()
    for lure in (f"/\t/{other}/phish", f"/\\{other}/phish", f"/\n/{other}/phish"):
        # off the chat page first: once its cookie is gone, the chat page's own check of its session navigates to
        # /login?error=session_ended, and that navigation interrupted the goto below (seen in a loaded suite)
        page.goto("about:blank")
        page.context.clear_cookies()
        page.goto("/login?next=" + quote(lure, safe=""))
        page.fill("#username", USER)
        page.fill("#password", PASSWORD)
        page.click("#sign-in")
        page.wait_for_url(lambda url: urlsplit(url).path != "/login")
        assert (urlsplit(page.url).netloc, urlsplit(page.url).path) == (own, "/"), repr(lure)
        page.goto("/login?next=" + quote(lure, safe=""))  # signed in: the server redirects at once
        assert (urlsplit(page.url).netloc, urlsplit(page.url).path) == (own, "/"), repr(lure)
    page.goto("/login?next=/account")  # a path of this site is kept
    assert (urlsplit(page.url).netloc, urlsplit(page.url).path) == (own, "/account")


def test_an_invite_link_made_on_the_account_page_works_once(device):
    admin = device()
    sign_in(admin)
    admin.wait_for_selector("body[data-ready=true]")
    send(admin, "The admin's own chat")
    expect(last_reply(admin)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    admin.click("#account-link")
    admin.fill("#invite-username", "vic")
    admin.select_option("#invite-role", "user")
    admin.click("#invite-form button[type=submit]")
    link = admin.locator("#invite-result")
    expect(link).to_be_visible()
    expect(admin.locator("#admin-status")).to_contain_text("Send this link to vic")
    url = link.inner_text()
    assert (
        urlsplit(url).path == "/invite" and len(urlsplit(url).fragment) >= 32
    )  # the token: the fragment only
    screenshot(admin, "accounts-invite-link.png")

    invitee = device()  # another person's browser, signed in as nobody
    invitee.goto(url)
    expect(invitee.locator("#invite-for")).to_contain_text("You are invited as vic")
    invitee.fill("#new-password", "vic's new password")
    invitee.fill("#repeat-password", "a different one")
    invitee.click("#accept")
    expect(invitee.locator("#invite-error")).to_have_text("The two passwords differ.")
    invitee.fill("#repeat-password", "vic's new password")
    invitee.click("#accept")
    invitee.wait_for_selector("body[data-ready=true]")  # signed in, on the chat
    expect(invitee.locator("#account-link")).to_have_text("vic")
    expect(invitee.locator(".session-open")).to_have_count(0)  # the admin's chats are not vic's

    again = device(refusal_expected=True)  # the link works once
    again.goto(url)
    expect(again.locator("#invite-error")).to_have_text(
        "this invite link is not valid: it was used, revoked or mistyped, or it expired"
    )
    expect(again.locator("#invite-form")).to_be_hidden()
    admin.reload()
    expect(admin.locator("#user-rows td:first-child")).to_contain_text(["uma", "vic"])


def test_the_account_page_makes_and_revokes_api_keys_and_pending_invites(device, accounts_server):
    page = device()
    sign_in(page)
    page.wait_for_selector("body[data-ready=true]")
    page.goto("/account")
    expect(page.locator("#keys-empty")).to_be_visible()
    page.fill("#key-name", "laptop")
    page.click("#key-form button[type=submit]")
    expect(page.locator("#key-result")).to_be_visible()
    key = page.locator("#key-result").inner_text()
    assert key.startswith("pck_") and len(key) == 47
    expect(page.locator("#key-rows td:first-child")).to_have_text(["laptop"])
    expect(page.locator("#key-rows td.mono")).to_have_text(
        [key[:12] + "…"]
    )  # the prefix, never the key again
    expect(page.locator("#key-status")).to_contain_text("it is not shown again")
    with_key = {"Authorization": f"Bearer {key}"}
    sessions = httpx.get(accounts_server.base_url + "/api/sessions", headers=with_key)
    assert sessions.status_code == 200, sessions.text  # the key acts as the account
    screenshot(page, "accounts-api-keys.png")
    page.once("dialog", lambda dialog: dialog.accept())  # "Revoke the key laptop?"
    page.click("#key-rows button")
    expect(page.locator("#key-rows tr")).to_have_count(0)
    expect(page.locator("#keys-empty")).to_be_visible()
    refused = httpx.get(accounts_server.base_url + "/api/sessions", headers=with_key)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "api_key_revoked"

    page.fill("#invite-username", "wes")
    page.click("#invite-form button[type=submit]")
    pending = page.locator("#invite-rows tr[data-username=wes]")
    expect(pending).to_have_count(1)
    expect(pending.locator("td")).to_have_text(["wes", "user", USER, re.compile(r"\d"), "Revoke"])
    token = urlsplit(page.locator("#invite-result").inner_text()).fragment
    pending.locator("button").click()
    expect(pending).to_have_count(0)
    origin = {"Origin": accounts_server.base_url}
    gone = httpx.post(accounts_server.base_url + "/auth/invite", json={"token": token}, headers=origin)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "invite_not_found"
