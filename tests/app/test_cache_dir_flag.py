"""`pagedchat serve --cache-dir` moves everything its help names: the models and compiled kernels as well as the
database, secret key and KV tier (they used to follow only $PAGEDCHAT_CACHE_DIR)."""

from __future__ import annotations

from pathlib import Path

import app.cli as cli
import engine.native.build as build
from engine.core.paths import CACHE_DIR_ENV
from engine.loading.provision import provisioned_path
from engine.native.stream import SOURCE as STREAM_SOURCE


def test_serve_cache_dir_flag_moves_models_and_kernels_too(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "from-the-variable"))  # the flag wins over it
    monkeypatch.setattr(build, "_loaded", {})  # this process may have loaded the library already
    monkeypatch.setattr(cli, "fetch_model", lambda config: None)
    monkeypatch.setattr(cli, "configure_logging", lambda level: None)
    seen: dict[str, Path] = {}

    def run(settings) -> int:
        seen["database"] = Path(settings.resolved_database_url.removeprefix("sqlite:///"))
        seen["kv"] = Path(settings.engine_config().kv_disk_dir)
        seen["model"] = provisioned_path()
        assert build.load_library(STREAM_SOURCE) is not None, "a C compiler is needed to build the kernels"
        return 0

    monkeypatch.setattr(cli, "run", run)
    chosen = tmp_path / "chosen"
    assert cli.serve_main(["--cache-dir", str(chosen)]) == 0

    assert seen["database"] == chosen / "pagedchat.db"
    assert seen["kv"] == chosen / "kv"
    assert seen["model"] == chosen / "models" / "smollm2-135m-instruct"
    assert [p.name.split("_")[0] for p in (chosen / "kernels").glob("*.so")] == ["stream"]
    assert not (tmp_path / "from-the-variable").exists()
