"""Qwen2, Mistral and Llama 3 GGUF files through the engine and the CLI, in one command each: greedy tokens of the
transformers model with the same weights; unsupported formats are one-line errors."""

from __future__ import annotations

import io
from contextlib import redirect_stdout
from typing import Any

import pytest
import torch

from engine import LLM, SamplingParams
from engine.cli import main as cli_main
from engine.models.quantized import QuantLinear
from tests.engine.gguf_factories import T
from tests.engine.gguf_from_hf import make_chat_gguf

KV_BYTES = 4 * 2**20
NUM_TOKENS = 12
PROMPTS = ["hello there", "What is the capital of France?", "Explain a hash table"]


def hf_greedy(hf_model: Any, prompt: list[int]) -> list[int]:
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(NUM_TOKENS):
            tokens.append(int(hf_model(torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(prompt) :]


def engine_greedy(llm: LLM) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt token ids, greedy reply ids) of each prompt, chat template applied."""
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    chats = [[{"role": "user", "content": p}] for p in PROMPTS]
    outs = llm.chat(chats, params)
    prompts = [llm.engine.apply_chat_template(c) for c in chats]
    return prompts, [o.outputs[0].token_ids for o in outs]


def test_qwen2_gguf_in_blocks_runs_its_biases_through_the_fused_decode(tmp_path):
    """Q8_0 linears with q/k/v biases stay in blocks and decode in the fused C step; greedy tokens equal the
    transformers Qwen2 model's and the dequantized model's (fp32 activations: int8 ones, the default, move logits)."""
    hf_model, path = make_chat_gguf(tmp_path / "qwen2.gguf", "qwen2", linear_type=T.Q8_0, embed_type=T.Q8_0)
    llm = LLM(model=str(path), dtype="float32", kv_cache_bytes=KV_BYTES, int8_activations=False)
    runner = llm.engine.runner
    qkv = runner.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, QuantLinear) and qkv.bias is not None and bool(qkv.bias.abs().sum() > 0)
    assert runner.fused is not None, "the fused decode step should take this model"
    prompts, got = engine_greedy(llm)
    assert len({tuple(t) for t in got}) == len(PROMPTS), (
        "the random model should answer each prompt differently"
    )
    assert got == [hf_greedy(hf_model, p) for p in prompts]
    dense = LLM(model=str(path), dtype="float32", kv_cache_bytes=KV_BYTES, quantization="none")
    assert engine_greedy(dense)[1] == got


@pytest.mark.parametrize("kind", ["mistral", "llama3"])
def test_k_quant_gguf_serves_the_transformers_greedy_tokens(tmp_path, kind):
    hf_model, path = make_chat_gguf(
        tmp_path / f"{kind}.gguf", kind, wide=True, linear_type=T.Q4_K if kind == "llama3" else T.Q6_K
    )
    # the K-quant blocks are multiplied natively; the exact mode (fp32 activations and batch GEMM) is what equals
    # transformers on the dequantized weights token for token, int8 activations move the logits (bench quality)
    llm = LLM(
        model=str(path), dtype="float32", kv_cache_bytes=KV_BYTES, int8_activations=False, batch_gemm="fp32"
    )
    prompts, got = engine_greedy(llm)
    assert got == [hf_greedy(hf_model, p) for p in prompts]


def test_cli_chat_with_a_k_quant_gguf_in_one_command(tmp_path, monkeypatch, capsys):
    _, path = make_chat_gguf(
        tmp_path / "qwen2-q4_k.gguf", "qwen2", True, linear_type=T.Q4_K, embed_type=T.Q6_K
    )
    monkeypatch.setattr("sys.stdin", io.StringIO("hello there\n"))
    stdout = io.StringIO()
    with redirect_stdout(stdout):
        code = cli_main(
            [
                "chat",
                "--model",
                str(path),
                "--max-tokens",
                "5",
                "--kv-cache-bytes",
                str(KV_BYTES),
                "--kv-disk-bytes",
                "0",
            ]
        )
    assert code == 0, capsys.readouterr().err
    assert "assistant> " in stdout.getvalue() and "prompt tokens" in capsys.readouterr().err


def test_unsupported_tensor_format_is_a_one_line_error(tmp_path, capsys):
    _, path = make_chat_gguf(
        tmp_path / "tq1.gguf",
        "llama",
        wide=True,
        linear_type=T.F16,
        type_overrides={"blk.1.ffn_up.weight": T.TQ1_0},
    )
    message = (
        "GGUF tensor 'blk.1.ffn_up.weight' has type TQ1_0, which is not supported; supported: F32, F16, BF16"
    )
    with pytest.raises(ValueError, match=message + ".*Q4_K, Q5_K, Q6_K"):
        LLM(model=str(path), kv_cache_bytes=KV_BYTES)
    assert cli_main(["generate", "--model", str(path), "--kv-disk-bytes", "0", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: GGUF tensor 'blk.1.ffn_up.weight' has type TQ1_0")
    assert "Traceback" not in "\n".join(err)
