"""Sampling defaults: request > server flag > model generation config > built-in; the CLI and provisioning."""

from __future__ import annotations

import json

import pytest
from transformers import GenerationConfig

from engine.cli import build_parser, sampling_params_from_args
from engine.core.sampling_defaults import (
    BUILTIN,
    SamplingDefaults,
    default_sources,
    effective_defaults,
    from_generation_config,
)
from engine.loading import provision
from engine.loading.loader import load_generation_config
from engine.loading.provision import CARD_SAMPLING, MARKER_FILE, provision_default_model, provisioned_path


def test_builtin_is_sampling_params_own_defaults():
    assert BUILTIN.given() == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "repetition_penalty": 1.0}


def test_server_wins_over_model_which_wins_over_builtin():
    server = SamplingDefaults(temperature=0.5)
    model = SamplingDefaults(temperature=0.2, top_p=0.9)
    assert effective_defaults(server, model) == SamplingDefaults(
        temperature=0.5, top_p=0.9, top_k=0, repetition_penalty=1.0
    )
    assert default_sources(server, model) == {
        "temperature": "server",
        "top_p": "model",
        "top_k": "built-in",
        "repetition_penalty": "built-in",
    }
    assert effective_defaults(SamplingDefaults(), SamplingDefaults()) == BUILTIN


def test_bad_defaults_raise_naming_the_field():
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\], got 1.5"):
        SamplingDefaults(top_p=1.5)
    with pytest.raises(ValueError, match="top_k must be -1, 0"):
        SamplingDefaults(top_k=-3)


def test_generation_config_sets_only_what_it_says(caplog):
    assert from_generation_config(None) == SamplingDefaults()
    config = GenerationConfig(do_sample=True, temperature=0.7, top_k=20, repetition_penalty=1.05)
    assert from_generation_config(config) == SamplingDefaults(
        temperature=0.7, top_k=20, repetition_penalty=1.05
    )
    # a value SamplingParams refuses is left out with a warning, the others still apply
    config = GenerationConfig(do_sample=True, temperature=0.7, top_p=0.0)
    assert from_generation_config(config) == SamplingDefaults(temperature=0.7)
    assert "ignoring top_p=0.0" in caplog.text


def test_model_folder_generation_config_is_read(tmp_path):
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"do_sample": True, "top_p": 0.8, "top_k": 40})
    )
    assert from_generation_config(load_generation_config(tmp_path)) == SamplingDefaults(top_p=0.8, top_k=40)
    assert load_generation_config(tmp_path / "model.gguf") is None  # a GGUF file alone: built-in defaults


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], (0.2, 0.9, 0, 1.0)),  # the model's, then built-in
        (["--temperature", "0", "--top-k", "5"], (0.0, 0.9, 5, 1.0)),
        (["--repetition-penalty", "1.3", "--top-p", "0.5"], (0.2, 0.5, 0, 1.3)),
    ],
)
def test_cli_flags_win_over_the_model(flags, expected):
    args = build_parser().parse_args(["chat", *flags, "--max-tokens", "7"])
    params = sampling_params_from_args(args, SamplingDefaults(temperature=0.2, top_p=0.9))
    assert (params.temperature, params.top_p, params.top_k, params.repetition_penalty) == expected
    assert params.max_tokens == 7


def _fake_provisioned(tmp_path, monkeypatch, generation_config: dict | None):
    monkeypatch.setenv("PAGEDCHAT_CACHE_DIR", str(tmp_path))
    folder = provisioned_path()
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / MARKER_FILE).write_text(json.dumps({"gguf_file": "x.gguf"}))
    if generation_config is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation_config))
    return folder


def test_an_existing_provisioned_folder_gets_the_card_sampling_once(tmp_path, monkeypatch):
    folder = _fake_provisioned(tmp_path, monkeypatch, {"bos_token_id": 1, "eos_token_id": 2})
    assert provision_default_model() == folder
    written = json.loads((folder / "generation_config.json").read_text())
    assert written == {"bos_token_id": 1, "eos_token_id": 2, **CARD_SAMPLING}
    assert json.loads((folder / MARKER_FILE).read_text())["sampling_defaults"] == CARD_SAMPLING
    assert from_generation_config(load_generation_config(folder)) == SamplingDefaults(
        temperature=0.2, top_p=0.9
    )
    # an operator's later edit stays: the marker says the card's values were written once already
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.6}))
    provision_default_model()
    assert json.loads((folder / "generation_config.json").read_text()) == {"temperature": 0.6}
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "generation_config.json", MARKER_FILE]


def test_a_folder_without_generation_config_gets_one(tmp_path, monkeypatch):
    folder = _fake_provisioned(tmp_path, monkeypatch, None)
    provision_default_model()
    assert json.loads((folder / "generation_config.json").read_text()) == CARD_SAMPLING


def test_a_read_only_cache_still_serves(tmp_path, monkeypatch, caplog):
    folder = _fake_provisioned(tmp_path, monkeypatch, {})

    def refuse(path, value):
        raise PermissionError(f"read-only: {path}")

    monkeypatch.setattr(provision, "_write_json", refuse)
    assert provision_default_model() == folder
    assert "cannot write the model card's sampling defaults" in caplog.text
    assert json.loads((folder / "generation_config.json").read_text()) == {}
