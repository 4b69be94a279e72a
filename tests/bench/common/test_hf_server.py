"""bench/common/hf_server.py: the FIFO lock that serves one request at a time, and the SSE streamer's deltas."""

from __future__ import annotations

import threading
import time


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
