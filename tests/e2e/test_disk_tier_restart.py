"""The KV disk tier across real restarts of `pagedchat serve` (tiny model, one cache dir and database per test).

1. A conversation, SIGTERM (the engine drains the tier's write queue), a restart: the next turn's history comes from
   disk (>= 90% of it cached, every cached token a disk hit) and its greedy reply, like every earlier one, equals a
   server's with prefix caching off.
2. A file attached to a question comes back from disk with the rest of the history after a restart.
3. kill -9 while the tier writes: the next start rebuilds the index from what is on disk, drops a leftover *.tmp,
   serves, and an earlier prompt's blocks come back from disk.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai

from bench.common.servers import stop_server
from tests.app.factories import sse_events
from tests.e2e.conftest import Server
from tests.reliability.helpers import session_events

BLOCK = 16
SYSTEM = "You are a careful assistant. " * 20  # ~120 tokens: most of the history is this and the turns below
TURNS = [
    "Tell me about the history of the lighthouse on the northern cape, and who kept it lit in winter storms.",
    "Now describe the keeper's daily routine: the lamp, the logbook, the weather readings and the long nights.",
    "What happened to the lighthouse when the electric lamp arrived, and where did the last keeper go?",
    "Summarize everything so far in a few words.",  # the turn after the restart
]


def tier_files(directory: Path, pattern: str = "*.kvb") -> list[Path]:
    return sorted(directory.glob(pattern))


def new_session(http: httpx.Client) -> str:
    body = {"system_prompt": SYSTEM, "settings": {"temperature": 0, "max_tokens": 16}}
    response = http.post("/api/sessions", json=body)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def turn(http: httpx.Client, sid: str, content: str) -> dict[str, Any]:
    """One session turn; its `done` event (message and usage)."""
    done = session_events(http, sid, content)[-1]
    assert done["type"] == "done" and done["message"]["status"] == "finished", done
    assert done["message"]["truncated_turns"] == 0
    return done


def session_client(server: Server, cookies: httpx.Cookies | None = None) -> httpx.Client:
    return httpx.Client(
        base_url=server.base_url, timeout=60, cookies=cookies, headers={"origin": server.base_url}
    )


def test_sigterm_then_restart_serves_the_history_from_disk_with_the_same_greedy_reply(
    server_factory, shared_cache_dir
):
    cache = {"PAGEDCHAT_CACHE_DIR": str(shared_cache_dir)}
    kv_dir = shared_cache_dir / "kv"  # the default: <cache dir>/kv
    first = server_factory(**cache)
    with session_client(first) as http:
        sid = new_session(http)
        before = [turn(http, sid, content) for content in TURNS[:-1]]
        assert first.admin_state()["stats"]["tier"]["enabled"] is True
        cookies = http.cookies
    stop_server(first)  # SIGTERM: the engine thread closes the tier, which writes what is still queued
    log = first.log()
    assert "Application shutdown complete." in log and "were not written" not in log, log[-3000:]
    last = before[-1]["usage"]
    history = last["prompt_tokens"] + last["completion_tokens"]
    num_files = len(tier_files(kv_dir))
    assert num_files >= (history - 1) // BLOCK  # every full block of the history, written before the exit
    assert not tier_files(kv_dir, "*.tmp")

    second = server_factory(**cache)  # the same database, cache dir and tier dir
    with session_client(second, cookies) as http:
        tier = second.admin_state()["stats"]["tier"]
        assert (tier["enabled"], tier["num_blocks"], tier["num_files"]) == (True, num_files, num_files)
        after = turn(http, sid, TURNS[-1])
    cached = after["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 0.9 * history and cached >= (history - 1) // BLOCK * BLOCK, (cached, history)
    stats = second.admin_state()["stats"]
    assert stats["disk_hit_tokens"] == stats["prefix_hit_tokens"] == cached  # a fresh pool: all from disk
    assert stats["tier"]["num_loaded_blocks"] == cached // BLOCK

    reference = server_factory(home="reference", PAGEDCHAT_ENABLE_PREFIX_CACHING="0", **cache)
    with session_client(reference) as http:
        assert reference.admin_state()["stats"]["tier"] is None  # no prefix cache, no tier
        sid = new_session(http)
        uncached = [turn(http, sid, content) for content in TURNS]
    assert uncached[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    replies = [(d["message"]["content"], d["usage"]["completion_tokens"]) for d in [*before, after]]
    assert replies == [(d["message"]["content"], d["usage"]["completion_tokens"]) for d in uncached]


def test_kill_9_while_the_tier_writes_then_the_next_start_rebuilds_its_index(
    server_factory, shared_cache_dir, tmp_path
):
    kv_dir = tmp_path / "kv"
    env = {"PAGEDCHAT_CACHE_DIR": str(shared_cache_dir), "PAGEDCHAT_KV_DISK_DIR": str(kv_dir)}
    first = server_factory(**env)
    ask = asker(first)
    kept = " ".join(f"fact{i}" for i in range(100))  # ~20 blocks, written and settled before the storm
    kept_usage = ask(kept).usage
    assert first.wait_tier_written()["num_writes"] >= (kept_usage.prompt_tokens - 1) // BLOCK

    # eight prompts of ~25 blocks finish together: ~200 blocks queued at once, killed as soon as some are on disk
    # and some still queued (or, if the writer was quicker than the polling, right after the replies)
    storm = [" ".join(f"w{j}x{i}" for i in range(75)) for j in range(8)]
    with ThreadPoolExecutor(len(storm)) as pool:
        futures = [pool.submit(ask, text) for text in storm]
        while not all(f.done() for f in futures):
            tier = first.admin_state()["stats"]["tier"]
            if tier["write_queue_depth"] > 0:
                break
            time.sleep(0.005)
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=10)
        for future in futures:  # replies cut by the kill fail on the client; the rest got their answer
            future.exception(timeout=30)
    num_blocks = len(tier_files(kv_dir))
    assert num_blocks >= (kept_usage.prompt_tokens - 1) // BLOCK
    # a write cut short leaves its temporary behind (a kill between write and rename): one, planted
    leftover = kv_dir / (tier_files(kv_dir)[0].name + ".4242.tmp")
    leftover.write_bytes(b"torn")

    log_offset = len(first.log())  # the log file is shared: what the next server writes comes after this
    second = server_factory(**env)
    log = second.log()[log_offset:]
    assert not leftover.exists()
    assert "Traceback" not in log and f"KV disk tier: {kv_dir}, {num_blocks} blocks of this model" in log
    tier = second.admin_state()["stats"]["tier"]
    assert (tier["enabled"], tier["num_blocks"], tier["num_files"]) == (True, num_blocks, num_blocks)
    ask = asker(second)
    again = ask(kept).usage
    assert again.prompt_tokens == kept_usage.prompt_tokens
    assert again.prompt_tokens_details.cached_tokens == (again.prompt_tokens - 1) // BLOCK * BLOCK
    assert second.admin_state()["stats"]["disk_hit_tokens"] == again.prompt_tokens_details.cached_tokens
    assert ask(storm[0]).choices[0].finish_reason == "length"  # whatever of it survived, it is served


def asker(server: Server) -> Callable[[str], Any]:
    """A function sending one user message to the server's /v1 chat completions (official client, greedy)."""
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id

    def ask(text: str) -> Any:
        messages = [{"role": "user", "content": text}]
        return client.chat.completions.create(model=model, messages=messages, max_tokens=2, temperature=0)

    return ask


