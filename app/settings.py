"""The service's settings: one frozen dataclass, read once from PAGEDCHAT_* environment variables."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from engine.core.config import EngineConfig
from engine.core.options import option, options, parse_env, parse_value
from engine.core.paths import KV_TIER_KEY_FILE, cache_dir
from engine.core.sampling_defaults import SamplingDefaults

API_KEY_ALIAS = "PAGEDCHAT_API_KEY"  # one key: the singular spelling operators reach for
_POSITIVE = (
    "max_body_bytes",
    "max_attachment_bytes",
    "max_attachment_chars",
    "max_attachments_per_message",
    "pdf_timeout_s",
    "pdf_memory_bytes",
    "pdf_max_pages",
    "max_messages",
    "max_message_chars",
    "default_max_tokens",
    "ws_max_frame_bytes",
    "request_timeout_s",
    "flush_interval_s",
    "slow_reader_timeout_s",
    "header_timeout_s",
    "account_session_days",
    "invite_hours",
    "credential_check_interval_s",
)
_NON_NEGATIVE = (
    "memory_budget_bytes",
    "keep_alive_s",
    "models_max",
    "max_queued_requests",
    "client_requests_per_minute",
    "client_max_streams",
    "db_busy_timeout_ms",
    "store_retry_s",
    "max_sessions_per_owner",
    "max_messages_per_owner",
    "max_bytes_per_owner",
    "max_database_bytes",
    "new_identities_per_minute",
    "client_max_connections",
    "max_queued_password_checks",
)
ADMIN_TOKEN_MIN_CHARS = 16
MODEL_BUDGET_SHARE = 0.6  # --memory-budget unset: this share of the memory available at start
SECRET_KEY_FILE = "secret_key"
AUTH_MODES = ("none", "local", "oidc")
ROUTING_POLICIES = ("kv", "round-robin", "least-loaded")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
WILDCARD_ADDRESSES = ("", "0.0.0.0", "::")  # listen addresses that name no host a client could use
ANY = "*"
# a DNS name (letters, digits, -, _ and dots), optionally `*.` for its subdomains; IP addresses are checked apart
_HOST_NAME = re.compile(r"(\*\.)?[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?")


def host_name(value: str) -> str:
    """A host as the Host check compares it: lower case, no IPv6 brackets, no trailing dot."""
    return value.strip().lower().removeprefix("[").removesuffix("]").rstrip(".")


def _entries(values: tuple[str, ...]) -> tuple[str, ...]:
    """Repeated flags and comma-separated values alike: `--allowed-hosts a,b --allowed-hosts c`."""
    return tuple(part.strip() for value in values for part in value.split(",") if part.strip())


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Settings:
    """Everything the server needs: where it listens, who may use it, its limits, and the engine's config."""

    # One line per setting: `pagedchat serve` flags and PAGEDCHAT_* variables are derived from these fields
    # (engine/core/options.py); the engine's own knobs are EngineConfig's fields, under `engine`.
    host: str = option("127.0.0.1", "listen address", group="server")
    port: int = option(8000, "listen port", group="server")
    database_url: str = option(
        "",
        "SQLAlchemy URL (postgresql+psycopg://... for PostgreSQL); unset: a SQLite file in the cache dir",
        group="server",
    )
    api_keys: tuple[str, ...] = option(
        (),
        "required on /v1 when set, and they identify session owners; PAGEDCHAT_API_KEY works too",
        flag="--api-key",
        group="accounts",
    )
    admin_token: str = option(
        "",
        f"guards /admin, /api/admin and /metrics (at least {ADMIN_TOKEN_MIN_CHARS} characters), beside admin "
        "accounts; unset: admin accounts only with --auth local|oidc, else loopback clients (not through a proxy)",
        group="accounts",
    )
    metrics_public: bool = option(
        False, "serve /metrics to anyone; unset: /metrics is part of the admin surface", group="accounts"
    )
    secret_key: str = option(
        "",
        "signs the browser cookie; unset: one generated and kept in the cache dir; flags show in ps, prefer the variable",
        group="server",
    )
    cache_dir: str = option(
        "",
        "models, kernels, database, secret key, KV disk tier; unset: $PAGEDCHAT_CACHE_DIR or ~/.cache/pagedchat",
        group="server",
    )
    log_level: str = option(
        "info", "log level", choices=("debug", "info", "warning", "error"), group="server"
    )
    exit_on_engine_failure: bool = option(
        True,
        "when the engine thread dies while serving, fail the running replies, drain as on SIGTERM and exit with "
        "status 70, so that a supervisor (systemd Restart=on-failure, a container restart policy) restarts the "
        "server; off: the process stays up, answering 503 with /health unhealthy, until something restarts it. "
        "One process only: with --replicas, Ray Serve restarts a replica whose engine died, and this does not apply",
        group="server",
    )
    allowed_origins: tuple[str, ...] = option(
        (),
        "origins allowed besides the server's own, for WebSocket upgrades and browser-cookie writes",
        flag="--allowed-origin",
        group="server",
    )
    allowed_hosts: tuple[str, ...] = option(
        (),
        "Host header names (any port) answered besides the listen address, localhost, 127.0.0.1 and [::1]; any "
        "other Host gets a 400, on every route (a DNS-rebinding page names its own host); '*' answers every Host "
        "(unsafe: a web page can then reach this server through the visitor's browser)",
        group="server",
    )
    forwarded_allow_ips: tuple[str, ...] = option(
        (),
        "addresses or networks of reverse proxies whose X-Forwarded-For and X-Forwarded-Proto are believed (as "
        "uvicorn's flag); a request through a proxy is never admin by its address; '*': every peer (unsafe)",
        group="server",
    )
    cookie_secure: bool = option(False, "mark the browser cookie Secure (serve behind HTTPS)", group="server")
    prefix_cache_isolation: bool = option(
        True,
        "salt cached blocks per caller (API key, browser, address) past the published prompt; "
        "off: every caller shares every cached prefix (single-tenant deployments)",
        group="cache",
    )
    served_model_name: str = option(
        "",
        "the id the API and the chat serve --model as; unset: the model's file or folder name (a hub id: the id); "
        "--model NAME=MODEL sets it too",
        group="model",
    )
    models: tuple[str, ...] = option(
        (),
        "more models to serve beside --model, each what --model takes, optionally as NAME=MODEL; each loads on "
        "its first request (a repeated --model adds here)",
        group="model",
    )
    models_dir: str = option(
        "",
        "serve every model in this folder too: each .gguf file, and each folder with a config.json and weights",
        group="model",
    )
    memory_budget_bytes: int = option(
        0,
        "bytes the loaded models' weights and KV pools may take together; a model that would pass it unloads the "
        f"least recently used idle ones first, else is refused; 0: {MODEL_BUDGET_SHARE:.0%} of the memory "
        "available at start",
        group="model",
        flag="--memory-budget",
        unit="bytes",
    )
    keep_alive_s: float = option(
        300.0,
        "a model other than --model that has served nothing for this many seconds is unloaded; 0: kept until "
        "the memory budget or --models-max needs its room",
        group="model",
    )
    models_max: int = option(
        0, "models loaded at once, --model's included; 0: as many as the memory budget holds", group="model"
    )
    default_system_prompt: str = option(
        "",
        "system prompt of sessions that set none; published: all users share its cached blocks",
        group="model",
    )
    shared_prompt_files: tuple[str, ...] = option(
        (),
        "files each holding a published system prompt: a chat whose first system message is one shares its "
        "cached blocks with all users",
        flag="--shared-prompt-file",
        group="cache",
    )
    max_body_bytes: int = option(1024 * 1024, "largest request body, in bytes", group="limits", unit="bytes")
    max_messages: int = option(512, "messages in one /v1/chat/completions request", group="limits")
    max_message_chars: int = option(200_000, "characters of one message or prompt", group="limits")
    max_attachment_bytes: int = option(
        10 * 1024 * 1024, "largest file attached to a chat, in bytes", group="limits", unit="bytes"
    )
    max_attachment_chars: int = option(
        200_000, "characters of text one attached file may hold (a PDF's: extracted)", group="limits"
    )
    max_attachments_per_message: int = option(8, "files attached to one chat message", group="limits")
    pdf_timeout_s: float = option(
        15.0, "longest, in seconds, the text of one attached PDF may take to extract", group="limits"
    )
    pdf_memory_bytes: int = option(
        1024 * 1024 * 1024,
        "address space of the process extracting a PDF's text, in bytes",
        group="limits",
        unit="bytes",
    )
    pdf_max_pages: int = option(500, "pages of one attached PDF", group="limits")
    max_queued_requests: int = option(256, "requests waiting beyond max-num-seqs before 503", group="limits")
    request_timeout_s: float = option(
        600.0, "longest a generation request may run, in seconds", group="limits"
    )
    default_max_tokens: int = option(
        512, "reply length, in tokens, of session turns whose settings do not say", group="limits"
    )
    ws_max_frame_bytes: int = option(
        256 * 1024, "largest WebSocket frame, in bytes", group="limits", unit="bytes"
    )
    shutdown_grace_s: float = option(
        10.0,
        "how long, in seconds, running replies may finish at shutdown; then every stream ends with a final event saying why",
        group="limits",
    )
    # a client: its API key, else its browser cookie, else its address
    client_requests_per_minute: int = option(
        0,
        "generation requests (chat turns, /v1 completions) per client per rolling minute; 0: no limit",
        group="limits",
    )
    client_max_streams: int = option(
        0, "generation requests in flight per client; 0: no limit", group="limits"
    )
    # an owner: its API key, else its browser cookie; checked inside the transaction of each write it asks for
    max_sessions_per_owner: int = option(1000, "sessions one owner may keep; 0: no limit", group="limits")
    max_messages_per_owner: int = option(
        20_000, "messages one owner may keep, over all its sessions; 0: no limit", group="limits"
    )
    max_bytes_per_owner: int = option(
        50 * 1024 * 1024,
        "UTF-8 bytes of titles, system prompts and messages one owner may keep; 0: no limit",
        group="limits",
        unit="bytes",
    )
    new_identities_per_minute: int = option(
        30,
        "new browser identities (requests without a valid cookie) that may create a session, per client address "
        "per rolling minute; 0: no limit",
        group="limits",
    )
    slow_reader_timeout_s: float = option(
        60.0,
        "a client that takes no data for this many seconds is cut off and its request aborted",
        group="limits",
    )
    header_timeout_s: float = option(
        10.0,
        "a connection that has not sent a whole request head within this many seconds is closed",
        group="limits",
    )
    client_max_connections: int = option(
        256, "open connections per client address; more are refused (503); 0: no limit", group="limits"
    )
    flush_interval_s: float = option(
        0.5, "how often, in seconds, a streaming reply is saved", group="advanced"
    )
    db_busy_timeout_ms: int = option(
        5000,
        "how long, in milliseconds, one database call waits for a lock before it is unavailable (503)",
        group="advanced",
    )
    store_retry_s: float = option(
        10.0,
        "how long, in seconds, a finished reply keeps retrying its final write while the database is down",
        group="advanced",
    )
    max_database_bytes: int = option(
        2 * 1024**3,
        "bytes of pages in use by the SQLite database (PostgreSQL: its tables' size) past which new sessions and messages are "
        "refused (507); 0: no limit",
        group="limits",
        unit="bytes",
    )
    # what a request that leaves these out samples with; unset: the model's generation_config.json, else built-in
    default_temperature: float | None = option(
        None, "temperature of requests that set none; unset: the model's, else 1.0", group="model"
    )
    default_top_p: float | None = option(
        None, "top_p of requests that set none; unset: the model's, else 1.0", group="model"
    )
    default_top_k: int | None = option(
        None, "top_k of requests that set none (0: off); unset: the model's, else 0", group="model"
    )
    default_repetition_penalty: float | None = option(
        None, "repetition_penalty of requests that set none; unset: the model's, else 1.0", group="model"
    )
    # accounts (docs/operators/accounts.md): who the chat's users are; the account is then the identity everywhere
    auth: str = option(
        "none",
        "who the chat's users are: none (each browser's cookie, a single-user machine), local (accounts with "
        "passwords), oidc (local accounts plus sign-in through an OpenID Connect provider)",
        choices=AUTH_MODES,
        group="accounts",
    )
    account_session_days: float = option(30.0, "how long a sign-in lasts, in days", group="accounts")
    invite_hours: float = option(72.0, "how long an invite link stays valid, in hours", group="accounts")
    credential_check_interval_s: float = option(
        2.0,
        "how often, in seconds, a long-lived stream (chat socket, reply over SSE, streamed /v1 request, admin feed) re-checks the "
        "sign-in, admin token or key it opened with; it ends within 1.5 times this once that is revoked",
        group="accounts",
    )
    max_queued_password_checks: int = option(
        8,
        "password checks (sign-ins, password changes) that may wait for a hashing thread; more are refused at once "
        "(503), so a flood of guesses cannot make every sign-in wait",
        group="accounts",
    )
    first_admin: str = option(
        "",
        "with accounts: at start, create this admin account unless an account of that name exists",
        group="accounts",
    )
    first_admin_password: str = option(
        "", "the first admin's password; flags show in ps, prefer the variable", group="accounts"
    )
    oidc_issuer: str = option(
        "",
        "with --auth oidc: the provider's issuer URL (its /.well-known/openid-configuration is read)",
        group="accounts",
    )
    oidc_client_id: str = option("", "with --auth oidc: this server's client id", group="accounts")
    oidc_client_secret: str = option(
        "",
        "with --auth oidc: this server's client secret; flags show in ps, prefer the variable",
        group="accounts",
    )
    oidc_scopes: str = option(
        "openid profile email", "with --auth oidc: the scopes asked for", group="accounts"
    )
    replicas: int = option(
        1, "engine replicas; above 1, served from a Ray Serve deployment (pagedchat[cluster])", group="engine"
    )
    threads_per_replica: int = option(
        0, "CPU threads of each replica's engine; 0: --num-threads, else 1", group="engine"
    )
    ray_address: str = option(
        "",
        "join this Ray cluster ('local': start one on 127.0.0.1, as --replicas above 1 does); anyone who can reach a "
        "Ray cluster can run code on it",
        group="engine",
    )
    routing: str = option("kv", "how a request picks its replica", choices=ROUTING_POLICIES, group="engine")
    engine: EngineConfig = field(default_factory=EngineConfig)

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in [1, 65535], got {self.port}")
        for name in _POSITIVE:
            if not getattr(self, name) > 0:  # written so that NaN fails too
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in _NON_NEGATIVE:
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be non-negative, got {getattr(self, name)}")
        try:
            self.sampling_defaults  # noqa: B018 - validates the default_* flags
        except ValueError as exc:
            raise ValueError(f"default_{exc}") from None
        if self.admin_token and len(self.admin_token) < ADMIN_TOKEN_MIN_CHARS:
            raise ValueError(
                f"admin_token must be at least {ADMIN_TOKEN_MIN_CHARS} characters, got {len(self.admin_token)} "
                "(generate one with: python -c 'import secrets; print(secrets.token_urlsafe(24))')"
            )
        self._check_accounts()
        self._check_hosts()
        if self.replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {self.replicas}")
        if self.routing not in ROUTING_POLICIES:
            raise ValueError(f"routing must be one of {', '.join(ROUTING_POLICIES)}, got {self.routing!r}")
        if (
            (self.models or self.models_dir)
            and self.ray_address not in ("", "local")
            and not self.memory_budget_bytes
        ):
            raise ValueError(
                "several models on a Ray cluster (--ray-address) need --memory-budget: the default is a share of this "
                "machine's memory, and the replicas hold theirs on the cluster's machines"
            )
        if self.threads_per_replica < 0:
            raise ValueError(
                f"threads_per_replica must be 0 (the engine's) or positive, got {self.threads_per_replica}"
            )

    def _check_accounts(self) -> None:
        """The account flags make sense together: an issuer and a client id for oidc, a password with first_admin."""
        if self.auth not in AUTH_MODES:
            raise ValueError(f"auth must be one of {', '.join(AUTH_MODES)}, got {self.auth!r}")
        if self.first_admin and self.auth == "none":
            raise ValueError("first_admin needs accounts: add --auth local (or oidc)")
        if self.first_admin and not self.first_admin_password:
            raise ValueError(
                f"first_admin {self.first_admin!r} needs a password: set PAGEDCHAT_FIRST_ADMIN_PASSWORD"
            )
        if self.auth != "oidc":
            return
        missing = [name for name in ("oidc_issuer", "oidc_client_id") if not getattr(self, name)]
        if missing:
            raise ValueError(f"--auth oidc needs {' and '.join(missing)} (see docs/operators/accounts.md)")
        parts = urlsplit(self.oidc_issuer)
        loopback = parts.scheme == "http" and parts.hostname in LOOPBACK_HOSTS
        if not parts.hostname or (parts.scheme != "https" and not loopback):
            raise ValueError(
                f"oidc_issuer must be an https:// URL (http:// only on loopback), got {self.oidc_issuer!r}"
            )
        if "openid" not in self.oidc_scopes.split():
            raise ValueError(f"oidc_scopes must include openid, got {self.oidc_scopes!r}")

    def _check_hosts(self) -> None:
        """Every allowed host is a name or an address without a port; every proxy an address or a network."""
        for entry in _entries(self.allowed_hosts):
            name = host_name(entry)
            if entry != ANY and not (_HOST_NAME.fullmatch(name) or _is_ip(name)):
                raise ValueError(
                    f"allowed_hosts: {entry!r} is not a host name or IP address (no scheme, no port: every port "
                    "of an allowed host is answered), e.g. chat.example.com, *.example.com or 192.0.2.7"
                )
        for entry in _entries(self.forwarded_allow_ips):
            if entry == ANY:
                continue
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(
                    f"forwarded_allow_ips: {entry!r} is not an IP address or network (e.g. 127.0.0.1 or "
                    "10.0.0.0/8), nor *"
                ) from None

    @property
    def allowed_host_names(self) -> frozenset[str]:
        """The hosts the server answers by name (normalised by `host_name`): the listen address unless it is a
        wildcard, localhost, 127.0.0.1, ::1 and `allowed_hosts`; '*' is not among them (see `any_host_allowed`)."""
        names = {host_name(entry) for entry in _entries(self.allowed_hosts) if entry != ANY}
        names.update(LOOPBACK_HOSTS)
        if host_name(self.host) not in WILDCARD_ADDRESSES:
            names.add(host_name(self.host))
        return frozenset(names)

    @property
    def any_host_allowed(self) -> bool:
        """True when `allowed_hosts` holds '*': every Host is answered."""
        return ANY in _entries(self.allowed_hosts)

    @property
    def proxy_addresses(self) -> tuple[str, ...]:
        """The peers whose forwarding headers are believed (`forwarded_allow_ips`, commas split)."""
        return _entries(self.forwarded_allow_ips)

    @property
    def sampling_defaults(self) -> SamplingDefaults:
        """The server's own sampling defaults (the default_* flags); ValueError naming a bad one."""
        return SamplingDefaults(
            temperature=self.default_temperature,
            top_p=self.default_top_p,
            top_k=self.default_top_k,
            repetition_penalty=self.default_repetition_penalty,
        )

    @property
    def uses_ray(self) -> bool:
        """True when the engines run as Ray Serve replicas (--replicas above 1, or --ray-address)."""
        return self.replicas > 1 or bool(self.ray_address)

    @property
    def model(self) -> str:
        """The engine's model (what the API reports before the engine has loaded)."""
        return self.engine.model

    def engine_config(self) -> EngineConfig:
        """The EngineConfig these settings describe; the KV disk tier lives under the service's cache dir unless
        its own directory is given, and its MAC key beside the database unless its own file is given."""
        engine = self.engine
        if not engine.kv_disk_dir:
            engine = dataclasses.replace(engine, kv_disk_dir=str(Path(self.resolved_cache_dir) / "kv"))
        if not engine.kv_disk_key_file:
            engine = dataclasses.replace(
                engine, kv_disk_key_file=str(self.kv_tier_key_dir / KV_TIER_KEY_FILE)
            )
        return engine

    @property
    def kv_tier_key_dir(self) -> Path:
        """Where the tier's key goes by default: a SQLite database's folder (what can read the one reads the
        other), else the cache dir."""
        parts = urlsplit(self.resolved_database_url)
        database = parts.path[1:]  # sqlite:///relative.db, sqlite:////absolute.db, as SQLAlchemy reads them
        if parts.scheme.split("+")[0] == "sqlite" and database not in ("", ":memory:"):
            return Path(database).expanduser().absolute().parent
        return Path(self.resolved_cache_dir)

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


