"""How fast the engine prefills the serving benchmark's prompts, split into the linears, attention and the rest:
`python scripts/prefill_rate.py [--requests N] [--repeats R]`. The prompts are `pagedchat bench serving`'s chat
requests (bench/common/workload.py, the same seed), prefilled with max_tokens 1 in steps of max_num_batched_tokens; the
step clock (engine/worker/step_clock.py) times every linear and the attention backend. Prints one JSON line: prompt
tokens, seconds (best of the repeats), tokens/s and the layer linears' rate (2 operations a weight and prompt
token; the matmul clock includes the LM head of each prompt's last token), beside the cores' int8 peak (engine/native/peak.c) on the same threads.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from bench.common.workload import chat_requests
from engine import LLM, SamplingParams
from engine.models.quantized import linear_modules
from engine.native.peak import measure_peak
from engine.worker.step_clock import StepClock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument(
        "--requests", type=int, default=128, help="the serving bench's 64-stream point sends 128"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "model", "float16", "int8"))
    args = parser.parse_args()
    # no prefix caching: every repeat prefills every token
    llm = LLM(model=args.model, enable_prefix_caching=False, kv_cache_dtype=args.kv_cache_dtype)
    engine = llm.engine
    clock = StepClock(engine.runner)
    chats = [r.messages for r in chat_requests(args.requests)]
    tokens = sum(len(engine.apply_chat_template(c)) for c in chats)
    model = engine.runner.model
    layer_weights = sum(
        m.in_features * m.out_features for m in linear_modules(model) if m is not model.lm_head
    )
    params = SamplingParams(temperature=0.0, max_tokens=1)
    llm.chat(chats[:2], params)  # warm up
    runs = []
    for _ in range(args.repeats):
        clock.reset()
        start = time.perf_counter()
        llm.chat(chats, params)
        seconds = time.perf_counter() - start
        matmul, attention = clock.read()
        runs.append((seconds, matmul, attention))
    seconds, matmul, attention = min(runs)
    peak = measure_peak(torch.get_num_threads())
    print(
        json.dumps(
            {
                "threads": torch.get_num_threads(),
                "requests": args.requests,
                "prompt_tokens": tokens,
                "seconds": round(seconds, 3),
                "tokens_per_s": round(tokens / seconds, 1),
                "matmul_s": round(matmul, 3),
                "attention_s": round(attention, 3),
                "rest_s": round(seconds - matmul - attention, 3),
                "layer_linears_gop_per_s": round(2 * layer_weights * tokens / matmul / 1e9, 1),
                "int8_peak_gop_per_s": None if peak is None else round(peak.int8_gops, 1),
                "kv_cache_dtype": engine.kv_cache_dtype,
            }
        )
    )


if __name__ == "__main__":
    main()
