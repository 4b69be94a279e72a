"""`pagedchat bench` without its extra installed: one line that says what to install, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_without_matplotlib_names_the_extra_in_one_line():
    # a None in sys.modules makes the import (and importlib.util.find_spec) fail as if it were not installed
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from pagedchat.cli import main\n"
        "raise SystemExit(main(['bench', 'memory', '--model', 'unused']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "pagedchat bench needs matplotlib, not installed here: pip install -e '.[bench]'"
    ]
    assert result.stdout == ""
