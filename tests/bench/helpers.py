"""What several benchmark tests share: SmolLM2-135M's shapes, and the one JSON + PNG a run writes."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

SMOLLM2_135M = SimpleNamespace(
    hidden_size=576,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    intermediate_size=1536,
    num_hidden_layers=30,
    vocab_size=49152,
)


def only_result(folder: Path, name: str) -> dict:
    """The JSON of the one run named `name` in `folder`, checking that it wrote exactly one JSON and one PNG."""
    jsons = sorted(folder.glob(f"{name}-*.json"))
    pngs = sorted(folder.glob(f"{name}-*.png"))
    assert len(jsons) == 1 and len(pngs) == 1, f"expected one JSON and one PNG, got {jsons + pngs}"
    assert pngs[0].read_bytes()[:4] == b"\x89PNG"
    return json.loads(jsons[0].read_text())
