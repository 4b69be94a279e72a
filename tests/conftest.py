"""Suite-wide setup: Triton's interpreter must be chosen before triton is first imported (CPU machines only)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True, scope="session")
def _private_kv_disk_tiers(tmp_path_factory):
    """Every engine the tests build without a tier directory of its own gets a fresh, empty one (never
    ~/.cache/pagedchat/kv): blocks another test (or an earlier run) wrote must not turn a miss into a hit. Session
    scoped, so engines built by module-scoped fixtures are covered too."""
    import tempfile

    import engine.tiers.setup

    root = tmp_path_factory.mktemp("kv-tiers")

    def fresh_dir(config) -> Path:
        return Path(config.kv_disk_dir) if config.kv_disk_dir else Path(tempfile.mkdtemp(dir=root))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine.tiers.setup, "tier_dir", fresh_dir)
        yield
