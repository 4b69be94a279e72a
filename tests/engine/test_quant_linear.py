"""Quantized linears: the torch twin and the compiled kernel against fp32 matmuls of gguf's own dequantization.

Tolerances, with n = in_features and u = 2^-24 (fp32 unit roundoff):
- exact paths: |y - y_ref| <= 2 (n + 2) u (|x| @ |W|^T), the textbook bound for two fp32 dot products of length n
  summed in different orders, plus one rounding per dequantized weight (an FMA where numpy multiplies then adds);
- q8 activations: each x in a 32-block becomes dx * round(x / dx) with dx = amax / 127, off by at most amax / 254,
  so |y - y_ref| <= (amax / 254) @ |W|^T on top of the fp32 bound; and against the same rounding of x done in
  torch, the fp32 bound alone.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from engine.native import quant_linear as quant_linear_module
from engine.native.quant_format import (
    FILE_TYPES,
    QuantType,
    QuantWeight,
    dequantize_torch,
    quant_linear_torch,
)
from engine.native.quant_linear import GEMV_MAX_ROWS, QuantLinear, load_kernel
from tests.engine.test_kquant_kernels import int8_inverse_scale

KERNEL = load_kernel()
needs_kernel = pytest.mark.skipif(
    KERNEL is None, reason="no C compiler: the native kernel cannot be built here"
)
SHAPES = [
    (37, 96),
    (101, 160),
    (64, 608),
    (5, 32),
    (9, 192),
    (7, 64),
    (38, 64),
    (11, 256),
    (9, 1056),
]  # (out, in): in a multiple of 32; the int8 kernels group a row's Q4 blocks in quads, then pairs: 0-4 quads, no
# pair or 1-2 pairs, and an odd leftover (a zero partner); on AVX-512 VNNI the GEMV takes 16 blocks at a time first
# (608: one group and three blocks; 1056: two groups and one), then quads, the last padded; outputs not a multiple
# of 4 (the int8 GEMV's tile for one row: 1, 2 and 3 left over) or of 2
ROWS = [1, 2, 3, 17, 64]  # 1 and 2 rows: the int8 GEMV multiplies 4 and 2 weight rows at once
U = 2.0**-24
LEGACY_TYPES = [q for q in FILE_TYPES if q.legacy]  # the other formats: test_kquant_kernels.py


def make_weight(
    qtype: QuantType, out_features: int, in_features: int, seed: int
) -> tuple[QuantWeight, torch.Tensor]:
    """Random weight quantized by gguf.quants, and gguf's own fp32 dequantization of it."""
    gen = np.random.default_rng(seed)
    w = (gen.standard_normal((out_features, in_features)) * gen.uniform(0.01, 2.0, (out_features, 1))).astype(
        np.float32
    )
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType(int(qtype)))
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(qtype)))
    return QuantWeight(qtype, torch.from_numpy(raw.copy()), in_features), torch.from_numpy(ref.copy())


def make_x(rows: int, in_features: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, in_features, generator=gen) * torch.rand(rows, 1, generator=gen) * 4


def fp32_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    n = x.shape[1]
    return 2 * (n + 2) * U * (x.double().abs() @ w.double().abs().T)


def block_amax(x: torch.Tensor) -> torch.Tensor:
    """Each element's 32-block absolute maximum, [rows, in]."""
    amax = x.reshape(x.shape[0], -1, 32).abs().amax(-1, keepdim=True)
    return amax.expand(-1, -1, 32).reshape(x.shape)


def q8_round(x: torch.Tensor) -> torch.Tensor:
    """x as the kernel sees it with act_q8: dx * round(x / dx) per 32-block, dx = amax / 127."""
    amax = block_amax(x)
    inv = int8_inverse_scale(amax)
    return torch.round(x * inv) * (amax / 127.0)


def assert_within(y: torch.Tensor, y_ref: torch.Tensor, bound: torch.Tensor) -> None:
    excess = (y.double() - y_ref.double()).abs() - bound
    assert excess.max().item() <= 0, (
        f"off by {excess.max().item():.3g} beyond the bound at {excess.argmax().item()}"
    )


@pytest.mark.parametrize("qtype", LEGACY_TYPES)
def test_torch_dequantize_is_gguf_bit_for_bit(qtype):
    weight, ref = make_weight(qtype, 37, 160, seed=1)
    assert torch.equal(dequantize_torch(weight), ref)


