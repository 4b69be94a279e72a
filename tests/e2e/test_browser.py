"""The chat page and the admin page in a real headless Chromium (Debian's) against a real server with the tiny model.

Every page is checked for console errors, so a Content-Security-Policy violation (inline script or style) fails
the test that caused it. Screenshots land in test-artifacts/.

Over 300 lines on purpose: the flows share module-scoped servers and a browser; split into files, each file would
start its own (about 10 s each on this machine).
"""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.http.security import key_fingerprint
from bench.common.servers import stop_server
from tests.e2e.browser_helpers import (
    ADMIN_TOKEN,
    REPLY_TIMEOUT_MS,
    expect,
    last_reply,
    new_session,
    page_scripts,
    screenshot,
    send,
    sign_in,
    wait_pool_idle,
    wait_streaming,
)
from tests.e2e.conftest import REPO_ROOT, Server, server_env, start_server
from tests.engine.bench_helpers import make_tiny_model_folder
from tests.faults import FAULTS_ENV

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
JAVASCRIPT_TYPES = ("text/javascript", "application/javascript")
EXPECTED_NETWORK_ERRORS = ("Failed to load resource", "WebSocket connection to")
LARGE_POOL_BLOCKS = 250_000
# 8 tokens x 2 layers x (K, V) x 2 KV heads x (16 int8 values + an fp16 scale)
TINY_INT8_BLOCK_BYTES = 8 * 2 * 2 * 2 * (16 + 2)
API_KEY = "e2e-api-key-4d2b9e"
API_HEADERS = {"Authorization": f"Bearer {API_KEY}"}
WIDE = {"width": 1280, "height": 800}
NARROW = {"width": 390, "height": 844}
STATS_LINE = re.compile(
    r"(\d+) tokens? · [\d.]+ tok/s · TTFT (\d+ ms|[\d.]+ s) · (\d+) of (\d+) prompt tokens cached"
    r"( · \d+ earlier turns? left out, as you chose)?( · hit the token limit)?"
)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One headless Chromium for the module; each test opens fresh contexts (fresh profile state, new cookies)."""
    if not CHROMIUM.exists():
        pytest.skip(
            f"no browser: {CHROMIUM} is missing (`apt-get install chromium`; `make test` does it as root)"
        )
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        # launch() gives the browser a fresh temporary user data dir of its own
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


def _ui_server(tmp_path: Path, tiny_model: str, **env: str) -> Iterator[Server]:
    """A server with an admin token, short default replies (200 tokens) and room for 500-token ones (`env` may
    change these)."""
    settings = dict(
        PAGEDCHAT_ADMIN_TOKEN=ADMIN_TOKEN, PAGEDCHAT_MAX_MODEL_LEN="1024", PAGEDCHAT_DEFAULT_MAX_TOKENS="200"
    )
    running = start_server(tmp_path, server_env(tmp_path, tiny_model, **{**settings, **env}))
    yield running
    # uvicorn re-raises the SIGTERM it handled once shut down, so a clean stop exits with -SIGTERM
    assert stop_server(running) in (0, -signal.SIGTERM), running.log()[-4000:]


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory, tiny_model) -> Iterator[Server]:
    yield from _ui_server(tmp_path_factory.mktemp("ui-server"), tiny_model)


@pytest.fixture
def slow_ui_server(tmp_path, tiny_model) -> Iterator[Server]:
    """The same with a pool of 250,000 blocks (8-token int8 blocks of the tiny model: 288 MB) and an API key, every
    engine step 15 ms slower: a reply stays running while the test looks at it."""
    env = {
        FAULTS_ENV: "step_delay_ms=15",
        "PAGEDCHAT_KV_CACHE_DTYPE": "int8",
        "PAGEDCHAT_BLOCK_SIZE": "8",
        "PAGEDCHAT_KV_CACHE_BYTES": str(LARGE_POOL_BLOCKS * TINY_INT8_BLOCK_BYTES),
        "PAGEDCHAT_API_KEY": API_KEY,
    }
    yield from _ui_server(tmp_path, tiny_model, **env)


@pytest.fixture
def reading_ui_server(tmp_path, tiny_model) -> Iterator[Server]:
    """The same reading a prompt 64 tokens a step, every step 250 ms slower: a 700-token prompt takes seconds to
    read, so a Stop lands before the first token."""
    env = {FAULTS_ENV: "step_delay_ms=250", "PAGEDCHAT_MAX_NUM_BATCHED_TOKENS": "64"}
    yield from _ui_server(tmp_path, tiny_model, **env)


@pytest.fixture
def open_page(chromium, ui_server) -> Iterator[Callable[..., Any]]:
    """Open a page in a new browser context; afterwards, fail on any console error the pages logged."""
    contexts: list[Any] = []
    problems: list[str] = []

    def open_(
        path: str = "/", *, viewport: dict[str, int] = WIDE, context: Any = None, http_errors_ok: bool = False
    ):
        if context is None:
            context = chromium.new_context(viewport=viewport, base_url=ui_server.base_url)
            contexts.append(context)
        page = context.new_page()
        page.set_viewport_size(viewport)

        def on_console(message: Any) -> None:
            # a page whose test stops the server logs its failed fetches and socket connections
            expected = http_errors_ok and any(text in message.text for text in EXPECTED_NETWORK_ERRORS)
            if message.type == "error" and not expected:
                problems.append(f"{page.url}: console error: {message.text}")

        page.on("console", on_console)
        page.on("pageerror", lambda error: problems.append(f"{page.url}: page error: {error}"))
        page.goto(path)
        if path.startswith("/") and not path.startswith("/admin"):
            page.wait_for_selector("body[data-ready=true]")
        return page

    yield open_
    for context in contexts:
        context.close()
    assert problems == []


# ---- chat ------------------------------------------------------------------------------------------------------
def test_chat_streams_replies_with_stats_and_reuses_the_cache(open_page, ui_server):
    page = open_page("/")
    expect(page.locator("#empty-state")).to_be_visible()
    send(page, "Hello there")
    expect(page.locator(".msg-user .msg-body")).to_have_text(["Hello there"])
    streaming = wait_streaming(page)
    assert (streaming["inputDisabled"], streaming["sendVisible"], streaming["stopVisible"]) == (
        True,
        False,
        True,
    )
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    final = last_reply(page).locator(".msg-body").inner_text()
    assert len(final) > len(streaming["text"]) > 0  # seen mid-stream, then it grew
    expect(page.locator("#input")).to_be_enabled()
    expect(page.locator("#input")).to_be_focused()
    stats = STATS_LINE.fullmatch(last_reply(page).locator(".msg-stats").inner_text())
    assert stats is not None and 1 <= int(stats.group(1)) <= 200 and stats.group(3) == "0"
    expect(page.locator(".session-open")).to_have_text(["Hello there"])
    expect(page.locator(".session.is-current .session-open")).to_have_attribute("aria-current", "true")

    send(page, "And a second turn, please")
    expect(page.locator(".msg-assistant")).to_have_count(2)
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    stats = STATS_LINE.fullmatch(last_reply(page).locator(".msg-stats").inner_text())
    assert (
        stats is not None and int(stats.group(3)) >= 16
    )  # the first turn's blocks came from the prefix cache
    expect(page.locator("[data-action=regenerate]:visible")).to_have_count(2)  # on every reply
    expect(page.locator("[data-action=edit]:visible")).to_have_count(2)  # on every message of yours
    # Continue: on the last reply, where it stopped at its token limit
    expect(page.locator("[data-action=continue]:visible")).to_have_count(1 if stats.group(6) else 0)
    screenshot(page, "chat-wide.png")

    narrow = open_page("/", viewport=NARROW, context=page.context)
    expect(narrow.locator(".msg")).to_have_count(4)
    expect(narrow.locator("#sidebar")).not_to_be_in_viewport()
    screenshot(narrow, "chat-narrow.png")
    narrow.click("#toggle-sidebar")
    expect(narrow.locator("#sidebar")).to_be_in_viewport()
    narrow.wait_for_timeout(250)  # the slide-in transition
    screenshot(narrow, "chat-narrow-sidebar.png")
    narrow.keyboard.press("Escape")
    expect(narrow.locator("#toggle-sidebar")).to_have_attribute("aria-expanded", "false")


def test_an_attached_file_is_a_chip_and_later_questions_read_it_from_the_cache(open_page, tmp_path):
    first = open_page("/")
    sid = new_session(first, title="Notes", settings={"temperature": 0, "max_tokens": 16})
    # the refused .exe below logs its 415 as a failed resource
    page = open_page(f"/#s={sid}", context=first.context, http_errors_ok=True)
    notes = "\n".join(f"- item {i}: the {i}th line of the project notes, number {i * 7}." for i in range(14))
    path = tmp_path / "notes.md"
    path.write_text(notes)
    page.set_input_files("#attach-input", str(path))  # what the paperclip button opens
    chips = page.locator("#attach-chips .attach-chip")
    expect(chips).to_have_count(1)
    expect(chips.locator(".attach-detail")).to_have_text(f"{len(notes)} B · 313 tokens")
    # dropped on the composer: a CSV, then removed with its ×
    page.evaluate(
        """() => {
            const data = new DataTransfer();
            data.items.add(new File(["a,b\\n1,2\\n"], "table.csv", { type: "text/csv" }));
            const composer = document.getElementById("composer");
            for (const type of ["dragover", "drop"]) {
                composer.dispatchEvent(new DragEvent(type, { dataTransfer: data, bubbles: true, cancelable: true }));
            }
        }"""
    )
    expect(chips.locator(".attach-name")).to_have_text(["notes.md", "table.csv"])
    expect(chips.nth(1).locator(".attach-detail")).to_have_text(re.compile(r"\d+ B · \d+ tokens"))
    chips.nth(1).locator("[data-action=remove-attachment]").click()
    expect(chips.locator(".attach-name")).to_have_text(["notes.md"])
    bad = tmp_path / "tool.exe"
    bad.write_bytes(b"MZ\x90\x00")
    page.set_input_files("#attach-input", str(bad))
    expect(page.locator("#attach-error")).to_contain_text(
        "tool.exe: 'tool.exe' is not a type that can be attached"
    )
    expect(chips).to_have_count(1)
    screenshot(page, "chat-attachment-composer.png")

    questions = ["What is item 3?", "And item 7?", "Which item has the number 70?"]
    ratios = []
    for number, question in enumerate(questions, start=1):
        send(page, question)
        expect(page.locator(".msg-assistant")).to_have_count(number)
        expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
        stats = STATS_LINE.fullmatch(last_reply(page).locator(".msg-stats").inner_text())
        assert stats is not None, last_reply(page).locator(".msg-stats").inner_text()
        ratios.append(int(stats.group(3)) / int(stats.group(4)))
    assert ratios[0] < 0.5 and min(ratios[1:]) >= 0.9, ratios  # the file's blocks came from the prefix cache
    expect(page.locator("#attach-chips")).to_be_hidden()  # sent with the first question
    expect(page.locator("#attach-error")).to_be_hidden()
    sent = page.locator(".msg-user").first
    expect(sent.locator(".msg-body")).to_have_text("What is item 3?")  # a chip, not a wall of text
    expect(sent.locator(".attach-chip .attach-name")).to_have_text(["notes.md"])
    expect(page.locator(".msg-user .attach-chip")).to_have_count(1)
    sent.scroll_into_view_if_needed()
    screenshot(page, "chat-attachment.png")
    sent.locator(".attach-chip").click()
    expect(page.locator("#attach-dialog")).to_be_visible()
    screenshot(page, "chat-attachment-text.png")
    expect(page.locator("#attach-text")).to_have_text(notes)
    page.click("#attach-close")
    expect(page.locator("#attach-dialog")).to_be_hidden()
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    expect(page.locator(".msg-user").first.locator(".attach-chip .attach-name")).to_have_text(["notes.md"])


@pytest.fixture
def long_prompt_ui_server(tmp_path) -> Iterator[Server]:
    """The same on a tiny model with room for a pasted document (4,608 tokens) and 8-token replies, every step 50 ms
    slower."""
    model = make_tiny_model_folder(tmp_path / "model", max_position_embeddings=8192)
    env = {
        FAULTS_ENV: "step_delay_ms=50",
        "PAGEDCHAT_MAX_MODEL_LEN": "4608",
        "PAGEDCHAT_DEFAULT_MAX_TOKENS": "8",
        "PAGEDCHAT_KV_CACHE_BYTES": str(16 * 2**20),  # the tiny model's 16-token blocks: 8,192 tokens
    }
    yield from _ui_server(tmp_path, str(model), **env)


def test_a_long_prompt_shows_how_far_it_is_read_until_the_reply_starts(
    chromium, open_page, long_prompt_ui_server
):
    server = long_prompt_ui_server
    page = open_page("/", context=chromium.new_context(viewport=WIDE, base_url=server.base_url))
    # every text the reading bubble shows, however briefly (512 tokens are read a step: eight steps here)
    page.evaluate(
        """() => {
          window.__reading = [];
          const record = () => document.querySelectorAll(".msg-reading .msg-progress")
            .forEach((p) => window.__reading.push(p.textContent));
          new MutationObserver(record).observe(document.getElementById("messages"),
            { subtree: true, childList: true, characterData: true });
        }"""
    )
    send(page, "word " * 2000)  # a 4,000-token paste (this tiny tokenizer reads "word " as two tokens)
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    seen = page.evaluate("() => window.__reading")
    shown = re.compile(r"reading ([\d,]+) of ([\d,]+) tokens( \([\d,]+ from cache\))?…")
    assert seen and all(shown.fullmatch(text) for text in seen), seen
    counts = [tuple(int(n.replace(",", "")) for n in shown.fullmatch(text).groups()[:2]) for text in seen]
    assert {total for _, total in counts} == {counts[0][1]} and counts[0][1] > 4000, counts
    read = [done for done, _ in counts]
    assert read == sorted(read) and len(set(read)) >= 4, read  # it moved on step by step
    expect(page.locator(".msg-reading")).to_have_count(0)  # gone once the reply started


def test_stop_really_stops_and_reload_finds_the_session(open_page, ui_server):
    page = open_page("/")
    page.click("#toggle-settings")
    page.fill("#set-system", "You are terse.")
    # empty fields show the server's defaults (the tiny model has no generation config: built-in ones)
    expect(page.locator("#set-temperature")).to_have_attribute("placeholder", "1.0")
    expect(page.locator("#set-top-k")).to_have_attribute("placeholder", "0")
    page.fill("#set-max-tokens", "500")
    page.fill("#set-top-k", "40")
    page.click("#settings-form button[type=submit]")
    expect(page.locator("#settings-status")).to_have_text("Saved.")
    page.click("#settings-close")
    send(page, "Write a long story")
    wait_streaming(page)
    page.click("#stop")
    reply = last_reply(page)
    expect(reply).to_have_attribute("data-status", "stopped", timeout=REPLY_TIMEOUT_MS)
    expect(reply.locator(".msg-badge")).to_have_text("stopped")
    stopped_text = reply.locator(".msg-body").inner_text()
    stats = STATS_LINE.fullmatch(reply.locator(".msg-stats").inner_text())
    assert stats is not None and int(stats.group(1)) < 500
    wait_pool_idle(ui_server, page)  # the engine let go of every block
    assert reply.locator(".msg-body").inner_text() == stopped_text

    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    expect(page.locator(".session.is-current .session-open")).to_have_text("Write a long story")
    expect(page.locator(".msg")).to_have_count(2)
    expect(last_reply(page).locator(".msg-badge")).to_have_text("stopped")
    expect(last_reply(page).locator("[data-action=regenerate]")).to_be_visible()
    page.click("#toggle-settings")
    expect(page.locator("#set-max-tokens")).to_have_value("500")
    expect(page.locator("#set-top-k")).to_have_value("40")
    expect(page.locator("#set-system")).to_have_value("You are terse.")


# 24 lines (a long message), about 300 tokens; its lines end in '?' too, and are no question for the title
PASTED_DOCUMENT = "Here is a document:\n\n" + "\n".join(
    f"Month {i}: {10 * i} kites, {3 * i} reels?" for i in range(1, 25)
)


def test_a_pasted_document_is_titled_by_its_question(open_page):
    page = open_page("/")
    send(page, PASTED_DOCUMENT + "\n\nHow many kites were sold in March? Answer briefly.")
    expect(page.locator("#chat-title")).to_have_text("How many kites were sold in March?")
    expect(page.locator(".session.is-current .session-open")).to_have_text(
        "How many kites were sold in March?"
    )
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    page.click("#new-chat")
    send(page, "Plan a trip\nto the coast")  # a short message keeps its first line
    expect(page.locator("#chat-title")).to_have_text("Plan a trip")
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)


def test_a_long_message_shows_collapsed_until_show_all(open_page):
    page = open_page("/")
    send(page, PASTED_DOCUMENT + "\n\nWhich month sold the most reels?")
    # measured once the reply ended: the page re-renders the message when the server has stored it
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    message = page.locator(".msg-user").last
    toggle = message.locator(".msg-toggle")
    expect(toggle).to_have_text("Show all")
    expect(toggle).to_have_attribute("aria-expanded", "false")
    collapsed = message.locator(".msg-body").bounding_box()["height"]
    assert collapsed < 200, collapsed  # a few lines, not 27
    clipped = message.locator(".msg-body").evaluate("(b) => b.scrollHeight > b.clientHeight + 100")
    assert clipped  # the rest of the text is there, hidden below the fade
    toggle.click()
    expect(toggle).to_have_text("Show less")
    expect(toggle).to_have_attribute("aria-expanded", "true")
    expanded = message.locator(".msg-body").bounding_box()["height"]
    assert expanded > 3 * collapsed, (collapsed, expanded)
    toggle.click()
    expect(toggle).to_have_text("Show all")
    assert message.locator(".msg-body").bounding_box()["height"] == collapsed
    page.reload()  # rendered from the stored conversation: collapsed again
    page.wait_for_selector("body[data-ready=true]")
    expect(page.locator(".msg-user .msg-toggle")).to_have_text("Show all")
    send(page, "A short one")
    expect(page.locator(".msg-user")).to_have_count(2)
    expect(page.locator(".msg-user").last.locator(".msg-toggle")).to_have_count(0)
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)


@pytest.mark.budget(seconds=60, why="a server of its own, reading a 700-token prompt at 250 ms a step")
def test_a_reply_stopped_before_its_first_token(chromium, open_page, reading_ui_server):
    server = reading_ui_server
    page = open_page("/", context=chromium.new_context(viewport=WIDE, base_url=server.base_url))
    send(page, "word " * 700)
    expect(page.locator(".msg-reading")).to_be_visible(timeout=REPLY_TIMEOUT_MS)  # still reading the prompt
    page.click("#stop")
    expect(page.locator(".msg-reading")).to_have_count(0)
    expect(page.locator("#stop")).to_be_hidden()
    expect(page.locator("#input")).to_be_enabled()
    expect(page.locator(".msg-assistant")).to_have_count(0)  # no "(no text)" bubble
    expect(page.locator(".msg-user")).to_have_count(1)  # the message stays, to edit or send again
    expect(page.locator(".msg-user [data-action=edit]")).to_be_visible()
    wait_pool_idle(server, page)  # the engine let go of every block
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    expect(page.locator(".msg-user")).to_have_count(1)
    expect(page.locator(".msg-assistant")).to_have_count(0)


def test_reconnect_after_a_drop_then_regenerate_and_edit(open_page, ui_server):
    page = open_page("/")
    session_id = new_session(page, title="Drop test", settings={"max_tokens": 300})
    page.goto(f"/#s={session_id}")
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    send(page, "Tell me more")
    wait_streaming(page)
    # the network drops mid-reply
    page.evaluate("async () => (await import('/static/chat_state.js')).state.socket.ws.close()")
    expect(page.locator(".msg")).to_have_count(2)
    expect(last_reply(page)).to_have_attribute("data-status", "interrupted")
    expect(page.locator("#conn-status")).to_be_hidden()  # reconnected on its own
    # the page shows the reply as the server stored it (the reload after reconnecting re-reads it)
    stored = page.request.get(f"/api/sessions/{session_id}").json()["messages"][-1]
    assert stored["status"] == "interrupted"
    expect(last_reply(page)).to_have_attribute("data-text", stored["content"])
    regenerate = last_reply(page).locator("[data-action=regenerate]")
    expect(regenerate).to_be_visible()
    regenerate.click()
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    expect(page.locator(".msg")).to_have_count(2)

    page.click(".msg-user [data-action=edit]")
    page.fill(".msg-edit textarea", "Tell me less")
    page.press(".msg-edit textarea", "Enter")
    expect(page.locator(".msg-user .msg-body")).to_have_text(["Tell me less"])
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    expect(page.locator(".msg")).to_have_count(2)
    stored = page.request.get(f"/api/sessions/{session_id}").json()["messages"]
    assert [(m["role"], m["status"]) for m in stored] == [("user", "complete"), ("assistant", "finished")]
    assert stored[0]["content"] == "Tell me less"

    # the socket drops just after a message went out, before the server's `start`: once reconnected the page finds
    # it stored (the server stopped its reply when the socket closed) and does not send it again
    page.fill("#input", "Once only")
    page.evaluate(
        """async () => {
            const ws = (await import('/static/chat_state.js')).state.socket.ws;
            const send = ws.send.bind(ws);
            ws.send = (data) => { send(data); ws.close(); };
            document.getElementById('composer').requestSubmit();
        }"""
    )
    expect(page.locator(".msg-user .msg-body")).to_have_text(["Tell me less", "Once only"])
    expect(last_reply(page)).to_have_attribute("data-status", "interrupted")
    expect(page.locator("#conn-status")).to_be_hidden()
    expect(page.locator(".msg-user.is-pending")).to_have_count(0)
    expect(page.locator("#input")).to_have_value("")
    expect(page.locator("#input")).to_be_enabled()
    stored = page.request.get(f"/api/sessions/{session_id}").json()["messages"]
    assert [(m["role"], m["content"] if m["role"] == "user" else m["status"]) for m in stored] == [
        ("user", "Tell me less"),
        ("assistant", "finished"),
        ("user", "Once only"),
        ("assistant", "interrupted"),
    ]


def test_a_restart_mid_reply_and_a_message_sent_while_the_server_is_down(
    chromium, open_page, tmp_path, tiny_model
):
    """SIGTERM while a reply streams, a message sent while the server is down, the server back on the same port and
    database: each failure state is one clear state, and what the page shows is what was stored."""
    settings = dict(
        PAGEDCHAT_MAX_MODEL_LEN="1024", PAGEDCHAT_DEFAULT_MAX_TOKENS="200", PAGEDCHAT_SHUTDOWN_GRACE_S="1"
    )
    # 150 tokens at >= 40 ms a step (>= 6 s) outlast the 1 s grace period by far (at 15 ms a loaded CI machine once
    # finished the reply before the cut): the shutdown cuts the reply, and the test waits no longer for it
    slow = start_server(
        tmp_path, server_env(tmp_path, tiny_model, **settings, **{FAULTS_ENV: "step_delay_ms=40"})
    )
    servers = [slow]
    context = chromium.new_context(viewport=WIDE, base_url=slow.base_url)
    try:
        page = open_page("/", context=context, http_errors_ok=True)
        sid = new_session(page, title="Restart", settings={"max_tokens": 150})
        page.goto(f"/#s={sid}")
        page.reload()
        page.wait_for_selector("body[data-ready=true]")
        other = open_page(f"/#s={sid}", context=context, http_errors_ok=True)  # a second tab on the same chat
        send(page, "Write a long story")
        wait_streaming(page)
        stop_server(slow)

        # the cut reply shows the status and the text it is stored with, and keeps its Regenerate
        reply = last_reply(page)
        expect(reply).to_have_attribute("data-status", "interrupted")
        expect(reply.locator(".msg-badge")).to_have_text("interrupted")
        with sqlite3.connect(slow.db_path) as db:
            rows = db.execute("SELECT role, status, content FROM messages ORDER BY id").fetchall()
        assert [row[:2] for row in rows] == [("user", "complete"), ("assistant", "interrupted")]
        assert reply.get_attribute("data-text") == rows[1][2] != ""
        expect(page.locator("#conn-status")).to_have_text("Connection lost — reconnecting…")
        expect(reply.locator("[data-action=regenerate]")).to_be_visible()

        # Regenerate while the server is down leaves the reply in place and says why
        reply.locator("[data-action=regenerate]").click()
        expect(page.locator("#error-text")).to_contain_text("Not connected to the server")
        expect(page.locator(".msg")).to_have_count(2)
        expect(reply.locator("[data-action=regenerate]")).to_be_visible()

        # a message sent meanwhile waits as one pending bubble (the composer is emptied), across failed reconnects
        send(page, "Are you back?")
        pending = page.locator(".msg-user.is-pending")
        expect(pending).to_have_count(1)
        expect(pending.locator(".msg-note")).to_contain_text("Not sent yet")
        expect(page.locator("#input")).to_have_value("")
        expect(page.locator("#error-banner")).to_be_hidden()
        wait_failed_reconnects(page, 3)
        screenshot(page, "chat-message-waiting.png")
        expect(pending).to_have_count(1)
        expect(pending.locator("[data-action=edit]")).to_be_hidden()
        expect(page.locator("#input")).to_have_value("")
        # Cancel: the text goes back to the composer, the interrupted reply gets its Regenerate back
        pending.locator("[data-action=cancel-send]").click()
        expect(pending).to_have_count(0)
        expect(page.locator("#input")).to_have_value("Are you back?")
        expect(reply.locator("[data-action=regenerate]")).to_be_visible()
        page.press("#input", "Enter")
        expect(pending).to_have_count(1)

        # a blank chat has no connection to lose: no stale status line there
        expect(other.locator("#conn-status")).to_have_text("Connection lost — reconnecting…")
        other.click("#new-chat")
        expect(other.locator(".msg")).to_have_count(0)
        expect(other.locator("#conn-status")).to_be_hidden()

        # back on the same port and database (at full speed): the waiting message goes out once, the status line goes
        servers.append(start_server(tmp_path, server_env(tmp_path, tiny_model, **settings), port=slow.port))
        expect(page.locator("#conn-status")).to_be_hidden(timeout=10_000)
        expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
        expect(page.locator(".msg-user .msg-body")).to_have_text(["Write a long story", "Are you back?"])
        expect(pending).to_have_count(0)
        expect(page.locator(".msg-assistant").first).to_have_attribute("data-status", "interrupted")
        expect(page.locator("#error-banner")).to_be_hidden()
        stored = page.request.get(f"/api/sessions/{sid}").json()["messages"]
        assert [(m["role"], m["status"]) for m in stored] == [
            ("user", "complete"),
            ("assistant", "interrupted"),
            ("user", "complete"),
            ("assistant", "finished"),
        ]
        assert stored[1]["content"] == rows[1][2]
        expect(other.locator("#conn-status")).to_be_hidden()
        other.click(f".session[data-id='{sid}'] .session-open")
        expect(other.locator(".msg")).to_have_count(4)

        page.reload()
        page.wait_for_selector("body[data-ready=true]")
        expect(page.locator(".msg-badge")).to_have_text(["interrupted", ""])
        # every reply can be regenerated (a new version beside it), the interrupted one included
        expect(page.locator("[data-action=regenerate]:visible")).to_have_count(2)
        expect(last_reply(page).locator("[data-action=regenerate]")).to_be_visible()
    finally:
        context.close()
        for running in servers:
            stop_server(running, signal.SIGKILL, timeout_s=10)


def wait_failed_reconnects(page: Any, count: int, timeout_s: float = 10.0) -> None:
    """Wait until the page's socket has failed to reconnect `count` times in a row."""
    deadline = time.monotonic() + timeout_s
    script = "async () => (await import('/static/chat_state.js')).state.socket.attempt"
    while page.evaluate(script) < count:
        assert time.monotonic() < deadline, f"fewer than {count} failed reconnects after {timeout_s} s"
        page.wait_for_timeout(100)


