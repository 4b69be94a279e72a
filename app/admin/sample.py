"""One sample of the admin feed: each engine's state (one engine, or each replica's) and what each page gets of it.

A page gets one engine's state (counters, sequences, charts' point, advice, disk tier) with the block map of its
view spliced in: the one engine's, or, with replicas, the replica the view names (the first by default), plus the
replica panels: each replica's health, load, prefix hit rate and routing decisions, and a small map of its whole
pool. The states are serialised once a sample; only the maps are made per page (a few KiB of numpy each).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from app.admin.block_map import MapView, PoolArrays, block_map
from app.admin.ops import routing_to_json
from engine.core.stats import EngineStats


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


class EngineSample:
    """One engine's part of a sample: its state's JSON without the block map, and what its maps are made from."""

    def __init__(self, state: dict[str, Any], snap: Any, hashed: range) -> None:
        self.state = state
        self.hashed = hashed
        self.json = _dumps(state)
        self.arrays = PoolArrays.from_lists(snap.block_states, snap.ref_counts)
        self.sequences = snap.sequences
        self.hashes = snap.block_hash_prefixes

    def map_json(self, view: MapView) -> dict[str, Any]:
        """The block map of one page's view."""
        return block_map(self.arrays, view, self.sequences, self.hashes, self.hashed)


def panel_json(
    replica: dict[str, Any], sample: EngineSample | None, routing: Any, hit_rate: float | None
) -> dict[str, Any]:
    """A replica's panel without its map: health (from /health's census), load and blocks, the prefix hit rate
    (last minute, and since the replica started), and its routing decisions. `sample` None: it did not answer
    this sample (starting, unreachable)."""
    panel: dict[str, Any] = {**replica, "sampled": sample is not None, "stats": None, "hit_rate": hit_rate}
    if sample is not None:
        stats = sample.state["pool"]["stats"]
        keys = (
            "num_running",
            "num_waiting",
            "num_blocks",
            "num_free_blocks",
            "num_cached_blocks",
            "num_used_blocks",
            "prefix_query_tokens",
            "prefix_hit_tokens",
        )
        panel["stats"] = {key: stats[key] for key in keys}
        queries = stats["prefix_query_tokens"]
        panel["hit_rate_total"] = stats["prefix_hit_tokens"] / queries if queries else None
    panel["routing"] = routing_to_json(routing) if routing is not None else None
    return panel


@dataclass
class FeedSample:
    """A sample of every engine, and the replica panels (None: one engine in this process)."""

    time_s: float
    engines: dict[str, EngineSample]  # engine name ("engine", or each replica's) -> its part, in rank order
    replicas: dict[str, Any] | None = None  # asked, ready, panels (each without its map)
    _panel_maps: dict[int, str] = field(default_factory=dict)  # panel cells -> the panels' JSON with maps

    def focus(self, view: MapView) -> str:
        """The engine whose state a page with `view` gets: the replica it names if sampled, else the first."""
        if view.replica is not None and view.replica in self.engines:
            return view.replica
        return next(iter(self.engines))

    def state(self, view: MapView) -> dict[str, Any]:
        """What a page with `view` gets, as a dict (the feed's `sample()` returns it)."""
        return json.loads(self.for_view(view))

    def for_view(self, view: MapView) -> str:
        """The focused engine's shared JSON with the page's own `map` spliced in, and with replicas the replica's
        name and the panels (their maps at the view's panel cells)."""
        name = self.focus(view)
        engine = self.engines[name]
        extra = ',"map":' + _dumps(engine.map_json(view))
        if self.replicas is not None:
            extra += ',"replica":' + _dumps(name) + ',"replicas":' + self._panels(view.panel_cells)
        return engine.json[:-1] + extra + "}"

    def _panels(self, cells: int) -> str:
        found = self._panel_maps.get(cells)
        if found is None:
            assert self.replicas is not None
            panels = []
            for panel in self.replicas["panels"]:
                engine = self.engines.get(panel["name"])
                whole = MapView(cells=cells)
                panels.append({**panel, "map": engine.map_json(whole) if engine is not None else None})
            found = self._panel_maps[cells] = _dumps({**self.replicas, "panels": panels})
        return found


def is_active(stats: EngineStats) -> bool:
    """Anything running, waiting or holding blocks (the feed samples faster then)."""
    return bool(stats.num_running or stats.num_waiting or stats.num_used_blocks)
