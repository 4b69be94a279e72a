"""The int8 dots of Q5_0, Q5_1, IQ4_NL and IQ4_XS (quant/dots_b32_iq4.h) are exact integer arithmetic: on every code
path (this CPU's, AVX2 only, scalar) they equal the activations rounded to int8 times the reference weights up to
fp32 summation order, a far tighter bound than the rounding bound test_kquant_kernels.py allows. Weights at their
extremes (Q5 q of 0 and 31, IQ4 levels -127 and 113, IQ4_XS scales -32 and 31) times activations of one magnitude
whose signs follow a weight row's make every product and pair of products as large as they get: a saturating
16-bit step (maddubs) or a lost bit would show.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.native.quant_format import QuantType, QuantWeight
from tests.engine.test_kquant_kernels import (
    U,
    assert_within,
    fp32_bound,
    int8_inverse_scale,
    kernel,
    random_weight,
    reference,
)

TYPES = [QuantType.Q5_0, QuantType.Q5_1, QuantType.IQ4_NL, QuantType.IQ4_XS]
MARCHES = ["native", "x86-64-v3", "x86-64"]


def extreme_weight(qtype: QuantType, out_features: int, in_features: int, seed: int) -> QuantWeight:
    """Random scales, every 4- or 5-bit value 0 or its maximum (fifth bits following the nibbles' top bits)."""
    weight = random_weight(qtype, out_features, in_features, seed)
    gen = np.random.default_rng(seed + 1)
    raw = weight.blocks.numpy().reshape(out_features, -1, qtype.block_bytes).copy()
    nibbles = {QuantType.Q5_0: 6, QuantType.Q5_1: 8, QuantType.IQ4_NL: 2, QuantType.IQ4_XS: 8}[qtype]
    n = qtype.block_bytes - nibbles
    raw[:, :, nibbles:] = gen.choice(np.array([0x00, 0x0F, 0xF0, 0xFF], np.uint8), (*raw.shape[:2], n))
    if qtype in (QuantType.Q5_0, QuantType.Q5_1):  # fifth bit j: weight j's nibble is 15
        qs = raw[:, :, nibbles:]
        bits = np.concatenate([qs & 1, qs >> 7], axis=-1).astype(np.uint32)  # weights 0..15, 16..31
        qh = (bits << np.arange(32, dtype=np.uint32)).sum(-1, dtype=np.uint32)
        raw[:, :, nibbles - 4 : nibbles] = qh[..., None].view(np.uint8).reshape(*qh.shape, 4)
    if qtype is QuantType.IQ4_XS:  # 6-bit scales 0 or 63: -32 or 31
        raw[:, :, 2:8] = gen.choice(np.array([0x00, 0xFF], np.uint8), (*raw.shape[:2], 6))
    return QuantWeight(qtype, torch.from_numpy(raw.reshape(out_features, -1)), in_features)


def rounded(x: torch.Tensor, block: int) -> torch.Tensor:
    """x as the kernels round it for their int8 dots (per block: d = amax / 127, q = round-half-even(x * 127 / amax)),
    as float64 d * q."""
    xb = x.reshape(x.shape[0], -1, block)
    amax = xb.abs().amax(-1, keepdim=True)
    inv = int8_inverse_scale(amax)
    q = torch.round(xb * inv)
    assert q.abs().max() <= 127
    return (q.double() * (amax / 127.0).double()).reshape(x.shape)


def activations(ref: torch.Tensor, seed: int) -> torch.Tensor:
    """11 rows (the GEMV's passes of 4, 4 and 3; the GEMM's 2 a tile and 8 a minimum term): one magnitude with
    weight row 0's signs, its negation, then random rows."""
    gen = torch.Generator().manual_seed(seed)
    signs = torch.where(ref[0] < 0, -1.0, 1.0)
    return torch.cat([3.0 * signs[None], -0.5 * signs[None], torch.randn(9, ref.shape[1], generator=gen)])


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("extreme", [True, False], ids=["extreme", "random"])
def test_int8_dots_are_exact_integer_math(qtype, march, extreme):
    k = kernel(march)
    in_features = 3 * 256  # 24 blocks of 32, 3 super-blocks
    make = extreme_weight if extreme else random_weight
    weight = make(qtype, 19, in_features, seed=5)
    ref = reference(weight)
    x = activations(ref, seed=6)
    bias = torch.randn(19)
    xq = rounded(x, qtype.block_weights)
    y_ref = xq @ ref.double().T + bias.double()
    bound = fp32_bound(xq, ref) + 2 * U * bias.abs().double()
    assert_within(k.linear(x, weight, bias, act_q8=True), y_ref, bound)
    assert_within(k.gemm_q8(x, weight, bias), y_ref, bound)
    for r in range(x.shape[0]):  # the same alone as in a pass (pairs and single rows)
        assert_within(k.linear(x[r : r + 1], weight, bias, act_q8=True), y_ref[r : r + 1], bound[r : r + 1])
    if extreme:  # the largest sums really are large: row 0's is |x| . |w| for weight row 0
        assert y_ref[0, 0] - bias[0] == pytest.approx((xq[0].abs() * ref[0].abs().double()).sum().item())


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_exact_dots_are_the_reference_weights(qtype, march):
    """The fp32 dots multiply the reference's weights: within the fp32 bound of x @ W^T, extremes included."""
    k = kernel(march)
    weight = extreme_weight(qtype, 13, 2 * 256, seed=8)
    ref = reference(weight)
    x = activations(ref, seed=9)
    y_ref = x.double() @ ref.double().T
    assert_within(k.linear(x, weight, None, act_q8=False), y_ref, fp32_bound(x, ref))
