"""engine/core/resolve.py and engine/core/limits.py: `auto` decided from plain facts, without torch or a model."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from engine.core.config import EngineConfig
from engine.core.limits import check_max_tokens
from engine.core.resolve import Machine, ModelFacts, check_kv_cache_dtype, resolve_config

CPU_BF16 = Machine(cuda=False, cuda_bf16=False, cpu_fast_bf16=True)
GGUF_BLOCKS = ModelFacts(max_len=2048, linear_weights=135_000_000, is_gguf=True, gguf_blocks=True)


def make_native_int8(answer: bool) -> tuple[list[int], Callable[[], bool]]:
    """A native_int8 probe that counts its calls."""
    calls: list[int] = []

    def probe() -> bool:
        calls.append(1)
        return answer

    return calls, probe


def test_a_gguf_model_on_the_cpu_resolves_every_auto():
    calls, probe = make_native_int8(True)
    config = resolve_config(EngineConfig(), CPU_BF16, GGUF_BLOCKS, probe)
    assert (config.device, config.dtype, config.quantization, config.batch_gemm) == (
        "cpu",
        "float32",
        "gguf",
        "bf16",
    )
    assert (config.int8_activations, config.kv_cache_dtype, config.attention_backend) == (
        True,
        "float16",
        "torch",
    )
    assert (config.max_model_len, config.max_num_batched_tokens) == (2048, 512)
    assert calls == [1]


def test_the_kernels_are_asked_only_where_the_activations_would_be_rounded():
    calls, probe = make_native_int8(False)
    assert (
        resolve_config(EngineConfig(), CPU_BF16, GGUF_BLOCKS, probe).kv_cache_dtype == "auto"
    )  # exact: no fp16
    dense = resolve_config(EngineConfig(quantization="none"), CPU_BF16, GGUF_BLOCKS, probe)
    assert (dense.dtype, dense.kv_cache_dtype, dense.int8_activations) == ("bfloat16", "auto", False)
    exact = resolve_config(EngineConfig(int8_activations=False), CPU_BF16, GGUF_BLOCKS, probe)
    assert (exact.dtype, exact.kv_cache_dtype) == ("float32", "auto")
    assert calls == [1]  # the first config only


def test_kv_cache_dtype_float16_needs_fp32_activations_and_the_torch_backend():
    check_kv_cache_dtype("float16", "float32", "torch")
    check_kv_cache_dtype("float16", "float16", "triton")
    check_kv_cache_dtype("int8", "bfloat16", "triton")
    with pytest.raises(ValueError, match="float16 is for float32 activations .* under bfloat16 activations"):
        check_kv_cache_dtype("float16", "bfloat16", "torch")
    with pytest.raises(ValueError, match="the Triton kernels take a pool of the model's dtype or int8"):
        check_kv_cache_dtype("float16", "float32", "triton")
    with pytest.raises(ValueError, match="under bfloat16 activations"):
        resolve_config(
            EngineConfig(kv_cache_dtype="float16", quantization="none"), CPU_BF16, GGUF_BLOCKS, bool
        )


def test_unset_max_model_len_is_the_models_own_limit_uncapped():
    long_model = ModelFacts(max_len=8192, linear_weights=135_000_000, is_gguf=True, gguf_blocks=True)
    assert resolve_config(EngineConfig(), CPU_BF16, long_model, bool).max_model_len == 8192
    assert resolve_config(EngineConfig(max_model_len=1024), CPU_BF16, long_model, bool).max_model_len == 1024


def test_max_model_len_is_capped_by_the_model():
    with pytest.raises(ValueError, match=r"max_model_len \(4096\) exceeds the model's limit \(2048\)"):
        resolve_config(EngineConfig(max_model_len=4096), CPU_BF16, GGUF_BLOCKS, bool)


def test_max_tokens_must_fit_beside_the_prompt():
    check_max_tokens(100, 28, 128)  # exactly full
    with pytest.raises(
        ValueError,
        match=r"^prompt \(100 tokens\) \+ max_tokens \(29\) exceeds max_model_len \(128\): shorten the prompt, "
        r"lower max_tokens, or start the server with a larger --max-model-len$",
    ):
        check_max_tokens(100, 29, 128)
