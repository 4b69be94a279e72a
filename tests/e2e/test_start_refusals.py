"""A port in use and a database schema newer than the code are refused before the model loads (they used to fail
after it, tens of seconds into the start, the newer schema with Alembic's traceback): one `cannot start:` line and
exit status 3, as the start's other refusals."""

from __future__ import annotations

import socket
import sqlite3

from bench.common.servers import free_port
from tests.e2e.conftest import Server, server_env, spawn_server

REFUSED = 3  # uvicorn's status for a failed start, as a `cannot start:` refusal of the lifespan
LOADING = "Waiting for application startup."  # uvicorn's line before the lifespan (which loads the model)


def spawn(tmp_path, tiny_model, port: int | None = None) -> Server:
    return spawn_server(tmp_path, server_env(tmp_path, tiny_model), port=port)


def test_a_port_in_use_is_refused_in_one_line_before_the_model_loads(tmp_path, tiny_model):
    port = free_port()
    with socket.socket() as other:  # another process's listener on the port
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(("127.0.0.1", port))
        other.listen()
        server = spawn(tmp_path, tiny_model, port=port)
        returncode = server.process.wait(timeout=60)
    log = server.log()
    assert returncode == REFUSED, log
    assert f"cannot start: cannot listen on 127.0.0.1:{port}: Address already in use" in log, log
    assert LOADING not in log and "engine ready" not in log and "Traceback" not in log, log


def test_a_newer_database_schema_is_refused_in_one_line_before_the_model_loads(tmp_path, tiny_model):
    from app.db.database import create_db_engine, upgrade_to_head

    engine = create_db_engine(f"sqlite:///{tmp_path / 'chat.db'}")
    upgrade_to_head(engine)
    engine.dispose()
    with sqlite3.connect(tmp_path / "chat.db") as db:  # as a newer pagedchat would leave it
        head = db.execute("SELECT version_num FROM alembic_version").fetchone()[0]
        db.execute("UPDATE alembic_version SET version_num = '9999'")
    server = spawn(tmp_path, tiny_model)
    returncode = server.process.wait(timeout=60)
    log = server.log()
    assert returncode == REFUSED, log
    assert (
        f"cannot start: the database schema is at revision 9999, newer than this code (its newest is {head})"
    ) in log, log
    assert "engine ready" not in log and "Traceback" not in log and "Can't locate revision" not in log, log
    with sqlite3.connect(tmp_path / "chat.db") as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [("9999",)]
