"""Every kernel launch compiles for sm_90 (H100/H200) without register spills, checked on a CPU-only machine.

The interpreter tests cannot see compile errors, so this runs kernels.compile_check in a subprocess without
TRITON_INTERPRET (Triton's mode is fixed per process) and reads its JSON report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_launch_compiles_for_sm90_without_spills() -> None:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO)
    result = subprocess.run(
        [sys.executable, "-m", "kernels.compile_check", "--arch", "90", "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    reports = json.loads(result.stdout)
    launches = [(r["scenario"].split(" H")[0], r["kernel"]) for r in reports]
    # two model shapes (Llama-1B-like and SmolLM2-135M-like), each with the same eleven launches
    assert launches == 2 * [
        ("store_kv", "_store_kv_kernel"),
        ("decode", "_paged_decode_kernel"),
        ("decode split-K", "_paged_decode_kernel"),
        ("decode split-K", "_decode_reduce_kernel"),
        ("prefill", "_paged_prefill_kernel"),
        ("prefill, decodes", "_paged_prefill_kernel"),
        ("store_kv int8", "_store_kv_kernel"),
        ("decode int8", "_paged_decode_kernel"),
        ("decode split-K int8", "_paged_decode_kernel"),
        ("decode split-K int8", "_decode_reduce_kernel"),
        ("prefill int8", "_paged_prefill_kernel"),
    ]
    spilled = [r for r in reports if r["spill_bytes"] > 0]
    assert spilled == []
    assert all(0 < r["registers"] <= 255 for r in reports)
