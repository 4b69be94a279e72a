"""HTML pages: the chat (`/`), the admin page (`/admin`) with its token-for-cookie sign-in, and `/static`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from app.routes.account_auth import signed_in_account
from app.routes.admin_auth import (
    admin_cookie_header,
    check_attempts,
    is_admin,
    read_login_token,
    record_attempt,
    sign_in,
    sign_out,
    token_matches,
)
from app.routes.context import Services, services
from app.routes.csrf import cross_origin_reason
from app.routes.errors import error_response
from app.services.advice import format_bytes
from app.services.chat_settings import CHAT_TEMPERATURE_RANGE, chat_max_tokens
from app.services.errors import APIError, from_exception
from app.services.tier_view import configured_tier_dir, tier_configured
from engine.core.memory import available_memory_bytes

logger = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[2]  # the supported install is the repo itself (editable)
TEMPLATES_DIR = REPO_ROOT / "templates"
STATIC_DIR = REPO_ROOT / "static"
NO_STORE = {"Cache-Control": "no-store"}


def static_url(name: str) -> str:
    """/static/<name>?v=<mtime>: a new URL whenever the file changes, so browsers never run stale scripts."""
    try:
        version = int((STATIC_DIR / name).stat().st_mtime)
    except OSError:
        version = 0
    return f"/static/{name}?v={version}"


templates = Jinja2Templates(directory=str(TEMPLATES_DIR))
templates.env.globals["static_url"] = static_url


def _render(
    request: Request,
    name: str,
    context: dict[str, Any],
    status_code: int = 200,
    headers: dict[str, str] | None = None,
) -> Response:
    headers = {**NO_STORE, **(headers or {})}
    return templates.TemplateResponse(request, name, context, status_code=status_code, headers=headers)


async def chat_page(request: Request) -> Response:
    """GET /: the chat UI (the middleware hands out the browser cookie that owns its sessions); with accounts on,
    the sign-in page first."""
    svc = services(request)
    account = signed_in_account(request) if svc.settings.auth != "none" else None
    if svc.settings.auth != "none" and account is None:
        return RedirectResponse("/login", status_code=303, headers=NO_STORE)
    model = svc.engine.engine.model_name if svc.engine.engine is not None else svc.settings.model
    context = {
        "account": account.user.username if account is not None else None,
        "model_name": model,
        "sampling_defaults": svc.sampling_defaults,
        "sampling_source": sampling_source_text(svc.sampling_sources),
        "default_system_prompt": svc.settings.default_system_prompt,
        "setting_rows": setting_rows(svc),
        "admin": await is_admin(request, svc),  # the admin link shows to admins only
    }
    return _render(request, "chat.html", context)


@dataclass(frozen=True)
class SettingField:
    """A number field of the chat settings form: its bounds, and the server's default with where that comes from."""

    name: str
    label: str
    min: float | None
    max: float | None
    step: float
    default: float | int
    source: str  # server, model or built-in

    @property
    def id(self) -> str:
        return "set-" + self.name.replace("_", "-")


def setting_rows(svc: Services) -> list[list[SettingField]]:
    """The chat settings form's number fields, two to a row; their bounds are the ones the server holds chats to."""
    d, sources = svc.sampling_defaults, svc.sampling_sources
    engine = svc.engine.engine
    max_tokens = (
        chat_max_tokens(svc.settings.default_max_tokens, engine.config.max_model_len)
        if engine is not None
        else svc.settings.default_max_tokens
    )
    low, high = CHAT_TEMPERATURE_RANGE

    def field(name: str, label: str, bounds: tuple[float | None, float | None], step: float) -> SettingField:
        default = max_tokens if name == "max_tokens" else getattr(d, name)
        return SettingField(name, label, *bounds, step, default, sources.get(name, "server"))

    return [
        [field("temperature", "Temperature", (low, high), 0.05), field("top_p", "Top p", (0, 1), 0.05)],
        [
            field("top_k", "Top k", (0, None), 1),
            field("repetition_penalty", "Repetition penalty", (0.01, 10), 0.05),
        ],
        [field("max_tokens", "Max tokens", (1, None), 1)],
    ]


