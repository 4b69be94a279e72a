"""`bench serving`'s pieces: its parser's rates and concurrencies, the load points, the ratios to a baseline."""

from __future__ import annotations

import math

import pytest

from bench.cli import build_parser
from bench.serving import command as serving
from bench.serving import report as serving_report


def test_serving_parser_takes_rates_and_concurrency_independently():
    parser = build_parser()
    default = parser.parse_args(["serving"])
    assert (default.rates, default.concurrency) == ([0.5, 1.0, 2.0, 4.0, 8.0], [1, 16, 64])
    assert (default.baseline_url, default.baseline_name) == (None, None)
    given = parser.parse_args(["serving", "--rates", "2", "--concurrency", "1,8"])
    assert (given.rates, given.concurrency) == ([2.0], [1, 8])
    only_closed = parser.parse_args(["serving", "--rates", "none", "--concurrency", "4"])
    assert (only_closed.rates, only_closed.concurrency) == ([], [4])
    only_poisson = parser.parse_args(["serving", "--concurrency", "None"])
    assert (only_poisson.rates, only_poisson.concurrency) == ([0.5, 1.0, 2.0, 4.0, 8.0], [])
    for bad in (["--rates", "1,-2"], ["--concurrency", "1.5"], ["--concurrency", "0"], ["--rates", ""]):
        with pytest.raises(SystemExit):
            parser.parse_args(["serving", *bad])


def test_serving_load_points_put_rates_first_and_reach_the_concurrency():
    args = build_parser().parse_args(["serving", "--rates", "0.5,2", "--num-requests", "48"])
    assert serving.load_points(args) == [
        serving.LoadPoint("rate", 0.5, 48),
        serving.LoadPoint("rate", 2.0, 48),
        serving.LoadPoint("concurrency", 1, 48),
        serving.LoadPoint("concurrency", 16, 48),
        serving.LoadPoint("concurrency", 64, 128),  # max(num_requests, 2 x concurrency)
    ]


def test_serving_ratios_cover_the_shared_points():
    def point(load: str, value: float, tok_s: float, ttft: float) -> dict:
        return {"load": load, "value": value, "output_tokens_per_s": tok_s, "ttft_ms": {"p50": ttft}}

    ours = [point("rate", 2.0, 300.0, 60.0), point("concurrency", 16, 400.0, 100.0)]
    theirs = [point("rate", 2.0, 100.0, 120.0), point("concurrency", 16, 0.0, 50.0)]
    ratios = serving_report.ratios(ours, theirs)
    assert ratios["rate=2"] == {"output_tokens_per_s": 3.0, "ttft_p50": 2.0}
    assert (
        math.isnan(ratios["concurrency=16"]["output_tokens_per_s"])
        and ratios["concurrency=16"]["ttft_p50"] == 0.5
    )
    assert set(serving_report.ratios(ours, theirs[:1])) == {"rate=2"}
