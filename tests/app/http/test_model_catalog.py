"""Which models a server serves: `--model` repeated, NAME=MODEL aliases, `--models-dir`, and the refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli import build_parser, repeated_models, serve_main
from app.http import model_catalog
from app.http.model_catalog import (
    ModelEntry,
    model_entries,
    scan_models_dir,
    weight_file_bytes,
    weights_written_at,
)
from app.settings import Settings, settings_from_env, split_alias
from engine.core.options import given_options


def _settings(argv: list[str]) -> Settings:
    from engine.core.config import EngineConfig

    args = build_parser().parse_args(repeated_models(argv))
    return settings_from_env({}, **given_options(args, Settings), **given_options(args, EngineConfig))


def _gguf(path: Path, size: int = 10) -> Path:
    path.write_bytes(b"GGUF" + b"\0" * (size - 4))
    return path


def test_a_repeated_model_flag_serves_each_and_an_alias_names_it(tmp_path):
    first, second = _gguf(tmp_path / "a.gguf"), _gguf(tmp_path / "b.gguf", 20)
    settings = _settings(["--model", f"fast={first}", "--model", str(second), f"--model=coder={second}"])
    assert settings.engine.model == str(first) and settings.served_model_name == "fast"
    assert settings.models == (str(second), f"coder={second}")
    assert model_entries(settings) == (
        ModelEntry("fast", str(first)),
        ModelEntry("b.gguf", str(second)),
        ModelEntry("coder", str(second)),
    )
    assert weight_file_bytes(str(second)) == 20


def test_the_variables_say_the_same(tmp_path):
    first = _gguf(tmp_path / "a.gguf")
    settings = settings_from_env(
        {"PAGEDCHAT_MODEL": f"small={first}", "PAGEDCHAT_MODELS": "big=org/big,org/other"}
    )
    assert [e.name for e in model_entries(settings)] == ["small", "big", "org/other"]


def test_an_alias_needs_a_plain_name_and_an_existing_path_is_never_split(tmp_path):
    odd = _gguf(tmp_path / "x=y.gguf")
    assert split_alias(str(odd)) == (None, str(odd))
    assert split_alias("org/name=x") == (None, "org/name=x")  # a name holds no slash
    assert split_alias("q4=org/name") == ("q4", "org/name")


def test_a_missing_model_file_is_refused_and_a_hub_id_is_not_checked(tmp_path):
    with pytest.raises(ValueError, match=r"model '/no/such.gguf' does not exist"):
        model_entries(_settings(["--model", str(_gguf(tmp_path / "a.gguf")), "--model", "/no/such.gguf"]))
    settings = _settings(["--model", str(_gguf(tmp_path / "b.gguf")), "--model", "org/name"])
    assert [e.name for e in model_entries(settings)] == ["b.gguf", "org/name"]


def test_the_first_model_named_twice_is_refused():
    with pytest.raises(ValueError, match="the first model is named twice: served_model_name 'foo' and 'bar'"):
        settings_from_env({}, model="bar=org/x", served_model_name="foo")


def test_a_models_dir_holding_the_default_model_serves_it_once(tmp_path):
    first = _gguf(tmp_path / "a.gguf")
    _gguf(tmp_path / "b.gguf")
    settings = _settings(["--model", str(first), "--models-dir", str(tmp_path)])
    assert [e.name for e in model_entries(settings)] == ["a.gguf", "b.gguf"]


def test_two_models_of_one_id_are_refused_with_both_sources(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    settings = _settings(["--model", str(_gguf(one / "m.gguf")), "--model", str(_gguf(two / "m.gguf"))])
    with pytest.raises(
        ValueError, match=r"two models are served as 'm.gguf' .* give each its own name as NAME=MODEL"
    ):
        model_entries(settings)


def test_a_models_dir_serves_its_gguf_files_and_model_folders(tmp_path):
    _gguf(tmp_path / "small.gguf")
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\0" * 30)
    wrapped = tmp_path / "wrapped"
    wrapped.mkdir()
    _gguf(wrapped / "q4.gguf")
    (tmp_path / "notes.txt").write_text("not a model")
    (tmp_path / "empty").mkdir()
    assert scan_models_dir(tmp_path) == [
        ModelEntry("hf", str(folder)),
        ModelEntry("small.gguf", str(tmp_path / "small.gguf")),
        ModelEntry("wrapped", str(wrapped / "q4.gguf")),
    ]
    assert weight_file_bytes(str(folder)) == 30
    with pytest.raises(ValueError, match="is not a folder"):
        scan_models_dir(tmp_path / "missing")


def test_a_weight_file_removed_after_its_listing_is_left_out_instead_of_failing(tmp_path, monkeypatch):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "model-1.safetensors").write_bytes(b"x" * 10)
    (folder / "model-2.safetensors").write_bytes(b"x" * 20)
    listed = model_catalog.weight_files(str(folder))
    (folder / "model-2.safetensors").unlink()  # the model is being replaced on disk: /v1/models must not fail
    monkeypatch.setattr(model_catalog, "weight_files", lambda source: listed)
    assert weight_file_bytes(str(folder)) == 10
    assert weights_written_at(str(folder)) == int((folder / "model-1.safetensors").stat().st_mtime)
    (folder / "model-1.safetensors").unlink()
    assert weight_file_bytes(str(folder)) is None and weights_written_at(str(folder)) is None

    def folder_gone(source: str) -> list:
        raise FileNotFoundError(source)  # removed between its is_dir and its listing

    monkeypatch.setattr(model_catalog, "weight_files", folder_gone)
    assert weight_file_bytes(str(folder)) is None and weights_written_at(str(folder)) is None


def test_serve_refuses_a_bad_model_list_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PAGEDCHAT_CACHE_DIR", str(tmp_path))
    one = _gguf(tmp_path / "a.gguf")
    assert serve_main(["--model", f"x={one}", "--model", f"x={one}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pagedchat serve: two models are served as 'x'") and "Traceback" not in err
