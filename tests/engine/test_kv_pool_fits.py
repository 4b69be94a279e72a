"""An explicit --kv-cache-bytes is checked against the memory left once the weights are in, as the weights are
checked before they load: refused at start with the numbers, instead of allocated (and faulted in) past what the
machine has."""

from __future__ import annotations

import pytest

import engine.llm_engine as llm_engine
from engine.core.memory import NotEnoughMemory, human_bytes
from tests.engine.gguf_factories import T, write_tiny_chat_gguf

POOL_BYTES = 64 << 20


def test_an_explicit_kv_pool_that_does_not_fit_beside_the_weights_is_refused_with_the_numbers(
    tmp_path, monkeypatch
):
    from engine import LLM

    path = write_tiny_chat_gguf(tmp_path / "chat.gguf", linear_type=T.Q4_0)
    monkeypatch.setattr(llm_engine, "available_memory_bytes", lambda: 5_000_000)  # what is left, weights in
    with pytest.raises(NotEnoughMemory) as refused:
        LLM(model=str(path), kv_disk_bytes=0, max_model_len=100, kv_cache_bytes=POOL_BYTES)
    message = str(refused.value)
    assert message.startswith(
        f"not allocating the KV pool: --kv-cache-bytes asks for {human_bytes(POOL_BYTES)}"
    )
    assert "the machine has 5.0 MB available, so weights and pool (" in message and "would not fit" in message
    assert isinstance(refused.value, ValueError)  # a start-up refusal: `cannot start: ...` in one line

    monkeypatch.setattr(llm_engine, "available_memory_bytes", lambda: POOL_BYTES)  # it fits: it starts
    llm = LLM(model=str(path), kv_disk_bytes=0, max_model_len=100, kv_cache_bytes=POOL_BYTES)
    assert llm.engine.num_blocks * llm.engine.kv_block_bytes <= POOL_BYTES
