"""Random GGUF-block weights for the kernel measurements: speed does not depend on how the blocks were chosen, only
their scales must be finite (small fp16 values where each type keeps them)."""

from __future__ import annotations

import numpy as np
import torch

from engine.native.quant_format import QuantType, QuantWeight

FP16_OFFSETS = {  # byte offsets of each type's fp16 scales inside its block
    QuantType.Q4_0: (0,),
    QuantType.Q4_1: (0, 2),
    QuantType.Q5_0: (0,),
    QuantType.Q5_1: (0, 2),
    QuantType.Q8_0: (0,),
    QuantType.IQ4_NL: (0,),
    QuantType.Q3_K: (108,),
    QuantType.Q4_K: (0, 2),
    QuantType.Q5_K: (0, 2),
    QuantType.Q6_K: (208,),
    QuantType.IQ4_XS: (0,),
}


def random_blocks(qtype: QuantType, out_features: int, in_features: int, seed: int) -> QuantWeight:
    """An [out_features, in_features] weight of random qtype blocks with scales of 0.01."""
    if qtype not in FP16_OFFSETS:
        raise ValueError(
            f"no random blocks for {qtype.name}: one of {', '.join(q.name for q in FP16_OFFSETS)}"
        )
    gen = np.random.default_rng(seed)
    nb = in_features // qtype.block_weights
    raw = gen.integers(0, 256, (out_features, nb, qtype.block_bytes), dtype=np.uint8)
    for offset in FP16_OFFSETS[qtype]:
        raw[:, :, offset : offset + 2] = np.full((out_features, nb, 1), 0.01, np.float16).view(np.uint8)
    return QuantWeight(qtype, torch.from_numpy(raw.reshape(out_features, -1)), in_features)
