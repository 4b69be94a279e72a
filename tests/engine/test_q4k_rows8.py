"""Q4_K_R8: Q4_K repacked into groups of 8 interleaved rows (engine/native/quant/q4k_r8.h, weight_layout rows8).

The repacking is a byte permutation (the compiled one equals its torch twin and inverts exactly); the exact mode and
dequantizing give the unrepacked weight's bits; the int8 dots give Q4_K's integer sums (so its results up to fp32
order), the same bits for a row whatever the number of rows beside it, on every instruction set; the loader repacks
without keeping the file's copy, and a model in rows8 decodes what the file's layout decodes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine import LLM, SamplingParams
from engine.core.config import EngineConfig
from engine.core.resolve import Machine, ModelFacts, resolve_config, resolve_weight_layout
from engine.models.quantized import QuantLinear
from engine.native.quant_format import QuantType, QuantWeight, dequantize_torch, repack_rows8, unpack_rows8
from engine.native.quant_linear import GEMV_MAX_ROWS
from tests.engine.gguf_factories import T, write_q4km_like_gguf
from tests.engine.test_kquant_kernels import (
    MARCHES,
    QK_K,
    assert_within,
    extreme_weight,
    fp32_bound,
    kernel,
    make_x,
    q8_bound,
    random_weight,
    reference,
)

SHAPES = [(8, QK_K), (48, 3 * QK_K), (64, 768), (24, 2 * QK_K)]


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_repack_is_the_twins_byte_permutation_and_inverts(march, out_features, in_features):
    weight = random_weight(QuantType.Q4_K, out_features, in_features, seed=out_features)
    packed = kernel(march).repack(weight)
    assert packed.qtype is QuantType.Q4_K_R8
    assert packed.blocks.shape == (out_features, in_features // QK_K * 148)  # +4 bytes a row and super-block
    assert torch.equal(packed.blocks, repack_rows8(weight).blocks)
    assert torch.equal(unpack_rows8(packed).blocks, weight.blocks)
    assert torch.equal(dequantize_torch(packed), reference(weight))


def test_a_weight_of_rows8_is_whole_groups():
    weight = random_weight(QuantType.Q4_K, 12, QK_K, seed=1)
    with pytest.raises(ValueError, match="groups of 8 rows, not 12"):
        repack_rows8(weight)
    with pytest.raises(ValueError, match="groups of 8 rows, not 4"):
        QuantWeight(QuantType.Q4_K_R8, torch.zeros(4, 148, dtype=torch.uint8), QK_K)


@pytest.mark.parametrize("march", MARCHES)
def test_dequantize_and_gather_are_the_unrepacked_bits(march):
    k = kernel(march)
    weight = random_weight(QuantType.Q4_K, 48, 3 * QK_K, seed=2)
    packed = k.repack(weight)
    assert torch.equal(k.dequantize(packed), k.dequantize(weight))
    assert torch.equal(k.dequantize(packed, 3, 21), k.dequantize(weight, 3, 21))  # not whole groups
    index = torch.tensor([0, 7, 13, 47, 8, 8])
    assert torch.equal(k.gather(packed, index), k.gather(weight, index))
    with pytest.raises(IndexError):
        k.gather(packed, torch.tensor([48]))


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("rows", [1, 3, 5, GEMV_MAX_ROWS + 1])
def test_the_exact_mode_is_the_unrepacked_bits(march, rows):
    """fp32 activations: each group is unpacked and multiplied by Q4_K's exact dot, so bit for bit the file's
    layout, in the GEMV and (QuantLinear past the GEMV bound) the fp32 tiles of the batch GEMM."""
    k = kernel(march)
    weight = random_weight(QuantType.Q4_K, 40, 3 * QK_K, seed=3)
    packed = k.repack(weight)
    x = make_x(rows, weight.in_features, seed=rows)
    assert torch.equal(k.linear(x, packed, None, act_q8=False), k.linear(x, weight, None, act_q8=False))
    bias = torch.randn(40)
    linears = [QuantLinear(w, bias, act_q8=False, batch_gemm="fp32") for w in (weight, packed)]
    assert torch.equal(linears[0](x), linears[1](x))


@pytest.mark.parametrize("march", MARCHES)
def test_int8_rows_are_row_exact_and_within_the_int8_bound(march):
    """Every row the same bits alone, beside up to 15 others (passes of 1-4 rows) and in the batch GEMM; each within
    int8 rounding of the fp32 matmul, and equal to Q4_K's own int8 dot up to fp32 order (the same integer sums)."""
    k = kernel(march)
    weight = random_weight(QuantType.Q4_K, 56, 2 * QK_K, seed=4)
    packed = k.repack(weight)
    ref = reference(weight)
    x = make_x(GEMV_MAX_ROWS + 4, weight.in_features, seed=5)
    alone = torch.cat([k.linear(x[i : i + 1], packed, None, act_q8=True) for i in range(x.shape[0])])
    for rows in (2, 3, 5, 8, 9, GEMV_MAX_ROWS):
        assert torch.equal(k.linear(x[:rows], packed, None, act_q8=True), alone[:rows]), rows
    assert torch.equal(k.gemm_q8(x, packed, None), alone)
    assert_within(alone, x.double() @ ref.double().T, q8_bound(x, ref, QK_K) + fp32_bound(x, ref))
    unrepacked = k.linear(x, weight, None, act_q8=True)
    assert_within(alone, unrepacked, 8 * fp32_bound(x, ref) + 1e-6 * unrepacked.abs())