@needs_kernel
@pytest.mark.parametrize("qtype", LEGACY_TYPES)
def test_kernel_dequantize_is_gguf_up_to_one_rounding(qtype):
    weight, ref = make_weight(qtype, 101, 608, seed=2)
    out = KERNEL.dequantize(weight)
    torch.testing.assert_close(out, ref, rtol=0, atol=4 * U * ref.abs().max().item())
    torch.testing.assert_close(KERNEL.dequantize(weight, 7, 40), out[7:40], rtol=0, atol=0)


@pytest.mark.parametrize("qtype", LEGACY_TYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_torch_twin_equals_fp32_matmul(qtype, rows):
    for i, (out_features, in_features) in enumerate(SHAPES):
        weight, ref = make_weight(qtype, out_features, in_features, seed=10 + i)
        x, bias = make_x(rows, in_features, seed=i), torch.randn(out_features)
        y = quant_linear_torch(x, weight, bias)
        assert_within(y, x @ ref.T + bias, fp32_bound(x, ref) + 2 * U * bias.abs())


@needs_kernel
@pytest.mark.parametrize("qtype", LEGACY_TYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_kernel_exact_paths_equal_fp32_matmul(qtype, rows):
    for i, (out_features, in_features) in enumerate(SHAPES):
        weight, ref = make_weight(qtype, out_features, in_features, seed=20 + i)
        x, bias = make_x(rows, in_features, seed=30 + i), torch.randn(out_features)
        bound = fp32_bound(x, ref) + 2 * U * bias.abs()
        y_ref = x @ ref.T + bias
        assert_within(KERNEL.linear(x, weight, bias, act_q8=False), y_ref, bound)
        assert_within(KERNEL.gemm(x, weight, bias), y_ref, bound)
        assert_within(
            KERNEL.linear(x, weight, bias, act_q8=False), quant_linear_torch(x, weight, bias), bound
        )


@needs_kernel
@pytest.mark.parametrize("qtype", LEGACY_TYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_kernel_q8_activations_within_format_bound(qtype, rows):
    for i, (out_features, in_features) in enumerate(SHAPES):
        weight, ref = make_weight(qtype, out_features, in_features, seed=40 + i)
        x = make_x(rows, in_features, seed=50 + i)
        y = KERNEL.linear(x, weight, None, act_q8=True)
        # the integer dot products are exact: only fp32 rounding separates y from the torch-rounded activations
        x_q8 = q8_round(x)
        assert_within(y, x_q8 @ ref.T, fp32_bound(x_q8, ref) + fp32_bound(x, ref))
        q8_error = (block_amax(x).double() / 254 * (1 + 1e-6)) @ ref.double().abs().T  # [rows, out]
        assert_within(y, x @ ref.T, q8_error + 2 * fp32_bound(x, ref))
        assert (y - x @ ref.T).abs().max() > 0, "act_q8 should round the activations"


@needs_kernel
@pytest.mark.parametrize("qtype", LEGACY_TYPES)
def test_kernel_q8_activations_do_not_depend_on_the_thread_count(qtype):
    """A weight big enough to be split between threads (the shapes above run on one): every output is one thread's
    whole dot product, so two threads give the very bits of one, at each of the GEMV's tilings (1, 2, 3-4 rows)."""
    weight, ref = make_weight(qtype, 301, 608, seed=7)  # 183,008 weights: past PARALLEL_MIN_WEIGHTS
    threads = torch.get_num_threads()
    try:
        for rows in (1, 2, 3, GEMV_MAX_ROWS):
            x = make_x(rows, 608, seed=rows)
            torch.set_num_threads(1)
            alone = KERNEL.linear(x, weight, None, act_q8=True)
            torch.set_num_threads(2)
            shared = KERNEL.linear(x, weight, None, act_q8=True)
            assert torch.equal(alone, shared), f"{rows} rows"
            x_q8 = q8_round(x)
            assert_within(shared, x_q8 @ ref.T, fp32_bound(x_q8, ref) + fp32_bound(x, ref))
    finally:
        torch.set_num_threads(threads)


@needs_kernel
@pytest.mark.parametrize("qtype", LEGACY_TYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_int8_gemm_within_format_bound_and_equal_to_the_q8_rows_kernel(qtype, rows):
    """quant_gemm_q8 (batch_gemm int8): the same int8 rounding of the activations as act_q8, the same exact integer
    dot products, only a different fp32 summation order; shapes whose rows and outputs are not whole register tiles
    (4 outputs x 2 rows) cover the edge tiles."""
    for i, (out_features, in_features) in enumerate(SHAPES):
        weight, ref = make_weight(qtype, out_features, in_features, seed=80 + i)
        x, bias = make_x(rows, in_features, seed=90 + i), torch.randn(out_features)
        y = KERNEL.gemm_q8(x, weight, bias)
        x_q8 = q8_round(x)
        bound = fp32_bound(x_q8, ref) + fp32_bound(x, ref) + 2 * U * bias.abs()
        assert_within(y, x_q8 @ ref.T + bias, bound)
        assert_within(y, KERNEL.linear(x, weight, bias, act_q8=True), 2 * bound)
        q8_error = (block_amax(x).double() / 254 * (1 + 1e-6)) @ ref.double().abs().T
        assert_within(y, x @ ref.T + bias, q8_error + 2 * bound)


@needs_kernel
@pytest.mark.parametrize("qtype", LEGACY_TYPES)
def test_kernel_extreme_values_do_not_saturate(qtype):
    """Largest quants against +-amax activations: the 16-bit pair sums of maddubs must not saturate (GEMV and GEMM;
    160 inputs: one quad of blocks and one block left over)."""
    weight, _ = make_weight(qtype, 4, 160, seed=3)
    blocks = weight.blocks.view(4, 5, qtype.block_bytes).clone()
    extreme = 0x80 if qtype is QuantType.Q8_0 else 0xFF  # q = -128, or both nibbles 15
    blocks[..., qtype.scale_bytes :] = extreme
    blocks[1, :, qtype.scale_bytes :] = 0x81 if qtype is QuantType.Q8_0 else 0x00  # q = -127, or 0
    weight = QuantWeight(qtype, blocks.reshape(4, -1).contiguous(), 160)
    ref = dequantize_torch(weight)
    x = torch.tensor([[3.0, -3.0] * 80, [-1.5] * 160, [2.0] * 160])
    for act_q8 in (False, True):
        y = KERNEL.linear(x, weight, None, act_q8=act_q8)
        assert_within(y, x @ ref.T, 2 * fp32_bound(x, ref))
    # the GEMM sums four blocks' maddubs pairs in 16 bits for Q4 (4 * 2 * 15 * 127)
    assert_within(KERNEL.gemm_q8(x, weight, None), x @ ref.T, 2 * fp32_bound(x, ref))
    assert_within(KERNEL.gemm_q8(x, weight, None), x @ ref.T, 2 * fp32_bound(x, ref))


@needs_kernel
@pytest.mark.parametrize("rows", [1, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1, 64])
def test_int8_batch_gemm_takes_over_above_the_gemv_bound_only(rows):
    """batch_gemm int8: up to GEMV_MAX_ROWS rows the exact kernel (decode stays fp32), above it quant_gemm_q8."""
    weight, _ = make_weight(QuantType.Q4_1, 101, 160, seed=9)
    bias = torch.randn(101)
    layer = QuantLinear(weight, bias, batch_gemm="int8")
    x = make_x(rows, 160, seed=10)
    expected = (
        KERNEL.linear(x, weight, bias, act_q8=False)
        if rows <= GEMV_MAX_ROWS
        else KERNEL.gemm_q8(x, weight, bias)
    )
    assert layer.gemv_max_rows == GEMV_MAX_ROWS
    assert torch.equal(layer(x), expected)
    with pytest.raises(ValueError, match="batch_gemm must be one of"):
        QuantLinear(weight, bias, batch_gemm="int4")


@pytest.mark.parametrize("use_kernel", [True, False])
@pytest.mark.parametrize(
    "rows", [1, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1, 64]
)  # both sides of the kernel/GEMM split
def test_quant_linear_module(monkeypatch, use_kernel, rows):
    if use_kernel and KERNEL is None:
        pytest.skip("no C compiler: the native kernel cannot be built here")
    monkeypatch.setattr(quant_linear_module, "TILE_WEIGHTS", 32 * 160)  # several tiles on the GEMM path
    weight, ref = make_weight(QuantType.Q4_1, 101, 160, seed=4)
    bias = torch.randn(101)
    layer = QuantLinear(weight, bias)
    if not use_kernel:
        layer.kernel = None
    x = make_x(rows, 160, seed=5).view(1, rows, 160)  # leading dims pass through
    y = layer(x)
    assert y.shape == (1, rows, 101) and y.dtype == torch.float32
    assert_within(y[0], x[0] @ ref.T + bias, fp32_bound(x[0], ref) + 2 * U * bias.abs())
    y_bf16 = layer(x.bfloat16())
    assert y_bf16.dtype == torch.bfloat16
    torch.testing.assert_close(y_bf16.float(), x.bfloat16().float() @ ref.T + bias, rtol=2**-7, atol=1e-2)


@needs_kernel
@pytest.mark.parametrize("qtype", LEGACY_TYPES)
@pytest.mark.parametrize("act_q8", [False, True])
@pytest.mark.parametrize("rows", [1, 3])
def test_module_decode_path_equals_the_checked_kernel_call(qtype, act_q8, rows):
    """2-D fp32 rows take QuantLinear's lean decode path; it gives `linear`'s result bit for bit, bias included."""
    weight, _ = make_weight(qtype, 101, 160, seed=6)
    bias = torch.randn(101)
    layer = QuantLinear(weight, bias, act_q8=act_q8)
    x = make_x(rows, 160, seed=7)
    assert torch.equal(layer(x), KERNEL.linear(x, weight, bias, act_q8=act_q8))
    strided = make_x(rows, 320, seed=8)[:, ::2]  # not unit stride: the general path copies it first
    assert torch.equal(layer(strided), KERNEL.linear(strided.contiguous(), weight, bias, act_q8=act_q8))


@pytest.mark.parametrize("qtype", LEGACY_TYPES)
def test_select_rows_and_cat_move_whole_blocks(qtype):
    a, ref_a = make_weight(qtype, 12, 96, seed=6)
    b, ref_b = make_weight(qtype, 5, 96, seed=7)
    order = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    assert torch.equal(dequantize_torch(a.select_rows(order)), ref_a[order])
    assert torch.equal(dequantize_torch(QuantWeight.cat([a, b])), torch.cat([ref_a, ref_b]))
    other = QuantType.Q8_0 if qtype is not QuantType.Q8_0 else QuantType.Q4_0
    c, _ = make_weight(other, 3, 96, seed=8)
    with pytest.raises(ValueError, match="formats differ"):
        QuantWeight.cat([a, c])


def test_weight_width_must_be_whole_blocks():
    with pytest.raises(ValueError, match="multiple of 32"):
        QuantWeight(QuantType.Q8_0, torch.zeros(2, 34, dtype=torch.uint8), 40)


@needs_kernel
@pytest.mark.parametrize("qtype", LEGACY_TYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_bf16_batch_gemm_is_within_bf16_rounding_and_few_rows_stay_exact(qtype, rows):
    """batch_gemm bf16: more than GEMV_MAX_ROWS rows multiply a bf16 copy of the weight by bf16 activations (fp32
    accumulation): each product's two roundings bound the error by 2 * 2^-8 of |x| @ |W|^T (plus fp32 summation);
    up to GEMV_MAX_ROWS rows take the exact kernel as before."""
    for i, (out_features, in_features) in enumerate(SHAPES):
        weight, ref = make_weight(qtype, out_features, in_features, seed=60 + i)
        x, bias = make_x(rows, in_features, seed=70 + i), torch.randn(out_features)
        module = QuantLinear(weight, bias, batch_gemm="bf16")
        y = module(x)
        exact_bound = fp32_bound(x, ref) + 2 * U * bias.abs()
        assert module.gemv_max_rows == GEMV_MAX_ROWS
        if rows <= module.gemv_max_rows:
            assert module._weight_bf16 is None  # never made: small decode steps keep the blocks only
            assert_within(y, x @ ref.T + bias, exact_bound)
            continue
        bf16_bound = 2 * 2.0**-8 * (x.double().abs() @ ref.double().abs().T) + exact_bound
        assert_within(y, x @ ref.T + bias, bf16_bound)
        assert module._weight_bf16 is not None and module._weight_bf16.dtype == torch.bfloat16
        w16 = KERNEL.dequantize(weight).to(torch.bfloat16)
        assert torch.equal(y, torch.nn.functional.linear(x.to(torch.bfloat16), w16).float() + bias)