def lose_the_connection(page: Any) -> None:
    """The chat's socket closes and stays closed, counted as reconnecting (as while the server cannot be reached)."""
    page.evaluate(
        """async () => {
            const { state } = await import('/static/chat_state.js');
            state.socket.close();
            state.socket.attempt = 1;
        }"""
    )


def reply_stats(reply: Any) -> re.Match[str]:
    """The stats line of a finished reply, parsed: tokens (1), cached (3) of prompt tokens (4)."""
    expect(reply).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    stats = STATS_LINE.fullmatch(reply.locator(".msg-stats").inner_text())
    assert stats is not None, reply.locator(".msg-stats").inner_text()
    return stats


def test_reply_versions_switch_and_any_message_can_be_edited(open_page):
    page = open_page("/")
    session_id = new_session(page, title="Branches", settings={"max_tokens": 8})
    page.goto(f"/#s={session_id}")
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    for text in ("First question", "Second question"):
        send(page, text)
        expect(page.locator(".msg")).to_have_count(2 if text.startswith("First") else 4)
        reply_stats(last_reply(page))
    original = last_reply(page).get_attribute("data-id")
    original_text = last_reply(page).locator(".msg-body").inner_text()
    expect(page.locator(".msg-versions")).to_have_count(0)

    last_reply(page).locator("[data-action=regenerate]").click()
    # the click took the old reply off the page: until the new one starts, the last reply is the first turn's
    expect(page.locator(".msg")).to_have_count(4)
    stats = reply_stats(last_reply(page))
    assert int(stats.group(3)) >= (int(stats.group(4)) - 1) // 16 * 16  # the same prompt: all its full blocks
    versions = last_reply(page).locator(".msg-versions")
    expect(versions.locator(".version-label")).to_have_text("2/2")
    regenerated = last_reply(page).get_attribute("data-id")
    assert regenerated != original
    versions.locator("[data-action=version-prev]").click()
    expect(last_reply(page)).to_have_attribute("data-id", original)
    expect(last_reply(page).locator(".version-label")).to_have_text("1/2")
    expect(last_reply(page).locator(".msg-body")).to_have_text(original_text)
    expect(last_reply(page).locator("[data-action=version-prev]")).to_be_disabled()
    last_reply(page).locator("[data-action=version-next]").click()
    expect(last_reply(page)).to_have_attribute("data-id", regenerated)

    first = page.locator(".msg-user").first  # not the last message: a branch starts there
    first.locator("[data-action=edit]").click()
    page.fill(".msg-edit textarea", "First question, edited")
    page.press(".msg-edit textarea", "Enter")
    expect(page.locator(".msg-user .msg-body")).to_have_text(["First question, edited"])
    stats = reply_stats(last_reply(page))
    assert int(stats.group(3)) >= 16  # the template's system prompt and header, shared with the first branch
    expect(page.locator(".msg")).to_have_count(2)
    expect(page.locator(".msg-user .version-label")).to_have_text("2/2")
    page.locator(".msg-user [data-action=version-prev]").click()
    expect(page.locator(".msg")).to_have_count(4)  # the first branch, at its newest turn
    expect(page.locator(".msg-user .msg-body")).to_have_text(["First question", "Second question"])
    expect(last_reply(page)).to_have_attribute("data-id", regenerated)
    page.reload()  # the server keeps the branch on show
    page.wait_for_selector("body[data-ready=true]")
    expect(page.locator(".msg")).to_have_count(4)
    expect(last_reply(page)).to_have_attribute("data-id", regenerated)
    screenshot(page, "chat-versions.png")


