"""Per-request histograms and counters with vLLM's meanings, after real requests against the app's tiny engine."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.app.factories import make_client
from tests.app.metrics.test_metrics import scrape
from tests.app.metrics.test_metrics import value as stat_value

PROMPT = [(7 * i + 100) % 4000 + 50 for i in range(40)]  # 40 token ids: two full blocks of 16 and 8 more
NUM_REQUESTS, MAX_TOKENS = 3, 4


def scraped(client) -> dict[str, float]:
    """Every sample of /metrics by name and labels, e.g. `pagedchat:request_prompt_tokens_bucket{le=20.0}`."""
    text = client.get("/metrics").text
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            found[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return found


def delta(after: dict, before: dict, name: str) -> float:
    return after[name] - before.get(name, 0.0)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The same 40-token prompt three times (greedy, exactly 4 tokens each), and /metrics before and after."""
    with make_client(tmp_path_factory.mktemp("request-metrics")) as client:
        before = scraped(client)
        started = time.monotonic()
        for _ in range(NUM_REQUESTS):
            body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
            response = client.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            assert response.json()["usage"]["completion_tokens"] == MAX_TOKENS
        wall = time.monotonic() - started
        yield before, scraped(client), wall


def test_prompt_tokens_count_every_prompt_token_and_computed_only_the_uncached(run):
    before, after, _ = run
    assert delta(after, before, "pagedchat:prompt_tokens_total") == NUM_REQUESTS * 40
    # the first computes all 40; the others find its two full blocks cached and compute the last 8
    assert delta(after, before, "pagedchat:prompt_tokens_computed_total") == 40 + 8 + 8
    assert delta(after, before, "pagedchat:generation_tokens_total") == NUM_REQUESTS * MAX_TOKENS


def test_length_histograms_hold_each_request(run):
    before, after, _ = run
    prompt, gen = "pagedchat:request_prompt_tokens", "pagedchat:request_generation_tokens"
    assert delta(after, before, prompt + "_count") == NUM_REQUESTS
    assert delta(after, before, prompt + "_sum") == NUM_REQUESTS * 40
    assert delta(after, before, prompt + "_bucket{le=20.0}") == 0
    assert delta(after, before, prompt + "_bucket{le=50.0}") == NUM_REQUESTS
    assert delta(after, before, gen + "_count") == NUM_REQUESTS
    assert delta(after, before, gen + "_sum") == NUM_REQUESTS * MAX_TOKENS
    assert delta(after, before, gen + "_bucket{le=2.0}") == 0
    assert delta(after, before, gen + "_bucket{le=5.0}") == NUM_REQUESTS


def test_phase_histograms_come_from_the_engines_timestamps(run):
    before, after, wall = run
    sums = {}
    for phase in ("queue_time", "prefill_time", "decode_time", "inference_time", "time_per_output_token"):
        name = f"pagedchat:request_{phase}_seconds"
        assert delta(after, before, name + "_count") == NUM_REQUESTS, phase
        sums[phase] = delta(after, before, name + "_sum")
    assert sums["queue_time"] >= 0 and sums["prefill_time"] > 0 and sums["decode_time"] > 0
    assert sums["inference_time"] == pytest.approx(sums["prefill_time"] + sums["decode_time"])
    assert sums["time_per_output_token"] == pytest.approx(sums["decode_time"] / (MAX_TOKENS - 1))
    # inside each request's own end-to-end time (measured by the app), and that inside the test's clock
    e2e = delta(after, before, "pagedchat:e2e_request_latency_seconds_sum")
    assert sums["queue_time"] + sums["inference_time"] <= e2e <= wall


def test_process_metrics_are_exported(run):
    _, after, _ = run
    assert after["process_resident_memory_bytes"] > 10 * 2**20
    assert after["process_cpu_seconds_total"] > 0
    assert after["process_start_time_seconds"] > 0


def test_the_old_prompt_count_keeps_an_honest_name():
    scraped_stats = scrape(num_prompt_tokens_total=300, num_computed_prompt_tokens_total=120)
    assert stat_value(scraped_stats, "prompt_tokens_total") == 300
    assert stat_value(scraped_stats, "prompt_tokens_computed_total") == 120
