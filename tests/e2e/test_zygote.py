"""The test servers' zygote (tests/e2e/zygote.py) gives a forked child what `python -m MODULE ARGS` in a subprocess
would have, and its handle answers as subprocess.Popen does: exit codes, -N for a signal, poll and wait."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.e2e.conftest import REPO_ROOT
from tests.e2e.zygote import fork_server


def fork_child(tmp_path, *args: str):
    log = tmp_path / "child.log"
    env = {**os.environ, "ZYGOTE_PROBE": "seen"}
    return fork_server([sys.executable, "-m", "tests.e2e.zygote_child", *args], env, REPO_ROOT, log), log


def test_a_child_runs_the_module_with_its_argv_env_cwd_and_session_and_exits_with_its_code(tmp_path):
    child, log = fork_child(tmp_path, "3")
    assert child.wait(30) == 3 and child.poll() == 3 and child.returncode == 3
    assert log.read_text().strip() == f"argv=['3'] cwd={REPO_ROOT} probe=seen leader=True"


def test_a_signal_ends_a_child_with_minus_the_signal_and_wait_times_out_before(tmp_path):
    child, log = fork_child(tmp_path, "sleep")
    deadline = time.monotonic() + 30
    while not log.exists() or not log.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert child.poll() is None
    os.kill(child.pid, 0)  # a real process of its own
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.1)
    child.send_signal(signal.SIGTERM)
    assert child.wait(30) == -signal.SIGTERM
    child.kill()  # after the end: nothing to signal, no error
