"""Settings from PAGEDCHAT_* variables, CLI flags over them, and the persisted cookie secret."""

from __future__ import annotations

import stat

import pytest

from app.cli import build_parser
from app.settings import ensure_secret_key, load_settings, settings_from_env


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
    assert settings.enable_prefix_caching is False
    assert settings.kv_cache_bytes == 1_000_000_000
    assert settings.max_model_len is None
    assert settings.request_timeout_s == 2.5
    config = settings.engine_config()
    assert (config.block_size, config.kv_cache_bytes, config.enable_prefix_caching) == (
        32,
        1_000_000_000,
        False,
    )


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


def test_default_database_is_sqlite_in_the_cache_dir(tmp_path):
    settings = settings_from_env({"PAGEDCHAT_CACHE_DIR": str(tmp_path)})
    assert settings.resolved_database_url == f"sqlite:///{tmp_path / 'pagedchat.db'}"
