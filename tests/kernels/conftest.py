"""Kernel tests run in one of two modes, fixed per process when triton is first imported.

- No CUDA (CI): TRITON_INTERPRET=1 is set here, before anything below imports triton; the kernels run in
  Triton's interpreter on CPU fp32 tensors (`interpreted` tests) and the `cuda` tests skip.
- CUDA, TRITON_INTERPRET unset (the GPU check: `pytest -m cuda tests/kernels`): the kernels compile natively;
  the `cuda` tests run and the interpreter tests skip, since the same comparisons run natively.
Triton's interpreter and compiler cannot share a process (triton.language's own helpers are decorated at
import). A full `pytest` run imports triton (through transformers) while collecting tests/app, before this
file runs, so tests/conftest.py must set TRITON_INTERPRET=1 first thing when CUDA is absent; where it was not
set in time, the interpreter tests fail with a message saying so.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.runtime import is_interpreted  # noqa: E402  (triton must be imported after the line above)
from kernels.store_kv import _store_kv_kernel  # noqa: E402

INTERPRETED = is_interpreted(_store_kv_kernel)
NATIVE_CUDA = not INTERPRETED and torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _kernel_mode(request: pytest.FixtureRequest) -> None:
    """Skip or fail each test according to the process's Triton mode (see the module docstring)."""
    if request.node.get_closest_marker("cuda"):
        if not NATIVE_CUDA:
            pytest.skip("needs CUDA with TRITON_INTERPRET unset")
    elif request.node.get_closest_marker("interpreted") and not INTERPRETED:
        if NATIVE_CUDA:
            pytest.skip("kernels are compiled in this process; the cuda tests run the same comparisons")
        pytest.fail(
            "triton was imported without TRITON_INTERPRET=1 before tests/kernels/conftest.py could set it: "
            "set it in tests/conftest.py (when CUDA is absent) or run with TRITON_INTERPRET=1"
        )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "interpreted: runs the kernels in Triton's interpreter on the CPU")
