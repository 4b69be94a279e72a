"""`pagedchat serve --model file.gguf`, one command: a Qwen2 GGUF with K-quant weights (multiplied in their blocks), its own
tokenizer and chat template, answering the official `openai` client; a file it cannot load is one line of error."""

from __future__ import annotations

import re

import openai

from bench.common.servers import spawn_pagedchat, stop_server, wait_ready
from tests.e2e.conftest import STARTUP_TIMEOUT_S, Server, server_env
from tests.e2e.zygote import fork_server
from tests.engine.gguf_factories import T
from tests.engine.gguf_from_hf import make_chat_gguf


def serve_gguf(tmp_path, cache_dir, path) -> Server:
    """`pagedchat serve --model <path>`, not waited for; only the flag names the model."""
    env = server_env(
        tmp_path,
        "no-such-model",
        PAGEDCHAT_MAX_MODEL_LEN="256",
        PAGEDCHAT_CACHE_DIR=str(cache_dir),  # the compiled kernels, shared between test servers
        PAGEDCHAT_KV_DISK_BYTES="0",
    )
    command = ("pagedchat", "serve", "--model", str(path))
    return spawn_pagedchat(
        "server", env, tmp_path, isolated=True, server_type=Server, command=command, launch=fork_server
    )


def test_serve_a_k_quant_qwen2_gguf_file(tmp_path, shared_cache_dir):
    _, path = make_chat_gguf(
        tmp_path / "qwen2-Q4_K_M.gguf", "qwen2", True, linear_type=T.Q4_K, embed_type=T.Q6_K
    )
    server = serve_gguf(tmp_path, shared_cache_dir, path)
    try:
        wait_ready(server, STARTUP_TIMEOUT_S)
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["qwen2-Q4_K_M.gguf"]
        reply = client.chat.completions.create(
            model="qwen2-Q4_K_M.gguf",
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=6,
            temperature=0,
        )
        assert reply.choices[0].finish_reason in ("length", "stop") and reply.usage.completion_tokens >= 1
        assert (
            reply.usage.prompt_tokens > 3
        )  # the ChatML template from the file's metadata wrapped the message
    finally:
        stop_server(server)
    # the K-quants are multiplied in their blocks: nothing of the file becomes float but its norms and biases
    assert re.search(r"GGUF Q4_K: [1-9]\d* tensors kept in blocks, 0 loaded", server.log()), server.log()[
        -4000:
    ]


def test_serving_an_unsupported_gguf_fails_with_one_line(tmp_path, shared_cache_dir):
    _, path = make_chat_gguf(
        tmp_path / "tq1.gguf",
        "llama",
        True,
        linear_type=T.F16,
        type_overrides={"blk.0.attn_q.weight": T.TQ1_0},
    )
    server = serve_gguf(tmp_path, shared_cache_dir, path)
    assert server.process.wait(timeout=STARTUP_TIMEOUT_S) != 0
    log = server.log()
    assert "cannot start: GGUF tensor 'blk.0.attn_q.weight' has type TQ1_0, which is not supported" in log, (
        log
    )
    assert "engine failed to start: GGUF tensor" in log and "Traceback" not in log, log