SOURCE_LABELS = {
    "server": "from the server's flags",
    "model": "from the model's generation config",
    "built-in": "built-in",
}


def sampling_source_text(sources: dict[str, str]) -> str:
    """Where the default of each sampling field comes from, in words: "temperature, top p from ...; ..."."""
    by_source: dict[str, list[str]] = {}
    for name, source in sources.items():
        by_source.setdefault(source, []).append(name.replace("_", " "))
    return "; ".join(f"{', '.join(names)} {SOURCE_LABELS[source]}" for source, names in by_source.items())


KV_DTYPE_LABELS = {"int8": "int8 (an fp16 scale per token and KV head)"}


def engine_settings_rows(svc: Services) -> list[tuple[str, str]]:
    """The engine's settings as (label, value) rows for the admin page."""
    engine = svc.engine.engine
    if engine is None:
        return [("Engine", "not started")]
    cfg = engine.config
    pool_bytes = engine.num_blocks * engine.kv_block_bytes
    return [
        ("Model", engine.model_name),
        ("Device / dtype", f"{cfg.device} / {cfg.dtype}"),
        ("Attention backend", cfg.attention_backend),
        ("Block size", f"{cfg.block_size} tokens"),
        (
            "KV pool",
            f"{engine.num_blocks} blocks · {engine.num_blocks * cfg.block_size} tokens · "
            f"{format_bytes(pool_bytes)}",
        ),
        *memory_rows(engine),
        ("KV cache dtype", KV_DTYPE_LABELS.get(engine.kv_cache_dtype, engine.kv_cache_dtype)),
        ("Bytes per block", format_bytes(engine.kv_block_bytes)),
        ("Max model length", f"{cfg.max_model_len} tokens"),
        ("Max sequences", str(cfg.max_num_seqs)),
        ("Max batched tokens", str(cfg.max_num_batched_tokens)),
        ("Prefix caching", "on" if cfg.enable_prefix_caching else "off"),
        *(disk_tier_rows(engine) if svc.engine.health() is None else replica_rows(svc)),
    ]


def memory_rows(engine: Any) -> list[tuple[str, str]]:
    """The weights' bytes (in quantized blocks, in float) and what the machine's memory has left, as the engine's
    start-up line logs them (a replica set's front engine holds no weights of its own: no weights row)."""
    rows = []
    weights = getattr(engine, "weight_memory", None)
    if weights is not None:
        rows.append(
            (
                "Weights",
                f"{format_bytes(weights.total)} · {format_bytes(weights.blocks)} in blocks · "
                f"{format_bytes(weights.float)} in float",
            )
        )
    available = available_memory_bytes()
    rows.append(("Memory available", "unknown" if available is None else format_bytes(available)))
    return rows


def replica_rows(svc: Services) -> list[tuple[str, str]]:
    """With replicas: how many, how requests pick one, and where their disk tiers are (each its own)."""
    settings, cfg = svc.settings, svc.engine.engine.config
    n = settings.threads_per_replica
    threads = f"{n} thread{'s' if n != 1 else ''}" if n else "threads as the engine's setting"
    rows = [
        ("Replicas", f"{settings.replicas} on Ray Serve · {threads} each"),
        ("Routing", settings.routing),
    ]
    if tier_configured(cfg):
        rows.append(("KV disk tier", "one per replica: see the Disk tier card of each replica"))
    return rows


def disk_tier_rows(engine: Any) -> list[tuple[str, str]]:
    """The disk tier's rows: its resolved cap and directory, or why there is none."""
    cfg, tier = engine.config, engine.tier
    if tier is not None:
        cap = f"{format_bytes(tier.capacity_bytes)} cap" + (" (auto)" if cfg.kv_disk_bytes is None else "")
        state = "" if tier.enabled else " · turned off after an error (see the log)"
        return [("KV disk tier", cap + state), ("KV disk directory", str(tier.directory))]
    if not tier_configured(cfg):
        why = "kv_disk_bytes 0" if cfg.kv_disk_bytes == 0 else "needs prefix caching"
        return [("KV disk tier", f"off ({why})")]
    return [
        ("KV disk tier", "off: could not be opened (see the log)"),
        ("KV disk directory", configured_tier_dir(cfg)),
    ]


