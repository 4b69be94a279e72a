"""Random GGUF-block weights for the kernel measurements: speed does not depend on how the blocks were chosen, only
their scales must be finite (small fp16 values where each type keeps them)."""

from __future__ import annotations

import numpy as np
import torch

from engine.native.quant_format import QuantType, QuantWeight


def random_blocks(qtype: QuantType, out_features: int, in_features: int, seed: int) -> QuantWeight:
    """An [out_features, in_features] weight of random qtype blocks with scales of 0.01."""
    gen = np.random.default_rng(seed)
    nb = in_features // qtype.block_weights
    raw = gen.integers(0, 256, (out_features, nb, qtype.block_bytes), dtype=np.uint8)
    for offset in qtype.fp16_offsets:
        raw[:, :, offset : offset + 2] = np.full((out_features, nb, 1), 0.01, np.float16).view(np.uint8)
    return QuantWeight(qtype, torch.from_numpy(raw.reshape(out_features, -1)), in_features)
