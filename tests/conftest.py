"""Suite-wide setup: Triton's interpreter must be chosen before triton is first imported (CPU machines only)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _private_kv_disk_tier(tmp_path_factory, monkeypatch):
    """Each test's engines keep their disk tier in a directory of that test's own, never in ~/.cache/pagedchat/kv:
    blocks a previous test (or run) wrote must not turn one of this test's misses into a hit."""
    import engine.tiers.setup

    directory = tmp_path_factory.mktemp("kv-tier")
    monkeypatch.setattr(engine.tiers.setup, "tier_dir", lambda config: Path(config.kv_disk_dir or directory))
