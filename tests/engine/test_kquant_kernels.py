"""The formats beyond Q4_0/Q4_1/Q8_0 (Q5_0, Q5_1, IQ4_NL, the K-quants Q3_K..Q6_K, IQ4_XS) in the compiled kernels,
against gguf.quants.dequantize and an fp32 matmul, for this CPU's build and the other machine kinds' code paths
(x86-64-v3: AVX2 without AVX-512; x86-64: no SIMD).

gguf-py cannot quantize the K-quants, and speed and correctness do not depend on how the blocks were chosen, so the
blocks are random bytes with finite fp16 scales. Bounds, with n = in_features and u = 2^-24: exact paths within the
fp32 bound of two dot products summed in different orders (2 (n + 2) u |x| @ |W|^T); int8 activations (each block of
32, or 256 for the super-block formats, rounded to d * round(x / d), d = amax / 127) additionally within
(amax / 254) @ |W|^T.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from engine.native.quant_format import (
    FILE_TYPES,
    QuantType,
    QuantWeight,
    dequantize_torch,
    quant_linear_torch,
)
from engine.native.quant_linear import GEMV_MAX_ROWS, load_kernel
from engine.worker.device import cpu_has_avx512_vnni

NEW_TYPES = [q for q in FILE_TYPES if not q.legacy]
MARCHES = ["native", "x86-64-v3", "x86-64"]  # this CPU; AVX2 only; scalar
ROWS = [
    1,
    2,
    3,
    4,
    5,
    9,
    17,
]  # the dots take up to 4 rows a pass; 5 and 9 leave one over; 17 is past the GEMV bound
U = 2.0**-24
QK_K = 256  # weights per super-block


def shapes(qtype: QuantType) -> list[tuple[int, int]]:
    """(out, in) with odd output counts and 1..3 blocks (and more) a row."""
    bw = qtype.block_weights
    return [(5, bw), (37, 3 * bw), (11, 2 * bw), (64, 576 if bw == 32 else 768)]


def random_weight(qtype: QuantType, out_features: int, in_features: int, seed: int) -> QuantWeight:
    """Random blocks whose fp16 fields are finite scales of either sign (minimums of either sign too)."""
    gen = np.random.default_rng(seed)
    nb = in_features // qtype.block_weights
    raw = gen.integers(0, 256, (out_features, nb, qtype.block_bytes), dtype=np.uint8)
    for offset in qtype.fp16_offsets:
        scale = (
            gen.uniform(0.002, 0.05, (out_features, nb)) * gen.choice([-1, 1], (out_features, nb))
        ).astype(np.float16)
        raw[:, :, offset : offset + 2] = scale.view(np.uint8).reshape(out_features, nb, 2)
    return QuantWeight(qtype, torch.from_numpy(raw.reshape(out_features, -1)), in_features)


def reference(weight: QuantWeight) -> torch.Tensor:
    values = gguf.quants.dequantize(weight.blocks.numpy(), gguf.GGMLQuantizationType(int(weight.qtype)))
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(weight.shape)


def int8_inverse_scale(amax: torch.Tensor) -> torch.Tensor:
    """127 / amax as the kernels' quantizer computes it: one correctly rounded fp32 division (0 where amax is 0).
    Not torch's `127 / amax`: a scalar over a tensor is a reciprocal times 127, 1 ulp off for some amax, and an
    activation that lands on a tie (45.5) under one and off it (45.499996) under the other rounds apart."""
    return torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))


def make_x(rows: int, in_features: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, in_features, generator=gen) * torch.rand(rows, 1, generator=gen) * 4


def fp32_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return 2 * (x.shape[1] + 2) * U * (x.double().abs() @ w.double().abs().T)


def q8_bound(x: torch.Tensor, w: torch.Tensor, block: int) -> torch.Tensor:
    amax = x.reshape(x.shape[0], -1, block).abs().amax(-1, keepdim=True).expand(-1, -1, block)
    return (amax.reshape(x.shape).double() / 254 * (1 + 1e-6)) @ w.double().abs().T


def assert_within(y: torch.Tensor, y_ref: torch.Tensor, bound: torch.Tensor) -> None:
    excess = (y.double() - y_ref.double()).abs() - bound
    assert excess.max().item() <= 0, (
        f"off by {excess.max().item():.3g} beyond the bound at {excess.argmax().item()}"
    )


def kernel(march: str):
    k = load_kernel(march)
    if k is None:
        pytest.skip(f"the native kernel cannot be built here for {march}")
    return k


@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda q: q.name)
def test_torch_twin_is_gguf(qtype):
    weight = random_weight(qtype, 7, 2 * qtype.block_weights, seed=1)
    ref = reference(weight)
    assert torch.isfinite(ref).all()
    assert torch.equal(dequantize_torch(weight), ref)
    x = make_x(3, weight.in_features, seed=2)
    assert_within(quant_linear_torch(x, weight), x @ ref.T, fp32_bound(x, ref))


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda q: q.name)
def test_kernel_dequantize_is_gguf(qtype, march):
    k = kernel(march)
    weight = random_weight(qtype, 13, 3 * qtype.block_weights, seed=3)
    ref = reference(weight)
    out = k.dequantize(weight)
    torch.testing.assert_close(out, ref, rtol=0, atol=4 * U * ref.abs().max().item())
    assert torch.equal(k.dequantize(weight, 2, 9), out[2:9])


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda q: q.name)
def test_kernel_products_equal_fp32_matmul(qtype, march):
    """The exact GEMV within the fp32 bound; int8 activations (GEMV and GEMM) within the rounding bound; the GEMV's
    few-row passes give each row what it gives that row alone."""
    k = kernel(march)
    act_block = qtype.block_weights
    for i, (out_features, in_features) in enumerate(shapes(qtype)):
        weight = random_weight(qtype, out_features, in_features, seed=10 + i)
        ref = reference(weight)
        bias = torch.randn(out_features)
        for rows in ROWS:
            x = make_x(rows, in_features, seed=100 * i + rows)
            y_ref = x @ ref.T + bias
            exact = fp32_bound(x, ref) + 2 * U * bias.abs()
            assert_within(k.linear(x, weight, bias, act_q8=False), y_ref, exact)
            rounded = q8_bound(x, ref, act_block) + 2 * exact
            y8 = k.linear(x, weight, bias, act_q8=True)
            assert_within(y8, y_ref, rounded)
            assert_within(k.gemm_q8(x, weight, bias), y_ref, rounded)
            alone = k.linear(x[rows - 1 :], weight, bias, act_q8=True)
            assert_within(y8[rows - 1 :], alone, 2 * exact)


@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda q: q.name)
def test_kernel_results_do_not_depend_on_the_thread_count(qtype):
    k = kernel("native")
    weight = random_weight(
        qtype, 301, 4 * qtype.block_weights if qtype.block_weights == 256 else 1024, seed=7
    )
    threads = torch.get_num_threads()
    try:
        for rows in (1, 5):
            x = make_x(rows, weight.in_features, seed=rows)
            results = []
            for n in (1, 2):
                torch.set_num_threads(n)
                results.append([k.linear(x, weight, None, act_q8=a) for a in (False, True)])
            assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))
    finally:
        torch.set_num_threads(threads)


K45_TYPES = [QuantType.Q4_K, QuantType.Q5_K]


def magnitudes(weight: QuantWeight) -> torch.Tensor:
    """|d sc q| + |dmin m| for each Q4_K / Q5_K weight: the reference of the blocks with d > 0 and dmin < 0."""
    raw = weight.blocks.numpy().reshape(weight.out_features, -1, weight.qtype.block_bytes).copy()
    raw[:, :, 1] &= 0x7F  # d's sign bit (fp16 little-endian: bit 15 is in byte 1)
    raw[:, :, 3] |= 0x80  # dmin's
    return reference(
        QuantWeight(weight.qtype, torch.from_numpy(raw.reshape(weight.out_features, -1)), weight.in_features)
    )


@pytest.mark.parametrize("qtype", K45_TYPES, ids=lambda q: q.name)
def test_int8_dots_agree_across_instruction_sets(qtype):
    """The AVX-512, AVX2 and scalar int8 dots compute the same integers per block and only then go to fp32 (a few
    roundings a block, then a sum over the nb blocks): their results differ by fp32 rounding of that length over the
    scale and minimum terms taken apart (|dx qx| <= |x| + amax / 254), far inside the int8 rounding."""
    weight = random_weight(qtype, 37, 3 * QK_K, seed=21)
    mag = magnitudes(weight)
    for rows in (
        1,
        3,
        5,
        7,
        14,
    ):  # AVX-512 passes of up to 8 rows (K45_Q8_ROWS): 7 and 14 = 8 + 6 take each width
        x = make_x(rows, weight.in_features, seed=rows)
        amax = x.reshape(rows, -1, QK_K).abs().amax(-1, keepdim=True).expand(-1, -1, QK_K).reshape(x.shape)
        bound = 2 * (weight.in_features // QK_K + 10) * U * ((x.abs() + amax / 127).double() @ mag.double().T)
        results = [kernel(march).linear(x, weight, None, act_q8=True) for march in MARCHES]
        for y in results[1:]:
            assert_within(y, results[0], bound)


def extreme_weight(qtype: QuantType, out_features: int, in_features: int) -> QuantWeight:
    """Every quant at its largest (15, Q5_K 31), every scale and minimum 63, d = dmin = 1."""
    nb = in_features // QK_K
    raw = np.full((out_features, nb, qtype.block_bytes), 0xFF, dtype=np.uint8)
    raw[:, :, 0:4] = np.array([1.0, 1.0], dtype=np.float16).view(np.uint8)
    return QuantWeight(qtype, torch.from_numpy(raw.reshape(out_features, -1)), in_features)


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("qtype", K45_TYPES, ids=lambda q: q.name)
def test_int8_dots_do_not_saturate(qtype, march):
    """Largest quants and scales against activations rounded to +-127: maddubs's 16-bit pair sums (2 * 31 * 127) and
    the 32-bit block sums stay exact, so the int8 result is the fp32 matmul's up to fp32 rounding (the activations
    are +-1 and +-0.5, d = 1 / 127 or 0.5 / 127, whose rounding to int8 is exact)."""
    k = kernel(march)
    weight = extreme_weight(qtype, 9, 4 * QK_K)
    ref = reference(weight)
    assert ref.max().item() == (31 if qtype == QuantType.Q5_K else 15) * 63 - 63
    signs = torch.tensor([1.0, -1.0]).repeat(2 * QK_K)
    x = torch.stack([torch.ones(4 * QK_K), -torch.ones(4 * QK_K), signs, 0.5 * signs.roll(1)])
    y_ref = x.double() @ ref.double().T
    for y in (k.linear(x, weight, None, act_q8=True), k.gemm_q8(x, weight, None)):
        assert_within(y, y_ref, 4 * fp32_bound(x, ref) + 1e-6 * y_ref.abs())


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("qtype", FILE_TYPES, ids=lambda q: q.name)
def test_int8_rows_do_not_depend_on_the_row_count(qtype, march):
    """With int8 activations every GEMV row is the same bits whether the call has 1 row or up to the GEMV bound (and
    the batch GEMM of the K-quants, the same dots, too): speculative decoding runs a sequence's proposed tokens as
    extra rows of a step and needs each to be what one decode row would have been (issue #40)."""
    k = kernel(march)
    # an odd number of 32-blocks in pairs; the legacy formats also 18 and 35 (AVX-512's GEMV takes a row's Q4 blocks
    # 16 at a time, then in quads, the last padded: SmolLM2's 576 inputs are one group and half a quad)
    widths = [2 * 256] if qtype.block_weights == 256 else [10 * 32] if not qtype.legacy else [320, 576, 1120]
    for in_features in widths:
        weight = (
            random_weight(qtype, 37, in_features, seed=11)
            if not qtype.legacy
            else legacy_weight(qtype, 37, in_features)
        )
        x = make_x(GEMV_MAX_ROWS, in_features, seed=12)
        alone = torch.cat([k.linear(x[i : i + 1], weight, None, act_q8=True) for i in range(GEMV_MAX_ROWS)])
        for rows in range(2, GEMV_MAX_ROWS + 1):
            got = k.linear(x[:rows], weight, None, act_q8=True)
            assert torch.equal(got, alone[:rows]), f"{rows} rows of {in_features}"
        if not qtype.legacy and qtype not in B32_GEMM_TYPES:
            assert torch.equal(k.gemm_q8(x, weight, None), alone)


B32_GEMM_TYPES = {
    QuantType.Q5_0,
    QuantType.Q5_1,
    QuantType.IQ4_NL,
}  # a tiled GEMM of their own: summed otherwise


def legacy_weight(qtype: QuantType, out_features: int, in_features: int) -> QuantWeight:
    """Q4_0 / Q4_1 / Q8_0 blocks quantized by gguf-py from random values."""
    gen = np.random.default_rng(13)
    w = gen.standard_normal((out_features, in_features)).astype(np.float32)
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType(int(qtype)))
    return QuantWeight(qtype, torch.from_numpy(raw.copy()), in_features)


@pytest.mark.skipif(not cpu_has_avx512_vnni(), reason="the AVX-512 VNNI GEMV runs only on a CPU that has it")
@pytest.mark.parametrize("qtype", [QuantType.Q4_0, QuantType.Q4_1, QuantType.Q8_0], ids=lambda q: q.name)
def test_avx512_gemv_without_vbmi_is_the_same_bits(qtype):
    """The legacy formats' AVX-512 GEMV gathers a group's nibble bytes and scales with vpermt2b where the CPU has
    AVX512-VBMI (Zen 4, Ice Lake and later) and with 128-bit loads and inserts where it does not (Cascade Lake): the
    same products in the same order, so a Cascade Lake build gives this CPU's build's very bits."""
    native, cascade = kernel("native"), kernel("cascadelake")
    for in_features in (576, 1120, 2048):
        weight = legacy_weight(qtype, 37, in_features)
        for rows in (1, 2, 5, GEMV_MAX_ROWS):
            x = make_x(rows, in_features, seed=rows)
            got = cascade.linear(x, weight, None, act_q8=True)
            assert torch.equal(got, native.linear(x, weight, None, act_q8=True)), (
                f"{rows} rows of {in_features}"
            )
