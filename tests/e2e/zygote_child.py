"""`python -m tests.e2e.zygote_child CODE|sleep`: what a forked child sees (its argv, cwd, one variable, its
session) written to stdout, then it exits with CODE, or sleeps until a signal ends it (tests/e2e/test_zygote.py)."""

from __future__ import annotations

import os
import sys
import time

print(
    f"argv={sys.argv[1:]} cwd={os.getcwd()} probe={os.environ.get('ZYGOTE_PROBE')} leader={os.getsid(0) == os.getpid()}"
)
sys.stdout.flush()
if sys.argv[1] == "sleep":
    time.sleep(600)
sys.exit(int(sys.argv[1]))
