"""The admin block map's aggregation: exact per-cell counts from 256 to 250,000 blocks, zoomed ranges, a marked
sequence, per-block details at one block a cell, and the view's query parameters."""

from __future__ import annotations

import base64
import json
import time

import numpy as np
import pytest

from app.admin.block_map import MapView, PoolArrays, block_map, detail_range, parse_view


def decode(counts: str) -> list[int]:
    """A base64 little-endian uint16 array, as the page's Uint16Array reads it."""
    return np.frombuffer(base64.b64decode(counts), dtype="<u2").tolist()


def make_pool(num_blocks: int, used: dict[int, int], cached: set[int]) -> PoolArrays:
    """States and ref counts: `used` block -> ref count, `cached` blocks ref 0 with a hash, the rest free."""
    states = [2 if i in used else 1 if i in cached else 0 for i in range(num_blocks)]
    return PoolArrays.from_lists(states, [used.get(i, 0) for i in range(num_blocks)])


def make_seq(seq_id: int, block_table: list[int]) -> dict:
    return {"seq_id": seq_id, "request_id": f"r{seq_id}", "block_table": block_table}


def test_a_small_pool_is_one_block_a_cell_with_each_blocks_details():
    pool = make_pool(256, used={3: 1, 4: 2, 200: 1}, cached={5, 9})
    seqs = [make_seq(0, [3, 4]), make_seq(1, [4, 200])]
    view = block_map(pool, MapView(), seqs, {4: "abcd1234", 5: "feedbeef"})
    assert (view["start"], view["end"], view["blocks_per_cell"], view["num_cells"]) == (0, 256, 1, 256)
    counts = {name: decode(value) for name, value in view["counts"].items() if value is not None}
    assert [i for i, n in enumerate(counts["used"]) if n] == [3, 200]
    assert [i for i, n in enumerate(counts["shared"]) if n] == [4]
    assert [i for i, n in enumerate(counts["cached"]) if n] == [5, 9]
    assert view["counts"]["picked"] is None and view["seq_id"] is None
    assert view["blocks"] == {
        "3": {"refs": 1, "owners": [0], "hash": None},
        "4": {"refs": 2, "owners": [0, 1], "hash": "abcd1234"},
        "5": {"refs": 0, "owners": [], "hash": "feedbeef"},
        "9": {"refs": 0, "owners": [], "hash": None},
        "200": {"refs": 1, "owners": [1], "hash": None},
    }


def test_a_large_pool_sums_each_cell_of_k_blocks_exactly():
    rng = np.random.default_rng(0)
    num_blocks = 250_000
    states = rng.choice([0, 1, 2], size=num_blocks, p=[0.5, 0.3, 0.2]).astype(np.uint8)
    refs = np.where(states == 2, rng.choice([1, 1, 1, 2, 5], size=num_blocks), 0).astype(np.int32)
    pool = PoolArrays(states, refs)
    view = block_map(pool, MapView(cells=2048), [], {})
    # 250,000 / 2048 -> 123 blocks a cell, 2033 cells, the last of 76 blocks
    assert (view["blocks_per_cell"], view["num_cells"], view["blocks"]) == (123, 2033, None)
    cached, used, shared = (np.array(decode(view["counts"][k])) for k in ("cached", "used", "shared"))
    assert len(cached) == len(used) == len(shared) == 2033
    bounds = [(i * 123, min((i + 1) * 123, num_blocks)) for i in (0, 1, 1000, 2032)]
    for i, (a, b) in zip((0, 1, 1000, 2032), bounds, strict=True):
        assert cached[i] == np.sum(states[a:b] == 1)
        assert used[i] == np.sum(refs[a:b] == 1)
        assert shared[i] == np.sum(refs[a:b] > 1)
    assert (cached.sum(), used.sum(), shared.sum()) == (
        np.sum(states == 1),
        np.sum(refs == 1),
        np.sum(refs > 1),
    )
    assert len(json.dumps(view)) < 20_000  # ~16 KiB whatever the pool: 3 arrays of 2033 uint16s in base64


