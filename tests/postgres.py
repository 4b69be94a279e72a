"""A throwaway PostgreSQL server for the tests: Debian's server binaries (`postgresql` package), `initdb` into a
temporary directory, `postgres` listening on 127.0.0.1 only (and a socket in that directory), stopped and deleted
after the session.

PostgreSQL refuses to run as root, so under root the server runs as an unprivileged user (`pagedchat-test`, which
scripts/setup_test_deps.sh creates, else `nobody`). It dies with the test process (PR_SET_PDEATHSIG) even when that
is killed. Tests connect as `pagedchat`, a role that is not a superuser and owns the databases it is given: the
migrations must work with no more rights than a deployment's own database gives. `PostgresUnavailable` says why no
server could be had (the tests skip with that reason); anything else going wrong is an error.
"""

from __future__ import annotations

import ctypes
import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BIN_DIRS = "/usr/lib/postgresql/*/bin"  # Debian's layout: one folder per major version
UNPRIVILEGED_USERS = ("pagedchat-test", "nobody")
APP_ROLE = "pagedchat"
START_TIMEOUT_S = 30.0
# a test server: nothing is kept after the session, so durability is off; small and quiet
SERVER_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "32MB",
    "max_connections": "60",
    "log_min_messages": "warning",
    "logging_collector": "off",
}
_PR_SET_PDEATHSIG = 1


class PostgresUnavailable(Exception):
    """No PostgreSQL server can be started here (no binaries, no psycopg, no unprivileged user)."""


def find_bin_dir() -> Path | None:
    """The newest installed server's bin folder (Debian's layout, else where `initdb` on PATH leads), or None."""

    def usable(path: Path) -> bool:
        return (path / "initdb").is_file() and (path / "postgres").is_file()

    def major(path: Path) -> int:
        return int(path.parent.name) if path.parent.name.isdigit() else 0

    debian = sorted((Path(p) for p in glob.glob(BIN_DIRS) if usable(Path(p))), key=major)
    if debian:
        return debian[-1]
    on_path = shutil.which("initdb")
    return Path(on_path).resolve().parent if on_path and usable(Path(on_path).resolve().parent) else None


def remove_stale_dirs(max_age_s: float = 3600.0) -> None:
    """Delete the directories of test servers whose test process was killed (their server died with it) once they
    are an hour old; a directory whose server still runs (another test session's) is left alone."""
    for path in Path(tempfile.gettempdir()).glob("pagedchat-pg-*"):
        try:
            if time.time() - path.stat().st_mtime < max_age_s:
                continue
            pid_file = path / "data" / "postmaster.pid"
            if pid_file.is_file() and Path(f"/proc/{pid_file.read_text().split()[0]}").exists():
                continue
        except (OSError, IndexError):
            continue
        shutil.rmtree(path, ignore_errors=True)


def _run_as() -> pwd.struct_passwd | None:
    """The account the server runs as: None (this one) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in UNPRIVILEGED_USERS:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise PostgresUnavailable(
        f"running as root and none of the unprivileged users {UNPRIVILEGED_USERS} exists to run PostgreSQL "
        "(scripts/setup_test_deps.sh creates pagedchat-test)"
    )


def _die_with_parent() -> None:
    # runs in the child after it switched user (the death signal would be cleared by the switch otherwise):
    # SIGQUIT is PostgreSQL's immediate shutdown
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGQUIT)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class PostgresServer:
    """A running server; `url(name)` is a SQLAlchemy URL of database `name` as the app role."""

    bin_dir: Path
    root: Path  # data/, the socket, the log
    port: int
    password: str
    process: subprocess.Popen[bytes]
    _num_databases: int = field(default=0)

    @property
    def version(self) -> str:
        return self.bin_dir.parent.name

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{APP_ROLE}:{self.password}@127.0.0.1:{self.port}/{database}"

    def admin(self) -> Any:
        """A psycopg connection as the superuser (autocommit), over the server's socket."""
        import psycopg

        return psycopg.connect(
            host=str(self.root), port=self.port, user="postgres", dbname="postgres", autocommit=True
        )

    def query(self, database: str, sql: str) -> list[tuple[Any, ...]]:
        """The rows of `sql` run on `database` as the superuser."""
        import psycopg

        with psycopg.connect(host=str(self.root), port=self.port, user="postgres", dbname=database) as conn:
            return conn.execute(sql).fetchall()

    def create_database(self, template: str | None = None) -> str:
        """A new empty database (or a copy of `template`) owned by the app role; its name."""
        self._num_databases += 1
        name = f"test_{self._num_databases}_{secrets.token_hex(3)}"
        # FILE_COPY: a copy of the files, 10 times faster than the default WAL_LOG for a small database (fsync off)
        copy = f" TEMPLATE {template} STRATEGY FILE_COPY" if template else ""
        with self.admin() as conn:
            conn.execute(f"CREATE DATABASE {name} OWNER {APP_ROLE}{copy}")
        return name

    def drop_database(self, name: str) -> None:
        """Drop a database, ending any connection left on it."""
        with self.admin() as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then delete the data directory."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        path = self.root / "server.log"
        return path.read_text(errors="replace") if path.is_file() else ""