def test_continue_grows_a_reply_cut_at_its_limit(open_page):
    page = open_page("/")
    session_id = new_session(page, title="Continue", settings={"max_tokens": 6})
    page.goto(f"/#s={session_id}")
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    send(page, "Tell me a story")
    reply = last_reply(page)
    first = reply_stats(reply)
    assert first.group(1) == "6" and first.group(6) == " · hit the token limit"
    reply_id, cut_text = reply.get_attribute("data-id"), reply.locator(".msg-body").inner_text()
    reply.locator("[data-action=continue]").click()
    expect(reply.locator(".msg-stats")).to_contain_text("12 tokens", timeout=REPLY_TIMEOUT_MS)
    grown = reply_stats(reply)
    prompt = int(first.group(4))
    assert int(grown.group(4)) == prompt + 6  # the history and the reply's own tokens
    assert int(grown.group(3)) >= (prompt + 5) // 16 * 16
    expect(page.locator(".msg")).to_have_count(2)  # the same bubble grew
    assert reply.get_attribute("data-id") == reply_id
    assert reply.locator(".msg-body").inner_text().startswith(cut_text.rstrip())
    expect(reply.locator("[data-action=continue]")).to_be_visible()  # cut at its limit again
    send(page, "Thanks")
    # until its reply starts, the last reply on the page is the continued one
    expect(page.locator(".msg")).to_have_count(4)
    reply_stats(last_reply(page))
    expect(page.locator("[data-action=continue]:visible")).to_have_count(1)  # only on the last reply

    # with the connection down, Continue changes nothing and says why (as Regenerate and Edit)
    cut = last_reply(page)
    text = cut.get_attribute("data-text")
    lose_the_connection(page)
    cut.locator("[data-action=continue]").click()
    expect(page.locator("#error-text")).to_contain_text("Not connected to the server")
    expect(page.locator(".msg")).to_have_count(4)
    expect(cut).to_have_attribute("data-status", "finished")
    assert cut.get_attribute("data-text") == text
    expect(cut.locator("[data-action=continue]")).to_be_visible()


def test_a_message_follows_the_reply_on_the_page_whatever_another_device_put_on_show(open_page):
    """Two devices of one owner on one chat: the other regenerates (its version is on show on the server), this page
    still shows the first reply and answers it; the message goes after that reply, as the page shows it."""
    page = open_page("/")
    sid = new_session(page, title="Two devices", settings={"max_tokens": 2})
    page.goto(f"/#s={sid}")
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    send(page, "First question")
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    shown = int(last_reply(page).get_attribute("data-id"))
    origin = page.url.split("/#")[0].rstrip("/")
    elsewhere = page.request.post(f"/api/sessions/{sid}/regenerate", data={}, headers={"Origin": origin})
    assert elsewhere.status == 200, elsewhere.text()
    send(page, "Second question")
    expect(page.locator(".msg")).to_have_count(4)
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    on_page = [int(n.get_attribute("data-id")) for n in page.locator(".msg").all()]
    stored = page.request.get(f"/api/sessions/{sid}").json()["messages"]
    assert [m["id"] for m in stored] == on_page
    assert stored[1]["id"] == shown and stored[2]["parent_id"] == shown


