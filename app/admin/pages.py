"""The admin page (`/admin`): the engine's settings, memory and disk tier, and its token-for-cookie sign-in."""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from app.admin.advice import format_bytes
from app.admin.tier_view import configured_tier_dir, tier_configured
from app.engine_client.protocol import EngineInfo, EngineUnavailable
from app.http.account_auth import signed_in_account
from app.http.admin_auth import (
    admin_cookie_header,
    check_attempts,
    is_admin,
    read_login_token,
    record_attempt,
    sign_in,
    sign_out,
    token_matches,
)
from app.http.csrf import cross_origin_reason
from app.http.error_handlers import error_response
from app.http.errors import APIError, from_exception
from app.http.services import Services, services
from app.http.templates import NO_STORE, render
from engine.core.memory import available_memory_bytes, process_rss_bytes

logger = logging.getLogger(__name__)

KV_DTYPE_LABELS = {"int8": "int8 (an fp16 scale per token and KV head)"}


async def engine_settings_rows(svc: Services) -> list[tuple[str, str]]:
    """The engine's settings as (label, value) rows for the admin page."""
    info = svc.engine.info
    cfg = info.config
    pool_bytes = info.num_blocks * info.kv_block_bytes
    tier_rows = (
        disk_tier_rows(info, await _tier_enabled(svc)) if svc.engine.health() is None else replica_rows(svc)
    )
    return [
        ("Model", info.model_name),
        ("Device / dtype", f"{cfg.device} / {cfg.dtype}"),
        ("Attention backend", cfg.attention_backend),
        ("Block size", f"{cfg.block_size} tokens"),
        (
            "KV pool",
            f"{info.num_blocks} blocks · {info.num_blocks * cfg.block_size} tokens · "
            f"{format_bytes(pool_bytes)}",
        ),
        *memory_rows(info),
        ("KV cache dtype", KV_DTYPE_LABELS.get(info.kv_cache_dtype, info.kv_cache_dtype)),
        ("Bytes per block", format_bytes(info.kv_block_bytes)),
        ("Max model length", f"{cfg.max_model_len} tokens"),
        ("Max sequences", str(cfg.max_num_seqs)),
        ("Max batched tokens", str(cfg.max_num_batched_tokens)),
        ("Prefix caching", "on" if cfg.enable_prefix_caching else "off"),
        *tier_rows,
    ]


def memory_rows(info: EngineInfo) -> list[tuple[str, str]]:
    """The weights' bytes (in quantized blocks, in float), the weights and KV pool together, this process's resident
    memory and what the machine's memory has left, as the engine's start-up line logs them (a replica set's front
    engine holds no weights or pool of its own: no weights rows, and its RSS is the front process's alone)."""
    rows = []
    weights = info.weight_memory
    if weights is not None:
        pool_bytes = info.num_blocks * info.kv_block_bytes
        rows += [
            (
                "Weights",
                f"{format_bytes(weights.total)} · {format_bytes(weights.blocks)} in blocks · "
                f"{format_bytes(weights.float)} in float",
            ),
            ("Weights + KV pool", format_bytes(weights.total + pool_bytes)),
        ]
    rss = process_rss_bytes()
    where = "" if weights is not None else " · this front process (each replica has its own)"
    rows.append(("Process memory (RSS)", ("unknown" if rss is None else format_bytes(rss)) + where))
    available = available_memory_bytes()
    rows.append(("Memory available", "unknown" if available is None else format_bytes(available)))
    return rows


def replica_rows(svc: Services) -> list[tuple[str, str]]:
    """With replicas: how many, how requests pick one, and where their disk tiers are (each its own)."""
    settings, cfg = svc.settings, svc.engine.info.config
    n = settings.threads_per_replica
    threads = f"{n} thread{'s' if n != 1 else ''}" if n else "threads as the engine's setting"
    rows = [
        ("Replicas", f"{settings.replicas} on Ray Serve · {threads} each"),
        ("Routing", settings.routing),
    ]
    if tier_configured(cfg):
        rows.append(("KV disk tier", "one per replica: see the Disk tier card of each replica"))
    return rows


async def _tier_enabled(svc: Services) -> bool | None:
    """Whether the disk tier still takes writes (it turns itself off after an error); None: the engine cannot say
    (it has stopped: the page still shows what it can)."""
    try:
        tier = (await svc.engine.stats()).tier
    except EngineUnavailable:
        return None
    return None if tier is None else tier.enabled


def disk_tier_rows(info: EngineInfo, enabled: bool | None) -> list[tuple[str, str]]:
    """The disk tier's rows: its resolved cap and directory (`enabled` False: turned off since), or why there is
    none."""
    cfg = info.config
    if info.tier_directory is not None and info.tier_capacity_bytes is not None:
        cap = f"{format_bytes(info.tier_capacity_bytes)} cap" + (
            " (auto)" if cfg.kv_disk_bytes is None else ""
        )
        state = " · turned off after an error (see the log)" if enabled is False else ""
        return [("KV disk tier", cap + state), ("KV disk directory", info.tier_directory)]
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
        return render(
            request,
            "admin.html",
            {
                "settings_rows": await engine_settings_rows(svc),
                "signed_in": bool(svc.settings.admin_token),
                # the Models card: each one's state, load, unload
                "several_models": len(svc.models.names) > 1,
            },
        )
    accounts = svc.settings.auth != "none"
    if svc.settings.admin_token:
        return render(request, "admin_login.html", {"error": None, "accounts": accounts}, status_code=401)
    if accounts:
        account = signed_in_account(request)
        context = {"account_needed": True, "account": account.user.username if account is not None else None}
        return render(request, "admin_login.html", context, status_code=401 if account is None else 403)
    return render(request, "admin_login.html", {"loopback_only": True}, status_code=403)


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
            return render(request, "admin_login.html", {"error": "That token is not valid."}, status_code=403)
        cookie = await sign_in(request, svc)
    except Exception as exc:  # noqa: BLE001 - throttled (429) or the sign-in could not be recorded (503)
        error = from_exception(exc)
        return render(request, "admin_login.html", {"error": error.message}, error.status, error.headers)
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
        response: Response = render(
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
    Route("/admin", admin_page, methods=["GET"]),
    Route("/admin/login", admin_login, methods=["POST"]),
    Route("/admin/logout", admin_logout, methods=["POST"]),
]