def start_postgres() -> PostgresServer:
    """initdb and start a server; PostgresUnavailable when this machine cannot run one."""
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        raise PostgresUnavailable("psycopg is not installed (pip install -e '.[postgres]')") from exc
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise PostgresUnavailable(
            f"no PostgreSQL server binaries ({BIN_DIRS} or initdb on PATH): scripts/setup_test_deps.sh installs "
            "Debian's postgresql package"
        )
    user = _run_as()
    remove_stale_dirs()
    # not under pytest's tmp dirs: those are private to root, and the server's user must reach its directory
    root = Path(tempfile.mkdtemp(prefix="pagedchat-pg-"))
    as_user: dict[str, Any] = {}
    if user is not None:
        os.chown(root, user.pw_uid, user.pw_gid)
        as_user = dict(user=user.pw_uid, group=user.pw_gid, extra_groups=[])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8", "HOME": str(root)}
    password = secrets.token_urlsafe(16)
    try:
        pwfile = root / "pwfile"
        pwfile.write_text(password + "\n")
        if user is not None:
            os.chown(pwfile, user.pw_uid, user.pw_gid)
        initdb = [str(bin_dir / "initdb"), "-D", str(root / "data"), "-U", "postgres", "-E", "UTF8"]
        initdb += ["--locale=C.UTF-8", "--no-sync", "--no-instructions", "--auth-local=trust"]
        initdb += ["--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
        done = subprocess.run(
            initdb, env=env, capture_output=True, text=True, timeout=120, check=False, **as_user
        )
        pwfile.unlink()
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}): {done.stdout}\n{done.stderr}")
        server = _start(bin_dir, root, env, as_user, password)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        with server.admin() as conn:
            conn.execute(f"CREATE ROLE {APP_ROLE} LOGIN PASSWORD '{password}'")
    except BaseException:
        server.stop()
        raise
    return server


def _start(
    bin_dir: Path, root: Path, env: dict[str, str], as_user: dict[str, Any], password: str
) -> PostgresServer:
    settings = {**SERVER_SETTINGS, "unix_socket_directories": str(root)}
    for _attempt in range(3):  # a free port may be taken between the probe and the bind
        port = _free_port()
        command = [str(bin_dir / "postgres"), "-D", str(root / "data"), "-p", str(port)]
        command += [arg for key, value in settings.items() for arg in ("-c", f"{key}={value}")]
        with open(root / "server.log", "ab") as log:
            process = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
                **as_user,
            )
        server = PostgresServer(bin_dir, root, port, password, process)
        if _wait_ready(server):
            return server
        server.process.kill()
        server.process.wait()
        if "could not bind" not in server.log():
            break
    raise RuntimeError(f"PostgreSQL did not start:\n{server.log()[-3000:]}")


def _wait_ready(server: PostgresServer) -> bool:
    import psycopg

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return False
        try:
            server.admin().close()
            return True
        except psycopg.OperationalError:
            time.sleep(0.05)
    return False
