"""Servers the HTTP benchmarks start themselves: pagedchat and the HF baseline, as subprocesses on free ports."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from engine.core.config import EngineConfig
from engine.core.options import to_env

READY_TIMEOUT_S = 600.0  # the first start may provision the default model


@dataclass
class ServerProcess:
    """A server subprocess, its base URL and the file its output goes to."""

    name: str
    url: str
    proc: subprocess.Popen
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)

    def log_tail(self, num_chars: int = 3000) -> str:
        """The end of the server's output, for error messages."""
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except OSError:
            return ""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def engine_env(config: EngineConfig) -> dict[str, str]:
    """PAGEDCHAT_* variables that make `pagedchat serve` build an engine with this config (None: left unset)."""
    return to_env(config)


def start_pagedchat(
    name: str, config: EngineConfig, log_dir: Path, extra_env: dict[str, str] | None = None
) -> ServerProcess:
    """`pagedchat serve` on a free loopback port with its own throwaway database."""
    port = free_port()
    env = {
        **engine_env(config),
        **(extra_env or {}),
        "PAGEDCHAT_HOST": "127.0.0.1",
        "PAGEDCHAT_PORT": str(port),
        "PAGEDCHAT_DATABASE_URL": f"sqlite:///{log_dir / (name + '.db')}",
        "PAGEDCHAT_LOG_LEVEL": "warning",
    }
    cmd = [sys.executable, "-m", "pagedchat", "serve"]  # the `pagedchat serve` console script
    return _spawn(name, cmd, env, f"http://127.0.0.1:{port}", log_dir)


def start_hf_baseline(name: str, model: str, dtype: str, log_dir: Path) -> ServerProcess:
    """The one-request-at-a-time HF server (engine/bench/hf_server.py) on a free loopback port."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "bench.hf_server",
        "--model",
        model,
        "--dtype",
        dtype,
        "--port",
        str(port),
    ]
    return _spawn(name, cmd, {}, f"http://127.0.0.1:{port}", log_dir)


def _spawn(name: str, cmd: list[str], env: dict[str, str], url: str, log_dir: Path) -> ServerProcess:
    log_path = log_dir / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=_repo_root(),
            start_new_session=True,
        )
    return ServerProcess(name, url, proc, log_path, env)


def _repo_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def wait_ready(server: ServerProcess, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Poll GET /health until 200; RuntimeError with the server's log if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                raise RuntimeError(
                    f"{server.name} exited with {server.proc.returncode} before it was ready:\n{server.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if client.get(server.url + "/health").status_code == 200:
                    return
            time.sleep(0.25)
    raise RuntimeError(f"{server.name} was not ready after {timeout_s:.0f} s:\n{server.log_tail()}")


def stop(server: ServerProcess, timeout_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after `timeout_s`; only this server's own process is signalled."""
    if server.proc.poll() is not None:
        return
    server.proc.terminate()
    try:
        server.proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


@contextlib.contextmanager
def log_folder(keep: str | Path | None = None) -> Iterator[Path]:
    """Where server logs and databases go: `keep` if given, else a temporary folder removed afterwards."""
    if keep is not None:
        path = Path(keep)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="pagedchat-bench-") as tmp:
        yield Path(tmp)


@contextlib.contextmanager
def running(
    servers: list[ServerProcess], timeout_s: float = READY_TIMEOUT_S
) -> Iterator[list[ServerProcess]]:
    """Wait until every server is ready; stop them all on exit, whatever happened."""
    try:
        for server in servers:
            wait_ready(server, timeout_s)
        yield servers
    finally:
        for server in servers:
            stop(server)