async def admin_page(request: Request) -> Response:
    """GET /admin: the live pool page, else why not: the token sign-in form (401), the need for an admin account
    (accounts on, no token: 401 signed out, 403 signed in), or loopback only (no accounts, no token: 403)."""
    svc = services(request)
    if await is_admin(request, svc):
        return _render(
            request,
            "admin.html",
            {"settings_rows": engine_settings_rows(svc), "signed_in": bool(svc.settings.admin_token)},
        )
    accounts = svc.settings.auth != "none"
    if svc.settings.admin_token:
        return _render(request, "admin_login.html", {"error": None, "accounts": accounts}, status_code=401)
    if accounts:
        account = signed_in_account(request)
        context = {"account_needed": True, "account": account.user.username if account is not None else None}
        return _render(request, "admin_login.html", context, status_code=401 if account is None else 403)
    return _render(request, "admin_login.html", {"loopback_only": True}, status_code=403)


async def admin_login(request: Request) -> Response:
    """POST /admin/login (form field `token`): a correct token records a sign-in, sets its cookie and redirects to
    /admin; an address that sent too many wrong tokens must wait (429 with Retry-After) before trying again."""
    svc = services(request)
    if (refused := _cross_origin(request, svc)) is not None:
        return refused
    if not svc.settings.admin_token:
        return RedirectResponse("/admin", status_code=303)
    try:
        token = await read_login_token(request)
        # checked after the await, with none between it and the count: concurrent tries cannot all slip past
        check_attempts(request, svc)
        ok = token_matches(token, svc.settings)
        record_attempt(request, svc, ok=ok)
        if not ok:
            return _render(
                request, "admin_login.html", {"error": "That token is not valid."}, status_code=403
            )
        cookie = await sign_in(request, svc)
    except Exception as exc:  # noqa: BLE001 - throttled (429) or the sign-in could not be recorded (503)
        error = from_exception(exc)
        return _render(request, "admin_login.html", {"error": error.message}, error.status, error.headers)
    response = RedirectResponse("/admin", status_code=303, headers=NO_STORE)
    response.headers.append("Set-Cookie", cookie)
    return response


async def admin_logout(request: Request) -> Response:
    """POST /admin/logout: revoke the sign-in (on the server: a copy of the cookie is worthless) and forget it."""
    svc = services(request)
    if (refused := _cross_origin(request, svc)) is not None:
        return refused
    try:
        await sign_out(request, svc)
    except Exception as exc:  # noqa: BLE001 - not revoked: say so rather than pretend
        error = from_exception(exc)
        logger.error("admin sign-out not recorded: %s", error.message)
        response: Response = _render(
            request, "admin_login.html", {"error": f"Sign-out failed: {error.message}"}, error.status
        )
    else:
        response = RedirectResponse("/admin", status_code=303, headers=NO_STORE)
    response.headers.append("Set-Cookie", admin_cookie_header(svc.settings, clear=True))
    return response


def _cross_origin(request: Request, svc: Services) -> Response | None:
    """403 for a sign-in or sign-out form posted from another origin (login CSRF, forced logout); else None."""
    reason = cross_origin_reason(request, svc.settings)
    if reason is None:
        return None
    logger.warning("admin %s refused: %s", request.url.path, reason)
    message = (
        f"cross-origin request refused: {request.url.path} must be posted from this server's own admin page, "
        f"but {reason}"
    )
    return error_response(APIError(403, message, code="cross_origin_request"))


routes = [
    Route("/", chat_page, methods=["GET"]),
    Route("/admin", admin_page, methods=["GET"]),
    Route("/admin/login", admin_login, methods=["POST"]),
    Route("/admin/logout", admin_logout, methods=["POST"]),
    Mount("/static", app=StaticFiles(directory=str(STATIC_DIR)), name="static"),
]
