"""GET /api/admin/stream: the admin page's live feed (SSE) of the block pool, chart points, advice and disk tier.

One sampler per app, running only while an admin page listens: 4 samples a second while anything is in the pool or
the queues, two a second when idle. Each sample is a snapshot taken on the engine thread between steps; each page
gets the block map of its own view of it (`?start=&end=&cells=&seq=`: see app/admin/block_map.py), so a page
zooms or marks a sequence by reconnecting with another view (`history=0` skips the chart history it has).

With replicas (`--replicas N`), each sample is a snapshot of every serving replica (taken on each replica's engine
thread, at the same cadence), each replica with a chart history of its own; a page gets the state of the replica its
view names (`?replica=`, the first by default) and a panel per replica (`?pcells=`: the cells of its small map; see
app/admin/sample.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.admin.advice import AdviceInputs, advise
from app.admin.block_map import MapView, detail_range, parse_view
from app.admin.ops import stats_to_json
from app.admin.owner_names import OwnerNames
from app.admin.sample import EngineSample, FeedSample, is_active, panel_json
from app.admin.tier_advice import tier_advice
from app.admin.tier_view import configured_tier_dir, tier_configured, tier_panel
from app.admin.traffic import TrafficRecorder
from app.http.admin_auth import check_admin
from app.http.credentials import credential_of, revocation, revoked_error
from app.http.error_handlers import error_response
from app.http.errors import from_exception
from app.http.services import Services, services
from app.http.shutdown import SHUTDOWN_MESSAGE
from app.http.sse import event_stream
from engine.core.stats import EngineStats

logger = logging.getLogger(__name__)
ACTIVE_INTERVAL_S = 0.25
IDLE_INTERVAL_S = 0.5
HISTORY_S = 180.0  # chart history sent to a page when it connects
DATABASE_SIZE_INTERVAL_S = 5.0  # the database's size is read this often (it changes slowly)
FRESH_S = 1.0  # a page that connects within this long of a sample gets that sample at once


class AdminFeed:
    """Samples the pool while subscribers listen and hands each the newest state (slow readers skip states)."""

    def __init__(self, svc: Services, recorder: TrafficRecorder, *, sample_lengths: bool) -> None:
        self.svc = svc
        self.recorder = recorder  # one engine's; each replica gets its own (`_recorder`)
        # True: learn sequence lengths by diffing snapshots (approximate)
        self.sample_lengths = sample_lengths
        self._subscribers: dict[asyncio.Queue[str], MapView] = {}
        self._task: asyncio.Task | None = None
        self._last: FeedSample | None = None
        self._replica_recorders: dict[str, TrafficRecorder] = {}
        self._database_bytes: int | None = None
        self._database_read_at = -DATABASE_SIZE_INTERVAL_S
        self._owner_names = OwnerNames(svc.store)  # accounts named by username, not id, on the page

    @property
    def replicated(self) -> bool:
        """Whether the engine is a replica set."""
        return self.svc.engine.health() is not None

    def subscribe(self, view: MapView | None = None) -> asyncio.Queue[str]:
        """A queue of JSON states with the block map of `view` (default: the whole pool); starts the sampler if it
        is not running. A fresh sample is queued at once (a page that zooms sees its new view without waiting)."""
        view = view or MapView()
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=1)
        self._subscribers[queue] = view
        last = self._last
        if last is not None and time.monotonic() - last.time_s < FRESH_S:
            queue.put_nowait(last.for_view(view))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="admin-feed")
        return queue

    def unsubscribe(self, queue: asyncio.Queue[str]) -> None:
        """Stop delivering to `queue`; the sampler stops after its last subscriber leaves."""
        self._subscribers.pop(queue, None)

    def history(self, now: float, view: MapView | None = None) -> list[dict[str, Any]]:
        """Recent chart points, for a page that just connected (with replicas: of the replica its view shows)."""
        recorder = self.recorder
        if self.replicated:
            last = self._last
            name = last.focus(view or MapView()) if last is not None else None
            recorder = self._replica_recorders.get(name) if name is not None else None
            if recorder is None:
                return []
        return [p.to_json() for p in recorder.points(since_s=now - HISTORY_S)]

    def _recorder(self, name: str) -> TrafficRecorder:
        if not self.replicated:
            return self.recorder
        found = self._replica_recorders.get(name)
        if found is None:
            found = self._replica_recorders[name] = TrafficRecorder()
        return found

    async def sample(self, *, resumed: bool = False) -> tuple[dict[str, Any], bool]:
        """One state (with the block map of the first listener's view, the whole pool when none listens), and
        whether anything is running (which sets the sampling rate); each listener's own view goes out from `_run`.
        `resumed`: the first sample of a sampler that was stopped (its chart point starts a new line)."""
        taken, active = await self._sample(resumed=resumed)
        return taken.state(next(iter(self._subscribers.values()), MapView())), active

    async def _sample(self, *, resumed: bool) -> tuple[FeedSample, bool]:
        engine = self.svc.engine
        views = list(self._subscribers.values()) or [MapView()]
        # the panels' maps show whole pools: their hashes too when a pool fits one block a cell
        wanted = views + [MapView(cells=cells) for cells in {v.panel_cells for v in views}]
        taken = await engine.pool_sample_each(functools.partial(detail_range, wanted))
        now = time.monotonic()
        database_bytes = await self._database_size(now)
        await self._owner_names.learn(
            engine.label_of(seq["request_id"]) for _, sample in taken for seq in sample.snapshot.sequences
        )
        engines: dict[str, EngineSample] = {}
        rates: dict[str, float | None] = {}
        active = False
        for name, sample in taken:
            snap = sample.snapshot
            active = active or is_active(snap.stats)
            recorder = self._recorder(name)
            state = self._engine_state(
                snap,
                recorder,
                now,
                sample.num_preempted,
                sample.tier_directory,
                database_bytes,
                resumed=resumed,
            )
            engines[name] = EngineSample(state, snap, sample.hashed)
            rates[name] = state["point"]["prefix_hit_rate"]
        replicas = None
        health = engine.health()
        if health is not None:
            routing = engine.replica_report().routing
            replicas = {
                "asked": health["asked"],
                "ready": health["ready"],
                "panels": [
                    panel_json(r, engines.get(r["name"]), routing.get(r["name"]), rates.get(r["name"]))
                    for r in health["replicas"]
                ],
            }
            known = {r["name"] for r in health["replicas"]} | set(engines)
            for gone in set(self._replica_recorders) - known:  # restarted replicas have new names
                del self._replica_recorders[gone]
        self._last = FeedSample(now, engines, replicas)
        return self._last, active

    def _engine_state(
        self,
        snap: Any,
        recorder: TrafficRecorder,
        now: float,
        num_preempted: int,
        directory: str | None,
        database_bytes: int | None,
        *,
        resumed: bool,
    ) -> dict[str, Any]:
        """One engine's state for the page: its pool and sequences, chart point, advice and disk tier panel."""
        info = self.svc.engine.info
        stats: EngineStats = snap.stats
        if self.sample_lengths or self.replicated:
            recorder.observe_live_sequences(snap.sequences, now)
        point = recorder.observe_stats(stats, now, num_preempted=num_preempted, resumed=resumed)
        advice = advise(
            AdviceInputs(
                block_size=stats.block_size,
                num_blocks=stats.num_blocks,
                block_bytes=info.kv_block_bytes,
                kv_cache_dtype=stats.kv_cache_dtype,
                int8_block_bytes=info.kv_int8_block_bytes,
                max_model_len=stats.max_model_len,
                max_num_seqs=info.config.max_num_seqs,
                num_running=stats.num_running,
                num_tokens_stored=stats.num_tokens_stored,
                num_slots_allocated=stats.num_slots_allocated,
                window_s=recorder.observed_span_s(now),
                num_preemptions=recorder.preemptions_in_window(),
                peak_running=recorder.peak_running(),
                peak_used_blocks=recorder.peak_used_blocks(),
                sequence_lengths=recorder.sequence_lengths(),
                database_bytes=database_bytes,
                max_database_bytes=self.svc.settings.max_database_bytes,
            )
        )
        cfg = info.config
        configured = tier_configured(cfg)
        advice = replace(advice, items=[*advice.items, *tier_advice(stats.tier, configured=configured)])
        if directory is None and configured:
            directory = configured_tier_dir(cfg)
        return {
            "time_s": round(now, 3),
            "pool": {
                "num_blocks": len(snap.block_states),
                "block_size": stats.block_size,
                "sequences": [self._sequence_json(seq) for seq in snap.sequences],
                "stats": stats_to_json(stats),
            },
            "point": point.to_json(),
            "advice": advice.to_json(),
            "tier": tier_panel(stats.tier, configured=configured, directory=directory),
        }

    def _sequence_json(self, seq: dict[str, Any]) -> dict[str, Any]:
        """A live sequence for the page: who it is for (as its submitter labelled it), its prefix-cache hit and
        sizes; not its block table (a page asks for a sequence's blocks on the map with `seq=`)."""
        label = self.svc.engine.label_of(seq["request_id"])
        return {
            "seq_id": seq["seq_id"],
            "request_id": seq["request_id"],
            "label": self._owner_names.name(label).to_json() if label is not None else None,
            "status": seq["status"],
            "num_tokens": seq["num_tokens"],
            "num_prompt_tokens": seq["num_prompt_tokens"],
            "num_cached_tokens": seq["num_cached_tokens"],
            "num_blocks": len(seq["block_table"]),
        }

    async def _database_size(self, now: float) -> int | None:
        """The database's size, read at most every DATABASE_SIZE_INTERVAL_S; None when unknown or unreadable."""
        if now - self._database_read_at >= DATABASE_SIZE_INTERVAL_S:
            self._database_read_at = now
            try:
                self._database_bytes = await self.svc.store.database_bytes()
            except Exception:  # noqa: BLE001 - an outage shows elsewhere; the advice just leaves the size out
                self._database_bytes = None
        return self._database_bytes

    async def _run(self) -> None:
        resumed = True
        while self._subscribers:
            error = None
            try:
                _, active = await self._sample(resumed=resumed)
                resumed = False
            except Exception as exc:  # noqa: BLE001 - the page shows the error and the feed keeps trying
                error, active = json.dumps({"error": from_exception(exc).message}), False
            last = self._last
            for queue, view in list(self._subscribers.items()):
                if error is None:
                    assert last is not None, "a sample that succeeded is kept"
                data = error if error is not None else last.for_view(view)
                if queue.full():  # a slow reader gets the newest state, not a backlog
                    with contextlib.suppress(asyncio.QueueEmpty):
                        queue.get_nowait()
                queue.put_nowait(data)
            await asyncio.sleep(ACTIVE_INTERVAL_S if active else IDLE_INTERVAL_S)


def admin_feed(app: Starlette) -> AdminFeed:
    """The app's feed, made on first use after each start: it keeps its own traffic recorder, which learns sequence
    lengths from the snapshots it takes while a page listens."""
    feed = getattr(app.state, "admin_feed", None)
    if feed is None or feed.svc is not app.state.services:  # none yet, or one of an earlier start's services
        feed = AdminFeed(app.state.services, TrafficRecorder(), sample_lengths=True)
        app.state.admin_feed = feed
    return feed


async def admin_stream(request: Request) -> Response:
    """SSE: a `history` event of recent chart points (unless `history=0`), then a `state` event per sample with
    the block map of the view the query asks for (start, end, cells, seq; a bad value is a 400)."""
    svc = services(request)
    try:
        await check_admin(request, svc)
        view = parse_view(request.query_params)
        credential = await credential_of(request, svc, admin=True)
    except Exception as exc:  # noqa: BLE001 - 401/403, or 400 for a bad view, in the API's error shape
        return error_response(from_exception(exc))
    send_history = request.query_params.get("history") != "0"
    feed = admin_feed(request.app)
    queue = feed.subscribe(view)

    async def events() -> AsyncIterator[dict[str, str]]:
        try:
            if send_history:
                now = time.monotonic()
                history = {"time_s": round(now, 3), "points": feed.history(now, view)}
                yield {"event": "history", "data": json.dumps(history, separators=(",", ":"))}
            while True:
                yield {"event": "state", "data": await queue.get()}
        finally:
            feed.unsubscribe(queue)

    def farewell() -> list[dict[str, str]]:
        return [
            {"event": "shutdown", "data": json.dumps({"reason": "shutdown", "message": SHUTDOWN_MESSAGE})}
        ]

    def revoked_events() -> list[dict[str, str]]:  # the page's reconnect then shows the sign-in
        return [{"event": "error", "data": json.dumps(revoked_error("this admin feed").to_dict())}]

    # at shutdown the page watches the pool drain through the grace period, then gets a `shutdown` event; an admin
    # sign-out, demotion or new admin token ends the feed with an `error` event within an interval
    return event_stream(
        events(),
        svc,
        farewell,
        end_wait_s=0.0,
        headers={"Cache-Control": "no-store"},
        revoked=revocation(request, svc, credential, revoked_events),
    )


routes = [Route("/api/admin/stream", admin_stream, methods=["GET"])]
