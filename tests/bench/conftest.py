"""Fixtures of the benchmark tests."""

from __future__ import annotations

import pytest

from tests.engine.bench_helpers import shared_tiny_model


@pytest.fixture(scope="module")
def tiny_model() -> str:
    """A tiny random model folder for one test module's benchmark runs."""
    return shared_tiny_model()