def test_an_attached_file_comes_back_from_disk_after_a_restart(server_factory, shared_cache_dir):
    """A file attached to the first question: after a restart the next question reads the file's blocks (and the
    rest of the history) from the disk tier, not from the model."""
    cache = {"PAGEDCHAT_CACHE_DIR": str(shared_cache_dir)}
    notes = "\n".join(
        f"Line {i}: the lighthouse log for night {i} records wind, rain and the lamp." for i in range(20)
    )
    roomy = {**cache, "PAGEDCHAT_MAX_MODEL_LEN": "1024"}  # the tiny model's own limit
    first = server_factory(**roomy)
    with session_client(first) as http:
        sid = new_session(http)
        uploaded = http.post(
            f"/api/sessions/{sid}/attachments",
            params={"filename": "log.md"},
            content=notes.encode(),
            headers={"content-type": "application/octet-stream"},
        )
        assert uploaded.status_code == 201, uploaded.text
        attachment = uploaded.json()
        body = {"content": "What does the log record?", "attachments": [attachment["id"]]}
        with http.stream("POST", f"/api/sessions/{sid}/messages", json=body) as response:
            assert response.status_code == 200, response.read()
            events = [json.loads(e["data"]) for e in sse_events(response.iter_lines())]
        done = events[-1]
        assert done["type"] == "done" and done["message"]["status"] == "finished", done
        cookies = http.cookies
    stop_server(first)
    history = done["usage"]["prompt_tokens"] + done["usage"]["completion_tokens"]
    assert (
        attachment["tokens"] > 400 and attachment["tokens"] > history / 2
    )  # the file is most of the history

    second = server_factory(**roomy)
    with session_client(second, cookies) as http:
        after = turn(http, sid, "Which night had the most rain?")
        stored = http.get(f"/api/sessions/{sid}").json()["messages"]
    cached = after["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= (history - 1) // BLOCK * BLOCK and cached >= 0.9 * history, (cached, history)
    stats = second.admin_state()["stats"]
    assert stats["disk_hit_tokens"] == stats["prefix_hit_tokens"] == cached  # a fresh pool: all from disk
    assert [a["filename"] for a in stored[0]["attachments"]] == ["log.md"]  # the file stays with its message
