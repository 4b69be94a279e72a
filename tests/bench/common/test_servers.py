"""bench/common/servers.py: a port answers for our server only when our process listens on it; each server its
own tier."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.common import servers
from bench.common.servers import free_port, listens_on
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


def test_cluster_args_only_for_a_replica_set_or_ray():
    assert servers.cluster_args(1) == ()  # the plain process: today's server, no new flags
    assert servers.cluster_args(2, "round-robin", 1, "local") == (
        "--replicas",
        "2",
        "--routing",
        "round-robin",
        "--threads-per-replica",
        "1",
        "--ray-address",
        "local",
    )
    assert servers.cluster_args(1, "kv", 0, "local") == (
        "--replicas",
        "1",
        "--routing",
        "kv",
        "--ray-address",
        "local",
    )
    for bad, message in (
        ({"replicas": 0}, "replicas must be at least 1, got 0"),
        (
            {"replicas": 2, "routing": "random"},
            "routing must be one of kv, round-robin, least-loaded, got 'random'",
        ),
        ({"replicas": 2, "threads_per_replica": -1}, "threads per replica must be 0"),
    ):
        with pytest.raises(ValueError, match=message):
            servers.cluster_args(**bad)


def test_start_pagedchat_passes_serve_args_after_the_command(tmp_path, monkeypatch):
    commands: list[tuple[str, ...]] = []
    monkeypatch.setattr(
        servers, "spawn_pagedchat", lambda name, env, log_dir, command: commands.append(command)
    )
    servers.start_pagedchat("a", EngineConfig(), tmp_path, serve_args=servers.cluster_args(2))
    assert commands == [("pagedchat", "serve", "--replicas", "2", "--routing", "kv")]


def test_replicas_ready_reads_the_replica_section_or_counts_a_plain_process_as_one():
    assert servers.replicas_ready({"status": "ok", "model": "m"}, 1)
    assert not servers.replicas_ready({"status": "ok", "model": "m"}, 2)
    degraded = {"status": "degraded", "replicas": {"asked": 2, "ready": 1, "replicas": []}}
    assert not servers.replicas_ready(degraded, 2)
    assert servers.replicas_ready({"status": "ok", "replicas": {"asked": 2, "ready": 2, "replicas": []}}, 2)


def process_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat (Z: a zombie, dead), "gone" once the process has been reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@NO_PROC
def test_reap_session_kills_what_a_stopped_server_left_in_its_session(tmp_path):
    # a "server" that leaves a child behind in its session when it exits, as Ray's processes would (Ray's workers
    # each in a process group of their own)
    leave_one = (
        "import subprocess; "
        "print(subprocess.Popen(['sleep', '60'], process_group=0, stdout=subprocess.DEVNULL).pid)"
    )
    leader = subprocess.Popen(
        [sys.executable, "-c", leave_one],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    left = int(leader.communicate()[0])
    server = servers.ServerProcess("s", "http://127.0.0.1:1", leader, tmp_path / "s.log")
    try:
        assert os.getsid(left) == leader.pid and os.getpgid(left) != leader.pid
        assert servers.session_members(leader.pid) == [left]
        assert servers.reap_session(server) == 1
        for _ in range(200):  # dead at once; whoever adopted the orphan reaps it soon after
            if process_state(left) in ("Z", "X", "gone"):
                break
            time.sleep(0.05)
        assert process_state(left) in ("Z", "X", "gone")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(left, signal.SIGKILL)


def test_reap_session_leaves_a_running_server_alone(tmp_path):
    running = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        with pytest.raises(RuntimeError, match="still runs"):
            servers.reap_session(
                servers.ServerProcess("r", "http://127.0.0.1:1", running, tmp_path / "r.log")
            )
    finally:
        running.kill()
        running.wait()
    assert (
        servers.reap_session(servers.ServerProcess("r", "http://127.0.0.1:1", running, tmp_path / "r.log"))
        == 0
    )


def test_servers_start_from_this_checkout():
    # `python -m pagedchat` runs whatever `pagedchat` the working directory holds: it must be this tree's
    assert (servers.REPO_ROOT / "pagedchat" / "__main__.py").is_file()
    assert (servers.REPO_ROOT / "bench" / "common" / "servers.py").samefile(servers.__file__)


def test_engine_env_maps_config_to_server_variables():
    env = servers.engine_env(EngineConfig(model="/m", kv_cache_bytes=1024, enable_prefix_caching=False))
    assert env["PAGEDCHAT_MODEL"] == "/m" and env["PAGEDCHAT_KV_CACHE_BYTES"] == "1024"
    assert env["PAGEDCHAT_ENABLE_PREFIX_CACHING"] == "0" and env["PAGEDCHAT_BLOCK_SIZE"] == "16"
    assert "PAGEDCHAT_MAX_MODEL_LEN" not in env  # None: the server's own default
    assert 0 < servers.free_port() < 65536


def test_a_baseline_given_by_url_is_named_after_its_models_entry():
    assert servers.baseline_name({"id": "m.gguf", "owned_by": "llamacpp"}) == "llama.cpp"
    assert servers.baseline_name({"id": "m"}) == "baseline"