def _context_chat(open_page: Callable[..., Any]) -> tuple[Any, str]:
    """A page on a new chat of 16-token replies (the server's max_model_len is 1024)."""
    page = open_page("/")
    sid = new_session(page, title="Context", settings={"max_tokens": 16, "temperature": 0})
    page.goto(f"/#s={sid}")
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    return page, sid


def _stored(page: Any, sid: str) -> list[dict[str, Any]]:
    return page.request.get(f"/api/sessions/{sid}/messages").json()["messages"]


def _stored_once_answered(page: Any, sid: str) -> list[dict[str, Any]]:
    """The stored branch once its last message is a reply that ended (the page may show the old version's reply
    as finished while the new one still streams)."""
    deadline = time.monotonic() + REPLY_TIMEOUT_MS / 1000
    while True:
        stored = _stored(page, sid)
        if stored[-1]["role"] == "assistant" and stored[-1]["status"] != "streaming":
            return stored
        assert time.monotonic() < deadline, stored[-1]
        time.sleep(0.1)


def test_a_document_larger_than_the_context_is_refused_at_the_composer(open_page):
    page, sid = _context_chat(open_page)
    document = "A long README. " + "lorem ipsum dolor sit amet " * 240  # over 1,100 tokens
    send(page, document)
    notice = page.locator("#composer-notice")
    expect(notice).to_be_visible()
    expect(notice).to_have_attribute("data-kind", "too-long")
    expect(notice).to_contain_text("exceeds max_model_len (1024)")
    expect(notice).to_contain_text("send a shorter message")
    expect(notice).to_contain_text("--max-model-len")
    # nothing sent: no bubble, no stored message, the text still in the composer, the composer free
    expect(page.locator(".msg")).to_have_count(0)
    assert page.locator("#input").input_value() == document
    expect(page.locator("#input")).to_be_enabled()
    assert _stored(page, sid) == []
    screenshot(page, "chat-context-too-long.png")
    page.fill("#input", "Hello")  # typing other text takes the advice away
    expect(notice).to_be_hidden()
    page.fill("#input", document)  # a long paste is checked after a pause in typing, before Send
    expect(notice).to_have_attribute("data-kind", "too-long")
    expect(notice).to_contain_text("--max-model-len")
    expect(page.locator(".msg")).to_have_count(0)
    assert _stored(page, sid) == []


def test_a_history_that_must_be_cut_offers_the_choice_and_drops_nothing_silently(open_page):
    page, sid = _context_chat(open_page)
    first = "Document one. " + "apples and pears grow here. " * 80  # about 500 tokens
    send(page, first)
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    second = "Document two. " + "plums and cherries grow there. " * 80  # the two do not fit 1024 together
    send(page, second)
    notice = page.locator("#composer-notice")
    expect(notice).to_have_attribute("data-kind", "choice")
    expect(notice).to_contain_text(
        "1 earlier exchange must be left out. Nothing is left out until you choose:"
    )
    expect(notice.locator("[data-choice]")).to_have_text(
        ["Drop the oldest turns", "New chat from a summary", "Cancel"]
    )
    # nothing sent, nothing dropped yet
    expect(page.locator(".msg")).to_have_count(2)
    assert page.locator("#input").input_value() == second
    assert len(_stored(page, sid)) == 2
    screenshot(page, "chat-context-choice.png")
    notice.locator("[data-choice=cancel]").click()
    expect(notice).to_be_hidden()
    assert len(_stored(page, sid)) == 2
    send(page, second)
    notice.locator("[data-choice=oldest]").click()
    expect(notice).to_be_hidden()
    expect(page.locator(".msg")).to_have_count(4)
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    expect(last_reply(page).locator(".msg-stats")).to_contain_text("1 earlier turn left out, as you chose")
    stored = _stored_once_answered(page, sid)
    assert [m["content"] for m in stored if m["role"] == "user"] == [first, second]
    assert stored[-1]["truncated_turns"] == 1
    # an edit of that message needs the same cut: the choice again (no summary: an edit stays in its chat)
    edited = page.locator(".msg-user").last
    edited.locator("[data-action=edit]").click()
    edited.locator(".msg-edit textarea").press("Enter")
    expect(notice).to_have_attribute("data-kind", "choice")
    expect(notice.locator("[data-choice]")).to_have_text(["Drop the oldest turns", "Cancel"])
    expect(page.locator(".msg")).to_have_count(4)  # the branch as it was, nothing dropped
    notice.locator("[data-choice=oldest]").click()
    expect(page.locator(".msg-user").last.locator(".msg-versions")).to_be_visible(timeout=REPLY_TIMEOUT_MS)
    assert _stored_once_answered(page, sid)[-1]["truncated_turns"] == 1


def test_keep_the_attachments_keeps_the_file_and_its_cached_blocks(open_page, tmp_path):
    page, sid = _context_chat(open_page)
    path = tmp_path / "pears.md"
    path.write_text("Pears. " + "apples and pears grow here. " * 60)
    page.set_input_files("#attach-input", str(path))
    chip = page.locator("#attach-chips .attach-chip .attach-detail")
    expect(chip).to_contain_text("tokens")
    file_tokens = int(chip.inner_text().split(" · ")[1].split()[0])
    send(page, "Where do pears grow?")
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    send(page, "Document two. " + "plums and cherries grow there. " * 60)
    expect(page.locator(".msg-assistant")).to_have_count(2)
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    send(
        page, "Document three. " + "figs and dates grow far away. " * 30
    )  # the three do not fit 1024 together
    notice = page.locator("#composer-notice")
    expect(notice).to_have_attribute("data-kind", "choice")
    expect(notice.locator("[data-choice]")).to_have_text(
        [
            "Drop the oldest turns",
            "Keep the attachments, drop other turns",
            "New chat from a summary",
            "Cancel",
        ]
    )
    notice.locator("[data-choice=keep_pinned]").click()
    expect(page.locator(".msg-assistant")).to_have_count(3)
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    stats = STATS_LINE.fullmatch(last_reply(page).locator(".msg-stats").inner_text())
    assert stats is not None and "1 earlier turn left out, as you chose" in stats.group(0)
    assert int(stats.group(3)) >= file_tokens - 16  # the exchange with the file stayed, read from the cache
    stored = _stored(page, sid)
    assert stored[-1]["truncated_turns"] == 1 and [a["filename"] for a in stored[0]["attachments"]] == [
        "pears.md"
    ]


def test_a_chat_that_no_longer_fits_can_go_on_in_a_new_chat_from_a_summary(open_page):
    page, sid = _context_chat(open_page)
    first = "Document one. " + "apples and pears grow here. " * 80
    send(page, first)
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    second = "Document two. " + "plums and cherries grow there. " * 80
    send(page, second)
    page.locator("#composer-notice [data-choice=summary]").click()
    page.wait_for_function(f"() => !location.hash.includes({json.dumps(sid)})", timeout=REPLY_TIMEOUT_MS)
    expect(page.locator(".msg")).to_have_count(2)
    expect(page.locator(".msg-user .msg-body")).to_have_text([second])
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    expect(page.locator("#composer-notice")).to_be_hidden()
    new_sid = page.evaluate("() => new URLSearchParams(location.hash.slice(1)).get('s')")
    made = page.request.get(f"/api/sessions/{new_sid}").json()
    assert made["system_prompt"].startswith("Summary of an earlier conversation")
    assert len(_stored(page, sid)) == 2  # the old chat is unchanged
    expect(page.locator(".session-open")).to_have_count(2)


def test_sidebar_rename_delete_keyboard_and_visible_errors(open_page):
    page = open_page("/")
    alpha = new_session(page, title="Alpha")
    new_session(page, title="Beta")
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    expect(page.locator(".session-open")).to_have_text(["Beta", "Alpha"])  # newest first

    page.click(f".session[data-id='{alpha}'] [data-action=rename]")
    page.fill(".session-rename input", "Gamma")
    page.press(".session-rename input", "Enter")
    expect(page.locator(".session-open")).to_have_text(["Beta", "Gamma"])  # renamed in place
    page.click(".session:has-text('Beta') [data-action=delete]")
    expect(page.locator(".session-confirm [data-action=confirm-delete]")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator(".session-open")).to_have_text(["Gamma"])

    page.focus("#input")
    page.keyboard.type("line one")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("line two")
    expect(page.locator("#input")).to_have_value("line one\nline two")
    expect(page.locator(".msg")).to_have_count(0)

    too_long = "word " * 1500  # over max_model_len (1024) with any reply length
    send(page, too_long)  # refused at the composer, saying what to do (chat_context.js)
    expect(page.locator("#composer-notice")).to_be_visible()
    expect(page.locator("#composer-notice")).to_contain_text("exceeds max_model_len (1024)")
    expect(page.locator("#input")).to_have_value(too_long)  # what was typed is not lost
    expect(page.locator("#input")).to_be_enabled()
    expect(page.locator(".msg")).to_have_count(0)


def test_xss_in_a_message_is_shown_as_text(open_page):
    page = open_page("/")
    payload = (
        '<img src=x onerror="window.__xss=1"> <script>window.__xss=2</script> '
        "[click](javascript:window.__xss=3) <b>bold?</b>"
    )
    send(page, payload)
    expect(page.locator(".msg-user .msg-body")).to_have_text([payload])
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    expect(page.locator(".msg-user .msg-body")).to_have_text([payload])
    injected = "#messages img, #messages script, .msg-user b, .msg-user a, #session-list img, #session-list b"
    assert page.locator(injected).count() == 0
    assert page.evaluate("() => window.__xss") is None


def test_search_opens_the_matching_chat_and_export_downloads_it(open_page):
    page = open_page("/")
    text = "Which <b>zanzibar</b> ferry leaves first?"
    sid = new_session(page, title="Ferries <i>east</i>", settings={"max_tokens": 2})
    origin = page.url.split("/#")[0].rstrip("/")
    reply = page.request.post(
        f"/api/sessions/{sid}/messages", data={"content": text}, headers={"Origin": origin}
    )
    assert reply.status == 200, reply.text()
    new_session(page, title="Another chat")
    page.reload()  # the newer chat is open; the search has to switch to the other one
    page.wait_for_selector("body[data-ready=true]")
    expect(page.locator("#chat-title")).to_have_text("Another chat")

    page.locator("#search-input").press_sequentially("zanzi")  # as typed: the last word is a prefix
    hit = page.locator("#search-results .search-hit")
    expect(hit).to_have_count(1)
    expect(hit.locator("mark")).to_have_text(["zanzibar"])
    expect(hit.locator(".search-snippet")).to_have_text(text)  # the tags are text, only the match is marked
    assert page.locator("#search-results b, #search-results i").count() == 0
    expect(page.locator("#session-list")).to_be_hidden()
    screenshot(page, "chat-search.png")
    hit.click()
    expect(page.locator("#chat-title")).to_have_text("Ferries <i>east</i>")
    expect(page.locator(".msg-user.is-search-hit .msg-body")).to_have_text(text)
    page.press("#search-input", "Escape")
    expect(page.locator("#session-list")).to_be_visible()

    page.click("#export-menu summary")
    screenshot(page, "chat-export-menu.png")
    with page.expect_download() as download_info:
        page.click("#export-md")
    download = download_info.value
    assert download.suggested_filename == "ferries-i-east-i.md"
    exported = Path(download.path()).read_text()
    assert exported.startswith("# Ferries \\<i\\>east\\</i\\>\n")
    assert "## User\n\n_" in exported and f"\n\n{text}\n\n## Assistant\n" in exported
    expect(page.locator("#export-menu")).not_to_have_attribute("open", "")


