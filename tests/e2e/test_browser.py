"""The chat page and the admin page in a real headless Chromium (Debian's) against a real server with the tiny model.

Every page is checked for console errors, so a Content-Security-Policy violation (inline script or style) fails
the test that caused it. Screenshots land in test-artifacts/.

Over 300 lines on purpose: the flows share module-scoped servers and a browser; split into files, each file would
start its own (about 10 s each on this machine).
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.servers import stop_server
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
WIDE = {"width": 1280, "height": 800}
NARROW = {"width": 390, "height": 844}
STATS_LINE = re.compile(
    r"(\d+) tokens? · [\d.]+ tok/s · TTFT (\d+ ms|[\d.]+ s) · (\d+) of (\d+) prompt tokens cached"
    r"( · \d+ earlier turns? left out to fit)?( · hit the token limit)?"
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
    """A server with an admin token, short default replies (200 tokens) and room for 500-token ones."""
    settings = dict(
        PAGEDCHAT_ADMIN_TOKEN=ADMIN_TOKEN, PAGEDCHAT_MAX_MODEL_LEN="1024", PAGEDCHAT_DEFAULT_MAX_TOKENS="200"
    )
    running = start_server(tmp_path, server_env(tmp_path, tiny_model, **settings, **env))
    yield running
    # uvicorn re-raises the SIGTERM it handled once shut down, so a clean stop exits with -SIGTERM
    assert stop_server(running) in (0, -signal.SIGTERM), running.log()[-4000:]


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory, tiny_model) -> Iterator[Server]:
    yield from _ui_server(tmp_path_factory.mktemp("ui-server"), tiny_model)


@pytest.fixture
def slow_ui_server(tmp_path, tiny_model) -> Iterator[Server]:
    """The same, with every engine step 15 ms slower: a reply stays running while the test looks at it."""
    yield from _ui_server(tmp_path, tiny_model, **{FAULTS_ENV: "step_delay_ms=15"})


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
            expected = http_errors_ok and "Failed to load resource" in message.text
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
    expect(page.locator("[data-action=regenerate]:visible")).to_have_count(1)
    expect(page.locator("[data-action=edit]:visible")).to_have_count(1)
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
    expect(last_reply(page)).to_have_attribute("data-status", re.compile("stopped|interrupted"))
    expect(page.locator("#conn-status")).to_be_hidden()  # reconnected on its own
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
    send(page, too_long)
    expect(page.locator("#error-banner")).to_be_visible()
    expect(page.locator("#error-text")).to_contain_text("exceeds max_model_len (1024)")
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


def test_scripts_are_modules_served_as_javascript(open_page, ui_server):
    page = open_page("/")
    assert page_scripts(page) == [["module", "/static/chat_page.js"]]  # one entry; it imports the rest
    assert page.evaluate("() => 'pagedchat' in window") is False  # modules share state by import only
    names = sorted(path.name for path in (REPO_ROOT / "static").glob("*.js"))
    assert "protocol.js" in names and "admin_page.js" in names
    for name in names:
        response = httpx.get(f"{ui_server.base_url}/static/{name}", timeout=10)
        assert response.status_code == 200, name
        # a module script of another MIME type is refused; imported modules have no ?v=, so they revalidate
        assert response.headers["content-type"].split(";")[0] in JAVASCRIPT_TYPES, name
        assert response.headers["cache-control"] == "no-cache", name


MARKDOWN_CASES = [
    ("<script>alert(1)</script>", "<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>"),
    ('<img src=x onerror="alert(1)">', '<p>&lt;img src=x onerror="alert(1)"&gt;</p>'),
    ("[click](javascript:alert(1))", "<p>[click](javascript:alert(1))</p>"),
    ("[x](JaVaScRiPt:alert(1))", "<p>[x](JaVaScRiPt:alert(1))</p>"),
    ("[x](data:text/html;base64,PHNjcmlwdD4=)", "<p>[x](data:text/html;base64,PHNjcmlwdD4=)</p>"),
    ("![i](javascript:alert(1))", "<p>![i](javascript:alert(1))</p>"),
    ("[x](/relative)", "<p>[x](/relative)</p>"),
    (
        "[ok](https://example.com/a?b=1)",
        '<p><a href="https://example.com/a?b=1" target="_blank" rel="noopener noreferrer nofollow">ok</a></p>',
    ),
    (
        "see https://example.org/x.",
        '<p>see <a href="https://example.org/x" target="_blank" rel="noopener noreferrer nofollow">'
        "https://example.org/x</a>.</p>",
    ),
    (
        "**bold** and *em* and `a<b>`",
        "<p><strong>bold</strong> and <em>em</em> and <code>a&lt;b&gt;</code></p>",
    ),
    ("snake_case_name and ~~old~~", "<p>snake_case_name and <del>old</del></p>"),
    (
        "```js\nconst a = '<b>';\n```",
        '<pre data-lang="js"><code class="language-js">const a = \'&lt;b&gt;\';</code></pre>',
    ),
    ("```\nunclosed <i>", "<pre><code>unclosed &lt;i&gt;</code></pre>"),
    ("# Title\n\ntext", "<h3>Title</h3><p>text</p>"),
    (
        "- one\n- two\n  - nested",
        "<ul><li><p>one</p></li><li><p>two</p><ul><li><p>nested</p></li></ul></li></ul>",
    ),
    ("3. three\n4. four", '<ol start="3"><li><p>three</p></li><li><p>four</p></li></ol>'),
    ("> quoted\n> more", "<blockquote><p>quoted<br>more</p></blockquote>"),
    ("a\nb\n\n---\n\nc", "<p>a<br>b</p><hr><p>c</p>"),
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


def test_admin_block_map_follows_a_running_request(open_page, chromium, slow_ui_server):
    server = slow_ui_server
    context = chromium.new_context(viewport=WIDE, base_url=server.base_url)
    page = open_page("/admin", context=context, http_errors_ok=True)
    sign_in(page)
    assert page_scripts(page) == [["module", "/static/admin_page.js"]]
    assert page.evaluate("() => 'pagedchat' in window") is False
    canvas = page.locator("#block-map")
    expect(page.locator("#stat-used")).to_have_text("0")
    expect(canvas).to_have_attribute("data-in-use", "0")
    idle_pixels = page.evaluate("() => document.getElementById('block-map').toDataURL()")
    model = httpx.get(server.base_url + "/v1/models", timeout=10).json()["data"][0]["id"]
    results: list[httpx.Response] = []
    # 480 tokens at >= 15 ms a step: >= 7 s running, whatever the model says (ignore_eos)
    messages = [{"role": "user", "content": "Count slowly."}]
    body = {"model": model, "messages": messages, "max_tokens": 480, "ignore_eos": True}
    worker = threading.Thread(
        target=lambda: results.append(
            httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=120)
        )
    )
    worker.start()
    try:
        expect(page.locator("#stat-used")).to_have_text(re.compile(r"^[1-9]\d*$"), timeout=REPLY_TIMEOUT_MS)
        expect(page.locator("#stat-running")).to_have_text("1")
        expect(canvas).not_to_have_attribute("data-in-use", "0")
        busy_pixels = page.evaluate("() => document.getElementById('block-map').toDataURL()")
        assert busy_pixels != idle_pixels
        # hovering an in-use block names it; picking the sequence highlights its block table
        cell = page.evaluate(
            """async () => {
                const { state: s } = await import("/static/admin_state.js");
                const index = s.lastPool.block_states.indexOf("u");
                const { cell, gap, cols } = s.map.layout;
                return { index, x: (index % cols) * (cell + gap) + cell / 2, y: Math.floor(index / cols) * (cell + gap) + cell / 2 };
            }"""
        )
        canvas.hover(position={"x": cell["x"], "y": cell["y"]})
        expect(page.locator("#block-info")).to_contain_text(f"#{cell['index']}")
        expect(page.locator("#block-info")).to_contain_text("in use")
        page.locator("#seq-rows button").first.click()
        expect(page.locator("#seq-rows tr.is-selected")).to_have_count(1)
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
