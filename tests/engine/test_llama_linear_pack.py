"""Prepacked bf16 linears (oneDNN layout) give F.linear's results; fp32 and non-CPU weights stay unpacked."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.attention_torch import TorchAttentionBackend
from engine.models.llama import Linear
from tests.engine.factories import make_attention_metadata, make_hf_model, make_kv_caches, make_model_from_hf

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@pytest.mark.parametrize("num_rows", [1, 7, 64, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_f_linear(num_rows, bias):
    torch.manual_seed(num_rows)
    layer = Linear(96, 160, bias=bias).to(torch.bfloat16).requires_grad_(False)
    x = torch.randn(num_rows, 96).to(torch.bfloat16)
    expected = F.linear(x, layer.weight, layer.bias)
    assert layer.pack() and layer.packed is not None
    out = layer(x)
    assert out.shape == (num_rows, 160) and out.dtype == torch.bfloat16
    # same products, maybe another summation order: within one bf16 rounding of |values| up to ~40
    torch.testing.assert_close(out.float(), expected.float(), atol=0.0, rtol=2**-7)


def test_fp32_weights_are_not_packed():
    layer = Linear(32, 48)
    assert not layer.pack() and layer.packed is None
    x = torch.randn(5, 32)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


def test_model_packs_every_linear_and_keeps_its_logits():
    hf = make_hf_model("qwen2", seed=3)  # QKV bias: packed linears carry their bias
    model = make_model_from_hf(hf, torch.bfloat16)
    args = model.args
    seq_lens = [9, 4]
    tables = [[0], [1]]
    meta = make_attention_metadata(seq_lens, seq_lens, tables, 16)
    ids = torch.randint(0, args.vocab_size, (sum(seq_lens),), generator=torch.Generator().manual_seed(0))
    pos = torch.tensor([*range(9), *range(4)])

    def logits():
        caches = make_kv_caches(args, num_blocks=2, block_size=16, dtype=torch.bfloat16)
        with torch.inference_mode():
            hidden = model(ids, pos, caches, meta, TorchAttentionBackend(16))
            return model.compute_logits(hidden)

    before = logits()
    assert model.pack_linear_weights() == 4 * args.num_layers + 1  # qkv, o, gate_up, down per layer; lm_head
    after = logits()
    torch.testing.assert_close(after, before, atol=2e-2, rtol=2e-2)
    assert make_model_from_hf(hf).pack_linear_weights() == 0  # fp32
