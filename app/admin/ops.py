"""Operations endpoints: /health, /metrics (Prometheus; admin only unless `metrics_public`) and /api/admin/state
(the block pool, for the admin page; with replicas, each replica's pool and the routing decisions)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.engine_client.protocol import EngineUnavailable
from app.http.admin_auth import check_admin
from app.http.error_handlers import error_response
from app.http.errors import from_exception
from app.http.services import Services, services
from app.metrics.cluster_metrics import ReplicaSetReport
from engine.core.stats import EngineStats, PoolSnapshot

_STATE_CHARS = "fcu"  # block_states 0 free / 1 cached-evictable / 2 in use, one character per block


async def health(request: Request) -> Response:
    """200 once the model is loaded and warmed up and the engine thread runs; 503 with the reason otherwise."""
    svc = services(request)
    engine = svc.engine
    if svc.shutdown.draining_since is not None:
        body = {"status": "draining", "reason": "the server is shutting down"}
        return JSONResponse(body, status_code=503, headers={"Retry-After": "5"})
    replicas = engine.health()
    if engine.healthy:
        store_ok = True
        try:
            await svc.store.ping()
        except Exception:  # noqa: BLE001 - reported in the body, the engine still serves /v1
            store_ok = False
        body: dict[str, Any] = {
            "status": "ok",
            "model": svc.models.default_name,  # the id /v1/models serves it as
            "database": "ok" if store_ok else "unavailable",
        }
        if replicas is not None:  # replicas on Ray Serve: degraded (still serving) while some are not ready
            body["replicas"] = replicas
            if replicas["ready"] < replicas["asked"]:
                body["status"] = "degraded"
                body["reason"] = f"{replicas['ready']} of {replicas['asked']} engine replicas ready"
        return JSONResponse(body)
    reason = engine.dead_reason or ("starting" if not engine.ready else "stopped")
    status = "starting" if engine.dead_reason is None and not engine.ready else "unhealthy"
    body = {"status": status, "reason": reason}
    if replicas is not None:
        body["replicas"] = replicas
    return JSONResponse(body, status_code=503, headers={"Retry-After": "5"})


async def metrics(request: Request) -> Response:
    """Prometheus text exposition; engine gauges are taken on the engine thread for this scrape. Admin only (token
    as X-Admin-Token or Bearer, the admin cookie, or loopback without a token) unless `metrics_public`."""
    svc = services(request)
    if not svc.settings.metrics_public:
        try:
            await check_admin(request, svc)
        except Exception as exc:  # noqa: BLE001 - 401/403/429 in the API's error shape
            return error_response(from_exception(exc))
    report = svc.engine.replica_report()
    if (
        report is not None
    ):  # replicas: from the census (each replica's stats as of its last answer) and ledger
        svc.metrics.set_replica_set(report)
    elif svc.engine.healthy:
        svc.metrics.set_engine_stats(await svc.engine.stats())
    svc.metrics.set_other_models(*await other_models_stats(svc))
    return Response(svc.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


async def other_models_stats(
    svc: Services,
) -> tuple[list[tuple[str, str | None, EngineStats]], list[tuple[str, ReplicaSetReport]]]:
    """(model, replica or None, engine stats) of each loaded model other than the default, and (model, report) of
    those that are replica sets; a model that unloads meanwhile is left out."""
    found: list[tuple[str, str | None, EngineStats]] = []
    replica_sets: list[tuple[str, ReplicaSetReport]] = []
    for handle in svc.models.loaded():
        if handle.engine is svc.engine:
            continue
        report = handle.engine.replica_report()
        if report is not None:
            found.extend((handle.name, replica, stats) for replica, stats in report.stats)
            replica_sets.append((handle.name, report))
            continue
        try:
            found.append((handle.name, None, await handle.engine.stats()))
        except EngineUnavailable:  # unloaded (or died) since the listing
            continue
    return found, replica_sets


def service_state(svc: Services) -> dict[str, Any]:
    """The service's own bookkeeping: streams and replies in flight (all 0 when idle: nothing leaked)."""
    return {
        "in_flight_requests": svc.engine.num_in_flight,
        "pending_outputs": svc.engine.num_pending_outputs,
        "streaming_replies": svc.chat.num_streaming,
        "client_limit_rejections": svc.admission.limiter.num_rejected,
        "draining": svc.shutdown.draining_since is not None,
    }


