"""bench/common/report.py: percentiles, targets and their lines, tables, the JSON + PNG a benchmark writes."""

from __future__ import annotations

import json
import math

import pytest

from bench.common import report


def test_percentiles_interpolate_linearly():
    assert report.percentiles([4.0, 1.0, 3.0, 2.0]) == pytest.approx({"p50": 2.5, "p90": 3.7, "p99": 3.97})
    assert report.percentiles([7.0]) == {"p50": 7.0, "p90": 7.0, "p99": 7.0}
    assert all(math.isnan(v) for v in report.percentiles([]).values())


def test_target_verdicts_and_lines():
    assert report.Target("speedup", 2.0, 2.0).line() == "PASS  speedup: 2.00 (target >= 2.00)"
    assert report.Target("speedup", 1.99, 2.0).line() == "FAIL  speedup: 1.99 (target >= 2.00)"
    assert report.Target("waste %", 3.5, 4.0, "<=").passed
    assert not report.Target("waste %", 4.5, 4.0, "<=").passed
    assert not report.Target("nan", float("nan"), 0.0).passed


def test_format_table_aligns_columns():
    text = report.format_table(["system", "tok/s"], [["ours", 1234.5], ["hf", 0.5]])
    assert text.splitlines() == ["system  tok/s", "------  -----", "ours     1234", "hf        0.5"]


def test_write_results_writes_json_with_nulls_and_a_png(tmp_path):
    fig, (ax,) = report.new_figure()
    ax.plot([0, 1], [1, 2])
    json_path, png_path = report.write_results("demo", {"value": float("nan"), "n": 3}, fig, tmp_path, "cmd")
    doc = json.loads(json_path.read_text())
    assert json_path.name.startswith("demo-") and json_path.suffix == ".json"
    assert (doc["benchmark"], doc["command"], doc["value"], doc["n"]) == ("demo", "cmd", None, 3)
    assert doc["machine"]["num_cpus"] >= 1
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