def test_a_search_hit_in_another_version_shows_its_branch(open_page):
    """Search finds every version of a message; opening a hit that is not on the branch on show switches to it."""
    page = open_page("/")
    sid = new_session(page, title="Versions to find", settings={"max_tokens": 2})
    origin = page.url.split("/#")[0].rstrip("/")
    first = page.request.post(
        f"/api/sessions/{sid}/messages",
        data={"content": "Which quokka is oldest?"},
        headers={"Origin": origin},
    )
    assert first.status == 200, first.text()
    asked = page.request.get(f"/api/sessions/{sid}").json()["messages"][0]["id"]
    edited = page.request.post(  # the edit is on show now; the first version waits on the other branch
        f"/api/sessions/{sid}/edit",
        data={"content": "Which wombat is oldest?", "message_id": asked},
        headers={"Origin": origin},
    )
    assert edited.status == 200, edited.text()
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    expect(page.locator(".msg-user .msg-body")).to_have_text(["Which wombat is oldest?"])

    page.locator("#search-input").press_sequentially("quokka")
    hit = page.locator("#search-results .search-hit")
    expect(hit).to_have_count(1)
    hit.click()
    expect(page.locator(f'.msg-user.is-search-hit[data-id="{asked}"] .msg-body')).to_have_text(
        "Which quokka is oldest?"
    )
    expect(page.locator(".msg-user .version-label")).to_have_text("1/2")
    assert page.request.get(f"/api/sessions/{sid}").json()["messages"][0]["id"] == asked  # the server's too
    page.press("#search-input", "Escape")


def test_scripts_are_modules_served_as_javascript(open_page, ui_server):
    page = open_page("/")
    # the theme, set before the first paint, then one entry module that imports the rest
    assert page_scripts(page) == [["", "/static/theme.js"], ["module", "/static/chat_page.js"]]
    assert page.evaluate("() => 'pagedchat' in window") is False  # modules share state by import only
    static = REPO_ROOT / "static"
    scripts = [path for path in static.rglob("*") if path.is_file() and path.suffix in (".js", ".mjs")]
    names = sorted(path.relative_to(static).as_posix() for path in scripts)
    assert "protocol.js" in names and "admin_page.js" in names and "vendor/katex/katex.mjs" in names
    for name in names:
        response = httpx.get(f"{ui_server.base_url}/static/{name}", timeout=10)
        assert response.status_code == 200, name
        # a module script of another MIME type is refused; imported modules have no ?v=, so they revalidate
        assert response.headers["content-type"].split(";")[0] in JAVASCRIPT_TYPES, name
        assert response.headers["cache-control"] == "no-cache", name


LINK = 'target="_blank" rel="noopener noreferrer nofollow"'


def code_block(lang: str, code_html: str) -> str:
    """A fenced code block as rendered: a bar with the language and a Copy button, then the code."""
    pre = f'<pre data-lang="{lang}">' if lang else "<pre>"
    return (
        f'<div class="code-block"><div class="code-bar"><span class="code-lang">{lang}</span>'
        '<button type="button" class="code-copy" aria-label="Copy code">Copy</button></div>'
        f"{pre}{code_html}</pre></div>"
    )


MARKDOWN_CASES = [
    # raw HTML stays text; only absolute http(s)/mailto URLs become links, anything else keeps its source text
    ("<script>alert(1)</script>", "<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>"),
    ('<img src=x onerror="alert(1)">', '<p>&lt;img src=x onerror="alert(1)"&gt;</p>'),
    ("[click](javascript:alert(1))", "<p>[click](javascript:alert(1))</p>"),
    ("[x](JaVaScRiPt:alert(1))", "<p>[x](JaVaScRiPt:alert(1))</p>"),
    ("[x](data:text/html;base64,PHNjcmlwdD4=)", "<p>[x](data:text/html;base64,PHNjcmlwdD4=)</p>"),
    ("![i](javascript:alert(1))", "<p>![i](javascript:alert(1))</p>"),
    ("[x](/relative)", "<p>[x](/relative)</p>"),
    ("[y](vbscript:x) www.example.com", "<p>[y](vbscript:x) www.example.com</p>"),
    ("[ok](https://example.com/a?b=1)", f'<p><a href="https://example.com/a?b=1" {LINK}>ok</a></p>'),
    (
        "see https://example.org/x.",
        f'<p>see <a href="https://example.org/x" {LINK}>https://example.org/x</a>.</p>',
    ),
    ("<https://a.b/c>", f'<p><a href="https://a.b/c" {LINK}>https://a.b/c</a></p>'),
    (
        "![alt](https://e.com/i.png)",
        f'<p><a href="https://e.com/i.png" class="md-image-link" {LINK}>alt</a></p>',
    ),
    (
        "**bold** and *em* and `a<b>`",
        "<p><strong>bold</strong> and <em>em</em> and <code>a&lt;b&gt;</code></p>",
    ),
    ("snake_case_name and ~~old~~", "<p>snake_case_name and <del>old</del></p>"),
    (
        "```js\nconst a = '<b>';\n```",
        code_block(
            "js",
            '<code class="hljs language-js"><span class="hljs-keyword">const</span> a = '
            "<span class=\"hljs-string\">'&lt;b&gt;'</span>;</code>",
        ),
    ),
    ("```\nunclosed <i>", code_block("", "<code>unclosed &lt;i&gt;</code>")),
    (
        "```no-such-lang\n<b>x</b>\n```",
        code_block("no-such-lang", '<code class="language-no-such-lang">&lt;b&gt;x&lt;/b&gt;</code>'),
    ),
    ("# Title\n\ntext", "<h3>Title</h3><p>text</p>"),
    ("- one\n- two\n  - nested", "<ul>\n<li>one</li>\n<li>two\n<ul>\n<li>nested</li>\n</ul>\n</li>\n</ul>"),
    (
        "1. a\n   - b\n     1. c",
        "<ol>\n<li>a\n<ul>\n<li>b\n<ol>\n<li>c</li>\n</ol>\n</li>\n</ul>\n</li>\n</ol>",
    ),
    ("3. three\n4. four", '<ol start="3">\n<li>three</li>\n<li>four</li>\n</ol>'),
    ("> quoted\n> more", "<blockquote>\n<p>quoted<br>\nmore</p>\n</blockquote>"),
    ("a\nb\n\n---\n\nc", "<p>a<br>\nb</p><hr><p>c</p>"),
    (  # GFM table: alignment as classes (the CSP allows no style attribute), cells are Markdown too
        "| a | b |\n|:--|--:|\n| <b>1</b> | [x](javascript:alert(1)) |",
        '<div class="md-table"><table>\n<thead>\n<tr>\n<th class="align-left">a</th>\n'
        '<th class="align-right">b</th>\n</tr>\n</thead>\n<tbody>\n<tr>\n'
        '<td class="align-left">&lt;b&gt;1&lt;/b&gt;</td>\n<td class="align-right">[x](javascript:alert(1))</td>\n'
        "</tr>\n</tbody>\n</table></div>",
    ),
    (  # GFM task list: disabled checkboxes (no ids: they would repeat across replies)
        "- [ ] todo\n- [x] done",
        '<ul class="task-list-container">\n<li class="task-list-item"><input type="checkbox" '
        'class="task-list-item-checkbox" disabled="disabled"> todo</li>\n<li class="task-list-item"><input '
        'type="checkbox" class="task-list-item-checkbox" checked="checked" disabled="disabled"> done</li>\n</ul>',
    ),
    (  # math is TeX for KaTeX (typeset once the node is in the page); "$5 and $10" is money
        "$x^2$ costs $5 and $10",
        '<p><span class="math inline"><span class="md-tex" data-display="false">x^2</span></span>'
        " costs $5 and $10</p>",
    ),
    (
        "$<img src=x onerror=alert(1)>$",
        '<p><span class="math inline"><span class="md-tex" data-display="false">'
        "&lt;img src=x onerror=alert(1)&gt;</span></span></p>",
    ),
]


def test_markdown_renderer_builds_safe_nodes(open_page):
    page = open_page("/")
    results = page.evaluate(
        """async (cases) => {
            const { render } = await import("/static/markdown.js");
            return cases.map((src) => {
                const box = document.createElement("div");
                box.appendChild(render(src));
                return box.innerHTML;
            });
        }""",
        [source for source, _ in MARKDOWN_CASES],
    )
    assert list(zip([s for s, _ in MARKDOWN_CASES], results, strict=True)) == [
        (s, html) for s, html in MARKDOWN_CASES
    ]
    safe = page.evaluate(
        """async () => {
            const { safeHref } = await import("/static/markdown.js");
            return ["javascript:alert(1)", "java\\tscript:alert(1)", " data:text/html,x", "vbscript:x", "/x",
                    "https://ok.example/", "mailto:a@b.c"].map((u) => safeHref(u));
        }"""
    )
    assert safe == [None, None, None, None, None, "https://ok.example/", "mailto:a@b.c"]


SHOWCASE = r"""Paged attention in **one table**, a task list, code and math:

| Engine | KV layout | Waste |
|:--|:--|--:|
| contiguous | one slab per request | up to 60% |
| paged | 16-token blocks | < 4% |

- [x] parse with markdown-it
- [ ] nested lists
  - blocks
    - tokens

```python
def block_of(position, block_size=16):
    # which KV block holds this token
    return position // block_size
```

Inline $e^{i\pi} + 1 = 0$, a broken $\frac{1$ and a display:

$$\sum_{i=1}^{n} i = \frac{n(n+1)}{2}$$
"""


def test_markdown_code_copy_and_math_in_a_reply(open_page, ui_server):
    page = open_page("/")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=ui_server.base_url)
    page.evaluate(
        """async (text) => {
            const view = await import("/static/chat_view.js");
            document.getElementById("messages").appendChild(view.assistantMessage({ content: text }));
            document.getElementById("empty-state").hidden = true;
        }""",
        SHOWCASE,
    )
    reply = last_reply(page).locator(".msg-body")
    expect(reply.locator("table th")).to_have_text(["Engine", "KV layout", "Waste"])
    expect(reply.locator("table td.align-right")).to_have_text(["up to 60%", "< 4%"])
    checkboxes = reply.locator("input[type=checkbox]")
    expect(checkboxes).to_have_count(2)
    assert [checkboxes.nth(i).is_checked() for i in range(2)] == [True, False]
    assert all(checkboxes.nth(i).is_disabled() for i in range(2))
    expect(reply.locator(".task-list-item ul ul li")).to_have_text(["tokens"])
    code = reply.locator("pre code.language-python")
    expect(code.locator(".hljs-keyword").first).to_have_text("def")
    expect(code.locator(".hljs-comment")).to_have_text("# which KV block holds this token")

    copy = reply.locator(".code-copy")
    copy.click()
    expect(copy).to_have_text("Copied")
    expect(copy).to_have_class(re.compile("is-copied"))
    clipboard = page.evaluate("() => navigator.clipboard.readText()")
    assert clipboard == code.inner_text() and clipboard.startswith("def block_of(position, block_size=16):\n")
    expect(copy).to_have_text("Copy", timeout=3000)  # back to its resting state

    # KaTeX typesets both formulas (its fonts load under the CSP); a parse error shows the TeX source, marked
    expect(reply.locator(".katex")).to_have_count(2)
    expect(reply.locator(".katex-display")).to_have_count(1)
    annotations = reply.locator(".katex-mathml annotation").all_text_contents()
    assert annotations == [r"e^{i\pi} + 1 = 0", r"\sum_{i=1}^{n} i = \frac{n(n+1)}{2}"]
    expect(reply.locator(".md-tex-error")).to_have_text(r"\frac{1")
    # KaTeX writes the MathML of these two with a style attribute, which the CSP refuses (a console error): they are
    # typeset as near equivalents instead
    page.evaluate(
        """async (text) => {
            const view = await import("/static/chat_view.js");
            document.getElementById("messages").appendChild(view.assistantMessage({ content: text }));
        }""",
        r"$\pmb{x}$ and $\fcolorbox{red}{yellow}{y}$",
    )
    expect(last_reply(page).locator(".katex")).to_have_count(2)
    fonts = page.evaluate(
        """async () => { await document.fonts.ready;
            return [...document.fonts].filter((f) => f.family.startsWith("KaTeX") && f.status === "loaded").length; }"""
    )
    assert fonts >= 2
    page.evaluate("() => document.activeElement.blur()")
    page.mouse.move(0, 0)
    screenshot(page, "chat-markdown.png")

    # code colours are variables: GitHub's light theme, GitHub Dark with <html data-theme=dark>, as the page's palette
    def code_colours() -> list[str]:
        return page.evaluate(
            """() => [document.querySelector(".msg-body pre"), document.querySelector(".hljs-keyword")]
                .map((node) => getComputedStyle(node)[node.tagName === "PRE" ? "backgroundColor" : "color"])"""
        )

    assert code_colours() == ["rgb(246, 248, 250)", "rgb(215, 58, 73)"]
    # theme.js follows the system (its change event comes a moment later)
    page.emulate_media(color_scheme="dark")
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    assert code_colours() == ["rgb(13, 17, 23)", "rgb(255, 123, 114)"]
    page.emulate_media(color_scheme="light")
    expect(page.locator("html")).to_have_attribute("data-theme", "light")
    assert code_colours() == ["rgb(246, 248, 250)", "rgb(215, 58, 73)"]
    page.evaluate("() => { document.documentElement.dataset.theme = 'dark'; }")  # as the theme menu sets it
    assert code_colours() == ["rgb(13, 17, 23)", "rgb(255, 123, 114)"]


