"""`bench models` against real servers on three tiny models: both sittings run, every request is answered, and the
loads are where the budget puts them (the reloads sitting reloads at every alternation, the fits one never)."""

from __future__ import annotations

import shlex

import httpx
import pytest

from bench.cli import bench_main
from bench.models import command
from tests.app.factories import make_tiny_model_dir
from tests.bench.helpers import only_result


@pytest.mark.budget(seconds=60, why="two servers, each loading two more models")
def test_models_bench_runs_both_sittings(tmp_path, capsys):
    a, b, c = (make_tiny_model_dir(seed) for seed in (0, 1, 2))
    argv = (
        f"models --model {a} --other-model {b} --other-model {c} --rounds 2 --round-tokens 4 --max-tokens 48 "
        f"--device cpu --dtype float32 --kv-cache-bytes {2**22} --results-dir {tmp_path}"
    )
    assert bench_main(shlex.split(argv)) == 0
    doc = only_result(tmp_path, "models")
    assert set(doc["runs"]) == {"pagedchat fits", "pagedchat reloads"}
    for name, run in doc["runs"].items():
        assert run["b_first_ok"] and run["a_gaps"]["ok"], name
        assert all(x["ok"] for x in run["alternation"]), name
        assert [x["model"] for x in run["alternation"]] == ["c", "b", "c", "b"]
    # fits: C loads at its first request, B was loaded by the first phase; reloads: every alternation loads
    assert [x["loaded"] for x in doc["runs"]["pagedchat fits"]["alternation"]] == [False, True, True, True]
    assert [x["loaded"] for x in doc["runs"]["pagedchat reloads"]["alternation"]] == [False] * 4
    assert "several models: A streams while B loads" in capsys.readouterr().out


def test_a_baseline_router_names_and_states_are_read_from_its_models_list(monkeypatch):
    listed = {
        "data": [
            {"id": "a-q4_1", "status": {"value": "loaded"}},
            {"id": "b-q8_0", "status": {"value": "unloaded"}},
        ]
    }
    monkeypatch.setattr(httpx, "get", lambda url, timeout: httpx.Response(200, json=listed))
    assert command._baseline_names("http://x", ["/m/a-q4_1.gguf", "/m/b-q8_0.gguf"]) == ["a-q4_1", "b-q8_0"]
    assert command._is_loaded("http://x", "a-q4_1") and not command._is_loaded("http://x", "b-q8_0")
    with pytest.raises(SystemExit, match="lists no model for /m/c.gguf"):
        command._baseline_names("http://x", ["/m/c.gguf"])
