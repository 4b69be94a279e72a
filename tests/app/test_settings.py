"""Settings from PAGEDCHAT_* variables, CLI flags over them (every engine field has both), the cookie secret."""

from __future__ import annotations

import argparse
import dataclasses
import stat

import pytest

from app.cli import build_parser
from app.settings import Settings, ensure_secret_key, load_settings, settings_from_env
from bench.common.servers import engine_env
from engine.cli import build_parser as build_engine_parser
from engine.cli import config_from_args
from engine.core.config import EngineConfig
from engine.core.options import given_options, options


def test_environment_is_parsed_into_typed_fields():
    settings = settings_from_env(
        {
            "PAGEDCHAT_PORT": "9001",
            "PAGEDCHAT_API_KEYS": "sk-a, sk-b,",
            "PAGEDCHAT_ENABLE_PREFIX_CACHING": "0",
            "PAGEDCHAT_KV_CACHE_BYTES": "1e9",
            "PAGEDCHAT_MAX_MODEL_LEN": "auto",
            "PAGEDCHAT_REQUEST_TIMEOUT_S": "2.5",
            "PAGEDCHAT_BLOCK_SIZE": "32",
            "UNRELATED": "x",
        }
    )
    assert (settings.host, settings.port) == ("127.0.0.1", 9001)
    assert settings.api_keys == ("sk-a", "sk-b")
    assert settings.engine.enable_prefix_caching is False
    assert settings.engine.kv_cache_bytes == 1_000_000_000
    assert settings.engine.max_model_len is None
    assert settings.request_timeout_s == 2.5
    config = settings.engine_config()
    assert (config.block_size, config.kv_cache_bytes, config.enable_prefix_caching) == (
        32,
        1_000_000_000,
        False,
    )


def test_every_byte_count_of_the_service_takes_units():
    """A field named for bytes is declared a size, so that no byte-sized flag is left taking integers only."""
    sizes = {o.name for o in options(Settings) if o.is_size}
    assert sizes == {o.name for o in options(Settings) if "bytes" in o.name and o.kind is int}
    assert sizes == {
        "max_body_bytes",
        "ws_max_frame_bytes",
        "max_bytes_per_owner",
        "max_database_bytes",
        "max_attachment_bytes",
        "pdf_memory_bytes",
        "memory_budget_bytes",
    }
    settings = settings_from_env(
        {"PAGEDCHAT_MAX_DATABASE_BYTES": "512MiB", "PAGEDCHAT_KV_CACHE_BYTES": "1GB"}
    )
    assert (settings.max_database_bytes, settings.engine.kv_cache_bytes) == (512 * 2**20, 10**9)
    args = build_parser().parse_args(["--kv-cache-bytes", "90MiB", "--max-body-bytes", "2MiB"])
    assert (args.kv_cache_bytes, args.max_body_bytes) == (90 * 2**20, 2 * 2**20)


def test_flags_override_the_environment_and_only_when_given():
    args = build_parser().parse_args(
        ["--port", "8123", "--no-prefix-caching", "--api-key", "k1", "--api-key", "k2"]
    )
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    assert overrides == {"port": 8123, "enable_prefix_caching": False, "api_keys": ["k1", "k2"]}
    settings = settings_from_env({"PAGEDCHAT_PORT": "9001", "PAGEDCHAT_HOST": "0.0.0.0"}, port=8123)
    assert (settings.host, settings.port) == ("0.0.0.0", 8123)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PAGEDCHAT_PORT": "eighty"}, "PAGEDCHAT_PORT must be an integer, got 'eighty'"),
        (
            {"PAGEDCHAT_ENABLE_PREFIX_CACHING": "maybe"},
            "PAGEDCHAT_ENABLE_PREFIX_CACHING must be true or false (1/0, yes/no, on/off), got 'maybe'",
        ),
        ({"PAGEDCHAT_PORT": "70000"}, "port must be in [1, 65535], got 70000"),
        ({"PAGEDCHAT_MAX_QUEUED_REQUESTS": "-1"}, "max_queued_requests must be non-negative, got -1"),
        ({"PAGEDCHAT_BLOCK_SIZE": "big"}, "PAGEDCHAT_BLOCK_SIZE must be an integer, got 'big'"),
        (
            {"PAGEDCHAT_MEMORY_UTILIZATION": "most"},
            "PAGEDCHAT_MEMORY_UTILIZATION must be a number, got 'most'",
        ),
        ({"PAGEDCHAT_NUM_THREADS": "two"}, "PAGEDCHAT_NUM_THREADS must be an integer, got 'two'"),
        ({"PAGEDCHAT_DEVICE": "tpu"}, "device must be one of auto, cpu, cuda, got 'tpu'"),
        ({"PAGEDCHAT_BLOCK_SIZE": "24"}, "block_size must be one of 8, 16, 32, 64, 128, got 24"),
    ],
)
def test_bad_values_name_the_variable(env, message):
    with pytest.raises(ValueError) as error:
        settings_from_env(env)
    assert str(error.value) == message


