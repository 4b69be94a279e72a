"""Test servers forked from one process that has already imported them: a real `pagedchat serve` process each, in
~1 s instead of ~5 s (~9 s under the suite's load), most of which was importing torch, transformers and the app.

`python -m tests.e2e.zygote` (started once per test process, on first use) imports what `pagedchat serve` and
`tests.fault_server` import, then reads requests from stdin, one JSON line each: module, arguments, environment,
working directory, log file. For each it forks a child that becomes the server exactly as `python -m MODULE ARGS`
would run it (its own session, environment, working directory, stdout and stderr to the log, stdin from
/dev/null, a fresh `random` state) and answers the child's pid; when a child exits it answers its exit code
(-N for a signal, as subprocess does). The zygote starts no thread, so a fork copies no half-held lock.

`ForkedProcess` is the test side's handle with the `subprocess.Popen` methods the harness uses (pid, poll, wait,
send_signal, kill, returncode): signals go to the server's real pid, exit codes come from the zygote.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import random
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

# what `pagedchat serve` imports on its way up (the rest it imports is small)
PRELOAD = (
    "pagedchat.cli",
    "app.main",
    "app.http.server",
    "engine.llm_engine",
    "tests.fault_server",
    "uvicorn",
)


# a test server whose environment sets this (to anything) hashes passwords with tests/app/factories.py's cheap
# argon2id parameters: for the tests that sign in often and test no hashing cost (test_security_signin's flood and
# queue tests keep the real one)
CHEAP_PASSWORD_HASHES_ENV = "PAGEDCHAT_TEST_CHEAP_PASSWORD_HASHES"


# ---- the zygote ----------------------------------------------------------------------------------------------
def warm_tokenizers() -> None:
    """Every server forked from here takes a copy of the tiny models' tokenizer instead of loading it
    (tests/tokenizer_memo.py): loaded here once, before any fork."""
    from engine.loading import engine_model
    from tests import tokenizer_memo
    from tests.app.factories import TINY_MODEL_PREFIX, TINY_MODELS

    tokenizer_memo.install()
    for folder in sorted(TINY_MODELS.glob(f"{TINY_MODEL_PREFIX}*")) if TINY_MODELS.is_dir() else []:
        if (folder / "model.safetensors").is_file():  # built (tests/app/factories.py), not half written
            engine_model.load_tokenizer(folder)


def serve_requests() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    warm_tokenizers()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that SIGCHLD writes to the wakeup fd
    answer({"ready": os.getpid()})
    pending = b""
    while True:
        ready, _, _ = select.select([0, wake_read], [], [])
        if wake_read in ready:
            os.read(wake_read, 4096)
        reap()
        if 0 in ready:
            data = os.read(0, 65536)
            if not data:  # the test process is gone: so are we (its servers get stopped by their tests)
                return
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    become_server(request, (wake_read, wake_write))  # never returns
                answer({"pid": pid, "tag": request["tag"]})


def answer(message: dict[str, Any]) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        answer({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def become_server(request: dict[str, Any], zygote_fds: tuple[int, int]) -> None:
    """In the child: the process `python -m MODULE ARGS` would be, then run it; its end is the interpreter's own
    (SystemExit, an uncaught exception, or a signal uvicorn re-raises)."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in zygote_fds:
        os.close(fd)
    os.setsid()
    os.chdir(request["cwd"])
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(devnull)
    os.environ.clear()
    os.environ.update(request["env"])
    if os.environ.pop(CHEAP_PASSWORD_HASHES_ENV, ""):
        use_cheap_password_hashes()
    random.seed()
    sys.argv = [request["module"], *request["args"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def use_cheap_password_hashes() -> None:
    """This process's Passwords hash with CHEAP_HASH_PARAMETERS (the product's default hasher, swapped)."""
    from argon2 import PasswordHasher

    import app.accounts.passwords
    from tests.app.factories import CHEAP_HASH_PARAMETERS

    app.accounts.passwords.PasswordHasher = lambda: PasswordHasher(**CHEAP_HASH_PARAMETERS)  # type: ignore[assignment,misc]


# ---- the test side -------------------------------------------------------------------------------------------
class Zygote:
    """The zygote process of this test process and the answers it sends (a reader thread files them)."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix="pagedchat-zygote-", suffix=".log")[1])
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.e2e.zygote"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=cwd,
                env=env,
                start_new_session=True,
            )
        self.changed = threading.Condition()
        self.pids: dict[int, int] = {}  # request tag -> pid
        self.exit_codes: dict[int, int] = {}  # pid -> exit code
        self.ready = False
        self.next_tag = 0
        threading.Thread(target=self._read_answers, name="zygote-answers", daemon=True).start()
        atexit.register(self.close)

    def _read_answers(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            message = json.loads(line)
            with self.changed:
                if "ready" in message:
                    self.ready = True
                elif "pid" in message:
                    self.pids[message["tag"]] = message["pid"]
                    # an exit code filed under this pid was an earlier server's, whose pid came round again
                    self.exit_codes.pop(message["pid"], None)
                else:
                    self.exit_codes[message["exit"]] = message["code"]
                self.changed.notify_all()
        with self.changed:
            self.ready = False
            self.changed.notify_all()

    def spawn(self, cmd: list[str], env: dict[str, str], cwd: Path, log_path: Path) -> ForkedProcess:
        """Fork a server: `cmd` is `[python, "-m", MODULE, *ARGS]`, as subprocess would run it."""
        assert cmd[1] == "-m", cmd
        with self.changed:
            tag, self.next_tag = self.next_tag, self.next_tag + 1
            request = {
                "tag": tag,
                "module": cmd[2],
                "args": cmd[3:],
                "env": env,
                "cwd": str(cwd),
                "log": str(log_path),
            }
            assert self.process.stdin is not None
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            self.process.stdin.flush()
            if not self.changed.wait_for(lambda: tag in self.pids or self.process.poll() is not None, 120):
                raise RuntimeError(
                    f"the test server zygote did not fork in 120 s: {self.log_path.read_text()}"
                )
            if tag not in self.pids:
                raise RuntimeError(f"the test server zygote exited: {self.log_path.read_text()[-4000:]}")
            return ForkedProcess(self, self.pids.pop(tag), cmd)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.process.kill()
        self.process.wait()


class ForkedProcess:
    """The `subprocess.Popen` methods the servers' harness uses, for a server the zygote forked."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str]) -> None:
        self.zygote, self.pid, self.args = zygote, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        with self.zygote.changed:
            self.returncode = self.zygote.exit_codes.get(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self.zygote.changed:
            if not self.zygote.changed.wait_for(lambda: self.pid in self.zygote.exit_codes, timeout):
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self.returncode = self.zygote.exit_codes[self.pid]
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_zygote: Zygote | None = None
_zygote_lock = threading.Lock()


def fork_server(cmd: list[str], env: dict[str, str], cwd: Path, log_path: Path) -> ForkedProcess:
    """A server process forked from this test process's zygote (started on first use, ready in ~4 s)."""
    global _zygote
    with _zygote_lock:
        if _zygote is None or _zygote.process.poll() is not None:
            _zygote = Zygote(cwd, dict(os.environ))
        zygote = _zygote
    with zygote.changed:
        zygote.changed.wait_for(lambda: zygote.ready or zygote.process.poll() is not None, 120)
        if not zygote.ready:
            raise RuntimeError(f"the test server zygote did not start: {zygote.log_path.read_text()[-4000:]}")
    return zygote.spawn(cmd, env, cwd, log_path)


if __name__ == "__main__":
    serve_requests()
