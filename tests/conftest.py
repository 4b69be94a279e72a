"""Suite-wide setup: Triton's interpreter must be chosen before triton is first imported (CPU machines only)."""

from __future__ import annotations

import os
import sys

import torch

if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