def test_secret_key_is_generated_once_and_kept_private(tmp_path):
    first = load_settings({"PAGEDCHAT_CACHE_DIR": str(tmp_path)})
    second = load_settings({"PAGEDCHAT_CACHE_DIR": str(tmp_path)})
    assert len(first.secret_key) >= 40 and first.secret_key == second.secret_key
    assert stat.S_IMODE((tmp_path / "secret_key").stat().st_mode) == 0o600
    given = ensure_secret_key(
        settings_from_env({"PAGEDCHAT_SECRET_KEY": "mine", "PAGEDCHAT_CACHE_DIR": str(tmp_path)})
    )
    assert given.secret_key == "mine"


def test_the_kv_disk_tier_follows_the_service_cache_dir_unless_given_its_own(tmp_path):
    settings = settings_from_env({"PAGEDCHAT_CACHE_DIR": str(tmp_path)})
    assert settings.engine_config().kv_disk_dir == str(tmp_path / "kv")
    own = settings_from_env({"PAGEDCHAT_CACHE_DIR": str(tmp_path), "PAGEDCHAT_KV_DISK_DIR": "/srv/kv"})
    assert own.engine_config().kv_disk_dir == "/srv/kv"


def test_default_database_is_sqlite_in_the_cache_dir(tmp_path):
    settings = settings_from_env({"PAGEDCHAT_CACHE_DIR": str(tmp_path)})
    assert settings.resolved_database_url == f"sqlite:///{tmp_path / 'pagedchat.db'}"


ENGINE_FIELDS = [f.name for f in dataclasses.fields(EngineConfig)]
SERVICE_OPTIONS = [opt.name for opt in options(Settings)]


def _non_default_config() -> EngineConfig:
    """A config in which every field differs from its default."""
    return EngineConfig(
        model="/models/tiny",
        model_revision="v1.0",
        gguf_file="model-Q8_0.gguf",
        dtype="float32",
        device="cpu",
        quantization="gguf",
        int8_activations=True,
        batch_gemm="fp32",
        weight_layout="rows8",
        fused_decode=False,
        step_timing=True,
        attention_backend="torch",
        kv_cache_dtype="int8",
        block_size=32,
        memory_utilization=0.5,
        kv_cache_bytes=123_456,
        max_model_len=300,
        max_num_seqs=3,
        max_num_batched_tokens=64,
        enable_prefix_caching=False,
        copy_partial_blocks=False,
        prefix_cache_salt="tenant-7",
        kv_disk_bytes=2**30,
        kv_disk_dir="/var/cache/kv",
        kv_disk_key_file="/var/lib/pagedchat/kv-tier.key",
        guided_mask_max_s=0.02,
        guided_mask_budget_s=3.0,
        speculative_method="draft",
        num_speculative_tokens=7,
        ngram_min=3,
        ngram_max=5,
        speculative_model="/models/draft.gguf",
        seed=11,
        num_threads=2,
    )


def test_the_non_default_config_covers_every_engine_field():
    config, default = _non_default_config(), EngineConfig()
    assert [n for n in ENGINE_FIELDS if getattr(config, n) == getattr(default, n)] == []


