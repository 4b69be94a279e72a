"""The clients of the reliability load (tests/load_round.py): one script per kind, each checking what it got.

Kinds: /v1 streams through the official openai client, plain /v1 completions, /v1 clients that vanish mid-stream,
multi-turn sessions over SSE (some stopped, some abandoned), WebSocket chats (some stopped, some closed mid-reply),
and with fault injection on, requests that must fail cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
from websockets.asyncio.client import connect

from bench.common.session_client import create_session, iter_sse
from tests.faults import marker

STEP_FAULT = "engine step failed: InjectedFault: injected step fault"
WORDS = ("paged", "attention", "keeps", "every", "block", "of", "the", "cache", "busy", "while", "scheduler")


@dataclass(frozen=True)
class LoadConfig:
    """What one round does."""

    base_url: str
    model: str
    num_streams: int = 64  # streams held open at once
    num_jobs: int = 160  # jobs per round, the held streams included
    concurrency: int = 48  # jobs after the held ones run this many at a time
    max_tokens: int = 16
    # the server injects faults: tests/fault_server.py with PAGEDCHAT_TEST_FAULTS=markers
    faults: bool = False
    seed: int = 0
    job_timeout_s: float = 120.0
    admin_token: str = ""


class Hold:
    """Counts open streams; `wait()` returns once `target` streams have arrived (the barrier of a round)."""

    def __init__(self, target: int) -> None:
        self.target, self.arrived, self.open, self.peak = target, 0, 0, 0
        self.all_open = asyncio.Event()

    @contextlib.contextmanager
    def opened(self) -> Any:
        self.open += 1
        self.peak = max(self.peak, self.open)
        try:
            yield
        finally:
            self.open -= 1

    async def wait(self) -> None:
        self.arrived += 1
        if self.arrived >= self.target:
            self.all_open.set()
        await asyncio.wait_for(self.all_open.wait(), timeout=60)


class Job:
    """One client's script; `run` returns an outcome name and raises AssertionError on a malformed answer."""

    def __init__(self, cfg: LoadConfig, kind: str, rng: random.Random, hold: Hold, held: bool) -> None:
        self.cfg, self.kind, self.hold, self.held = cfg, kind, hold, held
        self.prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 24)))
        self.max_tokens = rng.randint(max(2, cfg.max_tokens // 2), cfg.max_tokens)
        self.modes = [rng.choice(["normal"] * 6 + ["stop", "leave"]) for _ in range(3)]
        self.num_turns = rng.randint(2, 3)
        self.temperature = rng.choice([0.0, 0.7])
        self.fault_site = rng.choice(["detokenize", "deliver"])
        self.trace: list[
            str
        ] = []  # the HTTP requests made so far, for problem reports  # plan_jobs makes one /v1 fault a step fault

    async def first_event(self) -> None:
        if self.held:
            self.held = False
            await self.hold.wait()

    async def run(self) -> str:
        return await getattr(self, self.kind)()

    # ---- /v1 ----------------------------------------------------------------------------------------------------
    async def v1_stream(self, content: str | None = None) -> str:
        async with openai.AsyncOpenAI(
            base_url=self.cfg.base_url + "/v1", api_key="none", max_retries=0
        ) as client:
            stream = await client.chat.completions.create(
                model=self.cfg.model,
                messages=[{"role": "user", "content": content or self.prompt}],
                max_tokens=self.max_tokens,
                temperature=self.temperature,
                stream=True,
                stream_options={"include_usage": True},
            )
            text, finish, usage = "", None, None
            with self.hold.opened():
                async for chunk in stream:
                    await self.first_event()
                    assert chunk.object == "chat.completion.chunk", chunk
                    for choice in chunk.choices:
                        text += choice.delta.content or ""
                        finish = choice.finish_reason or finish
                    usage = chunk.usage or usage
        assert finish in ("stop", "length"), f"no final chunk: finish_reason {finish}"
        assert usage is not None and 1 <= usage.completion_tokens <= self.max_tokens, usage
        assert (finish == "length") == (usage.completion_tokens == self.max_tokens), (finish, usage)
        return "v1_stream completed"

    async def v1_plain(self) -> str:
        async with _http(self.cfg.base_url, self.trace) as http:
            r = await http.post(
                "/v1/completions", json={"prompt": self.prompt, "max_tokens": self.max_tokens}
            )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "text_completion" and body["choices"][0]["finish_reason"] in (
            "stop",
            "length",
        )
        assert body["usage"]["completion_tokens"] <= self.max_tokens
        return "v1_plain completed"

    async def v1_vanish(self) -> str:
        body = {"messages": [{"role": "user", "content": self.prompt}], "max_tokens": 300, "ignore_eos": True}
        async with (
            _http(self.cfg.base_url, self.trace) as http,
            http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r,
        ):
            assert r.status_code == 200
            seen = 0
            async for line in r.aiter_lines():
                seen += line.startswith("data:")
                if seen == 3:
                    break  # leave without reading the rest: the connection closes, the request is aborted
        return "v1_vanish aborted"

    async def v1_fault(self) -> str:
        site = self.fault_site
        try:
            await self.v1_stream(f"{self.prompt} {marker(site)}")
        except openai.APIError as exc:
            assert "InjectedFault" in str(exc.message), exc.message
            return f"v1_fault failed cleanly ({site})"
        if site == "step":  # a step fault may land in a step this request was not part of
            return "v1_fault spared (step)"
        raise AssertionError(f"a {site} fault did not fail its request")

    # ---- sessions -----------------------------------------------------------------------------------------------
    async def session_sse(self) -> str:
        async with _http(self.cfg.base_url, self.trace) as http:
            sid = await create_session(http, {"max_tokens": self.max_tokens, "temperature": 0})
            expected: list[str] = []
            for turn in range(self.num_turns):
                mode, content = self.modes[turn], f"turn {turn}: {self.prompt}"
                events = []
                with self.hold.opened():
                    async with http.stream(
                        "POST", f"/api/sessions/{sid}/messages", json={"content": content}
                    ) as r:
                        assert r.status_code == 200, await r.aread()
                        async for event in _events(r):
                            await self.first_event()
                            events.append(event)
                            if event["type"] == "delta" and mode == "stop":
                                mode = "stopped"
                                assert (await http.post(f"/api/sessions/{sid}/stop")).status_code == 200
                            if event["type"] == "delta" and mode == "leave":
                                break
                expected += ["user", "assistant"]
                if mode == "leave":
                    await _until_not_streaming(http, sid)
                    continue
                _check_reply(events, stopped=mode == "stopped")
            stored = (await http.get(f"/api/sessions/{sid}/messages")).json()["messages"]
        assert [m["role"] for m in stored] == expected, stored
        ended = ("complete", "finished", "stopped", "interrupted")  # interrupted: the client left mid-reply
        assert all(m["status"] in ended or m["error"] == STEP_FAULT for m in stored), stored
        return f"session_sse {self.num_turns} turns"

    async def ws_chat(self, fault: str | None = None) -> str:
        async with _http(self.cfg.base_url, self.trace) as http:
            sid = await create_session(http, {"max_tokens": self.max_tokens, "temperature": 0})
            cookie = f"pagedchat_browser={http.cookies['pagedchat_browser']}"
            url = self.cfg.base_url.replace("http", "ws", 1) + f"/ws/sessions/{sid}"
            async with connect(url, additional_headers={"Cookie": cookie}, open_timeout=30) as ws:
                for turn in range(1 if fault else 2):
                    mode = "normal" if fault else self.modes[turn]
                    content = f"{self.prompt} {marker(fault)}" if fault else f"turn {turn}: {self.prompt}"
                    await ws.send(json.dumps({"type": "message", "content": content}))
                    frames = []
                    with self.hold.opened():
                        while not frames or frames[-1]["type"] not in ("done", "error"):
                            frames.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
                            await self.first_event()
                            if frames[-1]["type"] == "delta" and mode == "stop":
                                mode = "stopped"
                                await ws.send(json.dumps({"type": "stop"}))
                            if frames[-1]["type"] == "delta" and mode == "leave":
                                break
                    if mode == "leave":
                        break  # closing the socket mid-reply aborts it
                    frames = [f for f in frames if f["type"] != "stop_ack"]
                    if fault:
                        done = frames[-1]
                        assert done["message"]["status"] == "failed", done
                        assert "InjectedFault" in done["message"]["error"], done
                        return f"ws_fault failed cleanly ({fault})"
                    _check_reply(frames, stopped=mode == "stopped")
            if mode == "leave":
                await _until_not_streaming(http, sid)
                last = (await http.get(f"/api/sessions/{sid}/messages")).json()["messages"][-1]
                assert last["status"] in ("interrupted", "finished") or last["error"] == STEP_FAULT, last
                return "ws_chat closed mid-reply"
        return "ws_chat 2 turns"

    async def ws_fault(self) -> str:
        return await self.ws_chat(fault=self.fault_site)


def _http(base_url: str, trace: list[str]) -> httpx.AsyncClient:
    """A client whose requests are noted in `trace`, one connection per request.

    Reusing idle HTTP/1.1 connections races the server closing them (a POST sent as the server's FIN or RST
    arrives cannot be retried safely); that is a property of HTTP/1.1 keep-alive, not a server fault, so the
    harness does not reuse connections.
    """

    async def note(request: httpx.Request) -> None:
        trace.append(f"{request.method} {request.url.path}")

    return httpx.AsyncClient(
        base_url=base_url,
        headers={"origin": base_url},  # as the chat page does: cookie-authenticated writes need their origin
        timeout=60,
        limits=httpx.Limits(max_keepalive_connections=0),
        event_hooks={"request": [note]},
    )


def _check_reply(events: list[dict[str, Any]], *, stopped: bool) -> None:
    """A session reply: start first, done last, deltas that add up to the stored text, a final status."""
    assert events[0]["type"] == "start", events[0]
    done = events[-1]
    assert done["type"] == "done", f"no final event: {events[-3:]}"
    text = "".join(e["text"] for e in events if e["type"] == "delta")
    message = done["message"]
    if message["status"] == "failed" and message["error"] == STEP_FAULT:
        raise AssertionError(STEP_FAULT)  # a neighbour's step fault: counted apart when faults are injected
    assert message["content"] == text, (message["content"], text)
    assert message["status"] in (("stopped", "finished") if stopped else ("finished",)), message
    assert done["usage"]["completion_tokens"] == message["completion_tokens"], done


async def _until_not_streaming(http: httpx.AsyncClient, sid: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (await http.get(f"/api/sessions/{sid}")).json()["streaming"]:
        assert time.monotonic() < deadline, "an abandoned reply was never aborted"
        await asyncio.sleep(0.05)


async def _events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON data of every SSE event of a session reply."""
    async for _, data in iter_sse(response):
        yield json.loads(data)
