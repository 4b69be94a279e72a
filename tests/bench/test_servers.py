"""bench/servers.py: a port answers for our server only when our process listens on it; each server its own tier."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bench import servers
from bench.servers import free_port, listens_on
from engine.core.config import EngineConfig

NO_PROC = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")


@NO_PROC
def test_listens_on_tells_the_process_that_holds_the_listening_socket():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert listens_on(os.getpid(), port) is True
            assert listens_on(other.pid, port) is False  # another process answering on "our" port
        finally:
            other.kill()
            other.wait()
    assert listens_on(os.getpid(), port) is False  # closed


@NO_PROC
def test_a_bound_but_not_listening_port_is_not_listened_on():
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
        assert listens_on(os.getpid(), port) is False


def test_start_pagedchat_gives_a_server_its_own_disk_tier_unless_one_is_named(tmp_path, monkeypatch):
    spawned: list[dict[str, str]] = []
    monkeypatch.setattr(servers, "spawn_pagedchat", lambda name, env, log_dir: spawned.append(env))
    servers.start_pagedchat("a", EngineConfig(), tmp_path)  # kv_disk_dir unset: "" in the environment
    servers.start_pagedchat("b", EngineConfig(kv_disk_dir="/srv/kv"), tmp_path)
    servers.start_pagedchat("c", EngineConfig(), tmp_path, {"PAGEDCHAT_KV_DISK_DIR": "/srv/other"})
    assert [env["PAGEDCHAT_KV_DISK_DIR"] for env in spawned] == [
        str(tmp_path / "a.kv"),
        "/srv/kv",
        "/srv/other",
    ]
