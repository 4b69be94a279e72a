"""The fp32 decode GEMV (engine/native/dense_gemv.c) against its twin, torch's F.linear: 1-4 rows, bias or none,
widths with a scalar tail, strided rows; more rows, other dtypes and autograd stay with torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.native.dense_gemv import MAX_ROWS, load_dense_gemv
from engine.native.onednn import Linear

GEMV = load_dense_gemv()
pytestmark = pytest.mark.skipif(GEMV is None, reason="no C compiler: the native GEMV cannot be built here")
U = 2.0**-24  # fp32 unit roundoff


def within_fp32(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    """|y - exact| <= n u sum |x w| (+ |b|): any fp32 summation order of n products stays inside."""
    exact = F.linear(x.double(), w.double(), None if b is None else b.double())
    bound = x.shape[1] * U * (x.double().abs() @ w.double().abs().T) + 1e-30
    if b is not None:
        bound = bound + 2 * U * b.double().abs()
    assert ((y.double() - exact).abs() <= 2 * bound).all()


@pytest.mark.parametrize("rows", list(range(1, MAX_ROWS + 1)))
@pytest.mark.parametrize("shape", [(37, 100), (576, 576), (70_000, 3)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_within_fp32_rounding_of_the_exact_product(rows, shape, with_bias):
    out_features, in_features = shape
    gen = torch.Generator().manual_seed(rows * 7 + out_features)
    w = torch.randn(out_features, in_features, generator=gen)
    x = torch.randn(rows, in_features, generator=gen)
    b = torch.randn(out_features, generator=gen) if with_bias else None
    assert GEMV.applies(x, w)
    within_fp32(GEMV.linear(x, w, b), x, w, b)


def test_strided_rows_and_the_module_path():
    layer = Linear(96, 40, bias=True)
    wide = torch.randn(3, 200)
    x = wide[:, 10:106]  # rows 200 floats apart, unit stride over features
    with torch.inference_mode():
        y = layer(x)
    within_fp32(y, x, layer.weight.detach(), layer.bias.detach())


def test_what_the_gemv_leaves_to_torch():
    w = torch.randn(8, 32)
    assert not GEMV.applies(torch.randn(MAX_ROWS + 1, 32), w)  # a prefill or a batch: torch's GEMM
    assert not GEMV.applies(torch.randn(2, 32, dtype=torch.bfloat16), w.bfloat16())
    assert not GEMV.applies(torch.randn(2, 32, requires_grad=True), w)
    assert not GEMV.applies(torch.randn(32, 2).T, w)  # features not unit stride
    assert not GEMV.applies(torch.randn(2, 4, 32), w)
