"""Native libraries are compiled once per machine even when several processes start together without them
(engine/native/build.py): one builds, the others wait on its lock and load what it published."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

LOAD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from engine.native.build import load_library
    lib = load_library(Path(sys.argv[1]))
    assert lib is not None and lib.answer() == 42
    """
)


def test_processes_starting_together_compile_a_library_once(tmp_path):
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler here")
    source = tmp_path / "answer.c"
    source.write_text("int answer(void) { return 42; }\n")
    calls = tmp_path / "calls"
    slow_cc = tmp_path / "slow-cc"  # a compiler that says it ran and takes its time, so the processes overlap
    slow_cc.write_text(f'#!/bin/sh\necho run >> "{calls}"\nsleep 1\nexec "{cc}" "$@"\n')
    slow_cc.chmod(0o755)
    env = {**os.environ, "CC": str(slow_cc), "PAGEDCHAT_CACHE_DIR": str(tmp_path / "cache")}
    repo = Path(__file__).resolve().parents[2]
    starts = [
        subprocess.Popen([sys.executable, "-c", LOAD, str(source)], env=env, cwd=repo) for _ in range(3)
    ]
    assert [p.wait(60) for p in starts] == [0, 0, 0]
    assert calls.read_text().splitlines() == ["run"]
    assert len(list((tmp_path / "cache" / "kernels").glob("answer_*.so"))) == 1