_ALIAS = re.compile(r"([A-Za-z0-9][A-Za-z0-9._:-]{0,63})=(.+)")


def split_alias(entry: str) -> tuple[str | None, str]:
    """`NAME=MODEL` as (NAME, MODEL); anything else, an existing path with a `=` included, as (None, entry)."""
    match = _ALIAS.fullmatch(entry.strip())
    if match is None or Path(entry).expanduser().exists():
        return None, entry.strip()
    return match.group(1), match.group(2).strip()


def settings_from_values(values: Mapping[str, Any]) -> Settings:
    """Settings from flat field names: the service's own, and EngineConfig's (which go into `engine`). A `model` given
    as NAME=MODEL serves MODEL as NAME (`served_model_name`)."""
    engine_names = {opt.name for opt in options(EngineConfig)}
    if "model" in values:
        alias, model = split_alias(values["model"])
        if alias is not None:
            named = values.get("served_model_name")
            if named and named != alias:
                raise ValueError(
                    f"the first model is named twice: served_model_name {named!r} and {alias!r} in "
                    f"{values['model']!r}; give one"
                )
            values = {**values, "model": model, "served_model_name": alias}
    engine = EngineConfig(**{k: v for k, v in values.items() if k in engine_names})
    return Settings(**{k: v for k, v in values.items() if k not in engine_names}, engine=engine)


def settings_from_env(env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Settings from PAGEDCHAT_* variables in `env` (default os.environ); `overrides` (CLI flags) win."""
    env = os.environ if env is None else env
    values = {**parse_env(Settings, env), **parse_env(EngineConfig, env)}
    if API_KEY_ALIAS in env and "api_keys" not in values:
        api_keys = next(opt for opt in options(Settings) if opt.name == "api_keys")
        values["api_keys"] = parse_value(api_keys, env[API_KEY_ALIAS], API_KEY_ALIAS)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return settings_from_values(values)


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
