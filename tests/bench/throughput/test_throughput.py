"""`bench throughput` end to end on a tiny random model: every baseline, int8 KV beside the float cache, a JSON
schema; the HF baselines' output trimming."""

from __future__ import annotations

import json
import shlex

import pytest

from bench.cli import bench_main, build_parser
from tests.bench.helpers import only_result


def test_trim_output_keeps_the_first_eos_and_the_limit():
    from bench.throughput.hf_baselines import agreement, trim_output

    assert trim_output([5, 6, 2, 7], frozenset({2}), max_tokens=10) == [5, 6, 2]
    assert trim_output([5, 6, 2, 7], frozenset({2}), max_tokens=2) == [5, 6]
    assert agreement([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 9]]) == {
        "identical_outputs": 1,
        "mean_shared_prefix_fraction": 0.75,
    }


def test_throughput_bench_runs_every_baseline(tiny_model, tmp_path, capsys):
    argv = shlex.split(
        f"throughput --model {tiny_model} --dtype float32 --kv-cache-bytes {4 * 2**20} "
        f"--num-requests 3 --max-tokens 6 --matmul-seconds 0.05 --results-dir {tmp_path}"
    )
    assert bench_main(argv) == 0
    doc = only_result(tmp_path, "throughput")
    assert set(doc["systems"]) == {"pagedchat", "hf_static", "hf_continuous", "hf_sequential"}
    assert set(doc["ratios"]) == {"pagedchat/hf_static", "pagedchat/hf_continuous", "pagedchat/hf_sequential"}
    budget = sum(doc["workload"]["max_tokens"])
    for name, system in doc["systems"].items():
        assert 3 <= system["num_output_tokens"] <= budget, name
        assert system["tokens_per_s"] > 0, name
    # fp32 greedy with identical EOS / max_tokens handling: one-at-a-time HF gives exactly our tokens
    assert doc["agreement_with_pagedchat"]["hf_sequential"]["identical_outputs"] == 3
    assert (
        doc["systems"]["hf_sequential"]["num_output_tokens"]
        == doc["systems"]["pagedchat"]["num_output_tokens"]
    )
    assert doc["matmul"]["flops_per_token"] > 0 and doc["matmul"]["engine_fraction"] > 0
    assert [t["name"] for t in doc["targets"]] == ["pagedchat / HF static batching"]
    out = capsys.readouterr().out
    assert "hf_continuous" in out and "pagedchat / HF static batching" in out


def test_throughput_bench_runs_int8_kv_beside_the_float_cache(tiny_model, tmp_path):
    argv = shlex.split(
        f"throughput --model {tiny_model} --dtype float32 --kv-cache-bytes {2 * 2**20} --max-model-len 2048 "
        "--kv-cache-dtypes auto,int8 "
        f"--baselines none --num-requests 3 --max-tokens 6 --matmul-seconds 0.05 --results-dir {tmp_path}"
    )
    assert bench_main(argv) == 0
    doc = only_result(tmp_path, "throughput")
    assert set(doc["systems"]) == {"pagedchat", "pagedchat-int8kv"}
    assert set(doc["ratios"]) == {"pagedchat/pagedchat-int8kv", "pagedchat-int8kv/pagedchat"}
    configs = doc["engine_configs"]
    assert (
        configs["pagedchat"]["kv_cache_stores"] == "float32"
        and configs["pagedchat-int8kv"]["kv_cache_stores"] == "int8"
    )
    # the same bytes: 64 bytes a row in fp32, 16 + 2 in int8
    assert configs["pagedchat-int8kv"]["num_blocks"] == pytest.approx(
        configs["pagedchat"]["num_blocks"] * 64 / 18, abs=1
    )


def test_throughput_bench_reports_the_cost_of_a_json_schema(tiny_model, tmp_path, capsys):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(schema))
    argv = shlex.split(
        f"throughput --model {tiny_model} --dtype float32 --kv-cache-bytes {4 * 2**20} --baselines none "
        f"--num-requests 3 --max-tokens 24 --matmul-seconds 0.05 --json-schema {schema_file} "
        f"--results-dir {tmp_path}"
    )
    assert bench_main(argv) == 0
    doc = only_result(tmp_path, "throughput")
    structured = doc["structured_output"]
    assert structured["schema"] == schema
    assert structured["tokens_per_s"] > 0 and structured["num_output_tokens"] >= 3
    assert structured["unconstrained_tokens_per_s"] == doc["systems"]["pagedchat"]["tokens_per_s"]
    assert structured["num_parsed"] == structured["num_stopped"]
    assert "with the JSON schema vs" in capsys.readouterr().out


def test_throughput_bench_refuses_a_bad_schema_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "foo"}')
    with pytest.raises(SystemExit):
        bench_main(["throughput", "--json-schema", str(bad)])
    assert "invalid JSON schema: Invalid type: foo" in capsys.readouterr().err


def test_bench_parser_checks_baselines_and_loads():
    parser = build_parser()
    assert parser.parse_args(["throughput", "--baselines", "none"]).baselines == []
    assert parser.parse_args(["throughput", "--baselines", "static, sequential"]).baselines == [
        "static",
        "sequential",
    ]
    with pytest.raises(SystemExit):
        parser.parse_args(["throughput", "--baselines", "static,vllm"])