STREAM_DOC = """Intro paragraph
on two lines.

## Steps
1. first
2. second

```py
x = 1

y = 2
```
| a | b |
|---|---|
| 1 | 2 |

> quote
lazy line

Setext
---
- [ ] task
text
#tag
#
last words"""


def test_streamed_markdown_renders_only_its_open_block(open_page):
    page = open_page("/")
    result = page.evaluate(
        """async (doc) => {
            const { streamInto, renderInto } = await import("/static/markdown_stream.js");
            const { render } = await import("/static/markdown.js");
            const box = document.createElement("div");
            const differ = [];
            let intro = null;
            let introNodes = 0;
            for (let n = 1; n <= doc.length; n++) {
                const prefix = doc.slice(0, n);
                streamInto(box, prefix);
                const whole = document.createElement("div");
                whole.appendChild(render(prefix));
                if (box.innerHTML !== whole.innerHTML) differ.push(prefix);
                if (box.firstChild !== intro) { intro = box.firstChild; introNodes++; }
            }
            const streamed = Array.from(box.childNodes);
            renderInto(box, doc);
            const kept = Array.from(box.childNodes).filter((node, i) => node === streamed[i]).length;
            return { differ, introNodes, kept, blocks: box.childNodes.length,
                     tags: Array.from(box.children, (node) => node.tagName + "." + node.className) };
        }""",
        STREAM_DOC,
    )
    assert result["differ"] == []  # at every length, the streamed rendering is the whole text's
    assert result["tags"] == [
        "P.",
        "H4.",
        "OL.",
        "DIV.code-block",
        "DIV.md-table",
        "BLOCKQUOTE.",
        "H4.",
        "UL.task-list-container",
        "H3.",
        "P.",
    ]  # fmt: skip (a lone "#" is an empty heading; "#tag" is not, though its first character alone was one)
    # the intro's node was made anew at each length while it was the open block, the last time at its blank line,
    # when it was complete; it was kept from then on, through every later update and the final whole render
    assert result["introNodes"] == STREAM_DOC.index("\n\n") + 2
    assert result["kept"] == result["blocks"] == 10


