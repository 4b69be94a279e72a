"""Fused linears of mixed block formats (QuantLinear segments: llama-quantize's Q4_K_M keeps q/k in Q4_K and v in
Q6_K in some layers) and the embedding gathered from its blocks (dequantize_gather, QuantEmbedding).

A segment's columns come from the same kernel call that multiplies that segment alone, so the GEMVs and the int8
GEMM give each segment's own result bit for bit; every path is within its bound of the torch twin (bounds as in
tests/engine/test_kquant_kernels.py; bf16 copies add 2^-8 relative rounding of both operands).
"""

from __future__ import annotations

import gguf
import pytest
import torch

from engine.models.quantized import QuantEmbedding
from engine.native.quant_format import (
    FILE_TYPES,
    QuantType,
    QuantWeight,
    dequantize_rows_torch,
    quant_linear_torch,
)
from engine.native.quant_linear import GEMV_MAX_ROWS, QuantLinear, load_kernel
from tests.engine.gguf_factories import random_blocks

KERNEL = load_kernel()
needs_kernel = pytest.mark.skipif(
    KERNEL is None, reason="no C compiler: the native kernel cannot be built here"
)
IN_FEATURES = 512  # whole super-blocks of 256 and blocks of 32
U = 2.0**-24
SEGMENTS = {  # formats and rows of each segment, in row order
    "q4k-q6k": [(QuantType.Q4_K, 48), (QuantType.Q6_K, 16)],
    "q4_1-q8_0-q4_1": [(QuantType.Q4_1, 40), (QuantType.Q8_0, 9), (QuantType.Q4_1, 7)],
    "q5k-q4_0-q6k": [(QuantType.Q5_K, 13), (QuantType.Q4_0, 20), (QuantType.Q6_K, 3)],
}


def make_weight(qtype: QuantType, out_features: int, in_features: int, seed: int) -> QuantWeight:
    raw = random_blocks(gguf.GGMLQuantizationType(int(qtype)), out_features, in_features, seed)
    return QuantWeight(qtype, torch.from_numpy(raw), in_features)


def make_segments(name: str) -> list[QuantWeight]:
    return [make_weight(q, rows, IN_FEATURES, seed=i) for i, (q, rows) in enumerate(SEGMENTS[name])]


def make_x(rows: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, IN_FEATURES, generator=gen) * torch.rand(rows, 1, generator=gen) * 4


def bound(x: torch.Tensor, segments: list[QuantWeight], int8: bool, bf16: bool) -> torch.Tensor:
    """What a path may differ from the twin by: fp32 order, plus the int8 rounding of x (per each segment's
    activation block) or bf16's of x and W."""
    parts = []
    for segment in segments:
        w = quant_linear_torch(torch.eye(IN_FEATURES), segment).T.double().abs()  # [seg out, in]
        b = 2 * (IN_FEATURES + 2) * U * (x.double().abs() @ w.T)
        if int8:
            block = segment.qtype.block_weights
            amax = x.reshape(x.shape[0], -1, block).abs().amax(-1, keepdim=True).expand(-1, -1, block)
            b = b * 3 + (amax.reshape(x.shape).double() / 254 * (1 + 1e-6)) @ w.T
        if bf16:
            b = b + 2.0**-7 * (x.double().abs() @ w.T)
        parts.append(b)
    return torch.cat(parts, dim=1)


