"""A real `pagedchat serve` (uvicorn) in a subprocess on a free loopback port, with a temp SQLite DB."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.app.factories import TINY_BLOCK_BYTES, make_tiny_model_dir, pool_is_idle
from tests.faults import FAULTS_ENV

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 180.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """One running server process and where to reach it."""

    port: int
    db_path: Path
    log_path: Path
    env: dict[str, str]
    process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def admin_state(self) -> dict[str, Any]:
        """The block pool (loopback needs no admin token)."""
        response = httpx.get(self.base_url + "/api/admin/state", timeout=10)
        assert response.status_code == 200, response.text
        return response.json()

    def wait_pool_idle(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """Poll until no block is in use and no sequence is live."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.admin_state()
            if pool_is_idle(state):
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"pool not idle after {timeout_s} s: {state['stats']}")
            time.sleep(0.05)


def server_env(tmp_path: Path, model: str, **env: str) -> dict[str, str]:
    """Environment of a test server: tiny pool, CPU fp32, its own cache dir and database."""
    values = {
        "PAGEDCHAT_MODEL": model,
        "PAGEDCHAT_DATABASE_URL": f"sqlite:///{tmp_path / 'chat.db'}",
        "PAGEDCHAT_CACHE_DIR": str(tmp_path / "cache"),
        "PAGEDCHAT_DEVICE": "cpu",
        "PAGEDCHAT_DTYPE": "float32",
        "PAGEDCHAT_BLOCK_SIZE": "16",
        "PAGEDCHAT_KV_CACHE_BYTES": str(256 * 16 * TINY_BLOCK_BYTES),
        "PAGEDCHAT_MAX_MODEL_LEN": "512",
        "PAGEDCHAT_MAX_NUM_SEQS": "8",
        "PAGEDCHAT_NUM_THREADS": "1",
        "PAGEDCHAT_FLUSH_INTERVAL_S": "0.05",
        "PAGEDCHAT_SHUTDOWN_GRACE_S": "2",
        "PAGEDCHAT_LOG_LEVEL": "info",
    }
    values.update(env)
    return values


def start_server(tmp_path: Path, env: dict[str, str], *, port: int | None = None) -> Server:
    """Start `pagedchat serve` and wait until /health says ok (fails with the server's log otherwise).

    When `env` sets FAULTS_ENV, the server runs under tests/fault_server.py: the same server, its engine faulty.
    """
    server = Server(
        port=port or free_port(), db_path=tmp_path / "chat.db", log_path=tmp_path / "server.log", env=env
    )
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PAGEDCHAT_")}
    full_env.update(env)
    full_env["PYTHONPATH"] = str(REPO_ROOT)
    module = "tests.fault_server" if FAULTS_ENV in env else "app.cli"
    with open(server.log_path, "ab") as log:
        server.process = subprocess.Popen(
            [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(server.port)],
            cwd=REPO_ROOT,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log()[-4000:]}")
        try:
            if httpx.get(server.base_url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    stop_server(server, signal.SIGKILL)
    raise RuntimeError(f"server not healthy after {STARTUP_TIMEOUT_S} s:\n{server.log()[-4000:]}")


def stop_server(server: Server, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
    """Signal the server and wait for it to exit; returns its exit code.

    After a graceful SIGTERM shutdown uvicorn re-raises the signal, so the code is -15: check the log for
    "Application shutdown complete." instead.
    """
    process = server.process
    if process is None or process.poll() is not None:
        return process.returncode if process else 0
    process.send_signal(sig)
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait(timeout=10)


@pytest.fixture(scope="module")
def tiny_model() -> str:
    """The tiny random model's folder (SmolLM2's tokenizer)."""
    return str(make_tiny_model_dir())


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model) -> Iterator[Server]:
    """One server for a test module, tiny model, loopback, no keys."""
    tmp_path = tmp_path_factory.mktemp("server")
    running = start_server(tmp_path, server_env(tmp_path, tiny_model))
    yield running
    stop_server(running)
    assert "Application shutdown complete." in running.log(), running.log()[-4000:]


@pytest.fixture
def server_factory(tmp_path, tiny_model) -> Iterator[Callable[..., Server]]:
    """Start servers on this test's directory (same database across restarts); all are stopped afterwards."""
    started: list[Server] = []

    def start(**env: str) -> Server:
        running = start_server(tmp_path, server_env(tmp_path, env.pop("model", tiny_model), **env))
        started.append(running)
        return running

    yield start
    for running in started:
        stop_server(running, signal.SIGKILL, timeout_s=10)
