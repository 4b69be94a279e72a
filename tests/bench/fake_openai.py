"""A tiny OpenAI-compatible streaming server on loopback for load-generator tests: it answers every chat with a few
fixed words (and llama.cpp's /completion with one word and a prompt time of 0.5 ms a token), optionally adds llama.cpp's `timings` to its last SSE chunk or fails its first chats (503), and counts
TCP connections, requests and the peak number of chats in flight. HTTP/1.1 with Content-Length, so a client could keep connections alive."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WORDS = ["alpha ", "beta ", "gamma ", "delta "]
LLAMA_TIMINGS = {
    "cache_n": 10,  # prompt tokens the slot already held
    "prompt_n": 2,
    "prompt_ms": 6.0,
    "prompt_per_token_ms": 0.5,
    "prompt_per_second": 2000.0,
    "predicted_n": 3,
    "predicted_ms": 12.6,
    "predicted_per_token_ms": 4.2,
    "predicted_per_second": 238.1,
}


@dataclass
class FakeStats:
    """What the fake server saw; `lock` guards every field."""

    connections: int = 0
    requests: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    models_asked: list[str] = field(default_factory=list)  # the `model` of every chat request
    messages_asked: list[list[dict]] = field(default_factory=list)  # the `messages` of every chat request
    prompts_asked: list[Any] = field(
        default_factory=list
    )  # the `prompt` of every llama.cpp /completion request
    completion_bodies: list[dict] = field(default_factory=list)  # every llama.cpp /completion request, whole
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(
    model_id: str, owned_by: str, timings: dict | None, delay_s: float, num_failing: int, stats: FakeStats
):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:  # once per TCP connection, however many requests it carries
            super().setup()
            with stats.lock:
                stats.connections += 1

        def log_message(self, fmt: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            with stats.lock:
                stats.requests += 1
            entry = {"id": model_id, "object": "model", "owned_by": owned_by}
            self._send("application/json", json.dumps({"object": "list", "data": [entry]}).encode())

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            if self.path == "/completion":  # llama.cpp's own completion route: its timings, one token
                with stats.lock:
                    stats.requests += 1
                    stats.prompts_asked.append(body["prompt"])
                    stats.completion_bodies.append(body)
                n = len(body["prompt"])
                reply = {
                    "content": WORDS[0],
                    "timings": {**(timings or {}), "prompt_n": n, "prompt_ms": n / 2.0},
                }
                self._send("application/json", json.dumps(reply).encode())
                return
            with stats.lock:
                stats.requests += 1
                stats.in_flight += 1
                stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
                stats.models_asked.append(body["model"])
                stats.messages_asked.append(body["messages"])
                failing = len(stats.messages_asked) <= num_failing
            time.sleep(delay_s)  # keeps the request in flight long enough to see the client's concurrency
            if failing:
                with stats.lock:
                    stats.in_flight -= 1
                self._send(
                    "application/json", json.dumps({"error": {"message": "replica died"}}).encode(), 503
                )
                return
            words = WORDS[: max(1, min(len(WORDS), int(body["max_tokens"])))]
            chunks = [
                {"choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]} for w in words
            ]
            usage = {"prompt_tokens": 12, "completion_tokens": len(words), "total_tokens": 12 + len(words)}
            chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
            chunks.append({"choices": [], "usage": usage})
            if timings is not None:  # llama.cpp puts them on its last chunk
                chunks[-1]["timings"] = timings
            base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model_id}
            sse = "".join(f"data: {json.dumps({**base, **c})}\n\n" for c in chunks) + "data: [DONE]\n\n"
            with stats.lock:
                stats.in_flight -= 1
            self._send("text/event-stream", sse.encode())

        def _send(self, content_type: str, raw: bytes, status: int = 200) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    return Handler


@contextlib.contextmanager
def fake_server(
    model_id: str, owned_by: str, timings: dict | None = None, delay_s: float = 0.0, num_failing: int = 0
) -> Iterator[tuple[str, FakeStats]]:
    """(base URL, stats) of a fake server running on a thread until the block ends; its first `num_failing` chat
    requests answer 503."""
    stats = FakeStats()
    handler = _handler(model_id, owned_by, timings, delay_s, num_failing, stats)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", stats
    finally:
        server.shutdown()
        server.server_close()
