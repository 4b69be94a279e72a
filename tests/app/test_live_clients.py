"""The after-test pool check (tests/app/live_clients.py) sees a sequence still holding blocks, names it, and lets
the app go once the sequence is done."""

from __future__ import annotations

import threading
import time

import pytest

from tests.app.factories import make_client, make_tiny_model_dir
from tests.app.live_clients import LIVE_CLIENTS, blocks_in_use, check_pool_idle, engine_state
from tests.faults import FaultPlan

# 30 tokens at 50 ms a step: the request holds its blocks for ~1.5 s while the check runs
SLOW_REQUEST = {
    "model": make_tiny_model_dir().name,
    "messages": [{"role": "user", "content": "hello"}],
    "max_tokens": 30,
    "ignore_eos": True,
}


def test_check_names_a_sequence_in_flight_and_passes_once_it_ends(tmp_path):
    with make_client(tmp_path, faults=FaultPlan(step_delay_s=0.05)) as client:
        assert LIVE_CLIENTS[-1] is client
        check_pool_idle(client)  # a fresh app holds nothing
        responses = []
        request = threading.Thread(
            target=lambda: responses.append(client.post("/v1/chat/completions", json=SLOW_REQUEST))
        )
        request.start()
        deadline = time.monotonic() + 5.0
        while not blocks_in_use(engine_state(client)) and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(AssertionError, match=r"blocks stayed in use .*live sequences \[\d+\]"):
            check_pool_idle(client, timeout_s=0.2)
        request.join()
        assert responses[0].status_code == 200, responses[0].text
        assert responses[0].json()["usage"]["completion_tokens"] == 30
        check_pool_idle(client)  # the finished request gave its blocks back
    assert client not in LIVE_CLIENTS
