"""Teacher-forced scoring: the log-probability a model gives to given tokens, computed as decode computes them."""

from __future__ import annotations

import torch

from engine.attention.metadata import AttentionMetadata
from engine.core.utils import cdiv
from engine.worker.model_runner import ModelRunner


@torch.inference_mode()
def score_tokens(
    runner: ModelRunner, sequences: list[list[int]], num_context: list[int]
) -> list[torch.Tensor]:
    """Log-probabilities [len(seq) - context] of each sequence's tokens after its first `context` tokens.

    One step prefills every context; then each step feeds every unfinished sequence its next given token, one row per
    sequence, as decode does (so per-row numerics such as int8 activations apply). The runner's model and attention
    backend run on a KV cache of their own; the engine's pool is not touched. CPU only.
    """
    assert runner.device.type == "cpu", f"scoring runs on the CPU, not {runner.device}"
    assert all(1 <= c < len(s) for s, c in zip(sequences, num_context, strict=True)), (
        "need 1 <= context < length"
    )
    spec, model, backend = runner.spec, runner.model, runner.backend
    longest = max(map(len, sequences))
    assert longest <= model.args.max_seq_len, (
        f"a sequence of {longest} tokens exceeds {model.args.max_seq_len}"
    )
    block_size = spec.block_size
    tables, next_block = [], 0
    for seq in sequences:
        num_blocks = cdiv(len(seq), block_size)
        tables.append(list(range(next_block, next_block + num_blocks)))
        next_block += num_blocks
    caches = spec.layers(*spec.allocate(next_block, torch.device("cpu")))
    done = [0] * len(sequences)  # tokens of each sequence with KV in the cache
    scores: list[list[torch.Tensor]] = [[] for _ in sequences]
    while True:
        feed = {i: (c if d == 0 else 1) for i, (c, d) in enumerate(zip(num_context, done))}
        active = [i for i, seq in enumerate(sequences) if done[i] + feed[i] < len(seq)]
        if not active:
            break
        query_lens = [feed[i] for i in active]
        seq_lens = [done[i] + feed[i] for i in active]
        meta = AttentionMetadata.build(query_lens, seq_lens, [tables[i] for i in active], block_size)
        ids = torch.tensor([t for i in active for t in sequences[i][done[i] : done[i] + feed[i]]])
        positions = torch.tensor([p for i in active for p in range(done[i], done[i] + feed[i])])
        backend.prepare(meta)
        hidden = model(ids, positions, caches, meta, backend)
        last_rows = meta.query_start_loc[1:].long() - 1
        logprobs = torch.log_softmax(model.compute_logits(hidden[last_rows]).float(), dim=-1)
        for row, i in enumerate(active):
            done[i] += feed[i]
            scores[i].append(logprobs[row, sequences[i][done[i]]])
    return [torch.stack(s) for s in scores]
