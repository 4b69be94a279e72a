"""GPU memory profiling: the peak a step of the largest shape the scheduler may build needs beside the KV pool."""

from __future__ import annotations

import torch

from engine.core.config import EngineConfig
from engine.core.outputs import ScheduledSequence as Item
from engine.core.outputs import SchedulerOutput
from engine.core.sequence import SamplingParams, Sequence
from engine.core.utils import cdiv
from engine.worker.kv_cache import KVCacheSpec
from engine.worker.model_runner import ModelRunner


def profile_peak_bytes(config: EngineConfig, model: torch.nn.Module, spec: KVCacheSpec) -> int:
    """Peak GPU memory (weights + activations) of the largest step the scheduler may build."""
    num_tokens = config.max_num_batched_tokens
    seq_len = min(num_tokens, config.max_model_len)
    lengths = [seq_len] * (num_tokens // seq_len) + ([num_tokens % seq_len] if num_tokens % seq_len else [])
    blocks_per_seq = cdiv(seq_len, spec.block_size)
    runner = ModelRunner(config, model, spec, blocks_per_seq * len(lengths))
    items = []
    for i, length in enumerate(lengths):
        seq = Sequence(
            seq_id=-1 - i,
            request_id="profile",
            token_ids=[0] * length,
            num_prompt_tokens=length,
            params=SamplingParams(max_tokens=1),
            arrival_time=0.0,
            block_table=list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)),
        )
        items.append(Item(seq, length))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    runner.forward(SchedulerOutput(scheduled=items))
    torch.cuda.synchronize()
    pool = [t for t in (runner.kv_cache, runner.kv_scales) if t is not None]
    peak = torch.cuda.max_memory_allocated() - sum(t.numel() * t.element_size() for t in pool)
    del runner
    torch.cuda.empty_cache()
    return int(peak)
