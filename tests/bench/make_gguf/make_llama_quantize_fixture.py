"""Regenerate llama_quantize_types.json: the tensor types the real llama-quantize picks, for test_tensor_types.py.

Small shapes: `bench make-gguf` writes an F16 file (as a converter would), llama-quantize requantizes it to each file
type, and the types are read back from the files it wrote. Full-size shapes: the F16 file is written with its data
left a hole (a sparse file: same metadata and tensor table, no bytes), and `llama-quantize --dry-run` reports the type
it would give each tensor. Run it where llama.cpp is built (../shared/BASELINES.md):

    LLAMA_QUANTIZE=~/.cache/llamacpp/build/bin/llama-quantize python -m tests.bench.make_gguf.make_llama_quantize_fixture
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf

from bench.make_gguf.shapes import SHAPES
from bench.make_gguf.writer import write_gguf

FIXTURE = Path(__file__).with_name("llama_quantize_types.json")
FILE_TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0")
QUANTIZED = (
    SHAPES["tiny"],  # tied, 8 layers, an intermediate width (1408) that needs the 32-block fallbacks
    SHAPES["tiny-qwen2"],  # qwen2 with q/k/v biases, 4 layers
    # untied head, 12 layers
    dataclasses.replace(SHAPES["tiny"], name="tiny-untied", num_layers=12, tie_word_embeddings=False),
    # SmolLM2-135M's widths: 576 is no multiple of 256 anywhere, so the tied head itself falls back
    dataclasses.replace(SHAPES["tiny"], name="tiny-576", hidden_size=576, num_heads=9, num_kv_heads=3,
                        intermediate_size=1536, num_layers=6, rope_scaling=None),
)  # fmt: skip
DRY_RUN = tuple(SHAPES[name] for name in ("llama-3.2-1b", "llama-3.2-3b", "qwen2.5-1.5b", "llama-3.1-8b"))
# "[  8/ 147] blk.0.attn_v.weight - [  2048,    512,      1,      1], type =    f16, size = 2.00 MiB -> 0.82 MiB (q6_K)"
DRY_RUN_LINE = re.compile(
    r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[.*\], type =\s+(\w+), size = [^(]*(?:\((\w+)\))?\s*$"
)


def run_quantize(quantize: str, *args: str) -> str:
    """llama-quantize's log (it logs to stderr)."""
    env = dict(os.environ, LD_LIBRARY_PATH=str(Path(quantize).parent))
    return subprocess.run([quantize, *args], check=True, env=env, capture_output=True, text=True).stderr


def quantized_types(quantize: str, source: Path, file_type: str, out: Path) -> tuple[dict[str, str], str]:
    """llama-quantize `source` to `file_type`: the type of each tensor of the result, and the tool's version line."""
    log = run_quantize(quantize, "--allow-requantize", str(source), str(out), file_type, "2")
    version = next((line for line in log.splitlines() if "commit" in line), "?")
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(out).tensors}, version.strip()


def dry_run_types(quantize: str, source: Path, file_type: str) -> dict[str, str]:
    """The type `llama-quantize --dry-run` says it would give each tensor of `source`."""
    types = {}
    for line in run_quantize(quantize, "--dry-run", str(source), file_type).splitlines():
        if match := DRY_RUN_LINE.match(line.strip()):
            name, source_type, target = match.groups()
            types[name] = (target or source_type).upper()
    return types


def entry(shape, types: dict[str, dict[str, str]]) -> dict:
    names = list(types[FILE_TYPES[0]])
    return {
        "shape": dataclasses.asdict(shape),
        "tensors": names,
        "types": {ft: " ".join(types[ft][n] for n in names) for ft in FILE_TYPES},
    }


def main() -> int:
    quantize = os.path.expanduser(
        os.environ.get("LLAMA_QUANTIZE", "~/.cache/llamacpp/build/bin/llama-quantize")
    )
    entries, version = [], "?"
    with tempfile.TemporaryDirectory(prefix="lq-fixture-") as tmp:
        for shape in QUANTIZED:
            source = write_gguf(shape, "F16", Path(tmp) / f"{shape.name}.F16.gguf").path
            types = {}
            for ft in FILE_TYPES:
                types[ft], version = quantized_types(
                    quantize, source, ft, Path(tmp) / f"{shape.name}.{ft}.gguf"
                )
            entries.append(entry(shape, types) | {"how": "quantized"})
            print(f"{shape.name}: {len(types[FILE_TYPES[0]])} tensors, quantized", file=sys.stderr)
        for shape in DRY_RUN:
            source = write_gguf(shape, "F16", Path(tmp) / f"{shape.name}.F16.gguf", weights=False).path
            types = {ft: dry_run_types(quantize, source, ft) for ft in FILE_TYPES}
            entries.append(entry(shape, types) | {"how": "dry-run"})
            source.unlink()
            print(f"{shape.name}: {len(types[FILE_TYPES[0]])} tensors, dry run", file=sys.stderr)
    doc = {
        "produced_by": "tests/bench/make_gguf/make_llama_quantize_fixture.py: bench make-gguf F16 files given to "
        "llama-quantize (llama.cpp vendored in llama-cpp-python 0.3.36): small shapes requantized "
        "(--allow-requantize) and read back, full-size shapes from --dry-run on a file with the same metadata",
        "llama_quantize_version": version,
        "shapes": entries,
    }
    FIXTURE.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
