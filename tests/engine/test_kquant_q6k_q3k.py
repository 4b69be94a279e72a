"""Q6_K's and Q3_K's fast dots (engine/native/quant/dots_q6k_q3k.h) against their arithmetic written out here.

With int8 activations a block's dot is integer arithmetic, exact in the kernels (no maddubs saturation, no int32
overflow), scaled once by d * d_x: the kernels must equal sum_b fp32(d_b * dx_b) * isum_b up to fp32 rounding of the
per-block terms and their sum, on every code path (this CPU's, AVX2's, scalar), including blocks at the extremes
(largest quants, scales of -128 and 127, activations of +-127, sums of one sign). The exact path is checked on the
same extremes against gguf's dequantization and an fp32 matmul.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.native.quant_format import QuantType, QuantWeight
from tests.engine.test_kquant_kernels import (
    MARCHES,
    U,
    assert_within,
    fp32_bound,
    int8_inverse_scale,
    kernel,
    random_weight,
    reference,
)

TYPES = [QuantType.Q6_K, QuantType.Q3_K]
OFF = {QuantType.Q6_K: 32, QuantType.Q3_K: 4}  # w = d * sc * (u - off)


def integer_parts(weight: QuantWeight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(u - off as int64 [out, nb, 256], the 16 scales as int64 [out, nb, 16], d as float32 [out, nb])."""
    qtype = weight.qtype
    b = weight.blocks.numpy().reshape(weight.out_features, -1, qtype.block_bytes).astype(np.int64)
    q = np.empty((*b.shape[:2], 256), dtype=np.int64)
    if qtype == QuantType.Q6_K:
        ql, qh = b[..., :128], b[..., 128:192]
        sc = b[..., 192:208].astype(np.uint8).view(np.int8).astype(np.int64)
        for c in range(8):
            n, k = divmod(c, 4)
            low = (ql[..., 64 * n + 32 * (k & 1) :][..., :32] >> (4 * (k >> 1))) & 15
            q[..., 32 * c : 32 * c + 32] = (
                low | (((qh[..., 32 * n : 32 * n + 32] >> (2 * k)) & 3) << 4)
            ) - 32
        d_at = 208
    else:
        hm, qs, raw = b[..., :32], b[..., 32:96], b[..., 96:108]
        j = np.arange(16)
        lo = np.where(j < 8, raw[..., j % 8] & 15, raw[..., j % 8] >> 4)
        sc = (lo | (((raw[..., 8 + j % 4] >> (2 * (j // 4))) & 3) << 4)) - 32
        for c in range(8):
            n, k = divmod(c, 4)
            u = ((qs[..., 32 * n : 32 * n + 32] >> (2 * k)) & 3) | (((hm >> c) & 1) << 2)
            q[..., 32 * c : 32 * c + 32] = u - 4
        d_at = 108
    d = b[..., d_at : d_at + 2].astype(np.uint8).copy().view(np.float16)[..., 0].astype(np.float32)
    return q, sc, d


def int8_rows(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """x rounded to int8 per 256 as the kernels' quantizer does: (qs int64 [rows, nb, 256], d float32 [rows, nb])."""
    xb = x.reshape(x.shape[0], -1, 256)
    amax = xb.abs().amax(-1)
    inv = int8_inverse_scale(amax)
    qs = (xb * inv[..., None]).round()
    return qs.numpy().astype(np.int64), (amax / 127).numpy()


def integer_linear(x: torch.Tensor, weight: QuantWeight) -> tuple[np.ndarray, np.ndarray]:
    """(sum_b fp32(d_b dx_b) * isum_b in float64, the bound on the kernels' fp32 rounding of it), [rows, out]."""
    q, sc, d = integer_parts(weight)
    a, dx = int8_rows(x)
    nb = q.shape[1]
    prod = q[None] * a[:, None]  # [rows, out, nb, 256]
    isum = (prod.reshape(*prod.shape[:3], 16, 16).sum(-1) * sc[None]).sum(-1)  # [rows, out, nb]
    u = q + OFF[weight.qtype]  # what the kernels multiply, less off * the scaled activation sums
    bsums = a.reshape(*a.shape[:2], 16, 16).sum(-1)
    size = (np.abs(u[None] * a[:, None]).reshape(*prod.shape[:3], 16, 16).sum(-1) * np.abs(sc[None])).sum(-1)
    size += OFF[weight.qtype] * (np.abs(bsums[:, None] * sc[None])).sum(-1)
    scale = np.abs((d[None] * dx[:, None]).astype(np.float32).astype(np.float64))  # [rows, out, nb]
    y = ((d[None] * dx[:, None]).astype(np.float32).astype(np.float64) * isum).sum(-1)
    return y, 2 * (nb + 8) * U * (scale * size).sum(-1)


def extreme_weight(qtype: QuantType, out_features: int, nb: int, seed: int) -> QuantWeight:
    """Blocks of the largest quants and scales: row 0 every weight u = 0 with the most negative scale (sums of one
    sign with positive x), row 1 every u at its top with the most negative scale (the largest unsigned sums), other
    rows of extreme bytes at random, fp16 d up to 65504."""
    gen = np.random.default_rng(seed)
    raw = gen.choice(np.array([0, 255], dtype=np.uint8), (out_features, nb, qtype.block_bytes))
    if qtype == QuantType.Q6_K:
        raw[..., 192:208] = gen.choice(np.array([-128, 127], dtype=np.int8), (out_features, nb, 16)).view(
            np.uint8
        )
        raw[0, :, :192], raw[1, :, :192] = 0, 255
        raw[:2, :, 192:208] = np.uint8(128)  # -128
        d_at = 208
    else:  # Q3_K: 6-bit scales less 32 (0 bits: -32, all bits: 31); u of 0 needs a clear mask bit and pair
        raw[0, :, :108], raw[1, :, :96], raw[1, :, 96:108] = 0, 255, 0
        d_at = 108
    d = gen.choice(np.array([1.0, -1.0, 0.5, 65504.0, -65504.0], dtype=np.float16), (out_features, nb))
    d[:2] = 1.0
    raw[..., d_at : d_at + 2] = d.view(np.uint8).reshape(out_features, nb, 2)
    return QuantWeight(qtype, torch.from_numpy(raw.reshape(out_features, -1)), nb * 256)


def extreme_x(rows: int, in_features: int, seed: int) -> torch.Tensor:
    """+-127 (rounded to exactly +-127 by the quantizer); row 0 all +127."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 2, (rows, in_features), generator=gen).float() * 254 - 127
    x[0] = 127
    return x


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_integer_parts_are_gguf(qtype):
    for weight in (random_weight(qtype, 5, 512, seed=1), extreme_weight(qtype, 5, 2, seed=2)):
        q, sc, d = integer_parts(weight)
        w = (d[..., None] * np.repeat(sc, 16, -1).astype(np.float32)) * q.astype(np.float32)
        assert np.array_equal(w.reshape(weight.shape), reference(weight).numpy())


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_int8_dot_is_exact_integer_arithmetic(qtype, march):
    """GEMV (every pass width and a leftover row) and GEMM, random and extreme blocks and activations."""
    k = kernel(march)
    cases = [
        (random_weight(qtype, 9, 768, seed=3), torch.randn(5, 768) * 3),
        (extreme_weight(qtype, 9, 3, seed=4), extreme_x(5, 768, seed=5)),
    ]
    for weight, x in cases:
        y_ref, bound = integer_linear(x, weight)
        y_ref = torch.from_numpy(y_ref)
        bound = torch.from_numpy(bound)
        for rows in (1, 2, 3, 4, 5):
            assert_within(k.linear(x[:rows], weight, None, act_q8=True), y_ref[:rows], bound[:rows])
        assert_within(k.gemm_q8(x, weight, None), y_ref, bound)
    assert y_ref[0, 0].item() > 0 and abs(y_ref[0, 1].item()) > 0  # the one-sign rows multiplied something


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_exact_dot_at_the_extremes(qtype, march):
    k = kernel(march)
    weight = extreme_weight(qtype, 9, 3, seed=6)
    ref = reference(weight)
    assert torch.isfinite(ref).all()
    for x in (extreme_x(5, 768, seed=7), torch.randn(5, 768)):
        for rows in (1, 4, 5):
            assert_within(
                k.linear(x[:rows], weight, None, act_q8=False), x[:rows] @ ref.T, fp32_bound(x[:rows], ref)
            )
