"""Checked by mypy (`make test`), never run: both engine clients are `EngineClient`s, as the app holds them.

A method missing from one, or one whose signature differs from the protocol's, fails `mypy` on this file.
"""

from __future__ import annotations

from app.cluster.replica_engine import ReplicaSetEngine
from app.engine_client.async_engine import AsyncEngine
from app.engine_client.protocol import EngineClient


def in_process(engine: AsyncEngine) -> EngineClient:
    return engine


def replica_set(engine: ReplicaSetEngine) -> EngineClient:
    return engine
