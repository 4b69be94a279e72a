"""Regenerate the docs' admin screenshot from the real default model under real traffic (not run by the tests).

    python scripts/admin_screenshot.py [--seconds 150] [--out docs/screenshots/admin.png] [--replicas N]

Starts `pagedchat serve` with its defaults: the default model (SmolLM2-135M-Instruct, provisioned on first use) and
the default KV pool (2 GiB on CPU: 5,825 blocks), loopback admin. Opens /admin in headless Chromium first (the feed
samples only while a page listens, and the advice needs minutes of samples), then runs chat users (multi-turn
sessions through the chat API, so their later turns hit the prefix cache) and API clients (/v1 with a `user`) side
by side, and screenshots the page after `--seconds` while replies still run. `--replicas N`: N engine replicas of
one thread on Ray Serve (a panel per replica at the top of the page; docs/screenshots/admin-replicas.png).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common.servers import spawn_pagedchat, stop_server, wait_ready, wait_replicas_ready  # noqa: E402

CHATS = [
    (
        "Trip to Lisbon",
        ["Plan three days in Lisbon.", "Which day suits a rainy forecast?", "Any vegan food there?"],
    ),
    (
        "Python help",
        ["How do I read a CSV file in Python?", "And write one back?", "How do I skip the header?"],
    ),
    (
        "Cover letter",
        ["Write a short cover letter for a junior data analyst.", "Make it friendlier.", "Shorter."],
    ),
    (
        "Physics homework",
        ["Explain Newton's second law simply.", "Give an example with a car.", "And a rocket?"],
    ),
]
API_PROMPTS = [
    ("analytics-bot", "Summarise in two sentences why caching matters for web servers."),
    ("support-bot", "Write a polite reply to a customer whose parcel is late."),
]
VIEWPORT = {"width": 1280, "height": 800}


@contextlib.contextmanager
def until_stopped(stop: threading.Event) -> Iterator[None]:
    """A request cut by the server's stop at the end is no error; any other failure is."""
    try:
        yield
    except httpx.HTTPError:
        if not stop.is_set():
            raise


def chat_user(base: str, title: str, turns: list[str], stop: threading.Event) -> None:
    """One browser identity: a session titled `title`, its turns one after another, again until `stop`."""
    with httpx.Client(base_url=base, timeout=300) as client:
        client.get("/")  # the signed browser cookie: this user's identity
        origin = {"Origin": base}
        while not stop.is_set():
            with until_stopped(stop):
                session = client.post("/api/sessions", json={"title": title}, headers=origin).json()["id"]
                for text in turns:
                    url = f"/api/sessions/{session}/messages"
                    with client.stream("POST", url, json={"content": text}, headers=origin) as reply:
                        for _ in reply.iter_lines():  # the reply's SSE events, read to its end
                            pass


def api_client(base: str, model: str, user: str, prompt: str, stop: threading.Event) -> None:
    """An OpenAI-style client asking the same kind of question again and again."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 160,
        "user": user,
    }
    while not stop.is_set():
        with until_stopped(stop):
            httpx.post(base + "/v1/chat/completions", json=body, timeout=300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=150.0, help="traffic before the screenshot")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots" / "admin.png")
    parser.add_argument("--replicas", type=int, default=1, help="engine replicas (above 1: on Ray Serve)")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    workdir = Path(tempfile.mkdtemp(prefix="admin-screenshot-"))
    # the defaults, but the disk tier in the work folder, not the user's cache dir
    env = {"PAGEDCHAT_KV_DISK_DIR": str(workdir / "kv")}
    if args.replicas > 1:
        env.update(PAGEDCHAT_REPLICAS=str(args.replicas), PAGEDCHAT_THREADS_PER_REPLICA="1")
    server = wait_ready(spawn_pagedchat("server", env, workdir), 600)
    if args.replicas > 1:
        server = wait_replicas_ready(server, args.replicas, 600)
    stop = threading.Event()
    workers: list[threading.Thread] = []
    try:
        model = httpx.get(server.base_url + "/v1/models", timeout=30).json()["data"][0]["id"]
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=shutil.which("chromium"), args=["--no-sandbox"]
            )
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(server.base_url + "/admin")
            page.wait_for_function("() => Number(document.body.dataset.samples || 0) > 0")
            for title, turns in CHATS:
                workers.append(threading.Thread(target=chat_user, args=(server.base_url, title, turns, stop)))
            for user, prompt in API_PROMPTS:
                workers.append(
                    threading.Thread(target=api_client, args=(server.base_url, model, user, prompt, stop))
                )
            for worker in workers:
                worker.start()
                time.sleep(2.0)  # staggered, as people arrive
            time.sleep(max(0.0, args.seconds - 2.0 * len(workers)))
            page.wait_for_function("() => document.querySelectorAll('#seq-rows tr[data-seq-id]').length >= 3")
            page.wait_for_timeout(500)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.out), full_page=True)
            summary = page.evaluate(
                """() => ({ scale: document.getElementById("map-scale").textContent,
                            sequences: document.getElementById("seq-rows").innerText,
                            advice: document.getElementById("advice").innerText })"""
            )
            browser.close()
        print(json.dumps(summary, indent=2))
        print(f"wrote {args.out}")
    finally:
        stop.set()
        stop_server(server)
        for worker in workers:
            worker.join(timeout=60)


if __name__ == "__main__":
    main()
