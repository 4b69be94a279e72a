"""Helpers of the browser tests: Playwright's expect, screenshots, chat actions, the admin JSON with the token."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.e2e.conftest import REPO_ROOT, Server

ADMIN_TOKEN = "e2e-admin-token-7c1f"
ARTIFACTS = REPO_ROOT / "test-artifacts"
REPLY_TIMEOUT_MS = 60_000


def expect(locator: Any) -> Any:
    """Playwright's auto-waiting assertions (imported late: the module loads even without Playwright)."""
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def screenshot(page: Any, name: str, *, full_page: bool = False) -> Path:
    """Save a screenshot under test-artifacts/."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=full_page)
    return path


def send(page: Any, text: str) -> None:
    """Type a message and press Enter, as a user would."""
    page.fill("#input", text)
    page.press("#input", "Enter")


def last_reply(page: Any) -> Any:
    """The newest assistant message."""
    return page.locator(".msg-assistant").last


def wait_streaming(page: Any) -> dict[str, Any]:
    """Wait until a reply is visibly streaming; the text so far and the composer's state, read at one instant."""
    handle = page.wait_for_function(
        """() => {
            const p = document.querySelector(".msg-assistant.is-streaming .msg-body p");
            if (!p || !p.textContent) return null;
            const visible = (id) => getComputedStyle(document.getElementById(id)).display !== "none";
            return { text: p.textContent, inputDisabled: document.getElementById("input").disabled,
                     sendVisible: visible("send"), stopVisible: visible("stop") };
        }""",
        timeout=REPLY_TIMEOUT_MS,
    )
    return handle.json_value()


def page_scripts(page: Any) -> list[list[str]]:
    """Each <script> of the page as [type, path]."""
    return page.eval_on_selector_all("script", "nodes => nodes.map((n) => [n.type, new URL(n.src).pathname])")


def admin_get(server: Server, path: str) -> httpx.Response:
    """GET an admin endpoint with the admin token."""
    return httpx.get(server.base_url + path, headers={"X-Admin-Token": ADMIN_TOKEN}, timeout=10)


def wait_pool_idle(server: Server, page: Any, timeout_s: float = 10.0) -> dict[str, Any]:
    """Poll the admin JSON until no block is in use and no sequence is live."""
    for _ in range(int(timeout_s / 0.1)):
        state = admin_get(server, "/api/admin/state").json()
        if "u" not in state["block_states"] and not state["sequences"]:
            return state
        page.wait_for_timeout(100)
    raise AssertionError(f"pool not idle after {timeout_s} s: {state['stats']}")


def new_session(page: Any, **body: Any) -> str:
    """Create a session through the page's own cookie (page.request shares the context's cookie jar; unlike the
    page's fetch() it sends no Origin by itself, and cookie-authenticated writes need the page's)."""
    parts = urlsplit(page.url)
    response = page.request.post(
        "/api/sessions", data=body, headers={"Origin": f"{parts.scheme}://{parts.netloc}"}
    )
    assert response.status == 201, response.text()
    return response.json()["id"]


def sign_in(page: Any) -> None:
    """Exchange the admin token on the sign-in form and wait for the live feed."""
    page.fill("#token", ADMIN_TOKEN)
    page.click("button[type=submit]")
    expect(page.locator("#feed-status")).to_have_text("live")


CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run")


@contextlib.contextmanager
def chromium_browser() -> Iterator[Any]:
    """Debian's headless Chromium under Playwright, for a module without test_browser.py's fixtures (skips when
    either is missing)."""
    executable = shutil.which("chromium")
    if executable is None:
        pytest.skip(
            "no browser: chromium is missing (`apt-get install chromium`; `make test` does it as root)"
        )
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, args=list(CHROMIUM_ARGS), headless=True
        )
        try:
            yield browser
        finally:
            browser.close()
