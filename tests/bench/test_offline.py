"""`bench throughput` and `bench memory` end to end on a tiny random model: JSON keys, PNG, sane values."""

from __future__ import annotations

import shlex
import threading
import time

from bench.cli import bench_main
from tests.bench.helpers import only_result


def test_memory_bench_reports_waste_and_concurrency(tiny_model, tmp_path):
    argv = shlex.split(
        f"memory --model {tiny_model} --dtype float32 --max-model-len 64 --budget-seqs 2 "
        f"--num-requests 6 --results-dir {tmp_path}"
    )
    assert bench_main(argv) == 0
    doc = only_result(tmp_path, "memory")
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
