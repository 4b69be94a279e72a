"""SIGHUP on a single-process server drains as SIGTERM does: uvicorn handles only INT and TERM, so a HUP (a closed
terminal, a `kill -HUP` meant as a reload) used to kill the process at once, cutting every reply in flight."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx

from tests.e2e.conftest import server_env, start_server
from tests.faults import FAULTS_ENV

MAX_TOKENS = 40
SLOW = {FAULTS_ENV: "step_delay_ms=25", "PAGEDCHAT_SHUTDOWN_GRACE_S": "5"}  # 40 tokens: about 1 s


def test_sighup_lets_a_streaming_reply_finish_then_exits_as_on_sigterm(tmp_path, tiny_model):
    server = start_server(tmp_path, server_env(tmp_path, tiny_model, **SLOW))
    chunks: list[dict] = []
    lines: list[str] = []
    streaming = threading.Event()

    def read() -> None:
        body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": MAX_TOKENS, "ignore_eos": True}
        url = server.base_url + "/v1/chat/completions"
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=30) as response:
            for line in filter(None, response.iter_lines()):
                lines.append(line)
                if line.startswith("data:") and line != "data: [DONE]":
                    chunks.append(json.loads(line[5:]))
                    streaming.set()

    reader = threading.Thread(target=read, daemon=True)
    try:
        reader.start()
        assert streaming.wait(30), server.log()[-3000:]
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGHUP)
        reader.join(timeout=30)
        returncode = server.process.wait(timeout=30)
        elapsed = time.monotonic() - signalled
    finally:
        if server.process.poll() is None:
            server.process.kill()
    log = server.log()
    assert returncode == -signal.SIGTERM, (returncode, log[-3000:])  # as on TERM: a clean stop to systemd
    assert "signal 1: draining (no new replies)" in log and "Application shutdown complete." in log, log[
        -3000:
    ]
    text_chunks = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and lines[-1] == "data: [DONE]"
    assert len(text_chunks) > 1  # it was streaming when the signal came, and went on
    # finished within the grace period: no server_shutdown error chunk
    assert not any(c.get("error") for c in chunks)
    assert elapsed < 10