@needs_kernel
@pytest.mark.parametrize("name", list(SEGMENTS))
@pytest.mark.parametrize(
    ("act_q8", "batch_gemm"),
    [(False, "fp32"), (True, "int8"), (False, "bf16")],
    ids=["exact", "int8", "bf16"],
)
def test_segments_give_each_segments_own_result_and_stay_within_the_twins_bound(name, act_q8, batch_gemm):
    segments = make_segments(name)
    out_features = sum(s.out_features for s in segments)
    bias = torch.randn(out_features)
    module = QuantLinear(segments, bias, act_q8=act_q8, batch_gemm=batch_gemm)
    assert module.qtypes == tuple(int(s.qtype) for s in segments) and module.out_features == out_features
    assert [s.blocks.data_ptr() for s in module.segments] == [
        s.blocks.data_ptr() for s in segments
    ]  # not copied
    starts = [0]
    for s in segments:
        starts.append(starts[-1] + s.out_features)
    alone = [
        QuantLinear(s, bias[a:b], act_q8=act_q8, batch_gemm=batch_gemm)
        for s, a, b in zip(segments, starts, starts[1:], strict=False)
    ]
    for rows in (1, 5, GEMV_MAX_ROWS + 1):
        x = make_x(rows, seed=rows)
        y = module(x)
        gemv = rows <= module.gemv_max_rows
        if gemv or batch_gemm == "int8":  # the very kernel calls of each segment alone
            assert torch.equal(y, torch.cat([m(x) for m in alone], dim=1)), f"{rows} rows"
        twin = quant_linear_torch(x, segments, bias)
        excess = (y.double() - twin.double()).abs() - bound(
            x,
            segments,
            int8=act_q8 or batch_gemm == "int8" and not gemv,
            bf16=batch_gemm == "bf16" and not gemv,
        )
        assert excess.max().item() <= 0, f"{rows} rows: off by {excess.max().item():.3g} beyond the bound"
    module.kernel = None  # no compiler: the twin itself
    x = make_x(3, seed=9)
    assert torch.equal(module(x), quant_linear_torch(x, segments, bias))
    assert torch.equal(module.dequantized_weight(), quant_linear_torch(torch.eye(IN_FEATURES), segments).T)


def test_the_twin_of_segments_is_the_stacked_weight():
    segments = make_segments("q4k-q6k")
    x = make_x(4, seed=1)
    stacked = torch.cat([quant_linear_torch(torch.eye(IN_FEATURES), s).T for s in segments])
    assert torch.equal(quant_linear_torch(x, segments), torch.nn.functional.linear(x, stacked))


@needs_kernel
@pytest.mark.parametrize("march", ["native", "x86-64-v3", "x86-64"])
@pytest.mark.parametrize("qtype", FILE_TYPES, ids=lambda q: q.name)
def test_gather_is_dequantize_of_those_rows(qtype, march):
    kernel = load_kernel(march)
    if kernel is None:
        pytest.skip(f"the native kernel cannot be built here for {march}")
    weight = make_weight(qtype, 23, IN_FEATURES if qtype.block_weights == 256 else 96, seed=5)
    index = torch.tensor([5, 0, 22, 5, 7])
    got = kernel.gather(weight, index)
    assert torch.equal(got, kernel.dequantize(weight)[index])  # bit for bit: the fused step and modules agree
    ref = dequantize_rows_torch(weight, index)
    torch.testing.assert_close(got, ref, rtol=0, atol=4 * U * ref.abs().max().item())
    assert kernel.gather(weight, torch.tensor([], dtype=torch.int64)).shape == (0, weight.in_features)
    for bad in (23, -1):
        with pytest.raises(IndexError, match=r"outside \[0, 23\)"):
            kernel.gather(weight, torch.tensor([1, bad]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quant_embedding_gathers_rows_in_the_models_dtype(dtype):
    weight = make_weight(QuantType.Q6_K, 40, 256, seed=3)
    embed = QuantEmbedding(weight, dtype)
    ids = torch.tensor([[3, 39], [0, 3]])
    rows = embed(ids)
    assert rows.shape == (2, 2, 256) and rows.dtype == dtype
    ref = dequantize_rows_torch(weight, ids.reshape(-1)).to(dtype).reshape(2, 2, 256)
    torch.testing.assert_close(rows, ref, rtol=0, atol=4 * U * ref.abs().max().item())
    embed.kernel = None  # the twin
    assert torch.equal(embed(ids), ref)
    with pytest.raises(IndexError):
        embed(torch.tensor([40]))
