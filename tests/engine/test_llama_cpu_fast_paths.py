"""CPU fast paths: prepacked bf16 linears give F.linear's results; the fused ops match torch's to one rounding in
bf16 and to fp32 rounding in fp32; a bf16 model keeps its logits with them on, an fp32 model its logits to ~1e-6."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.attention.torch_backend import TorchAttentionBackend
from engine.models.rope import apply_rope
from engine.native.fused_ops import load_cpu_ops
from engine.native.onednn import Linear, bf16_prepack_supported
from tests.engine.factories import make_attention_metadata, make_hf_model, make_kv_caches, make_model_from_hf

OPS = load_cpu_ops()
needs_ops = pytest.mark.skipif(OPS is None, reason="no C compiler: the fused ops cannot be built here")
needs_onednn = pytest.mark.skipif(
    not bf16_prepack_supported(),
    reason="oneDNN cannot prepack bf16 here (torch without oneDNN, or a CPU without AVX-512 BW/VL/DQ)",
)
ONE_ROUNDING = dict(atol=1e-6, rtol=2**-7)  # a bf16 result against an fp32 reference of the same bf16 inputs


def _bf16(*shape, seed=0, scale=1.0):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale).to(torch.bfloat16)


@needs_onednn
@pytest.mark.parametrize("num_rows", [1, 7, 64, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_f_linear(num_rows, bias):
    torch.manual_seed(num_rows)
    layer = Linear(96, 160, bias=bias).to(torch.bfloat16).requires_grad_(False)
    x = _bf16(num_rows, 96, seed=1)
    expected = F.linear(x, layer.weight, layer.bias)
    assert layer.pack() and layer.packed is not None
    out = layer(x)
    assert out.shape == (num_rows, 160) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected.float(), atol=0.0, rtol=2**-7)


def test_fp32_linear_is_not_packed():
    layer = Linear(32, 48)
    assert not layer.pack() and layer.packed is None
    x = torch.randn(5, 32)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


@needs_ops
@pytest.mark.parametrize("rows,dim", [(3, 576), (64, 100), (512, 576)])  # tail lanes; 512 rows run threaded
def test_add_rms_norm(rows, dim):
    residual, delta = _bf16(rows, dim, seed=2, scale=3), _bf16(rows, dim, seed=3)
    weight = (1 + 0.2 * torch.randn(dim, generator=torch.Generator().manual_seed(4))).to(torch.bfloat16)
    expected_residual = residual + delta  # torch rounds the fp32 sum to bf16 once, as the op does
    updated = residual.clone()
    out = OPS.add_rms_norm_(updated, delta, weight, 1e-5)
    assert torch.equal(updated, expected_residual)
    expected = F.rms_norm(expected_residual.float(), (dim,), weight.float(), 1e-5)
    torch.testing.assert_close(out.float(), expected, **ONE_ROUNDING)
    untouched = residual.clone()
    out = OPS.add_rms_norm_(untouched, None, weight, 1e-5)  # no delta: norm only
    assert torch.equal(untouched, residual)
    torch.testing.assert_close(
        out.float(), F.rms_norm(residual.float(), (dim,), weight.float(), 1e-5), **ONE_ROUNDING
    )


@needs_ops
@pytest.mark.parametrize("rows,width", [(5, 1536), (64, 37), (512, 1536)])
def test_silu_mul(rows, width):
    gate_up = _bf16(rows, 2 * width, seed=5, scale=4)
    gate, up = gate_up.float().chunk(2, dim=-1)
    out = OPS.silu_mul(gate_up)
    assert out.shape == (rows, width) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), F.silu(gate) * up, **ONE_ROUNDING)


@needs_ops
@pytest.mark.parametrize("rows,head_dim", [(6, 64), (40, 24), (300, 64)])
def test_rope_in_place_on_the_rotated_heads_only(rows, head_dim):
    from engine.models.llama import ModelArgs
    from engine.models.rope import rope_cos_sin

    args = ModelArgs(100, 64, 64, 1, 6, 2, head_dim, max_seq_len=512, rope_theta=10000.0)
    table = rope_cos_sin(args).to(torch.bfloat16)
    qkv = _bf16(rows, 10 * head_dim, seed=6)
    positions = torch.randint(0, 512, (rows,), generator=torch.Generator().manual_seed(7))
    qk = qkv[:, : 8 * head_dim].view(rows, 8, head_dim)  # strided: rows of 10 heads, the first 8 rotated
    cos_sin = table[positions].float()
    expected = apply_rope(qk.float(), cos_sin[:, 0:1], cos_sin[:, 1:2])
    before_v = qkv[:, 8 * head_dim :].clone()
    assert OPS.rope_(qk, positions, table) is qk
    torch.testing.assert_close(qk.float(), expected, atol=1e-2, rtol=2**-7)  # values near 0 lose a few bits
    assert torch.equal(qkv[:, 8 * head_dim :], before_v)


def _logits(model, seed=0):
    args = model.args
    seq_lens = [9, 4]
    meta = make_attention_metadata(seq_lens, seq_lens, [[0], [1]], 16)
    ids = torch.randint(0, args.vocab_size, (sum(seq_lens),), generator=torch.Generator().manual_seed(seed))
    pos = torch.tensor([*range(9), *range(4)])
    caches = make_kv_caches(args, num_blocks=2, block_size=16, dtype=model.embed_tokens.weight.dtype)
    with torch.inference_mode():
        return model.compute_logits(model(ids, pos, caches, meta, TorchAttentionBackend(16)))


@needs_onednn
@pytest.mark.parametrize("kind,seed", [("qwen2", 3), ("llama3", 5)])  # QKV bias: packed linears carry it
def test_bf16_model_with_fast_paths_is_as_close_to_fp32_as_torch_bf16(kind, seed):
    hf = make_hf_model(kind, seed=seed)
    reference = _logits(make_model_from_hf(hf))  # fp32, logits up to ~4.5
    model = make_model_from_hf(hf, torch.bfloat16)
    plain_error = (_logits(model) - reference).abs()
    num_packed, fused = model.use_cpu_fast_paths()
    assert num_packed == 4 * model.args.num_layers + 1  # qkv, o, gate_up, down per layer; lm_head
    assert fused == (OPS is not None)
    fast_error = (_logits(model) - reference).abs()
    # measured: mean 0.012 / max 0.066 for both paths; a wrong bias, norm or rotation is ~1 or more
    assert fast_error.max() < 0.15 and fast_error.mean() < 1.25 * plain_error.mean()


def test_fp32_model_with_the_fused_ops_keeps_its_logits():
    model = make_model_from_hf(make_hf_model("llama", seed=4))
    before = _logits(model)
    assert model.use_cpu_fast_paths() == (0, OPS is not None)  # fp32 linears are never packed
    torch.testing.assert_close(_logits(model), before, atol=2e-5, rtol=1e-5)


FP32_ROUNDING = dict(atol=2e-6, rtol=1e-5)  # an fp32 op against torch's fp32 ops: summation order only


@needs_ops
@pytest.mark.parametrize("rows,dim", [(1, 576), (64, 100), (512, 576)])
def test_fp32_twins_match_torch(rows, dim):
    gen = torch.Generator().manual_seed(rows)
    residual, delta = 3 * torch.randn(rows, dim, generator=gen), torch.randn(rows, dim, generator=gen)
    weight = 1 + 0.2 * torch.randn(dim, generator=gen)
    updated = residual.clone()
    out = OPS.add_rms_norm_(updated, delta, weight, 1e-5)
    assert torch.equal(updated, residual + delta)
    torch.testing.assert_close(out, F.rms_norm(residual + delta, (dim,), weight, 1e-5), **FP32_ROUNDING)
    torch.testing.assert_close(
        OPS.add_rms_norm_(residual.clone(), None, weight, 1e-5), F.rms_norm(residual, (dim,), weight, 1e-5)
    )
    gate_up = 4 * torch.randn(rows, 2 * dim, generator=gen)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(OPS.silu_mul(gate_up), F.silu(gate) * up, **FP32_ROUNDING)


@needs_ops
def test_fp32_rope_twin_matches_apply_rope():
    from engine.models.llama import ModelArgs
    from engine.models.rope import rope_cos_sin

    args = ModelArgs(100, 64, 64, 1, 6, 2, 64, max_seq_len=512, rope_theta=10000.0)
    table = rope_cos_sin(args)
    qkv = torch.randn(9, 10 * 64, generator=torch.Generator().manual_seed(8))
    positions = torch.randint(0, 512, (9,), generator=torch.Generator().manual_seed(9))
    qk = qkv[:, : 8 * 64].view(9, 8, 64)
    cos_sin = table[positions]
    expected = apply_rope(qk, cos_sin[:, 0:1], cos_sin[:, 1:2])
    before_v = qkv[:, 8 * 64 :].clone()
    assert OPS.rope_(qk, positions, table) is qk
    torch.testing.assert_close(qk, expected, **FP32_ROUNDING)
    assert torch.equal(qkv[:, 8 * 64 :], before_v)


@needs_ops
@pytest.mark.parametrize("cols", [1, 7, 8, 9, 17, 64, 1000, 49152])
@pytest.mark.parametrize("kind", ["random", "ties", "nan", "all_minus_inf", "inf"])
def test_argmax_rows_is_torch_argmax(cols, kind):
    """The fused step's greedy pick: each row's first maximum, a NaN counting as the maximum, in rows of any width
    (a vector body and a scalar tail) and a row stride wider than the row."""
    g = torch.Generator().manual_seed(cols)
    wide = torch.randint(-3, 4, (5, cols + 3), generator=g).float()  # few values: many ties
    if kind == "random":
        wide = torch.randn(5, cols + 3, generator=g)
    elif kind == "nan":
        wide[torch.rand(wide.shape, generator=g) < 0.1] = float("nan")
        wide[0, cols // 2] = float("nan")  # one row surely has one, maybe after a tied maximum
    elif kind == "all_minus_inf":
        wide[:] = float("-inf")
    elif kind == "inf":
        wide[torch.rand(wide.shape, generator=g) < 0.2] = float("inf")
    x = wide[:, :cols]  # rows of `cols` floats, `cols + 3` apart
    got = OPS.argmax_rows(x)
    assert got.tolist() == x.argmax(-1).tolist() == x.numpy().argmax(-1).tolist()
