"""Our Llama-family model over a paged cache gives HF's full-sequence logits: prefill, chunked prefill, decode."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine.attention.torch_backend import TorchAttentionBackend
from engine.models.llama import ModelArgs, rope_inv_freq
from tests.engine.factories import (
    HF_KINDS,
    TINY,
    make_attention_metadata,
    make_block_tables,
    make_hf_config,
    make_hf_model,
    make_kv_caches,
    make_model_from_hf,
)

BLOCK_SIZE = 4
NUM_BLOCKS = 64
ATOL = 1e-4


def _hf_logits(hf_model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([tokens])).logits[0].float()


def _run_steps(model, caches, backend, tokens, tables, steps):
    """Run steps of (seq index, num_new_tokens) lists; yield (seq index, first position, logits rows)."""
    done = [0] * len(tokens)
    for step in steps:
        seqs = [i for i, _ in step]
        query_lens = [n for _, n in step]
        seq_lens = [done[i] + n for i, n in step]
        meta = make_attention_metadata(query_lens, seq_lens, [tables[i] for i in seqs], BLOCK_SIZE)
        ids = torch.tensor([t for i, n in step for t in tokens[i][done[i] : done[i] + n]])
        positions = torch.tensor([p for i, n in step for p in range(done[i], done[i] + n)])
        backend.prepare(meta)
        with torch.no_grad():
            logits = model.compute_logits(model(ids, positions, caches, meta, backend))
        row = 0
        for i, n in step:
            yield i, done[i], logits[row : row + n]
            row += n
            done[i] += n


@pytest.mark.parametrize("kind", HF_KINDS)
def test_paged_steps_match_hf_full_sequence(kind):
    hf_model = make_hf_model(kind, seed=1)
    model = make_model_from_hf(hf_model)
    gen = torch.Generator().manual_seed(2)
    lengths = [31, 43, 20]
    tokens = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in lengths]
    ref = [_hf_logits(hf_model, t) for t in tokens]
    assert float(ref[0].std()) > 0.5, "random weights should give well-spread logits"
    tables = make_block_tables(lengths, BLOCK_SIZE, NUM_BLOCKS, seed=3)
    caches = make_kv_caches(model.args, NUM_BLOCKS, BLOCK_SIZE)
    steps = [
        [(0, 13), (1, 21)],  # ragged prefill of two sequences
        [(0, 15), (1, 18)],  # chunked continuation: the first chunk's K/V is read from the cache
        [(0, 1), (1, 1), (2, 17)],  # decodes mixed with a third sequence's prefill
        [(0, 1), (1, 1), (2, 1)],  # three decode-only steps
        [(0, 1), (1, 1), (2, 1)],
        [(2, 1), (1, 1)],
    ]
    checked = 0
    for i, start, logits in _run_steps(
        model, caches, TorchAttentionBackend(BLOCK_SIZE), tokens, tables, steps
    ):
        expected = ref[i][start : start + logits.shape[0]]
        torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)
        checked += logits.shape[0]
    assert checked == 31 + 43 + 20


def test_bf16_model_is_as_close_to_fp32_as_hf_bf16():
    hf_model = make_hf_model("llama", seed=4)
    hf_bf16 = make_hf_model("llama", seed=4).to(torch.bfloat16)
    model = make_model_from_hf(hf_model, dtype=torch.bfloat16)
    tokens = [list(range(3, 40)), list(range(50, 60))]
    tables = make_block_tables([37, 10], BLOCK_SIZE, NUM_BLOCKS, seed=5)
    caches = make_kv_caches(model.args, NUM_BLOCKS, BLOCK_SIZE, dtype=torch.bfloat16)
    steps = [[(0, 36), (1, 9)], [(0, 1), (1, 1)]]
    ours, theirs = [], []
    for i, start, logits in _run_steps(model, caches, TorchAttentionBackend(), tokens, tables, steps):
        rows = slice(start, start + logits.shape[0])
        expected = _hf_logits(hf_model, tokens[i])[rows]
        assert logits.dtype == torch.float32
        ours.append((logits - expected).abs().flatten())
        theirs.append((_hf_logits(hf_bf16, tokens[i])[rows] - expected).abs().flatten())
    ours_err, theirs_err = torch.cat(ours), torch.cat(theirs)
    assert 0 < float(ours_err.max()) < 1.5 * float(theirs_err.max())
    assert float(ours_err.mean()) < 1.5 * float(theirs_err.mean())


def test_llama3_rope_scaling_changes_low_frequencies_only():
    plain = ModelArgs.from_hf_config(make_hf_config("llama"))
    scaled = ModelArgs.from_hf_config(make_hf_config("llama3"))
    assert scaled.rope_type == "llama3"
    base, llama3 = rope_inv_freq(plain), rope_inv_freq(scaled)
    wavelen = 2 * torch.pi / base
    assert torch.equal(llama3[wavelen < 16], base[wavelen < 16])  # high frequencies untouched
    torch.testing.assert_close(llama3[wavelen > 64], base[wavelen > 64] / 8.0)  # low ones divided by factor
    medium = (wavelen >= 16) & (wavelen <= 64)
    assert medium.any() and bool((llama3[medium] < base[medium]).all())


def test_model_args_from_configs():
    qwen = ModelArgs.from_hf_config(make_hf_config("qwen2"))
    assert (qwen.qkv_bias, qwen.o_bias, qwen.num_kv_heads, qwen.head_dim) == (True, False, 2, 16)
    llama = ModelArgs.from_hf_config(make_hf_config("llama", tie_word_embeddings=True), max_model_len=100)
    assert (llama.qkv_bias, llama.tie_word_embeddings, llama.max_seq_len) == (False, True, 100)
    with pytest.raises(ValueError, match="sliding_window \\(128\\) is shorter than max_model_len \\(256\\)"):
        ModelArgs.from_hf_config(make_hf_config("mistral", sliding_window=128))
    assert ModelArgs.from_hf_config(make_hf_config("qwen2", sliding_window=8)).max_seq_len == 256  # unused


def test_model_args_from_a_4x_style_config():
    # transformers 4.x kept rope_theta at the top level and scaling in rope_scaling (with "type")
    old = SimpleNamespace(
        **TINY, model_type="llama", rope_theta=500000.0, rope_scaling={"type": "linear", "factor": 2.0}
    )
    args = ModelArgs.from_hf_config(old)
    assert (args.rope_type, args.rope_theta, args.rope_scaling) == ("linear", 500000.0, (("factor", 2.0),))
    unscaled = ModelArgs.from_hf_config(SimpleNamespace(**TINY, model_type="llama", rope_theta=500000.0))
    torch.testing.assert_close(rope_inv_freq(args), rope_inv_freq(unscaled) / 2.0)
    with pytest.raises(ValueError, match="rope_type 'yarn' is not supported"):
        ModelArgs.from_hf_config(
            SimpleNamespace(**TINY, model_type="llama", rope_scaling={"rope_type": "yarn"})
        )
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        ModelArgs.from_hf_config(SimpleNamespace(**TINY, model_type="gpt2"))


def test_load_weights_rejects_unknown_and_missing_tensors():
    hf_model = make_hf_model("llama", seed=0)
    model = make_model_from_hf(hf_model)
    state = dict(hf_model.state_dict())
    with pytest.raises(ValueError, match="'model.layers.0.extra.weight' has no place"):
        model.load_weights([*state.items(), ("model.layers.0.extra.weight", torch.zeros(1))])
    del state["model.layers.1.self_attn.k_proj.weight"]
    with pytest.raises(ValueError, match="layers.1.self_attn.qkv_proj.weight"):
        model.load_weights(state.items())


def test_tied_embeddings_share_one_tensor():
    hf_model = make_hf_model("llama", seed=0, tie_word_embeddings=True)
    model = make_model_from_hf(hf_model)
    assert model.lm_head.weight.data_ptr() == model.embed_tokens.weight.data_ptr()
    torch.testing.assert_close(model.lm_head.weight, hf_model.lm_head.weight)
