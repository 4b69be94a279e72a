"""What the service keeps on disk beside its data is private: a new SQLite database and its -wal and -shm files are
0600, a looser existing mode is warned about (not changed), and the disk tier's MAC key goes beside the database."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

from sqlalchemy import text

from app.db.database import create_db_engine, upgrade_to_head
from app.settings import settings_from_values


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_database_and_its_wal_and_shm_are_0600(tmp_path):
    path = tmp_path / "chat.db"
    engine = create_db_engine(f"sqlite:///{path}")
    upgrade_to_head(engine)
    with engine.connect() as conn:  # open: the -wal and -shm files are there
        conn.execute(text("SELECT count(*) FROM messages")).all()
        files = sorted(tmp_path.iterdir())
        assert [f.name for f in files] == ["chat.db", "chat.db-shm", "chat.db-wal"]
        assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}
    engine.dispose()


def test_a_looser_existing_database_is_warned_about_and_left_as_it_is(tmp_path, caplog):
    path = tmp_path / "chat.db"
    create_db_engine(f"sqlite:///{path}").dispose()
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="app.db.database"):
        create_db_engine(f"sqlite:///{path}").dispose()
    assert f"database file {path} has mode 644: other users of this machine can read" in caplog.text
    assert mode(path) == 0o644
    caplog.clear()
    path.chmod(0o600)
    with caplog.at_level(logging.WARNING, logger="app.db.database"):
        create_db_engine(f"sqlite:///{path}").dispose()
    assert caplog.text == ""


def test_in_memory_databases_make_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for url in ("sqlite://", "sqlite:///:memory:"):
        create_db_engine(url).dispose()
    assert list(tmp_path.iterdir()) == []


def test_the_tier_key_goes_beside_a_sqlite_database_else_in_the_cache_dir(tmp_path):
    beside = settings_from_values({"database_url": f"sqlite:///{tmp_path}/data/chat.db"})
    assert beside.engine_config().kv_disk_key_file == str(tmp_path / "data" / "kv-tier.key")
    default = settings_from_values(
        {"cache_dir": str(tmp_path / "cache")}
    )  # its database: <cache dir>/pagedchat.db
    assert default.engine_config().kv_disk_key_file == str(tmp_path / "cache" / "kv-tier.key")
    postgres = settings_from_values(
        {"database_url": "postgresql://u@db/chat", "cache_dir": str(tmp_path / "c")}
    )
    assert postgres.engine_config().kv_disk_key_file == str(tmp_path / "c" / "kv-tier.key")
    chosen = settings_from_values({"kv_disk_key_file": "/secrets/kv.key"})
    assert chosen.engine_config().kv_disk_key_file == "/secrets/kv.key"
