"""Regenerate llama_quantize_types.json: the tensor types the real llama-quantize picks, for test_tensor_types.py.

For each shape below, `bench make-gguf` writes an F16 file (as a converter would), llama-quantize requantizes it to
each file type, and the types it chose are read back. Run it where llama.cpp is built (../shared/BASELINES.md):

    LLAMA_QUANTIZE=~/.cache/llamacpp/build/bin/llama-quantize python -m tests.bench.make_gguf.make_llama_quantize_fixture
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf

from bench.make_gguf.shapes import SHAPES
from bench.make_gguf.writer import write_gguf

FIXTURE = Path(__file__).with_name("llama_quantize_types.json")
FILE_TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0")
SHAPES_CHECKED = (
    SHAPES["tiny"],  # tied, 8 layers, an intermediate width (1408) that needs the 32-block fallbacks
    SHAPES["tiny-qwen2"],  # qwen2 with q/k/v biases, 4 layers
    # untied head, 12 layers
    dataclasses.replace(SHAPES["tiny"], name="tiny-untied", num_layers=12, tie_word_embeddings=False),
    # SmolLM2-135M's widths: 576 is no multiple of 256 anywhere, so the tied head itself falls back
    dataclasses.replace(SHAPES["tiny"], name="tiny-576", hidden_size=576, num_heads=9, num_kv_heads=3,
                        intermediate_size=1536, num_layers=6, rope_scaling=None),
)  # fmt: skip


def quantized_types(quantize: str, source: Path, file_type: str, out: Path) -> tuple[dict[str, str], str]:
    """llama-quantize `source` to `file_type`: the type of each tensor of the result, and the tool's version line."""
    env = dict(os.environ, LD_LIBRARY_PATH=str(Path(quantize).parent))
    done = subprocess.run([quantize, "--allow-requantize", str(source), str(out), file_type, "2"], check=True,
                          env=env, capture_output=True, text=True)  # fmt: skip
    version = next((line for line in done.stderr.splitlines() if "commit" in line), "?")
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(out).tensors}, version.strip()


def main() -> int:
    quantize = os.path.expanduser(
        os.environ.get("LLAMA_QUANTIZE", "~/.cache/llamacpp/build/bin/llama-quantize")
    )
    entries, version = [], "?"
    with tempfile.TemporaryDirectory(prefix="lq-fixture-") as tmp:
        for shape in SHAPES_CHECKED:
            source = write_gguf(shape, "F16", Path(tmp) / f"{shape.name}.F16.gguf").path
            types = {}
            for ft in FILE_TYPES:
                types[ft], version = quantized_types(
                    quantize, source, ft, Path(tmp) / f"{shape.name}.{ft}.gguf"
                )
            names = list(types[FILE_TYPES[0]])
            entries.append({
                "shape": dataclasses.asdict(shape),
                "tensors": names,
                "types": {ft: [types[ft][n] for n in names] for ft in FILE_TYPES},
            })  # fmt: skip
            print(f"{shape.name}: {len(names)} tensors", file=sys.stderr)
    doc = {
        "produced_by": "tests/bench/make_gguf/make_llama_quantize_fixture.py: bench make-gguf F16 files "
        "requantized by llama-quantize (llama.cpp vendored in llama-cpp-python 0.3.36) --allow-requantize",
        "llama_quantize_version": version,
        "shapes": entries,
    }
    FIXTURE.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
