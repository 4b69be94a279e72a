"""The docs' chat screenshots, from the real default model in Chromium (Playwright, as the browser tests use):

- `chat.png`, light: a chat whose last reply was regenerated once (its "‹ 2/2 ›" versions) below a reply with code;
- `chat-dark.png`, dark: a preset made the default, a new chat with two turns, the settings panel showing where each
  value comes from.

`python scripts/chat_screenshots.py [--out-dir docs/screenshots]` (a few minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from playwright.sync_api import expect, sync_playwright

from bench.common.servers import spawn_pagedchat, stop_server, wait_ready

REPLY_TIMEOUT_MS = 600_000
TURNS = [
    "Give me three tips for writing readable Python, as a bulleted list.",
    "Show the first one as a short code example.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", type=Path, default=Path("docs/screenshots"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {"PAGEDCHAT_KV_DISK_BYTES": "0", "PAGEDCHAT_DEFAULT_MAX_TOKENS": "160"}
        server = wait_ready(spawn_pagedchat("screenshot", env, Path(tmp), isolated=True), 600)
        try:
            shoot_light(server.base_url, args.out_dir / "chat.png")
            shoot_dark(server.base_url, args.out_dir / "chat-dark.png")
        finally:
            stop_server(server)


LIGHT_TURNS = [
    "Write a Python function that checks whether a number is prime.",
    "Give me three tips for writing readable Python, as a bulleted list.",
]


def send_turns(page: Any, turns: list[str]) -> None:
    for text in turns:
        count = page.locator(".msg-assistant").count()
        page.fill("#input", text)
        page.press("#input", "Enter")
        replies = page.locator(".msg-assistant")
        expect(replies).to_have_count(count + 1, timeout=REPLY_TIMEOUT_MS)
        expect(replies.last).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)


@contextlib.contextmanager
def chat_page(base_url: str, color_scheme: str) -> Iterator[Any]:
    """The chat page, ready, in a new Chromium at 1280x800."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        context = browser.new_context(
            viewport={"width": 1280, "height": 800}, base_url=base_url, color_scheme=color_scheme
        )
        page = context.new_page()
        page.goto("/")
        page.wait_for_selector("body[data-ready=true]")
        yield page
        browser.close()


def shoot_light(base_url: str, out: Path) -> None:
    with chat_page(base_url, "light") as page:
        send_turns(page, LIGHT_TURNS)
        last = page.locator(".msg-assistant").last
        last.locator("[data-action=regenerate]").click()  # a second version beside the first
        expect(page.locator(".msg-assistant").last.locator(".msg-versions")).to_contain_text(
            "2/2", timeout=REPLY_TIMEOUT_MS
        )
        expect(page.locator(".msg-assistant").last).to_have_attribute(
            "data-status", "finished", timeout=REPLY_TIMEOUT_MS
        )
        page.evaluate("() => document.activeElement.blur()")
        page.mouse.move(0, 0)
        page.wait_for_timeout(300)
        page.screenshot(path=str(out))
    print(out)


def shoot_dark(base_url: str, out: Path) -> None:
    with chat_page(base_url, "dark") as page:
        page.click("#toggle-settings")
        page.fill("#set-system", "You are a concise assistant for Python developers.")
        page.fill("#set-temperature", "0.2")
        page.fill("#preset-name", "Concise Python")
        page.click("#preset-form button[type=submit]")
        expect(page.locator("#preset-status")).to_contain_text("Concise Python")
        page.select_option("#default-preset", label="Concise Python")
        page.click("#new-chat")
        page.click("#settings-close")
        send_turns(page, TURNS)
        page.click("#toggle-settings")
        page.evaluate(
            "() => { document.getElementById('settings-panel').scrollTop = 0; document.activeElement.blur(); }"
        )
        page.wait_for_timeout(300)
        page.screenshot(path=str(out))
    print(out)


if __name__ == "__main__":
    main()
