"""Fixtures of the benchmark tests."""

from __future__ import annotations

import pytest

from bench.common import servers
from tests.e2e.zygote import fork_server
from tests.engine.bench_helpers import shared_tiny_model


@pytest.fixture(autouse=True, scope="session")
def _forked_servers():
    """The benchmarks' pagedchat servers forked from the tests' zygote (tests/e2e/zygote.py), as the end-to-end
    tests' are: ~5 s less a start."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(servers, "default_launcher", fork_server)
        yield


@pytest.fixture(scope="module")
def tiny_model() -> str:
    """A tiny random model folder for one test module's benchmark runs."""
    return shared_tiny_model()
