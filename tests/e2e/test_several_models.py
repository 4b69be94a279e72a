"""Several models in one real server (`pagedchat serve --model A --model B=... --models C=...`): the `openai`
client lists and retrieves them with their state, a request's `model` picks one, a model loads on its first request,
the least recently used idle one unloads when the memory budget needs its room, a model with a request running is
never unloaded (the load is refused with the numbers), and the admin API loads and unloads."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from websockets.sync.client import connect

from bench.common.servers import stop_server
from tests.app.factories import TINY_BLOCK_BYTES, make_tiny_model_dir
from tests.e2e.browser_helpers import REPLY_TIMEOUT_MS, chromium_browser, expect, last_reply, screenshot, send
from tests.e2e.conftest import Server, server_env, start_server
from tests.faults import FAULTS_ENV

POOL_BYTES = 256 * 16 * TINY_BLOCK_BYTES  # server_env's pool, which every model gets
HELLO = [{"role": "user", "content": "Say something."}]


def _model_bytes(seed: int) -> int:
    """What a tiny model holds once loaded: its fp32 weights (the file's bytes) and its pool."""
    return (make_tiny_model_dir(seed) / "model.safetensors").stat().st_size + POOL_BYTES


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    """The default model and two more, a budget that holds the default and one other; every step takes 10 ms (the
    fault server's step delay), so that a long reply is still running when the next request comes."""
    tmp_path = tmp_path_factory.mktemp("several")
    budget = _model_bytes(0) + int(1.5 * _model_bytes(1))
    env = server_env(
        tmp_path,
        f"tiny={make_tiny_model_dir(0)}",
        PAGEDCHAT_MODELS=f"second={make_tiny_model_dir(1)},third={make_tiny_model_dir(2)}",
        PAGEDCHAT_MEMORY_BUDGET_BYTES=str(budget),
        PAGEDCHAT_KEEP_ALIVE_S="0",
        PAGEDCHAT_DEFAULT_MAX_TOKENS="16",  # chat replies: three turns fit the tiny models' 512 tokens
        **{FAULTS_ENV: "step_delay_ms=10"},
    )
    running = start_server(tmp_path, env)
    yield running
    stop_server(running)
    assert "Application shutdown complete." in running.log(), running.log()[-4000:]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


@contextlib.contextmanager
def _browser_page(server: Server, path: str) -> Iterator[Any]:
    """A page of the server in headless Chromium; afterwards, no console error may have been logged."""
    with chromium_browser() as browser:
        context = browser.new_context(base_url=server.base_url)
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.goto(path)
        yield page
        context.close()
        assert not errors, errors


def _states(client: openai.OpenAI) -> dict[str, str]:
    return {m.id: m.model_extra["state"] for m in client.models.list().data}


def _reply(client: openai.OpenAI, model: str, max_tokens: int = 4) -> str:
    reply = client.chat.completions.create(model=model, messages=HELLO, max_tokens=max_tokens, temperature=0)
    assert reply.model == model
    return reply.choices[0].message.content


def test_models_are_listed_with_their_state_and_the_default_alone_loaded(client):
    assert _states(client) == {"tiny": "loaded", "second": "not_loaded", "third": "not_loaded"}
    assert client.models.retrieve("second").model_extra["state"] == "not_loaded"
    assert client.models.retrieve("tiny").model_extra["default"] is True
    # created: when the model's weights were written
    weights = make_tiny_model_dir(1) / "model.safetensors"
    assert client.models.retrieve("second").created == int(weights.stat().st_mtime)
    with pytest.raises(openai.NotFoundError, match="'tiny', 'second', 'third'"):
        client.models.retrieve("fourth")
    with pytest.raises(openai.NotFoundError, match="this server serves 'tiny', 'second', 'third'"):
        _reply(client, "fourth")


def test_a_model_loads_on_its_first_request_and_the_least_recently_used_idle_one_makes_room(client, server):
    first = _reply(client, "second")
    assert _states(client) == {"tiny": "loaded", "second": "loaded", "third": "not_loaded"}
    assert _reply(client, "second") == first  # loaded: the same greedy reply again
    assert _reply(client, "tiny") != first  # another model's weights
    _reply(client, "third")  # the budget holds two models: the idle "second" unloads
    assert _states(client) == {"tiny": "loaded", "second": "not_loaded", "third": "loaded"}
    assert _reply(client, "second") == first  # loaded again, the same model
    assert "unloading model third (least recently used) to make room for second" in server.log()
    server.wait_pool_idle()


def test_a_model_with_a_request_running_is_never_unloaded_and_the_load_is_refused_with_the_numbers(
    client, server
):
    _reply(client, "third")  # "third" loaded, "second" not
    assert _states(client)["second"] == "not_loaded"
    running = threading.Event()
    finished: list[str] = []

    def long_reply() -> None:  # ~400 steps of 10 ms: "third" is busy for seconds
        stream = client.chat.completions.create(
            model="third", messages=HELLO, max_tokens=400, temperature=0, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        for chunk in stream:
            running.set()
            if chunk.choices and chunk.choices[0].finish_reason:
                finished.append(chunk.choices[0].finish_reason)

    thread = threading.Thread(target=long_reply)
    thread.start()
    assert running.wait(30)
    with pytest.raises(openai.APIStatusError) as refused:
        _reply(client, "second")
    assert refused.value.status_code == 507
    message = refused.value.body["message"]
    assert "model 'second' cannot be loaded: it needs" in message and "third" in message
    assert "(running requests)" in message and "(the default model)" in message
    assert _states(client)["third"] == "loaded"
    thread.join(60)
    assert finished == ["length"]
    assert _reply(client, "second")  # "third" is idle now: it makes room
    assert _states(client) == {"tiny": "loaded", "second": "loaded", "third": "not_loaded"}
    server.wait_pool_idle()


def test_the_admin_api_loads_and_unloads_a_model(client, server):
    base = server.base_url + "/api/admin/models"
    headers = {**server.admin_headers, "Origin": server.base_url}  # a write from the server's own page
    assert httpx.post(f"{base}/second/unload", headers=headers, timeout=30).json()["state"] == "not_loaded"
    loaded = httpx.post(f"{base}/third/load", headers=headers, timeout=60)
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["state"] == "loaded"
    refused = httpx.post(f"{base}/tiny/unload", headers=headers, timeout=30)
    assert refused.status_code == 400 and "stays loaded" in refused.json()["error"]["message"]
    listed = httpx.get(base, headers=headers, timeout=30).json()
    assert [(m["id"], m["state"]) for m in listed["models"]] == [
        ("tiny", "loaded"),
        ("second", "not_loaded"),
        ("third", "loaded"),
    ]
    assert listed["budget_bytes"] >= listed["held_bytes"] > 0
    # /metrics: each loaded model's engine gauges, under its own model_name
    text = httpx.get(server.base_url + "/metrics", headers=server.admin_headers, timeout=30).text
    pattern = r'^pagedchat:kv_cache_blocks_total\{model_name="([^"]+)"\} (\S+)$'
    blocks = {model: float(value) for model, value in re.findall(pattern, text, re.MULTILINE)}
    assert blocks == {m["id"]: m["num_blocks"] for m in listed["models"] if m["state"] == "loaded"}, blocks


def test_a_model_idle_past_keep_alive_unloads(server_factory):
    """--keep-alive-s: a model other than the default that served nothing for that long unloads by itself."""
    running = server_factory(
        "keepalive",
        model=str(make_tiny_model_dir(0)),
        PAGEDCHAT_MODELS=f"second={make_tiny_model_dir(1)}",
        PAGEDCHAT_KEEP_ALIVE_S="1",
    )
    client = openai.OpenAI(base_url=running.base_url + "/v1", api_key="unused", max_retries=0)
    _reply(client, "second")
    deadline = time.monotonic() + 20
    while _states(client)["second"] != "not_loaded":
        assert time.monotonic() < deadline, running.log()[-3000:]
        time.sleep(0.2)
    assert "model second idle for" in running.log()


def test_the_chat_page_picks_a_model_per_chat_and_a_model_gone_keeps_the_history(server):
    """The picker in Chromium: a chat's first reply on the default model, then on another one (the page says the
    history is read again, with its tokens); a chat naming a model no longer served keeps its history, says so, and
    goes on once another model is picked."""
    with _browser_page(server, "/") as page:
        picker = page.locator("#model-picker")
        expect(picker.locator("option")).to_have_count(3)
        expect(picker).to_have_value("tiny")
        send(page, "Hello there")
        expect(page.locator(".msg-assistant")).to_have_count(1, timeout=REPLY_TIMEOUT_MS)
        expect(last_reply(page)).to_have_attribute(
            "data-status", re.compile("finished|length"), timeout=REPLY_TIMEOUT_MS
        )
        # "second" not loaded (an earlier test may have loaded it): this chat's next turn waits for its load
        deadline = time.monotonic() + 30
        while _states(openai.OpenAI(base_url=server.base_url + "/v1", api_key="-"))["second"] == "loading":
            assert time.monotonic() < deadline, "second is still loading"
            time.sleep(0.1)
        unloaded = httpx.post(
            f"{server.base_url}/api/admin/models/second/unload",
            headers={**server.admin_headers, "origin": server.base_url},
        )
        assert unloaded.status_code == 200 and unloaded.json()["state"] == "not_loaded", unloaded.text
        picker.select_option("second")
        note = page.locator("#model-note")
        expect(note).to_contain_text(
            re.compile(r"runs on second: it reads this chat's history again \(about \d+ tokens\)")
        )
        send(page, "And now?")
        expect(page.locator(".msg-assistant")).to_have_count(2, timeout=REPLY_TIMEOUT_MS)
        expect(last_reply(page)).to_have_attribute(
            "data-status", re.compile("finished|length"), timeout=REPLY_TIMEOUT_MS
        )
        # its stats line says how long the turn waited for the model, apart from the engine's TTFT
        expect(last_reply(page).locator(".msg-stats")).to_contain_text(
            re.compile(r"after [\d.]+ m?s loading the model")
        )
        session_id = page.evaluate("async () => (await import('/static/chat_state.js')).state.current.id")
        session = page.request.get(f"/api/sessions/{session_id}").json()
        assert session["settings"]["model"] == "second"
        assert session["messages"][-1]["timings"]["model_load_s"] > 0
        assert {m["id"]: m["state"] for m in page.request.get("/api/models").json()["models"]}[
            "second"
        ] == "loaded"

        # the chat's model goes away (as after a restart without it): the history stays, the page says so
        origin = {"Origin": server.base_url}
        gone = page.request.patch(
            f"/api/sessions/{session_id}", data={"settings": {"model": "retired"}}, headers=origin
        )
        assert gone.status == 200, gone.text()
        page.reload()
        expect(page.locator(".msg-assistant")).to_have_count(2)
        expect(note).to_contain_text("This chat's model retired is no longer served: pick another to go on.")
        send(page, "Still there?")
        expect(page.locator("#error-text")).to_contain_text(
            "no longer serves; pick one of 'tiny', 'second', 'third'"
        )
        picker.select_option("tiny")
        send(page, "Still there?")
        expect(page.locator(".msg-assistant")).to_have_count(3, timeout=REPLY_TIMEOUT_MS)
        expect(last_reply(page)).to_have_attribute(
            "data-status", re.compile("finished|length"), timeout=REPLY_TIMEOUT_MS
        )
        screenshot(page, "several-models-picker.png")


def test_the_admin_page_shows_each_model_and_loads_and_unloads_one(server):
    """The admin page's Models card in Chromium: every model with its state and memory, and Load / Unload."""
    base = server.base_url + "/api/admin/models"
    headers = {**server.admin_headers, "Origin": server.base_url}
    httpx.post(f"{base}/third/unload", headers=headers, timeout=30)
    with _browser_page(server, "/admin") as page:
        rows = page.locator("#models-rows tr")
        expect(rows).to_have_count(3)
        expect(page.locator('#models-rows tr[data-model="tiny"]')).to_have_attribute("data-state", "loaded")
        # in the page's one byte format (binary units, as the tier and pool figures elsewhere on it)
        budget = re.compile(r"^[\d.]+ MiB of a [\d.]+ MiB budget held")
        expect(page.locator("#models-budget")).to_have_text(budget)
        expect(page.locator('#models-rows tr[data-model="tiny"] td').nth(2)).to_have_text(
            re.compile(r"^[\d.]+ MiB$")
        )
        third = page.locator('#models-rows tr[data-model="third"]')
        expect(third).to_have_attribute("data-state", "not_loaded")
        third.get_by_role("button", name="Load third").click()
        expect(third).to_have_attribute("data-state", "loaded", timeout=30_000)
        third.get_by_role("button", name="Unload third").click()
        expect(third).to_have_attribute("data-state", "not_loaded", timeout=30_000)
        expect(page.locator('#models-rows tr[data-model="tiny"] button')).to_have_count(
            0
        )  # the default stays
        screenshot(page, "several-models-admin.png")


def test_the_chat_socket_answers_while_a_model_loads_and_a_stop_then_cancels_the_turn(server_factory):
    """A chat turn waiting for its model to load (2 s here) leaves its socket answering: a ping is answered, a Stop
    cancels the turn (nothing stored, the model still loads), and the next turn runs on the loaded model."""
    running = server_factory(
        "slowload",
        model=str(make_tiny_model_dir(0)),
        PAGEDCHAT_MODELS=f"second={make_tiny_model_dir(1)}",
        PAGEDCHAT_KEEP_ALIVE_S="0",
        PAGEDCHAT_DEFAULT_MAX_TOKENS="8",
        **{FAULTS_ENV: "load_delay_ms=2000"},
    )
    with httpx.Client(base_url=running.base_url, headers={"origin": running.base_url}, timeout=30) as http:
        sid = http.post("/api/sessions", json={"title": "t", "settings": {"model": "second"}}).json()["id"]
        cookie = f"pagedchat_browser={http.cookies['pagedchat_browser']}"
        with connect(f"{running.ws_url}/ws/sessions/{sid}", additional_headers={"Cookie": cookie}) as ws:
            ws.send(json.dumps({"type": "message", "content": "Hello"}))
            time.sleep(0.5)
            sent = time.monotonic()
            ws.send(json.dumps({"type": "ping"}))
            assert json.loads(ws.recv(timeout=10)) == {"type": "pong"}
            assert time.monotonic() - sent < 1.0  # answered while the model loads
            ws.send(json.dumps({"type": "stop"}))
            frames = [json.loads(ws.recv(timeout=10)) for _ in range(2)]
            assert {"type": "stop_ack", "stopped": True} in frames
            (error,) = [f for f in frames if f["type"] == "error"]
            assert error["code"] == "stopped_before_start"
            assert http.get(f"/api/sessions/{sid}").json()["messages"] == []  # nothing stored
            admin_rows = http.get("/api/admin/models", headers=running.admin_headers).json()["models"]
            assert admin_rows[1]["state"] == "loading" and admin_rows[1]["loading_seconds"] >= 0.5, admin_rows
            deadline = time.monotonic() + 20
            while http.get("/api/models").json()["models"][1]["state"] != "loaded":
                assert time.monotonic() < deadline
                time.sleep(0.1)
            ws.send(json.dumps({"type": "message", "content": "Hello"}))
            while (frame := json.loads(ws.recv(timeout=30)))["type"] != "done":
                pass
            assert frame["message"]["status"] == "finished"
            assert "model_load_s" not in frame["timings"]  # the model was loaded: no wait to report
            # a turn that waits for the load reports the wait beside the engine's TTFT, which starts after it
            unloaded = http.post("/api/admin/models/second/unload", headers=running.admin_headers)
            assert unloaded.status_code == 200, unloaded.text
            ws.send(json.dumps({"type": "message", "content": "Hello again"}))
            while (frame := json.loads(ws.recv(timeout=30)))["type"] != "done":
                pass
            timings = frame["message"]["timings"]
            assert frame["message"]["status"] == "finished" and timings == frame["timings"]
            assert timings["model_load_s"] >= 2.0 and timings["ttft_s"] < timings["model_load_s"], timings
            stored = http.get(f"/api/sessions/{sid}").json()["messages"][-1]
            # kept with the reply: the page's stats line shows it on reload
            assert stored["timings"] == timings


def test_the_settings_form_shows_the_defaults_of_the_chats_own_model(server_factory, tmp_path):
    """Each model has its own context, so its own default max_tokens (half the context at most): once a model has
    loaded, /api/models gives what a chat turn on it fills in, and the settings form shows that model's, not
    --model's."""
    short = tmp_path / "short-model"
    shutil.copytree(make_tiny_model_dir(1), short)
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 256}))
    running = server_factory(
        "defaults",
        model=f"tiny={make_tiny_model_dir(0)}",
        PAGEDCHAT_MODELS=f"short={short}",
        PAGEDCHAT_MAX_MODEL_LEN="",  # each model its own context: 1024 and 256 tokens
        PAGEDCHAT_DEFAULT_MAX_TOKENS="400",
    )

    def chat_defaults() -> dict[str, Any]:
        rows = httpx.get(running.base_url + "/api/models", timeout=10).json()["models"]
        return {row["id"]: row.get("chat_defaults") for row in rows}

    defaults = chat_defaults()
    assert defaults["tiny"]["max_tokens"] == 400 and defaults["short"] is None  # not loaded yet: not known
    headers = {**running.admin_headers, "Origin": running.base_url}
    with _browser_page(running, "/") as page:
        page.click("#toggle-settings")
        max_tokens = page.locator("#set-max-tokens")
        expect(max_tokens).to_have_attribute("placeholder", "400")
        page.locator("#model-picker").select_option("short")
        expect(page.locator("#model-picker")).to_have_value("short")
        expect(max_tokens).to_have_attribute("placeholder", "400")  # not known before it loads: --model's
        loaded = httpx.post(running.base_url + "/api/admin/models/short/load", headers=headers, timeout=60)
        assert loaded.status_code == 200, loaded.text
        assert chat_defaults()["short"]["max_tokens"] == 128  # half its 256 tokens
        # the page's next look at the models (every 5 s; here at once) brings the loaded model's own defaults to
        # the open form
        page.evaluate("async () => (await import('/static/chat_models.js')).loadModels()")
        expect(max_tokens).to_have_attribute("placeholder", "128")
        expect(page.locator("#src-max_tokens")).to_have_text("Server default")
        page.locator("#model-picker").select_option("tiny")
        expect(max_tokens).to_have_attribute("placeholder", "400")