@pytest.mark.parametrize("march", MARCHES)
def test_int8_dots_do_not_saturate(march):
    """Largest nibbles, scales and minimums against activations of +-127: the AVX2 16-bit sums of 4 byte pairs
    (4 * 2 * 15 * 127) and the minimums' 16-bit pairs stay exact."""
    k = kernel(march)
    weight = extreme_weight(QuantType.Q4_K, 16, 4 * QK_K)
    packed = k.repack(weight)
    ref = reference(weight)
    signs = torch.tensor([1.0, -1.0]).repeat(2 * QK_K)
    x = torch.stack([torch.ones(4 * QK_K), -torch.ones(4 * QK_K), signs, 0.5 * signs.roll(1)])
    y_ref = x.double() @ ref.double().T
    for y in (k.linear(x, packed, None, act_q8=True), k.gemm_q8(x, packed, None)):
        assert_within(y, y_ref, 4 * fp32_bound(x, ref) + 1e-6 * y_ref.abs())


def test_auto_repacks_where_int8_activations_run_on_avx512_vnni():
    config = EngineConfig(model="m.gguf")
    facts = ModelFacts(max_len=2048, linear_weights=1 << 20, is_gguf=True, gguf_blocks=True)
    for vnni, layout in ((True, "rows8"), (False, "file")):
        machine = Machine(cuda=False, cuda_bf16=False, cpu_fast_bf16=False, cpu_avx512_vnni=vnni)
        assert resolve_config(config, machine, facts, lambda: True).weight_layout == layout
        exact = dataclasses.replace(config, int8_activations=False)
        assert resolve_config(exact, machine, facts, lambda: True).weight_layout == "file"
    assert resolve_weight_layout("auto", in_blocks=True, rounded=True) == "rows8"
    assert resolve_weight_layout("auto", in_blocks=True, rounded=False) == "file"
    assert resolve_weight_layout("auto", in_blocks=False, rounded=False) == "file"
    assert resolve_weight_layout("rows8", in_blocks=True, rounded=False) == "rows8"
    with pytest.raises(ValueError, match="needs quantization 'gguf'"):
        resolve_weight_layout("rows8", in_blocks=False, rounded=False)
    with pytest.raises(ValueError, match="'auto', 'file' or 'rows8'"):
        resolve_weight_layout("rows4", in_blocks=True, rounded=True)
    assert "weight_layout" in {f.name for f in dataclasses.fields(EngineConfig)}


@pytest.fixture(scope="module")
def q4k_gguf(tmp_path_factory):
    """Q4_K linears (v and down in Q6_K, as Q4_K_M), a tied Q4_K embedding that stays in the file's layout."""
    return write_q4km_like_gguf(tmp_path_factory.mktemp("rows8") / "q4k.gguf", seed=9, embed_type=T.Q4_K)


def _decode(path, layout: str, act_q8: bool):
    llm = LLM(
        model=str(path),
        quantization="gguf",
        int8_activations=act_q8,
        weight_layout=layout,
        kv_cache_bytes=8 << 20,
    )
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=1)
    prompts = [[{"role": "user", "content": p}] for p in ("hello there", "the blocks", "a b c d e f g")]
    outs = llm.chat(prompts, params)
    return llm, [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


def test_the_loader_repacks_without_a_copy_and_decodes_as_the_file(q4k_gguf):
    """rows8: q/k, o, gate/up become Q4_K_R8 (a fused qkv: Q4_K_R8 + Q6_K segments), the tied embedding stays Q4_K,
    each linear's bytes are 148/144 of the file's; exact mode decodes bit for bit what the file's layout decodes."""
    llm, packed = _decode(q4k_gguf, "rows8", act_q8=False)
    model = llm.engine.runner.model
    assert llm.engine.config.weight_layout == "rows8"
    layer = model.layers[0]
    assert layer.self_attn.qkv_proj.qtypes == (QuantType.Q4_K_R8, QuantType.Q6_K)
    assert layer.mlp.gate_up_proj.qtypes == (QuantType.Q4_K_R8,)
    assert layer.mlp.down_proj.qtypes == (QuantType.Q6_K,)
    assert model.embed_tokens.qtype == QuantType.Q4_K and model.lm_head.qtypes == (QuantType.Q4_K,)
    assert layer.mlp.gate_up_proj.blocks.shape == (1024, 148)
    _, file = _decode(q4k_gguf, "file", act_q8=False)
    assert packed == file


def test_rows8_decodes_with_int8_activations(q4k_gguf):
    """int8 activations (auto's rows8 on an AVX512-VNNI CPU): Q4_K repacked, the fused step taking it, greedy tokens
    of the file's layout (the integer sums are the same; only fp32 order differs)."""
    llm, packed = _decode(q4k_gguf, "rows8", act_q8=True)
    assert llm.engine.config.weight_layout == "rows8"
    assert llm.engine.runner.fused is not None
    assert llm.engine.runner.model.layers[1].mlp.gate_up_proj.qtypes == (QuantType.Q4_K_R8,)
    _, file = _decode(q4k_gguf, "file", act_q8=True)
    assert [tokens for tokens, _ in packed] == [tokens for tokens, _ in file]
