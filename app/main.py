"""The app factory: routes, middleware, error handlers, and a lifespan that owns the store and the engine thread."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from itsdangerous import Signer
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from app.accounts import invite_routes, key_routes, oidc
from app.accounts import routes as account_routes
from app.accounts.oidc import flow_middleware, make_oauth
from app.accounts.passwords import Passwords
from app.accounts.service import AccountService
from app.admin import feed as admin_feed
from app.admin import models as admin_models
from app.admin import ops
from app.admin import pages as admin_pages
from app.chat import attachment_routes, export_routes, page, preset_routes, search_routes, ws
from app.chat import routes as session_routes
from app.chat.service import ChatService, chat_of, make_chat_model
from app.db import StorageQuota, Store
from app.engine_client.async_engine import AsyncEngine, EngineFactory
from app.engine_client.async_engine import engine_factory as engine_factory_of
from app.engine_client.protocol import EngineClient
from app.http.account_auth import AccountMiddleware
from app.http.admin_auth import token_fingerprint
from app.http.admission import Admission
from app.http.error_handlers import api_error_handler, http_exception_handler, unhandled_error_handler
from app.http.errors import APIError
from app.http.key_auth import ApiKeyMiddleware
from app.http.middleware import AllowedHostsMiddleware, ProxyMiddleware, RequestContextMiddleware
from app.http.model_catalog import model_entries
from app.http.model_registry import ModelRegistry, ReplicaSetFactory
from app.http.public_prefix import published_prompts
from app.http.security import make_signer
from app.http.services import Services
from app.http.shutdown import Shutdown
from app.http.templates import STATIC_DIR
from app.metrics.metrics import Metrics
from app.openai import routes as openai_routes
from app.settings import Settings, ensure_secret_key
from engine.core.config import EngineConfig
from engine.core.memory import human_bytes

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Parts:
    """What `create_app` makes before anything starts; the lifespan builds the services around them."""

    settings: Settings
    engine: EngineClient
    models: ModelRegistry
    metrics: Metrics
    signer: Signer
    admission: Admission
    shutdown: Shutdown


def create_app(
    settings: Settings,
    engine_factory: EngineFactory | None = None,
    model_factory: Callable[[EngineConfig], EngineFactory] | None = None,
) -> Starlette:
    """A new app with its own engine bridge, metrics registry and store; nothing starts before the lifespan.
    `engine_factory` builds the default model's engine, `model_factory` the others' from their configs (tests)."""
    settings = ensure_secret_key(settings)
    entries = model_entries(settings)  # two models of one id are refused here
    metrics = Metrics(model_name=entries[0].name)
    remote = settings.uses_ray and engine_factory is None
    models = ModelRegistry(
        settings,
        entries,
        metrics,
        factory=model_factory or engine_factory_of,
        replica_set=_replica_sets(settings) if remote else None,
    )
    engine: EngineClient
    shutdown = Shutdown()
    if remote:
        from app.cluster.replica_engine import ReplicaSetEngine  # Ray loads only when replicas are asked for

        engine = ReplicaSetEngine(settings, num_models=models.max_loaded, metrics=metrics)
    else:
        engine = AsyncEngine(
            engine_factory or engine_factory_of(settings.engine_config()),
            max_queued_requests=settings.max_queued_requests,
            request_timeout_s=settings.request_timeout_s,
            metrics=metrics,
            drain_s=settings.shutdown_grace_s,
            # one process, one engine: its death stops the server (replicas: Ray Serve restarts a dead one)
            on_death=shutdown.engine_failed if settings.exit_on_engine_failure else None,
            step_loop=models.step_loop,  # the models loaded on demand step on its thread too
        )
    parts = Parts(
        settings,
        engine,
        models,
        metrics,
        make_signer(settings.secret_key),
        Admission(settings, shutdown),
        shutdown,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        svc = await _startup(parts)
        app.state.services = svc
        try:
            yield
        finally:
            await _shutdown(svc)

    app = Starlette(
        routes=[
            *ops.routes,
            *openai_routes.routes,
            *session_routes.routes,
            *preset_routes.routes,
            *export_routes.routes,
            *attachment_routes.routes,
            *search_routes.routes,
            *ws.routes,
            *admin_feed.routes,
            *admin_models.routes,
            *account_routes.routes,
            *invite_routes.routes,
            *key_routes.routes,
            *oidc.routes,
            *page.routes,
            *admin_pages.routes,
            Mount("/static", app=StaticFiles(directory=str(STATIC_DIR)), name="static"),
        ],
        middleware=[
            # first: a Host the server does not answer (DNS rebinding) reaches nothing, not even the cookie
            Middleware(AllowedHostsMiddleware, settings=settings),
            Middleware(ProxyMiddleware, settings=settings),
            # with accounts on, no browser cookie is handed out: it identifies no one
            Middleware(
                RequestContextMiddleware,
                signer=parts.signer,
                cookie_secure=settings.cookie_secure,
                browser_identity=settings.auth == "none",
            ),
            Middleware(AccountMiddleware),
            Middleware(ApiKeyMiddleware),
            *([flow_middleware(settings)] if settings.auth == "oidc" else []),
        ],
        exception_handlers={
            APIError: api_error_handler,
            HTTPException: http_exception_handler,
            Exception: unhandled_error_handler,
        },
        lifespan=lifespan,
    )
    app.state.shutdown = shutdown  # the server drains through it, started or not (app.http.server)
    app.state.oidc = make_oauth(settings) if settings.auth == "oidc" else None
    return app


def _replica_sets(settings: Settings) -> ReplicaSetFactory:
    """With --replicas, each model loaded on demand is a replica set of its own: a Serve application of its name,
    on the Ray instance --model's replica set started (or joined)."""
    from app.cluster.ray_runtime import model_app_name
    from app.cluster.replica_engine import ReplicaSetEngine

    def replica_set(key: str, config: EngineConfig, metrics: Metrics) -> EngineClient:
        return ReplicaSetEngine(settings, engine_config=config, app_name=model_app_name(key), metrics=metrics)

    return replica_set


