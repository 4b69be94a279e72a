"""The admin page's memory rows: weights, weights and pool together, the process's RSS, the memory left."""

from __future__ import annotations

from types import SimpleNamespace

from app.admin import pages
from engine.core.memory import WeightMemory

MiB = 2**20


def test_memory_rows_add_up_the_weights_and_pool_and_show_the_process_rss(monkeypatch):
    monkeypatch.setattr(pages, "process_rss_bytes", lambda: 900 * MiB)
    monkeypatch.setattr(pages, "available_memory_bytes", lambda: 20 * 2**30)
    info = SimpleNamespace(
        weight_memory=WeightMemory(100 * MiB, 40 * MiB), num_blocks=2048, kv_block_bytes=368_640
    )
    assert pages.memory_rows(info) == [
        ("Weights", "140 MiB · 100 MiB in blocks · 40.0 MiB in float"),
        ("Weights + KV pool", "860 MiB"),  # 140 MiB + 2,048 blocks of 360 KiB (720 MiB)
        ("Process memory (RSS)", "900 MiB"),
        ("Memory available", "20.0 GiB"),
    ]


def test_a_replica_sets_front_has_no_weights_and_says_whose_rss_it_is(monkeypatch):
    monkeypatch.setattr(pages, "process_rss_bytes", lambda: None)
    monkeypatch.setattr(pages, "available_memory_bytes", lambda: None)
    info = SimpleNamespace(weight_memory=None, num_blocks=64, kv_block_bytes=1024)
    assert pages.memory_rows(info) == [
        ("Process memory (RSS)", "unknown · this front process (each replica has its own)"),
        ("Memory available", "unknown"),
    ]