def test_a_streamed_reply_keeps_its_finished_blocks(chromium, open_page, ui_server):
    """One real reply over the page's socket: the server's own frames, held by a relay until the reply is done, then
    played to the page with STREAM_DOC's lines as its deltas, 80 ms apart: a reply with known blocks, at a pace
    that lets the page draw between deltas whatever the machine's speed."""
    context = chromium.new_context(viewport=WIDE, base_url=ui_server.base_url)
    held: list[tuple[Any, dict[str, Any]]] = []

    def relay(ws: Any) -> None:
        server = ws.connect_to_server()
        server.on_message(lambda message: held.append((ws, json.loads(message))))

    context.route_web_socket(re.compile(r"/ws/sessions/"), relay)
    try:
        page = open_page("/", context=context)
        page.evaluate(
            """() => {
                window.streamRenders = []; // per render of the streaming reply: the nodes it put in
                new MutationObserver((records) => {
                    const added = records.filter((r) => r.target.classList.contains("msg-body"))
                        .flatMap((r) => Array.from(r.addedNodes));
                    if (added.length) window.streamRenders.push(added);
                }).observe(document.getElementById("messages"), { childList: true, subtree: true });
            }"""
        )
        send(page, "Show me some Markdown")
        for _ in range(REPLY_TIMEOUT_MS // 50):
            if any(frame["type"] == "done" for _, frame in held):
                break
            page.wait_for_timeout(50)
        played = False
        for ws, frame in list(held):
            if frame["type"] == "delta":
                if not played:  # the model's text gives way to the script's, a line per delta
                    for line in STREAM_DOC.splitlines(keepends=True):
                        ws.send(json.dumps({"type": "delta", "text": line}))
                        page.wait_for_timeout(80)
                    played = True
                continue
            if frame["type"] == "done":
                frame["message"]["content"] = STREAM_DOC
            ws.send(json.dumps(frame))
        expect(last_reply(page)).to_have_attribute("data-status", "finished")
        result = page.evaluate(
            """async (doc) => {
                const { render } = await import("/static/markdown.js");
                const body = Array.from(document.querySelectorAll(".msg-assistant .msg-body")).pop();
                const intro = body.firstElementChild;
                const renders = window.streamRenders;
                const whole = document.createElement("div");
                whole.appendChild(render(doc));
                return { introText: intro.textContent, renders: renders.length,
                         introRender: renders.findIndex((added) => added.includes(intro)),
                         introAdds: renders.flat().filter((node) => node === intro).length,
                         final: body.innerHTML === whole.innerHTML };
            }""",
            STREAM_DOC,
        )
    finally:
        context.close()
    assert result["introText"] == "Intro paragraph\non two lines."
    assert result["final"]  # reconciled with the whole text's rendering at the end
    # the intro's node went in once, when it was complete, and stayed while later renders drew the rest
    assert result["introAdds"] == 1
    assert result["renders"] - result["introRender"] - 1 >= len(STREAM_DOC.splitlines()) // 2, result


# ---- theme -----------------------------------------------------------------------------------------------------
LIGHT_BG, DARK_BG = "rgb(246, 247, 251)", "rgb(15, 17, 23)"  # --bg of each palette (static/base.css)
DARK_SURFACE = "rgb(23, 26, 35)"
# in an init script: the theme <html> carries when <body> appears, before anything of the page is drawn
RECORD_THEME_AT_BODY = """
new MutationObserver((_, observer) => {
  if (!document.body) return;
  window.__themeAtBody = document.documentElement.getAttribute("data-theme");
  observer.disconnect();
}).observe(document, { childList: true, subtree: true });
"""
# WCAG contrast of each selector's text against the first opaque background behind it
CONTRAST = """(selectors) => {
  const rgb = (c) => c.match(/[\\d.]+/g).map(Number);
  const lin = (v) => (v /= 255) <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
  const lum = ([r, g, b]) => 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b);
  const background = (node) => {
    for (; node; node = node.parentElement) {
      const c = rgb(getComputedStyle(node).backgroundColor);
      if (c.length < 4 || c[3] > 0) return c;
    }
    return [255, 255, 255];
  };
  return Object.fromEntries(selectors.map((sel) => {
    const node = document.querySelector(sel);
    if (!node) return [sel, null];
    const [a, b] = [lum(rgb(getComputedStyle(node).color)), lum(background(node))].sort((x, y) => y - x);
    return [sel, Math.round(((a + 0.05) / (b + 0.05)) * 100) / 100];
  }));
}"""
TEXT_ON_SURFACES = [
    ".chat-title",  # text on the header
    ".session.is-current .session-open",  # accent text on the current chat's tint
    ".sidebar-foot .model-name",  # muted text on the sidebar
    "#toggle-settings",  # a ghost button
    "#new-chat",  # a primary button
    ".msg-user .msg-body",  # your message: text on the accent
    ".msg-assistant .msg-body",  # a reply
    ".msg-stats",  # the quiet stats line on the page background
    "#settings-panel label",
    "#src-temperature",  # where a setting comes from
]


def background(page: Any) -> str:
    return page.evaluate("() => getComputedStyle(document.documentElement).backgroundColor")


def chat_with_a_reply(page: Any) -> None:
    """Open a new chat with one short exchange (16 tokens) and the settings panel."""
    session_id = new_session(page, title="Theme check", settings={"max_tokens": 16})
    page.goto(f"/#s={session_id}")
    expect(page.locator("#chat-title")).to_have_text("Theme check")
    send(page, "Hello in the dark")
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    # the sidebar lists the chat (its list is fetched again after the turn) before any contrast is measured on it
    expect(page.locator(f".session.is-current[data-id='{session_id}']")).to_have_count(1)
    page.click("#toggle-settings")


# text that the chat shows in passing: a search's highlighted words, the note on a message waiting to go out
TEXT_IN_PASSING = ["#search-results mark", ".msg-user.is-pending .msg-note span"]


def check_contrast(page: Any, selectors: list[str] = TEXT_ON_SURFACES) -> None:
    ratios = page.evaluate(CONTRAST, selectors)
    assert all(r is not None and r >= 4.5 for r in ratios.values()), ratios


def search_and_wait_offline(page: Any) -> None:
    """Search for the chat's own words (highlighted hits), and send a message while the socket is down, so that it
    waits with its note."""
    page.locator("#search-input").fill("dark")
    expect(page.locator("#search-results mark").first).to_be_visible()
    lose_the_connection(page)
    send(page, "Waits for the connection")
    expect(page.locator(".msg-user.is-pending .msg-note")).to_contain_text("Not sent yet")


def test_dark_mode_follows_the_system_from_the_first_paint_with_readable_text(chromium, ui_server, open_page):
    context = chromium.new_context(viewport=WIDE, base_url=ui_server.base_url, color_scheme="dark")
    context.add_init_script(RECORD_THEME_AT_BODY)
    page = open_page("/", context=context)
    assert page.evaluate("() => window.__themeAtBody") == "dark"  # set before the body, so no light flash
    assert background(page) == DARK_BG
    expect(page.locator("#theme-select")).to_have_value("system")
    chat_with_a_reply(page)
    check_contrast(page)
    # a formula KaTeX refuses is shown as its source, in the error colour (made up: the tiny model writes no TeX)
    page.evaluate(
        """() => document.querySelector(".msg-assistant .msg-body").insertAdjacentHTML("beforeend",
            '<p><span class="md-tex-error">\\\\frac{</span></p>')"""
    )
    check_contrast(page, [".msg-assistant .md-tex-error"])
    # code blocks follow the theme too (markdown.css: highlight.js's GitHub Dark)
    code_bg = page.evaluate("() => getComputedStyle(document.documentElement).getPropertyValue('--code-bg')")
    assert code_bg == "#0d1117"
    screenshot(page, "theme-dark-wide.png")
    context.close()


def test_the_theme_menu_switches_at_once_and_is_remembered(chromium, ui_server, open_page):
    context = chromium.new_context(viewport=WIDE, base_url=ui_server.base_url, color_scheme="light")
    context.add_init_script(RECORD_THEME_AT_BODY)
    page = open_page("/", context=context)
    assert (page.evaluate("() => window.__themeAtBody"), background(page)) == ("light", LIGHT_BG)
    chat_with_a_reply(page)
    check_contrast(page)
    screenshot(page, "theme-light-wide.png")
    search_and_wait_offline(page)
    check_contrast(page, TEXT_IN_PASSING)
    page.select_option("#theme-select", "dark")
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    assert background(page) == DARK_BG
    check_contrast(page)
    check_contrast(page, TEXT_IN_PASSING)
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    assert (page.evaluate("() => window.__themeAtBody"), background(page)) == ("dark", DARK_BG)
    expect(page.locator("#theme-select")).to_have_value("dark")
    page.select_option("#theme-select", "system")  # back to the system's, which is light here
    assert background(page) == LIGHT_BG
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    assert (page.evaluate("() => window.__themeAtBody"), background(page)) == ("light", LIGHT_BG)
    assert page.evaluate("() => localStorage.getItem('pagedchat-theme')") is None
    context.close()


def test_a_phone_in_dark_mode(chromium, ui_server, open_page):
    context = chromium.new_context(viewport=NARROW, base_url=ui_server.base_url, color_scheme="dark")
    page = open_page("/", viewport=NARROW, context=context)
    surface = "() => getComputedStyle(document.getElementById(%r)).backgroundColor"
    chat_with_a_reply(page)
    assert page.evaluate(surface % "settings-panel") == DARK_SURFACE  # it covers the whole screen
    assert page.evaluate("() => document.documentElement.scrollWidth") <= NARROW["width"]
    screenshot(page, "theme-dark-narrow-settings.png")
    page.click("#settings-close")
    screenshot(page, "theme-dark-narrow.png")
    shadow = "() => getComputedStyle(document.getElementById('sidebar')).boxShadow"
    assert page.evaluate(shadow) == "none"  # the closed drawer casts nothing onto the screen's left edge
    page.click("#toggle-sidebar")
    expect(page.locator("#sidebar")).to_be_in_viewport()
    assert page.evaluate(shadow) != "none"
    assert page.evaluate(surface % "sidebar") == DARK_SURFACE
    check_contrast(page)
    page.select_option("#theme-select", "light")  # the menu sits in the drawer's foot
    assert background(page) == LIGHT_BG
    page.keyboard.press("Escape")
    page.wait_for_timeout(250)  # the drawer's slide-out
    screenshot(page, "theme-light-narrow.png")
    context.close()


# ---- settings and presets --------------------------------------------------------------------------------------
def session_of(page: Any) -> dict[str, Any]:
    """The open chat as the server has it."""
    return page.evaluate(
        "async () => (await fetch('/api/sessions/' + (await import('/static/chat_state.js')).state.current.id)).json()"
    )


def test_a_phone_keeps_its_header_buttons_while_the_connection_is_lost(chromium, ui_server, open_page):
    """On a phone the "Connection lost — reconnecting…" line takes a row of its own under the header: it used to
    squeeze the title to nothing and push Settings off the screen for as long as the server was away."""
    context = chromium.new_context(viewport=NARROW, base_url=ui_server.base_url)
    try:
        page = open_page("/", viewport=NARROW, context=context, http_errors_ok=True)
        sid = new_session(page, title="Packing list for the trip")
        page.goto(f"/#s={sid}")
        page.reload()
        page.wait_for_selector("body[data-ready=true]")
        context.route_web_socket(re.compile(r"/ws/sessions/"), lambda ws: ws.close())  # the server is away
        page.evaluate("async () => (await import('/static/chat_state.js')).state.socket.ws.close()")
        expect(page.locator("#conn-status")).to_have_text("Connection lost — reconnecting…")
        for control in (
            "#toggle-sidebar",
            "#chat-title",
            "#conn-status",
            "#export-menu summary",
            "#toggle-settings",
        ):
            expect(page.locator(control)).to_be_in_viewport(ratio=1)
        assert page.locator("#chat-title").bounding_box()["width"] >= 100
        screenshot(page, "chat-narrow-connection-lost.png")
        page.click("#toggle-settings")
        expect(page.locator("#settings-panel")).to_be_visible()
    finally:
        context.close()


def test_a_saved_preset_made_default_starts_the_next_chat_and_the_chats_own_value_wins(open_page):
    page = open_page("/")
    page.click("#toggle-settings")
    expect(page.locator("#set-max-tokens")).to_have_attribute("placeholder", "200")  # the server's, shown
    expect(page.locator("#src-max_tokens")).to_have_text("Server default")
    expect(page.locator("#src-temperature")).to_have_text("Built-in default")
    page.fill("#set-system", "You are terse.")
    page.fill("#set-temperature", "0.3")
    expect(page.locator("#src-temperature")).to_have_text("This chat")
    page.fill("#preset-name", "Terse")
    page.click("#preset-form button[type=submit]")
    expect(page.locator("#preset-status")).to_have_text("Saved preset “Terse”.")
    expect(page.locator("#preset-list .preset-name")).to_have_text(["Terse"])
    page.select_option("#default-preset", label="Terse")
    expect(page.locator("#preset-status")).to_have_text("New chats start from “Terse”.")
    expect(page.locator("#preset-list .preset-badge")).to_have_text(["default"])

    page.click("#new-chat")  # the settings panel stays open, now showing the blank chat's
    expect(page.locator("#set-preset option:checked")).to_have_text("Terse")
    expect(page.locator("#set-temperature")).to_have_value("")
    expect(page.locator("#set-temperature")).to_have_attribute("placeholder", "0.3")
    expect(page.locator("#src-temperature")).to_have_text("Preset “Terse”")
    expect(page.locator("#set-system")).to_have_attribute("placeholder", "You are terse.")
    expect(page.locator("#src-top_p")).to_have_text("Built-in default")
    page.click("#settings-close")
    send(page, "Hi")
    expect(last_reply(page)).to_have_attribute("data-status", "finished", timeout=REPLY_TIMEOUT_MS)
    preset_id = page.evaluate("async () => (await (await fetch('/api/presets')).json()).default_preset_id")
    chat = session_of(page)
    assert (chat["preset_id"], chat["settings"], chat["system_prompt"]) == (preset_id, {}, "")

    page.click("#toggle-settings")
    page.fill("#set-temperature", "0.9")
    page.click("#settings-form button[type=submit]")
    expect(page.locator("#settings-status")).to_have_text("Saved.")
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    page.click("#toggle-settings")
    expect(page.locator("#set-temperature")).to_have_value("0.9")
    expect(page.locator("#src-temperature")).to_have_text("This chat")
    expect(page.locator("#src-system_prompt")).to_have_text("Preset “Terse”")
    chat = session_of(page)
    assert (chat["preset_id"], chat["settings"]) == (preset_id, {"temperature": 0.9})


def test_a_rejected_value_shows_the_servers_error_at_its_field_and_no_saved(open_page):
    page = open_page("/", http_errors_ok=True)  # the refused PATCH is a 400 the console notes
    page.click("#toggle-settings")
    page.fill("#set-temperature", "0.5")
    page.click("#settings-form button[type=submit]")
    expect(page.locator("#settings-status")).to_have_text("Saved.")
    expect(page.locator("#settings-status")).to_have_text("", timeout=5000)  # then it goes
    page.fill("#set-temperature", "5")
    page.click("#settings-form button[type=submit]")
    error = page.locator("#err-temperature")
    expect(error).to_have_text("temperature must be in [0, 2] for a chat, got 5")
    expect(page.locator("#set-temperature")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#set-temperature")).to_be_focused()
    expect(page.locator("#settings-status")).to_have_text("")
    expect(page.locator("#settings-error")).to_have_text("")  # in place, not at the bottom
    screenshot(page, "settings-error-in-place.png")
    assert session_of(page)["settings"] == {"temperature": 0.5}  # nothing was stored
    page.fill("#set-temperature", "0.7")  # fixing it clears the error
    expect(error).to_have_text("")
    expect(page.locator("#set-temperature")).not_to_have_attribute("aria-invalid", "true")
    page.click("#settings-form button[type=submit]")
    expect(page.locator("#settings-status")).to_have_text("Saved.")


# ---- admin -----------------------------------------------------------------------------------------------------
def test_admin_without_the_token_is_refused(open_page, ui_server):
    base = ui_server.base_url
    page_response = httpx.get(base + "/admin", timeout=10)
    assert page_response.status_code == 401 and "Admin sign-in" in page_response.text
    assert 'id="block-map"' not in page_response.text
    assert httpx.get(base + f"/admin?token={ADMIN_TOKEN}", timeout=10).status_code == 401  # never via the URL
    stream = httpx.get(base + "/api/admin/stream", timeout=10)
    assert stream.status_code == 401 and stream.json()["error"]["code"] == "admin_token_required"
    wrong = httpx.post(base + "/admin/login", data={"token": "nope"}, headers={"origin": base}, timeout=10)
    assert wrong.status_code == 403 and "That token is not valid." in wrong.text
    forged = httpx.get(base + "/admin", cookies={"pagedchat_admin": "forged.value.sig"}, timeout=10)
    assert forged.status_code == 401

    page = open_page("/admin", http_errors_ok=True)
    expect(page.locator("h1")).to_have_text("Admin sign-in")
    page.fill("#token", "wrong-token")
    page.click("button[type=submit]")
    expect(page.locator(".form-error")).to_have_text("That token is not valid.")
    page.fill("#token", ADMIN_TOKEN)
    page.click("button[type=submit]")
    expect(page.locator("#map-title")).to_have_text("Block map")
    assert page.url == base + "/admin"
    cookie = next(c for c in page.context.cookies() if c["name"] == "pagedchat_admin")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and ADMIN_TOKEN not in cookie["value"]
    page.click("text=Sign out")
    expect(page.locator("h1")).to_have_text("Admin sign-in")


def test_admin_block_map_at_256_blocks_charts_and_map_helpers(open_page):
    page = open_page("/admin", http_errors_ok=True)
    sign_in(page)
    canvas = page.locator("#block-map")
    # the test pool: one block a cell, cells big enough to point at
    expect(page.locator("#map-scale")).to_have_text("1 cell = 1 block · the whole pool, 256 blocks")
    expect(canvas).to_have_attribute("data-cells", "256")
    assert int(canvas.get_attribute("data-cell-px")) >= 14
    expect(page.locator("#map-zoom-out")).to_be_disabled()
    expect(page.locator("#paging-title")).to_have_text("What paging saves")
    expect(page.locator("#paging-text")).to_contain_text(
        "A hypothetical engine reserving max_model_len (1024)"
    )
    assert "Paging vs contiguous" not in page.locator("#advice").inner_text()  # one panel, not advice
    checks = page.evaluate(
        """async () => {
            const m = await import("/static/admin_cells.js");
            const c = await import("/static/admin_charts.js");
            const { state: s } = await import("/static/admin_state.js");
            // cells stay readable from 256 to 250,000 blocks: the server sums blocks into what the width holds
            const layouts = [256, 5825, 250000].map((n) => {
                const cells = Math.min(n, m.cellsFor(720));
                const k = Math.ceil(n / cells);
                return { n, k, px: m.cellLayout(720, Math.ceil(n / k)).cell };
            });
            const t = (time_s, v, resumed) => ({ time_s, hit_pct: v, resumed: Boolean(resumed) });
            // sampling resumed at 40 s after a gap (no page listened); no hit rate at 40.5 s; 9 s behind a long step
            const points = [t(0, 50), t(0.5, 60), t(1, 60), t(40, 20, true), t(40.5, null), t(41, 30), t(50, 35)];
            // a chart fed that history draws three runs: the resumed sampling and the missing value break the line
            s.charts.hits.setData(points, 50);
            return {
                layouts,
                decoded: Array.from(m.decodeCounts(btoa(String.fromCharCode(3, 0, 0, 1, 255, 255)))),
                bars: [m.barHeights({ size: 121, free: 118, used: 3, cached: 0, shared: 0 }, 8),
                       m.barHeights({ size: 4, free: 0, used: 1, cached: 3, shared: 0 }, 8)],
                runs: c.segments(points, "hit_pct").map((run) => run.map((p) => p.time_s)),
                drawn: s.charts.hits.canvas.dataset.segments,
            };
        }"""
    )
    assert checks["layouts"] == [
        {"n": 256, "k": 1, "px": 22},
        {"n": 5825, "k": 3, "px": 8},
        {"n": 250000, "k": 116, "px": 8},
    ]
    assert checks["decoded"] == [3, 256, 65535]
    # 3 in use among 121: a quarter of the cell, not a hairline; a full cell is split by share (sqrt), filled
    assert checks["bars"][0] == [["used", 2]]
    assert [state for state, _ in checks["bars"][1]] == ["used", "cached"]
    assert round(sum(h for _, h in checks["bars"][1]), 6) == 8
    assert checks["runs"] == [[0, 0.5, 1], [40], [41, 50]] and checks["drawn"] == "3"


@pytest.mark.budget(
    seconds=60,
    why="a server of its own with 250,000 blocks, watched through a 960-token reply at 15 ms a step",
)
def test_admin_block_map_at_250k_blocks_zooms_and_names_who_runs(open_page, chromium, slow_ui_server):
    server = slow_ui_server
    context = chromium.new_context(viewport=WIDE, base_url=server.base_url)
    page = open_page("/admin", context=context, http_errors_ok=True)
    sign_in(page)
    assert page_scripts(page) == [["", "/static/theme.js"], ["module", "/static/admin_page.js"]]
    assert page.evaluate("() => 'pagedchat' in window") is False
    canvas = page.locator("#block-map")
    scale = page.locator("#map-scale")
    expect(scale).to_have_text(re.compile(r"^1 cell = 1\d\d blocks · the whole pool, 250,000 blocks$"))
    assert int(canvas.get_attribute("data-cell-px")) >= 6 and int(canvas.get_attribute("data-cells")) >= 1500
    expect(page.locator("#stat-used")).to_have_text("0")
    expect(canvas).to_have_attribute("data-in-use", "0")
    idle_pixels = page.evaluate("() => document.getElementById('block-map').toDataURL()")
    model = httpx.get(server.base_url + "/v1/models", headers=API_HEADERS, timeout=10).json()["data"][0]["id"]
    results: list[httpx.Response] = []
    # 960 tokens at >= 15 ms a step: >= 14 s running, whatever the model says (ignore_eos). 480 (7 s) ran out under a
    # clean clone's load before the last look at its row (the browser's steps slow down with the machine, the reply's not)
    messages = [{"role": "user", "content": "Count slowly."}]
    body = {"model": model, "messages": messages, "max_tokens": 960, "ignore_eos": True, "user": "alice"}
    worker = threading.Thread(
        target=lambda: results.append(
            httpx.post(server.base_url + "/v1/chat/completions", json=body, headers=API_HEADERS, timeout=120)
        )
    )
    worker.start()
    chat = context.new_page()
    chat.goto("/")
    chat.wait_for_selector("body[data-ready=true]")
    send(chat, "Quarterly report draft")  # the new session is titled from the message
    try:
        rows = page.locator("#seq-rows")
        expect(rows).to_contain_text("Chat “Quarterly report draft”", timeout=REPLY_TIMEOUT_MS)
        browser_id = next(c for c in context.cookies() if c["name"] == "pagedchat_browser")["value"]
        expect(rows).to_contain_text(f"browser {browser_id[:8]}")  # the cookie's id, before its signature
        expect(rows).to_contain_text("API chat completion, user 'alice'")
        expect(rows).to_contain_text(f"API key {key_fingerprint(API_KEY)[:8]}")
        expect(rows).not_to_contain_text("chatcmpl-")  # request ids only in the tooltip
        expect(rows.locator("tr").first).to_contain_text(re.compile(r"\d+/\d+ \(\d+%\)"))  # its prefix hit
        expect(page.locator("#stat-running")).to_have_text("2")
        expect(canvas).not_to_have_attribute("data-in-use", "0")
        assert page.evaluate("() => document.getElementById('block-map').toDataURL()") != idle_pixels
        # the cell holding the running blocks: its mix on hover, then zoom into it at one block a cell
        cell = page.evaluate(
            """async () => {
                const { state: s } = await import("/static/admin_state.js");
                const index = s.map.cells.used.findIndex((n) => n > 0);
                const { cell, gap, cols } = s.map.layout;
                return { index, x: (index % cols) * (cell + gap) + cell / 2, y: Math.floor(index / cols) * (cell + gap) + cell / 2 };
            }"""
        )
        canvas.click(position={"x": cell["x"], "y": cell["y"]})
        expect(page.locator("#block-info")).to_contain_text("In use")
        page.locator("#block-info .map-zoom-cell").click()
        expect(scale).to_have_text(re.compile(r"^1 cell = 1 block · blocks [\d,]+–[\d,]+ of 250,000$"))
        expect(page.locator("#map-zoom-out")).to_be_enabled()
        block = page.evaluate(
            """async () => {
                const { state: s } = await import("/static/admin_state.js");
                const index = s.map.cells.used.findIndex((n) => n > 0);
                const { cell, gap, cols } = s.map.layout;
                return { id: s.map.map.start + index, x: (index % cols) * (cell + gap) + cell / 2,
                         y: Math.floor(index / cols) * (cell + gap) + cell / 2 };
            }"""
        )
        canvas.hover(position={"x": block["x"], "y": block["y"]})
        info = page.locator("#block-info")
        expect(info).to_contain_text(f"#{block['id']}")
        expect(info).to_contain_text("in use")
        expect(info).to_contain_text(
            re.compile(r"seq \d+ \((Quarterly report draft, browser|chat completion)")
        )
        # back to the whole pool, then drag across four cells: those blocks, one a cell
        page.click("#map-whole")
        expect(scale).to_contain_text("the whole pool")
        pitch = page.evaluate(
            "async () => { const { state: s } = await import('/static/admin_state.js'); "
            "return { step: s.map.layout.cell + s.map.layout.gap, k: s.map.map.blocks_per_cell }; }"
        )
        page.mouse.move(*_canvas_point(canvas, 2, 2))
        page.mouse.down()
        page.mouse.move(*_canvas_point(canvas, pitch["step"] * 3 + 2, 2), steps=4)
        page.mouse.up()
        expect(scale).to_have_text(f"1 cell = 1 block · blocks 0–{4 * pitch['k'] - 1:,} of 250,000")
        page.click("#map-whole")
        # picking a sequence marks its cells (the feed counts its blocks per cell)
        page.locator("#seq-rows button").first.click()
        expect(page.locator("#seq-rows tr.is-selected")).to_have_count(1)
        page.wait_for_function(
            "async () => { const { state: s } = await import('/static/admin_state.js'); "
            "return s.map.cells.picked !== null && s.map.cells.picked.some((n) => n > 0); }"
        )
        # the feed updates the row's numbers in place: the same element (and button) across samples
        before = page.evaluate(
            """() => { const tr = document.querySelector('#seq-rows tr'); tr.__kept = true;
                       return { samples: Number(document.body.dataset.samples), tokens: tr.cells[3].textContent }; }"""
        )
        page.wait_for_function("n => Number(document.body.dataset.samples) >= n", arg=before["samples"] + 2)
        after = page.evaluate(
            "() => { const tr = document.querySelector('#seq-rows tr'); return { kept: tr.__kept === true, tokens: tr.cells[3].textContent }; }"
        )
        assert after["kept"] and after["tokens"] != before["tokens"], (before, after)
        screenshot(page, "admin-wide.png", full_page=True)
    finally:
        worker.join(timeout=120)
    assert results and results[0].status_code == 200, results
    expect(page.locator("#stat-used")).to_have_text("0", timeout=REPLY_TIMEOUT_MS)
    expect(page.locator("#stat-running")).to_have_text("0")
    expect(page.locator("#stat-tokps")).to_have_text("0")  # idle: no speed left over from the burst
    expect(page.locator("#stat-spec-sub")).to_contain_text(
        "proposed tokens kept (ngram)"
    )  # the default method
    expect(canvas).to_have_attribute("data-in-use", "0")
    assert (
        int(page.locator("#stat-cached").inner_text()) > 0
    )  # the finished request's full blocks stay cached
    expect(page.locator("#advice .advice-item")).not_to_have_count(0)
    expect(page.locator(".settings-table")).to_contain_text("1024 tokens")
    expect(page.locator(".settings-table")).to_contain_text("KV disk directory")
    # the finished request's full blocks went to the disk tier (in the server's own cache dir)
    expect(page.locator("#tier-status")).to_have_text("on")
    expect(page.locator("#tier-blocks")).to_have_text(re.compile(r"^[1-9]\d*$"), timeout=REPLY_TIMEOUT_MS)
    expect(page.locator("#tier-cap")).to_contain_text(" cap")

    page.set_viewport_size(NARROW)
    page.wait_for_timeout(300)
    screenshot(page, "admin-narrow.png", full_page=True)
    context.close()


def test_the_admin_page_and_its_canvases_follow_the_theme(chromium, ui_server, open_page):
    context = chromium.new_context(viewport=WIDE, base_url=ui_server.base_url, color_scheme="dark")
    page = open_page("/admin", context=context, http_errors_ok=True)
    assert background(page) == DARK_BG  # the sign-in card too
    sign_in(page)
    expect(page.locator("#block-map")).to_have_attribute("data-blocks", re.compile(r"^\d+$"))
    # block 0's pixel, and the colour the theme gives its state (the pool is idle: free or cached)
    first_cell = """async () => {
        const { state } = await import("/static/admin_state.js");
        const mix = state.map.mix(0); // a cell per block in this small pool
        const name = mix.cached ? "--map-cached" : "--map-free";
        const css = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
        const [r, g, b] = document.getElementById("block-map").getContext("2d").getImageData(2, 2, 1, 1).data;
        return { pixel: [r, g, b], css: [1, 3, 5].map((i) => parseInt(css.slice(i, i + 2), 16)) };
    }"""
    dark = page.evaluate(first_cell)
    assert dark["pixel"] == dark["css"], dark
    # a sequence whose prefix is being read from the disk tier (the pool is idle here: its status line, made up)
    # a selected sequence, and one whose prefix is being read from the disk tier (the pool is idle here: made up)
    page.evaluate(
        """() => document.getElementById("seq-rows").insertAdjacentHTML("beforeend",
            '<tr class="is-selected"><td><button class="link-btn">#7</button>' +
            '<span class="seq-status" data-status="loading">loading from disk</span></td></tr>')"""
    )
    texts = [
        ".counter dt",
        ".counter dd",
        ".settings-table td",
        "#map-title",
        ".seq-status",
        ".is-selected .link-btn",
    ]
    check_contrast(page, texts)
    screenshot(page, "admin-dark-wide.png", full_page=True)
    page.select_option("#theme-select", "light")  # redrawn at once, not at the next sample
    light = page.evaluate(first_cell)
    assert light["pixel"] == light["css"] != dark["css"], (light, dark)
    context.close()


def _canvas_point(canvas: Any, x: float, y: float) -> tuple[float, float]:
    """Page coordinates of a point (x, y) CSS px inside the canvas."""
    box = canvas.bounding_box()
    return box["x"] + x, box["y"] + y
