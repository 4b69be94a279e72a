"""Write a random-weight GGUF file tensor by tensor: metadata as llama.cpp's converter writes it, then the tensors'
bytes streamed in chunks (memory stays at a few tens of MB for any model size)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import gguf
import numpy as np

from bench.make_gguf.blocks import FLOAT_STD, random_chunks, tensor_nbytes
from bench.make_gguf.shapes import ModelShape, rope_freq_factors
from bench.make_gguf.tensor_types import FILE_TYPES, TensorSpec, tensor_plan
from bench.make_gguf.vocab import Vocab, make_vocab

logger = logging.getLogger(__name__)
T = gguf.GGMLQuantizationType
ALIGNMENT = gguf.GGUF_DEFAULT_ALIGNMENT  # the writer's: no general.alignment key is written


@dataclass(frozen=True)
class WrittenFile:
    """What make_gguf wrote: the file, its size, how long it took and its tensors by type."""

    path: Path
    num_bytes: int
    seconds: float
    tensors_by_type: dict[str, tuple[int, int]]  # type -> (tensors, bytes)


def add_metadata(writer: gguf.GGUFWriter, shape: ModelShape, file_type: str, vocab: Vocab) -> None:
    """general.*, the architecture's hyperparameters and tokenizer.* under llama.cpp's key names."""
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(f"{shape.name} (random weights)")
    writer.add_size_label(gguf.size_label(shape.num_parameters, 0, 0, 0))
    writer.add_file_type(int(FILE_TYPES[file_type][0]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_block_count(shape.num_layers)
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.hidden_size)
    writer.add_feed_forward_length(shape.intermediate_size)
    writer.add_head_count(shape.num_heads)
    writer.add_head_count_kv(shape.num_kv_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_norm_eps)
    if shape.arch == "llama":  # Llama 3.2's converter states them; Qwen2's leaves them to hidden / heads
        writer.add_key_length(shape.head_dim)
        writer.add_value_length(shape.head_dim)
        writer.add_vocab_size(shape.vocab_size)
        writer.add_rope_dimension_count(shape.head_dim)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.bos_token_id)
    writer.add_eos_token_id(vocab.eos_token_id)
    if vocab.padding_token_id is not None:
        writer.add_pad_token_id(vocab.padding_token_id)
    writer.add_add_bos_token(vocab.add_bos_token)
    writer.add_chat_template(vocab.chat_template)


class OverlappedWriter:
    """Writes to a file on one thread while the caller makes the next chunk (a file write releases the GIL).

    A write waits for the one before it: at most two chunks exist at a time, and the file stays in order."""

    def __init__(self, fout: BinaryIO) -> None:
        self.fout = fout
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.pending: Future | None = None

    def write(self, data: np.ndarray | bytes) -> None:
        self.wait()
        self.pending = self.pool.submit(self.fout.write, data)

    def wait(self) -> None:
        if self.pending is not None:
            self.pending.result()
            self.pending = None

    def __enter__(self) -> OverlappedWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.wait()  # a failed write raises here
        finally:
            self.pool.shutdown()


def small_tensor(spec: TensorSpec, shape: ModelShape, rng: np.random.Generator) -> np.ndarray:
    """A 1-D F32 tensor: the rope divisors, a norm's weights near 1, or a bias."""
    if spec.name == "rope_freqs.weight":
        return np.asarray(rope_freq_factors(shape), dtype=np.float32)
    if spec.name.endswith("norm.weight"):
        return (1 + rng.standard_normal(spec.shape, dtype=np.float32) * 0.05).astype(np.float32)
    return rng.standard_normal(spec.shape, dtype=np.float32) * FLOAT_STD


def tensor_chunks(spec: TensorSpec, shape: ModelShape, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """A tensor's bytes in file order: a 1-D tensor whole, a weight in chunks."""
    if len(spec.shape) == 1:
        yield small_tensor(spec, shape, rng)
    else:
        yield from random_chunks(spec.type, spec.shape, rng)


def write_gguf(
    shape: ModelShape,
    file_type: str,
    out: str | Path,
    seed: int = 0,
    on_tensor: Callable[[TensorSpec, int], None] | None = None,
    weights: bool = True,
) -> WrittenFile:
    """Write a random `shape` model in `file_type` to `out` (through a .part file renamed at the end).

    `on_tensor(spec, nbytes)` is called after each tensor (a progress bar). weights=False leaves the tensor data a
    hole of the right size (a sparse file, instant): for tools that read only the metadata, such as
    `llama-quantize --dry-run`."""
    start = time.monotonic()
    out = Path(out).expanduser()
    plan = tensor_plan(shape, file_type)
    vocab = make_vocab(shape, seed)
    rng = np.random.default_rng(seed)
    partial = out.with_name(out.name + ".part")
    writer = gguf.GGUFWriter(partial, shape.arch)
    add_metadata(writer, shape, file_type, vocab)
    for spec in plan:  # dims as HF lists them; the writer stores them innermost first
        writer.add_tensor_info(spec.name, spec.shape, np.dtype(np.float32), tensor_nbytes(spec.type, spec.shape),
                               raw_dtype=spec.type)  # fmt: skip
    writer.write_header_to_file(partial)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    assert writer.fout is not None and len(writer.fout) == 1, "one file, no shards"
    fout = writer.fout[0]
    by_type: dict[str, list[int]] = {}
    try:
        with OverlappedWriter(fout) as background:
            data_end = writer.ggml_pad(fout.tell(), ALIGNMENT)
            background.write(bytes(data_end - fout.tell()))  # tensor data starts aligned
            for spec in plan:
                nbytes = tensor_nbytes(spec.type, spec.shape)
                padded = writer.ggml_pad(nbytes, ALIGNMENT)
                if weights:
                    for chunk in tensor_chunks(spec, shape, rng):
                        background.write(chunk)
                    background.write(bytes(padded - nbytes))
                data_end += padded
                counts = by_type.setdefault(spec.type.name, [0, 0])
                counts[0] += 1
                counts[1] += nbytes
                if on_tensor is not None:
                    on_tensor(spec, nbytes)
        fout.truncate(data_end)  # weights=False: the data is a hole
        writer.close()
        os.replace(partial, out)
    except BaseException:
        writer.close()
        partial.unlink(missing_ok=True)
        raise
    seconds = time.monotonic() - start
    logger.info("wrote %s (%s, %s) in %.1f s", out, shape.name, file_type, seconds)
    return WrittenFile(out, out.stat().st_size, seconds, {k: (v[0], v[1]) for k, v in by_type.items()})