def storage_quota(settings: Settings) -> StorageQuota:
    """The store's quota from the settings."""
    return StorageQuota(
        max_sessions=settings.max_sessions_per_owner,
        max_messages=settings.max_messages_per_owner,
        max_bytes=settings.max_bytes_per_owner,
        max_database_bytes=settings.max_database_bytes,
    )


def revoked_sign_ins_message(settings: Settings, num_revoked: int) -> str:
    """Why admin sign-ins were revoked at start. A sign-in keeps the admin token's fingerprint, keyed by the secret
    key: a new token and a new secret key both change it, and which of the two did cannot be told apart."""
    if not settings.admin_token:
        return f"no admin token is set: revoked {num_revoked} admin sign-ins made with one"
    return f"the admin token or the secret key changed: revoked {num_revoked} admin sign-ins made with the old one"


async def _startup(parts: Parts) -> Services:
    """Start the store and the engine together, then build the services whole."""
    settings, engine = parts.settings, parts.engine
    published = published_prompts(settings)  # a missing shared prompt file stops the start here
    url = settings.resolved_database_url
    if url.startswith("sqlite:///") and not settings.database_url:
        Path(settings.resolved_cache_dir).mkdir(parents=True, exist_ok=True)
    store = Store(url, busy_timeout_ms=settings.db_busy_timeout_ms, quota=storage_quota(settings))
    await store.check_schema()  # a newer schema, an unreachable database: refused before the model loads
    results = await asyncio.gather(store.start(), engine.start(), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        await engine.stop()
        await store.close()
        raise failures[0]
    if len(parts.models.names) > 1:
        logger.info(
            "serving %d models within a memory budget of %s: %s loads now, the others on their first request",
            len(parts.models.names),
            human_bytes(parts.models.budget_bytes),
            parts.models.default_name,
        )
    # sign-ins made with another admin token (or any, when none is set now) end here, for good
    num_revoked = await store.admin.revoke_admin_sessions_except(token_fingerprint(settings))
    if num_revoked:
        logger.warning(revoked_sign_ins_message(settings, num_revoked))
    info = engine.info
    default = parts.models.adopt_default(engine, published)
    if parts.engine.health() is not None:  # --replicas: SIGHUP rolls the replica sets instead of stopping
        from app.cluster.replica_engine import restart_on_sighup

        restart_on_sighup(lambda: [model.engine for model in parts.models.loaded()])
    sampling_defaults, public_prefixes = default.sampling_defaults, default.public_prefixes
    chat_model = await make_chat_model(default, store, settings)  # as every other model's, when it loads
    chat = ChatService(
        store,
        engine,
        settings,
        chat_model.builder,
        chat_model.fingerprint,
        public_prefixes,
        sampling_defaults,
    )
    chat.serve_models(parts.models)  # each chat runs on its own model (the setting `model`)
    accounts = None
    if settings.auth != "none":
        passwords = Passwords(max_queued=settings.max_queued_password_checks)
        accounts = AccountService(
            store,
            settings,
            passwords,
            chat,
            lambda: [model.engine for model in parts.models.loaded()],
            parts.models.purge_unloaded,
        )
        await accounts.bootstrap()  # the first admin (first_admin), and expired sign-ins dropped
    logger.info(
        "serving %s: %d KV blocks of %d tokens, max_model_len %d, sampling defaults %s",
        default.name,
        info.num_blocks,
        info.block_size,
        info.max_model_len,
        sampling_defaults.given(),
    )
    return Services(
        settings=settings,
        engine=engine,
        metrics=parts.metrics,
        signer=parts.signer,
        store=store,
        chat=chat,
        public_prefixes=public_prefixes,
        sampling_defaults=sampling_defaults,
        sampling_sources=default.sampling_sources,
        models=parts.models,
        accounts=accounts,
        admission=parts.admission,
        shutdown=parts.shutdown,
    )


async def _shutdown(svc: Services) -> None:
    await svc.drain()  # served by `pagedchat serve`, the server has drained already: this returns at once
    await chat_of(svc).shutdown(0.0)  # the replies it cut are stored before the store closes
    await svc.models.stop()
    await svc.engine.stop()
    if svc.accounts is not None:
        svc.accounts.passwords.close()
    await svc.store.close()
