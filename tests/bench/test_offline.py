"""`bench throughput` and `bench memory` end to end on a tiny random model: JSON keys, PNG, sane values."""

from __future__ import annotations

import json
import shlex
import threading
import time
from pathlib import Path

import pytest

from bench.cli import bench_main
from tests.engine.bench_helpers import shared_tiny_model


@pytest.fixture(scope="module")
def tiny_model() -> str:
    return shared_tiny_model()


def _only_result(folder: Path, name: str) -> dict:
    jsons = sorted(folder.glob(f"{name}-*.json"))
    pngs = sorted(folder.glob(f"{name}-*.png"))
    assert len(jsons) == 1 and len(pngs) == 1, f"expected one JSON and one PNG, got {jsons + pngs}"
    assert pngs[0].read_bytes()[:4] == b"\x89PNG"
    return json.loads(jsons[0].read_text())


def test_trim_output_keeps_the_first_eos_and_the_limit():
    from bench.hf_baselines import agreement, trim_output

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
    doc = _only_result(tmp_path, "throughput")
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
    doc = _only_result(tmp_path, "throughput")
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
    doc = _only_result(tmp_path, "throughput")
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


def test_memory_bench_reports_waste_and_concurrency(tiny_model, tmp_path):
    argv = shlex.split(
        f"memory --model {tiny_model} --dtype float32 --max-model-len 64 --budget-seqs 2 "
        f"--num-requests 6 --results-dir {tmp_path}"
    )
    assert bench_main(argv) == 0
    doc = _only_result(tmp_path, "memory")
    pool, summary = doc["pool"], doc["summary"]
    assert pool["max_model_len"] == 64 and pool["pool_tokens"] == 128
    assert summary["contiguous_capacity"] == 2
    assert 0 <= summary["max_waste_per_seq_tokens"] < pool["block_size"]  # paged waste is under one block
    assert 0 <= summary["paged_waste_pct"] < summary["contiguous_waste_pct"]
    assert summary["peak_running"] >= 2 and len(doc["workload"]["lengths"]) == 6
    assert doc["timeline"] and doc["timeline"][-1]["num_running"] == 0
    by_dtype = doc["by_kv_cache_dtype"]  # int8 by default beside the float pool, at the same bytes
    assert list(by_dtype) == ["pagedchat", "pagedchat-int8kv"]
    int8 = by_dtype["pagedchat-int8kv"]["pool"]
    assert int8["kv_cache_dtype"] == "int8" and int8["kv_cache_bytes"] == pool["kv_cache_bytes"]
    assert int8["num_blocks"] == pool["kv_cache_bytes"] // int8["block_bytes"] > pool["num_blocks"]
    assert by_dtype["pagedchat-int8kv"]["summary"]["peak_running"] >= summary["peak_running"]
    assert [t["name"] for t in doc["targets"]] == [
        "paged KV waste %",
        "concurrency vs contiguous reservation",
    ]


def test_fifo_lock_serves_waiters_in_arrival_order():
    from bench.common.hf_server import FifoLock

    lock, order = FifoLock(), []
    lock.__enter__()
    threads = []
    for i in range(4):
        t = threading.Thread(target=lambda i=i: _record_under(lock, order, i))
        t.start()
        while lock._next_ticket < i + 2:  # wait until this thread holds its ticket before starting the next
            time.sleep(0.001)
        threads.append(t)
    lock.__exit__(None, None, None)
    for t in threads:
        t.join(5)
    assert order == [0, 1, 2, 3]


def _record_under(lock, order: list[int], i: int) -> None:
    with lock:
        order.append(i)


def test_sse_streamer_sends_deltas_that_add_up_to_the_text(tiny_model):
    import torch
    from transformers import AutoTokenizer

    from bench.common.hf_server import SSEStreamer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    ids = tokenizer.encode("Explain how a hash table works, then give an example.", add_special_tokens=False)
    sent: list[str] = []
    streamer = SSEStreamer(tokenizer, sent.append)
    streamer.put(torch.tensor([[1, 2, 3]]))  # the prompt comes first and is not sent
    for tok in ids:
        streamer.put(torch.tensor([tok]))
    streamer.end()
    assert "".join(sent) == tokenizer.decode(ids) == streamer.text
    assert streamer.token_ids == ids and all(sent)
