"""The service's settings: one frozen dataclass, read once from PAGEDCHAT_* environment variables."""

from __future__ import annotations

import dataclasses
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.config import DEFAULT_MODEL, EngineConfig
from engine.core.paths import cache_dir

ENV_PREFIX = "PAGEDCHAT_"
_POSITIVE = (
    "max_body_bytes",
    "max_messages",
    "max_message_chars",
    "default_max_tokens",
    "ws_max_frame_bytes",
    "request_timeout_s",
    "flush_interval_s",
    "slow_reader_timeout_s",
)
_NON_NEGATIVE = (
    "max_queued_requests",
    "client_requests_per_minute",
    "client_max_streams",
    "db_busy_timeout_ms",
    "store_retry_s",
)
SECRET_KEY_FILE = "secret_key"


@dataclass(frozen=True)
class Settings:
    """Everything the server needs: where it listens, who may use it, its limits and every engine knob."""

    host: str = "127.0.0.1"
    port: int = 8000
    model: str = DEFAULT_MODEL
    database_url: str = ""  # empty: sqlite file under cache_dir
    api_keys: tuple[str, ...] = ()  # when set, required on /v1 and they identify session owners
    admin_token: str = ""  # empty: the admin surface answers loopback clients only
    secret_key: str = ""  # signs the browser cookie; load_settings() generates and persists one
    cache_dir: str = ""
    log_level: str = "info"
    # limits
    max_body_bytes: int = 1024 * 1024
    max_messages: int = 512  # messages in one /v1/chat/completions request
    max_message_chars: int = 200_000  # characters of one message or prompt
    max_queued_requests: int = 256  # requests allowed to wait beyond max_num_seqs before 503
    request_timeout_s: float = 600.0
    default_max_tokens: int = 512  # session turns whose settings do not say
    ws_max_frame_bytes: int = 256 * 1024
    flush_interval_s: float = 0.5
    allowed_origins: tuple[str, ...] = ()  # extra WebSocket origins besides the server's own
    cookie_secure: bool = False
    shutdown_grace_s: float = 10.0
    # per client (API key, else browser cookie, else address); 0 disables the limit
    # generation requests (chat turns, /v1 completions) per rolling minute
    client_requests_per_minute: int = 0
    client_max_streams: int = 0  # generation requests in flight at once
    slow_reader_timeout_s: float = 60.0  # a client that takes no data for this long is cut off (and aborted)
    # storage
    db_busy_timeout_ms: int = 5000  # how long one database call waits for a lock before it is "unavailable"
    # how long a finished reply keeps retrying its final write while the DB is down
    store_retry_s: float = 10.0
    # prefix-cache isolation: salt block hashes per tenant; None: on exactly when API keys are configured
    prefix_cache_isolation: bool | None = None
    # engine knobs (None: the engine's default)
    block_size: int = 16
    kv_cache_bytes: int | None = None
    memory_utilization: float = 0.9
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    dtype: str = "auto"
    device: str = "auto"
    attention_backend: str = "auto"
    seed: int = 0
    num_threads: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in [1, 65535], got {self.port}")
        for name in _POSITIVE:
            if not getattr(self, name) > 0:  # written so that NaN fails too
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in _NON_NEGATIVE:
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be non-negative, got {getattr(self, name)}")

    @property
    def isolates_prefix_cache(self) -> bool:
        """Whether block hashes are salted per tenant (explicit setting, else: API keys are configured)."""
        return bool(self.api_keys) if self.prefix_cache_isolation is None else self.prefix_cache_isolation

    def engine_config(self) -> EngineConfig:
        """The EngineConfig these settings describe (validated by EngineConfig itself)."""
        return EngineConfig(
            model=self.model,
            dtype=self.dtype,
            device=self.device,
            attention_backend=self.attention_backend,
            block_size=self.block_size,
            memory_utilization=self.memory_utilization,
            kv_cache_bytes=self.kv_cache_bytes,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enable_prefix_caching=self.enable_prefix_caching,
            seed=self.seed,
            num_threads=self.num_threads,
        )

    @property
    def resolved_database_url(self) -> str:
        """The database URL, defaulting to a SQLite file in the cache directory."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{Path(self.resolved_cache_dir) / 'pagedchat.db'}"

    @property
    def resolved_cache_dir(self) -> str:
        """The configured cache dir, else the engine's rule ($PAGEDCHAT_CACHE_DIR or ~/.cache/pagedchat)."""
        return str(cache_dir(self.cache_dir))


def _field_types() -> dict[str, str]:
    return {f.name: str(f.type) for f in dataclasses.fields(Settings)}


_KIND_NAMES = {"bool": "true or false (1/0, yes/no, on/off)", "int": "an integer", "float": "a number"}


def _parse(name: str, type_name: str, raw: str) -> Any:
    """Turn one environment string into the field's type; ValueError names the variable."""
    raw = raw.strip()
    try:
        if "None" in type_name and raw.lower() in ("", "none", "auto"):
            return None
        if type_name.startswith("tuple"):
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        if type_name.startswith("bool"):
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if type_name.startswith("int"):
            return int(float(raw)) if "e" in raw.lower() else int(raw)
        if type_name.startswith("float"):
            return float(raw)
        return raw
    except ValueError:
        kind = next((v for k, v in _KIND_NAMES.items() if type_name.startswith(k)), type_name)
        raise ValueError(f"{ENV_PREFIX}{name.upper()} must be {kind}, got {raw!r}") from None


def settings_from_env(env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Settings from PAGEDCHAT_* variables in `env` (default os.environ); `overrides` (CLI flags) win."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for name, type_name in _field_types().items():
        key = ENV_PREFIX + name.upper()
        if key in env:
            values[name] = _parse(name, type_name, env[key])
    if "PAGEDCHAT_API_KEY" in env and "api_keys" not in values:
        values["api_keys"] = _parse("api_keys", "tuple[str, ...]", env["PAGEDCHAT_API_KEY"])
    values.update({k: v for k, v in overrides.items() if v is not None})
    return Settings(**values)


def ensure_secret_key(settings: Settings) -> Settings:
    """Settings with a secret key: the configured one, else one persisted in the cache dir (created 0600)."""
    if settings.secret_key:
        return settings
    path = Path(settings.resolved_cache_dir) / SECRET_KEY_FILE
    if path.is_file():
        key = path.read_text().strip()
        if key:
            return dataclasses.replace(settings, secret_key=key)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process created it between our check and now
        return dataclasses.replace(settings, secret_key=path.read_text().strip())
    with os.fdopen(fd, "w") as f:
        f.write(key)
    return dataclasses.replace(settings, secret_key=key)


def load_settings(env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """The one call the CLI makes: environment + flags, with the secret key resolved."""
    return ensure_secret_key(settings_from_env(env, **overrides))