@pytest.mark.parametrize("argv", [[], ["generate", "hi"], ["chat"]])
def test_every_engine_field_has_a_flag_in_serve_generate_and_chat(argv):
    parser = build_parser() if not argv else build_engine_parser()
    dests = set(vars(parser.parse_args(argv)))
    assert set(ENGINE_FIELDS) <= dests
    if not argv:
        assert set(SERVICE_OPTIONS) <= dests


def test_every_engine_field_and_setting_has_an_environment_variable():
    config = _non_default_config()
    env = engine_env(config)
    assert sorted(env) == sorted("PAGEDCHAT_" + n.upper() for n in ENGINE_FIELDS)
    assert settings_from_env(env).engine == config  # what the benchmarks' servers are started with
    service = {opt.name: opt.env_var for opt in options(Settings)}
    assert (
        service["max_body_bytes"] == "PAGEDCHAT_MAX_BODY_BYTES"
        and service["api_keys"] == "PAGEDCHAT_API_KEYS"
    )
    assert settings_from_env({"PAGEDCHAT_API_KEY": "solo"}).api_keys == ("solo",)
    assert settings_from_env({"PAGEDCHAT_API_KEYS": "a,b", "PAGEDCHAT_API_KEY": "solo"}).api_keys == (
        "a",
        "b",
    )


def test_generate_flags_build_the_engine_config():
    args = build_engine_parser().parse_args(
        ["generate", "hi", "--no-prefix-caching", "--attention-backend", "torch", "--num-threads", "2"]
    )
    assert config_from_args(args) == EngineConfig(
        attention_backend="torch", num_threads=2, enable_prefix_caching=False
    )
    assert config_from_args(build_engine_parser().parse_args(["chat"])) == EngineConfig()
    with pytest.raises(SystemExit):
        build_engine_parser().parse_args(["chat", "--block-size", "24"])


def test_serve_flags_reach_the_settings_and_the_engine():
    args = build_parser().parse_args(
        ["--api-key", "k1", "--api-key", "k2", "--block-size", "32", "--prefix-caching", "--no-cookie-secure"]
    )
    env = {"PAGEDCHAT_ENABLE_PREFIX_CACHING": "0", "PAGEDCHAT_COOKIE_SECURE": "1", "PAGEDCHAT_PORT": "9001"}
    settings = settings_from_env(env, **given_options(args, Settings), **given_options(args, EngineConfig))
    assert (settings.api_keys, settings.cookie_secure, settings.port) == (("k1", "k2"), False, 9001)
    assert (settings.engine.block_size, settings.engine.enable_prefix_caching) == (32, True)
    assert settings.model == settings.engine.model == EngineConfig().model


def test_every_serve_flag_has_help_and_a_group():
    parser = build_parser()
    groups = {g.title: [a.dest for a in g._group_actions] for g in parser._action_groups if g._group_actions}
    assert list(groups) == [
        "options",
        "server",
        "accounts",
        "model",
        "engine",
        "cache",
        "limits",
        "speculative",
        "advanced",
    ]
    assert groups["options"] == ["help"]  # every other flag is in a named group
    flags = [a for a in parser._actions if a.dest != "help"]
    assert sorted(a.dest for a in flags) == sorted(ENGINE_FIELDS + SERVICE_OPTIONS)
    assert [a.dest for a in flags if not a.help or a.help == argparse.SUPPRESS] == []
    assert {"host", "port"} <= set(groups["server"]) and {"auth", "api_keys"} <= set(groups["accounts"])
    internals = {
        "batch_gemm",
        "fused_decode",
        "step_timing",
        "guided_mask_max_s",
        "guided_mask_budget_s",
        "block_size",
    }
    assert internals <= set(groups["advanced"])
    text = parser.format_help()
    assert "PAGEDCHAT_ENABLE_PREFIX_CACHING" in text
    assert (
        text.index("--port PORT") < text.index("--model MODEL") < text.index("--batch-gemm")
    )  # advanced: last


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_every_generate_and_chat_flag_has_help(command):
    [subcommands] = [
        a.choices for a in build_engine_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ]
    actions = subcommands[command]._actions
    assert [a.dest for a in actions if not a.help or a.help == argparse.SUPPRESS] == []