def test_a_zoomed_range_and_a_marked_sequence():
    pool = make_pool(250_000, used={i: 1 for i in range(120_000, 120_010)}, cached={120_500})
    seq = make_seq(7, [120_004, 120_005, 3, 249_999])
    zoomed = block_map(
        pool,
        MapView(start=120_000, end=121_000, seq_id=7),
        [seq],
        {120_500: "00ff00ff"},
        range(120_000, 121_000),
    )
    assert (zoomed["start"], zoomed["end"], zoomed["blocks_per_cell"], zoomed["seq_id"]) == (
        120_000,
        121_000,
        1,
        7,
    )
    assert [i for i, n in enumerate(decode(zoomed["counts"]["picked"])) if n] == [
        4,
        5,
    ]  # offsets in the range
    assert sorted(zoomed["blocks"], key=int) == [str(i) for i in range(120_000, 120_010)] + ["120500"]
    assert zoomed["blocks"]["120004"] == {"refs": 1, "owners": [7], "hash": None}
    assert zoomed["blocks"]["120500"]["hash"] == "00ff00ff"
    # a view whose blocks the snapshot took no hashes of (a page that just zoomed) leaves `hash` out
    assert "hash" not in block_map(pool, MapView(120_000, 121_000), [seq], {}, range(0))["blocks"]["120004"]
    whole = block_map(pool, MapView(cells=100, seq_id=7), [seq], {})
    picked = decode(whole["counts"]["picked"])
    assert whole["blocks_per_cell"] == 2500 and (picked[0], picked[48], picked[99], sum(picked)) == (
        1,
        2,
        1,
        4,
    )
    gone = block_map(pool, MapView(cells=100, seq_id=8), [seq], {})  # the sequence ended: nothing marked
    assert (gone["seq_id"], gone["counts"]["picked"]) == (None, None)


def test_a_view_past_the_pool_is_clipped_to_it():
    assert MapView(start=300, end=400).bounds(256) == (255, 256, 1)
    assert MapView(start=10, end=400).bounds(256) == (10, 256, 1)
    # 16 cells of 10,000,000 blocks would overflow a cell's uint16 count: 153 cells of 65,360 blocks instead
    assert MapView(cells=16).bounds(10_000_000) == (0, 10_000_000, 65_360)


def test_detail_range_covers_the_views_at_one_block_a_cell():
    views = [MapView(), MapView(start=1000, end=1500), MapView(start=4000, end=4100)]
    assert detail_range(views, 250_000) == range(1000, 4100)
    assert detail_range(views, 256) == range(0, 256)  # the whole small pool is one block a cell
    assert detail_range([MapView()], 250_000) == range(0)


def test_view_parameters_and_their_errors():
    assert parse_view({}) == MapView()
    assert parse_view({"start": "10", "end": "20", "cells": "64", "seq": "3"}) == MapView(10, 20, 64, 3)
    assert parse_view({"start": "", "seq": ""}) == MapView()
    # with replicas: the replica the page shows and its panels' map cells
    assert parse_view({"replica": "q2w9e8r7", "pcells": "300"}) == MapView(
        replica="q2w9e8r7", panel_cells=300
    )
    assert parse_view({"replica": ""}).replica is None
    for params, message in [
        (
            {"replica": "a b"},
            "replica must be a replica's name (letters, digits, - and _, at most 100), got 'a b'",
        ),
        (
            {"replica": "x" * 101},
            f"replica must be a replica's name (letters, digits, - and _, at most 100), got {'x' * 40!r}",
        ),
        ({"pcells": "8"}, "pcells must be in [16, 8192], got 8"),
        ({"start": "ten"}, "start must be an integer, got 'ten'"),
        ({"start": "-1"}, "start must be at least 0, got -1"),
        ({"start": "20", "end": "20"}, "end must be greater than start, got start 20 and end 20"),
        ({"cells": "4"}, "cells must be in [16, 8192], got 4"),
        ({"cells": "100000"}, "cells must be in [16, 8192], got 100000"),
    ]:
        with pytest.raises(ValueError) as caught:
            parse_view(params)
        assert str(caught.value) == message


def test_a_250k_block_view_takes_milliseconds():
    states = [0] * 250_000
    refs = [0] * 250_000
    started = time.perf_counter()
    pool = PoolArrays.from_lists(states, refs)
    view = block_map(pool, MapView(cells=2048), [make_seq(0, list(range(0, 250_000, 7)))], {})
    elapsed = time.perf_counter() - started
    assert view["num_cells"] == 2033
    assert elapsed < 0.1, f"{elapsed * 1000:.0f} ms"  # measured ~15 ms on 2 cores