def stats_to_json(stats: EngineStats) -> dict[str, Any]:
    """The stats as a JSON object: every field (the tier's as a nested object, or null), `ram_hit_tokens` and
    `kv_pool_bytes`."""
    return {**asdict(stats), "ram_hit_tokens": stats.ram_hit_tokens, "kv_pool_bytes": stats.kv_pool_bytes}


def snapshot_to_json(snap: PoolSnapshot) -> dict[str, Any]:
    """A compact JSON picture of the pool: one character per block, ref counts and hashes only where set."""
    owners: dict[int, list[int]] = {}
    for seq in snap.sequences:
        for block_id in seq["block_table"]:
            owners.setdefault(block_id, []).append(seq["seq_id"])
    return {
        "num_blocks": len(snap.block_states),
        "block_size": snap.stats.block_size,
        "block_states": "".join(_STATE_CHARS[s] for s in snap.block_states),
        "ref_counts": {str(i): r for i, r in enumerate(snap.ref_counts) if r},
        "block_hashes": {str(i): h for i, h in snap.block_hash_prefixes.items()},
        "block_owners": {str(i): ids for i, ids in owners.items()},
        "sequences": snap.sequences,
        "stats": stats_to_json(snap.stats),
    }


def routing_to_json(counts: Any) -> dict[str, Any]:
    """One replica's routing counts (app/cluster/routing_ledger.py's ReplicaRouting) as JSON, with the split the
    admin page shows: to the longest cached prefix, fallen back for load, and the rest."""
    requests = dict(counts.requests)
    return {
        "requests": requests,
        "num_requests": sum(requests.values()),
        "longest_prefix": requests.get("longest_prefix", 0),
        "load_fallback": requests.get("load_fallback", 0),
        "other": sum(n for o, n in requests.items() if o not in ("longest_prefix", "load_fallback")),
        "num_at_longest": counts.num_at_longest,
        "matched_blocks": counts.matched_blocks,
        "best_matched_blocks": counts.best_matched_blocks,
        "route_blocks": counts.route_blocks,
    }


async def replicas_state(svc: Services) -> dict[str, Any]:
    """Every replica the census knows (name, state, pid, rank, in flight) with the pool snapshot of each that
    answered, and the routing decisions per replica."""
    engine = svc.engine
    snaps = dict(await engine.snapshot_each())
    health = engine.health()
    replicas = [
        {**replica, **(snapshot_to_json(snaps[replica["name"]]) if replica["name"] in snaps else {})}
        for replica in health["replicas"]
    ]
    report = engine.replica_report()
    return {
        "asked": health["asked"],
        "ready": health["ready"],
        "replicas": replicas,
        "routing": {name: routing_to_json(counts) for name, counts in sorted(report.routing.items())},
    }


async def admin_state(request: Request) -> Response:
    """The block pool snapshot, taken between steps (with replicas: each replica's, and the routing decisions);
    admin token (or cookie), or loopback without a token."""
    svc = services(request)
    try:
        await check_admin(request, svc)
        if svc.engine.health() is None:
            [(_, snap)] = await svc.engine.snapshot_each()
            state = snapshot_to_json(snap)
        else:
            state = await replicas_state(svc)
    except Exception as exc:  # noqa: BLE001 - auth and engine failures become API errors
        return error_response(from_exception(exc))
    return JSONResponse({**state, "service": service_state(svc)})


routes = [
    Route("/health", health, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/api/admin/state", admin_state, methods=["GET"]),
]
