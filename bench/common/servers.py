"""The one server harness of benchmarks and tests: `pagedchat serve` and the HF baseline as subprocesses on free
loopback ports, with their logs, a readiness wait and a graceful or hard stop; the model a running server serves."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from engine.core.config import EngineConfig
from engine.core.options import to_env

READY_TIMEOUT_S = 600.0  # the first start may provision the default model
REPO_ROOT = Path(__file__).resolve().parents[2]  # servers run from here, so `-m pagedchat` is this checkout's
ROUTINGS = ("kv", "round-robin", "least-loaded")  # `pagedchat serve --routing`
logger = logging.getLogger(__name__)

# starts a server: (command, environment, working directory, log file) -> a subprocess.Popen, or a handle with its
# pid, returncode, poll, wait, send_signal and kill
Launcher = Callable[[list[str], dict[str, str], Path, Path], "subprocess.Popen"]
# what spawn_pagedchat starts servers with when its caller names no launcher (None: subprocess.Popen); the test suite
# sets its zygote's here for the benchmarks it runs
default_launcher: Launcher | None = None


@dataclass
class ServerProcess:
    """A server subprocess, where to reach it, the file its output goes to and (pagedchat) its SQLite database."""

    name: str
    base_url: str
    process: subprocess.Popen  # or a launcher's handle with the same methods (see Launcher)
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    db_path: Path | None = None

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])

    @property
    def ws_url(self) -> str:
        return "ws" + self.base_url.removeprefix("http")

    def log(self) -> str:
        """Everything the server has written so far (servers restarted under one name share the file)."""
        try:
            return self.log_path.read_text(errors="replace")
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


def cluster_args(
    replicas: int, routing: str = "kv", threads_per_replica: int = 0, ray_address: str = ""
) -> tuple[str, ...]:
    """The `pagedchat serve` flags of a replica set (issue #19); none for one plain process (1 replica, no Ray).

    `threads_per_replica` 0: the engine's own thread setting; `ray_address` "local": a local Ray on loopback.
    """
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    if threads_per_replica < 0:
        raise ValueError(
            f"threads per replica must be 0 (the engine's own) or more, got {threads_per_replica}"
        )
    if replicas == 1 and not ray_address:
        return ()
    args = ["--replicas", str(replicas), "--routing", routing]
    if threads_per_replica:
        args += ["--threads-per-replica", str(threads_per_replica)]
    if ray_address:
        args += ["--ray-address", ray_address]
    return tuple(args)


def start_pagedchat(
    name: str,
    config: EngineConfig,
    log_dir: Path,
    extra_env: dict[str, str] | None = None,
    serve_args: tuple[str, ...] = (),
) -> ServerProcess:
    """`pagedchat serve` with this engine config on a free loopback port, its own database in `log_dir`, and its own
    KV disk tier `log_dir/<name>.kv` unless the config or `extra_env` names one (no blocks from other runs, no
    directory lock shared with another server; started again under the same name, it keeps its tier).

    `serve_args`: more `pagedchat serve` flags, e.g. `cluster_args(...)`.
    """
    env = {**engine_env(config), **(extra_env or {}), "PAGEDCHAT_LOG_LEVEL": "warning"}
    if not env.get("PAGEDCHAT_KV_DISK_DIR"):  # an unset kv_disk_dir reaches the environment as ""
        env["PAGEDCHAT_KV_DISK_DIR"] = str(log_dir / f"{name}.kv")
    if serve_args:
        return spawn_pagedchat(name, env, log_dir, command=("pagedchat", "serve", *serve_args))
    return spawn_pagedchat(name, env, log_dir)


def spawn_pagedchat(
    name: str,
    env: dict[str, str],
    log_dir: Path,
    *,
    db_path: Path | None = None,
    port: int | None = None,
    isolated: bool = False,
    server_type: type[ServerProcess] = ServerProcess,
    command: tuple[str, ...] = ("pagedchat", "serve"),
    database_url: str | None = None,
    launch: Launcher | None = None,
) -> ServerProcess:
    """`pagedchat serve` with `env` on 127.0.0.1:`port` (default: a free one), not waited for.

    `command` is the module (and its arguments) `python -m` runs: tests run the same server under a wrapper.
    `launch` starts the process instead of subprocess.Popen (the tests fork theirs from a process that has
    imported the server already: tests/e2e/zygote.py); it gets the command, the whole environment, the working
    directory and the log file.

    Its output is appended to `log_dir/<name>.log`, its database is `db_path` (default `log_dir/<name>.db`), or
    `database_url` when given (then `db_path` is None): a server started again under the same name keeps both.
    `isolated`: PAGEDCHAT_* variables of this process's own environment are not passed on, only `env`.
    """
    port = port or free_port()
    db_path = None if database_url else db_path or log_dir / f"{name}.db"
    # flags, not variables: they win over the environment, so the server listens on loopback whatever it holds
    cmd = [sys.executable, "-m", *command, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--database-url", database_url or f"sqlite:///{db_path}"]
    log_path = log_dir / f"{name}.log"
    launch = launch or default_launcher
    if launch is None:
        process = _popen(cmd, env, log_path, isolated)
    else:
        process = launch(cmd, _child_env(env, isolated), REPO_ROOT, log_path)
    return server_type(name, f"http://127.0.0.1:{port}", process, log_path, env, db_path)


def restart_pagedchat(
    server: ServerProcess, timeout_s: float = READY_TIMEOUT_S, stop_timeout_s: float = 60.0
) -> ServerProcess:
    """Stop `server` gracefully (SIGTERM: it ends its replies and writes its disk tier's queue) and start `pagedchat
    serve` again on the same port with the same variables, so the same database, cache and tier directories; ready.

    For servers `start_pagedchat` started (the plain command, this process's PAGEDCHAT_* variables passed on).
    """
    stop_server(server, timeout_s=stop_timeout_s)
    log_dir = server.log_path.parent
    again = spawn_pagedchat(server.name, server.env, log_dir, db_path=server.db_path, port=server.port)
    return wait_ready(again, timeout_s)


def start_hf_baseline(name: str, model: str, dtype: str, log_dir: Path) -> ServerProcess:
    """The one-request-at-a-time HF server (bench/common/hf_server.py) on a free loopback port."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "bench.common.hf_server",
        "--model",
        model,
        "--dtype",
        dtype,
        "--port",
        str(port),
    ]
    log_path = log_dir / f"{name}.log"
    return ServerProcess(name, f"http://127.0.0.1:{port}", _popen(cmd, {}, log_path, False), log_path)


def _child_env(env: dict[str, str], isolated: bool) -> dict[str, str]:
    """This process's environment (less its PAGEDCHAT_* variables if `isolated`) with `env` over it."""
    inherited = {k: v for k, v in os.environ.items() if not (isolated and k.startswith("PAGEDCHAT_"))}
    return {**inherited, **env}


def _popen(cmd: list[str], env: dict[str, str], log_path: Path, isolated: bool) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            cmd,
            env=_child_env(env, isolated),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            start_new_session=True,  # a Ctrl-C of the caller reaches it only through stop_server
        )


def _listening_inodes(port: int) -> set[str] | None:
    """Inodes of the TCP sockets listening on `port` (Linux: /proc/net/tcp and tcp6); None without /proc."""
    inodes: set[str] = set()
    tables = [Path("/proc/net/tcp"), Path("/proc/net/tcp6")]
    if not tables[0].exists():
        return None
    for table in tables:
        with contextlib.suppress(OSError):
            for line in table.read_text().splitlines()[1:]:
                fields = line.split()  # sl, local address:port (hex), remote, state (0A: LISTEN), ..., inode
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    return inodes


def listens_on(pid: int, port: int) -> bool | None:
    """Whether process `pid` holds a socket listening on `port`; None where this machine cannot tell (no /proc)."""
    inodes = _listening_inodes(port)
    if inodes is None:
        return None
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")  # socket:[inode]
            if target.startswith("socket:[") and target[len("socket:[") : -1] in inodes:
                return True
    return False


def wait_ready(server: ServerProcess, timeout_s: float = READY_TIMEOUT_S) -> ServerProcess:
    """Poll GET /health until our process answers 200; else kill the server and raise RuntimeError with its log."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise RuntimeError(
                    f"{server.name} exited with {server.process.returncode} before it was ready:\n"
                    f"{server.log()[-4000:]}"
                )
            with contextlib.suppress(httpx.HTTPError):
                # uvicorn binds its port only after the app's startup (the model load), so until then another
                # process's server may have taken the free port we chose and answer for us
                ok = client.get(server.base_url + "/health").status_code == 200
                if ok and listens_on(server.process.pid, server.port) is not False:
                    return server
            time.sleep(0.1)
    stop_server(server, signal.SIGKILL)
    raise RuntimeError(f"{server.name} was not ready after {timeout_s:.0f} s:\n{server.log()[-4000:]}")


def replicas_ready(health: dict, asked: int) -> bool:
    """Whether a 200 /health body shows `asked` engine replicas ready: a replica set's `replicas` section (issue
    #19) says so, and a plain process (no section) is one replica."""
    section = health.get("replicas")
    if section is None:
        return asked == 1 and health.get("status") == "ok"
    return health.get("status") == "ok" and int(section.get("ready", 0)) >= asked


def wait_replicas_ready(
    server: ServerProcess, asked: int, timeout_s: float = READY_TIMEOUT_S
) -> ServerProcess:
    """Poll GET /health until `asked` replicas are ready (a replica set answers 200 "degraded" before that); else
    kill the server and raise RuntimeError with the last answer and its log."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise RuntimeError(
                    f"{server.name} exited with {server.process.returncode} while its replicas started:\n"
                    f"{server.log()[-4000:]}"
                )
            with contextlib.suppress(httpx.HTTPError, ValueError):
                response = client.get(server.base_url + "/health")
                last = response.json()
                if response.status_code == 200 and replicas_ready(response.json(), asked):
                    return server
            time.sleep(0.25)
    stop_server(server, signal.SIGKILL)
    raise RuntimeError(
        f"{server.name}: {asked} replicas not ready after {timeout_s:.0f} s (last /health: {last}):\n"
        f"{server.log()[-4000:]}"
    )


def session_members(session_id: int) -> list[int]:
    """Pids of the processes in session `session_id` (Linux /proc; empty elsewhere)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (
                stat.read_text().rsplit(")", 1)[1].split()
            )  # after "(comm)": state, ppid, pgrp, session, ...
            if int(fields[3]) == session_id and fields[0] not in ("Z", "X"):
                members.append(int(stat.parent.name))
    return members


def reap_session(server: ServerProcess) -> int:
    """SIGKILL whatever is left of the server's session after it stopped (every server starts a session of its
    own, so its session id is its pid; a replica set's Ray processes and workers run in it, each worker in a
    process group of its own); the number of processes signalled.

    Only for servers that have exited: a running server's processes are its own business.
    """
    if server.process.poll() is None:
        raise RuntimeError(f"{server.name} still runs: stop it before reaping its session")
    left = session_members(server.process.pid)
    if left:
        logger.warning("%s left %d processes behind after it stopped: killing them", server.name, len(left))
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(left)


def stop_server(server: ServerProcess, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
    """Send `sig` (SIGTERM: graceful shutdown, SIGKILL: a crash) to this server only, SIGKILL after `timeout_s`;
    returns the exit code.

    After a graceful SIGTERM shutdown uvicorn re-raises the signal, so the code is -15: check the log for
    "Application shutdown complete." instead.
    """
    process = server.process
    if process.poll() is not None:
        return process.returncode
    process.send_signal(sig)
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait(10)


def served_model(base_url: str, api_key: str | None = None) -> dict:
    """The first entry of the server's GET /v1/models: `id` is the model to name in requests (llama.cpp ignores
    the request's, other servers may not), `owned_by` says whose server it is (llama.cpp's: "llamacpp")."""
    headers = {"Authorization": f"Bearer {api_key or 'bench'}", "Connection": "close"}
    response = httpx.get(base_url.rstrip("/") + "/v1/models", headers=headers, timeout=30.0)
    response.raise_for_status()
    models = response.json().get("data") or []
    if not models:
        raise RuntimeError(f"{base_url}/v1/models lists no model")
    return models[0]


def baseline_name(model_entry: dict) -> str:
    """The default name of a baseline given by URL, from its /v1/models entry: llama.cpp's says owned_by llamacpp."""
    return "llama.cpp" if model_entry.get("owned_by") == "llamacpp" else "baseline"


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
            stop_server(server, timeout_s=15.0)
            reap_session(server)
