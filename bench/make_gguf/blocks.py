"""Random tensor bytes of any GGUF type, made chunk by chunk: random blocks whose fp16 scales are small and finite.

Speed does not depend on the weights' values, so a block is random bytes (quants, packed sub-block scales) with its
fp16 scale fields (d, and dmin or m where the format has one) overwritten by small values: a random fp16 could be
NaN or infinite, or huge. The ranges are picked so that weights spread by ~0.015-0.03, as in a trained model (some
K-quant d values then lie below fp16's normal range, as llama-quantize's own often do).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

T = GGMLQuantizationType
FLOAT_STD = 0.02  # F32/F16 weights: normal with this spread
# byte offset of each fp16 field in a block (ggml-common.h's layouts) -> the range its value is drawn from
SCALE_FIELDS: dict[GGMLQuantizationType, tuple[tuple[int, float, float], ...]] = {
    T.Q4_0: ((0, 2e-3, 4e-3),),  # w = d * (q - 8)
    T.Q4_1: ((0, 2e-3, 4e-3), (2, -3e-2, -1.5e-2)),  # w = d * q + m
    T.Q5_0: ((0, 1e-3, 2e-3),),  # w = d * (q - 16)
    T.Q5_1: ((0, 1e-3, 2e-3), (2, -3e-2, -1.5e-2)),
    T.Q8_0: ((0, 1.5e-4, 3e-4),),  # w = d * q, q int8
    T.Q2_K: ((80, 1e-3, 2e-3), (82, 1e-3, 2e-3)),  # d, dmin after scales[16] and qs[64]
    T.Q3_K: ((108, 3e-4, 6e-4),),  # d last
    T.Q4_K: ((0, 5e-5, 1e-4), (2, 5e-5, 1e-4)),  # d, dmin, then 6-bit sub-block scales and mins
    T.Q5_K: ((0, 2.5e-5, 5e-5), (2, 5e-5, 1e-4)),
    T.Q6_K: ((208, 1.5e-5, 3e-5),),  # ql[128], qh[64], int8 scales[16], then d
}
CHUNK_BYTES = 32 << 20  # bytes generated at a time: memory stays flat however big the tensor


def tensor_nbytes(kind: GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of `shape` (rows last-dimension wide) in `kind`."""
    block_elems, block_bytes = GGML_QUANT_SIZES[kind]
    num_values = int(np.prod(shape))
    assert shape[-1] % block_elems == 0, (
        f"rows of {shape[-1]} are no whole {kind.name} blocks of {block_elems}"
    )
    return num_values // block_elems * block_bytes


def random_blocks(kind: GGMLQuantizationType, num_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """`num_blocks` random blocks of `kind` as uint8 [num_blocks, block_bytes], every fp16 scale small and finite."""
    block_bytes = GGML_QUANT_SIZES[kind][1]
    num_bytes = num_blocks * block_bytes
    # the generator's raw 64-bit words: about twice as fast as integers(0, 256) bytes
    raw = rng.bit_generator.random_raw(-(-num_bytes // 8)).view(np.uint8)
    blocks = raw[:num_bytes].reshape(num_blocks, block_bytes)
    for offset, low, high in SCALE_FIELDS[kind]:
        values = rng.uniform(low, high, num_blocks).astype(np.float16)
        blocks[:, offset : offset + 2] = values.view(np.uint8).reshape(num_blocks, 2)
    return blocks


def random_floats(kind: GGMLQuantizationType, num_values: int, rng: np.random.Generator) -> np.ndarray:
    """Normal weights in F32 or F16."""
    values = rng.standard_normal(num_values, dtype=np.float32) * FLOAT_STD
    return values.astype(np.float16) if kind == T.F16 else values


def random_chunks(
    kind: GGMLQuantizationType,
    shape: tuple[int, ...],
    rng: np.random.Generator,
    chunk_bytes: int = CHUNK_BYTES,
) -> Iterator[np.ndarray]:
    """A random tensor's bytes in whole-row chunks of about `chunk_bytes`, in file order."""
    rows = int(np.prod(shape[:-1]))
    row_bytes = tensor_nbytes(kind, (shape[-1],))
    rows_per_chunk = max(1, chunk_bytes // row_bytes)
    for first in range(0, rows, rows_per_chunk):
        num_rows = min(rows_per_chunk, rows - first)
        if kind in (T.F32, T.F16):
            yield random_floats(kind, num_rows * shape[-1], rng)
        else:
            num_blocks = num_rows * row_bytes // GGML_QUANT_SIZES[kind][1]
            yield random_blocks(kind, num_blocks, rng)
