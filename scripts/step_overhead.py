"""Per-step time at batch 1 split into the model's forward (the layers: the fused C step when it runs, else the
module forward), the logits matmul, and everything else (scheduling, inputs, sampling, detokenization):
`python scripts/step_overhead.py [--tokens N] [--repeats R] [--quantization none|gguf]`. With the fused C step, its
own clocks split the forward further into linears (the LM head's too: the fused step runs it, so `logits` is then
~0), attention and its small ops (argmax and the Python around the call included). Prints one JSON line (medians,
ms); `rest_ms_p50` is the step minus its linears and attention, the lean step's measure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from engine import LLM, SamplingParams
from engine.worker.step_clock import Clock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantization", default="auto", choices=("auto", "gguf", "none"))
    parser.add_argument(
        "--int8-activations",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="default: the engine's",
    )
    args = parser.parse_args()
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        quantization=args.quantization,
        int8_activations=args.int8_activations,
        kv_cache_bytes=256 * 2**20,
    )
    engine = llm.engine
    runner, model = engine.runner, engine.runner.model
    forward, logits = Clock(), Clock()
    # the module path (prefill, and decode without the fused step)
    model.forward = forward.wrap(model.forward)
    model.compute_logits = logits.wrap(model.compute_logits)
    fused = runner.fused
    if fused is not None:
        fused.decode = forward.wrap(fused.decode)
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    prompt = engine.apply_chat_template(
        [{"role": "user", "content": "Write a story about a lighthouse keeper."}]
    )
    # per decode step: step, forward, logits, fused linears, fused attention
    rows: list[tuple[float, ...]] = []
    for r in range(args.repeats + 1):
        engine.add_request(f"r{r}", prompt, params)
        first = True
        while engine.has_unfinished_requests():
            forward.seconds = logits.seconds = 0.0
            if fused is not None:
                fused.seconds[0] = fused.seconds[1] = 0.0
            start = time.perf_counter()
            engine.step()
            step = time.perf_counter() - start
            if first or r == 0:  # the prefill step; the first request warms up
                first = False
                continue
            inside = (fused.seconds[0], fused.seconds[1]) if fused is not None else (0.0, 0.0)
            rows.append((step, forward.seconds, logits.seconds, *inside))

    def median_ms(fn: Callable[[tuple[float, ...]], float]) -> float:
        return round(1000 * statistics.median(fn(row) for row in rows), 3)

    result: dict[str, Any] = {
        "threads": torch.get_num_threads(),
        "quantization": engine.config.quantization,
        "int8_activations": engine.config.int8_activations,
        "fused_decode": fused is not None,
        "decode_step_ms_p50": median_ms(lambda x: x[0]),
        "forward_ms_p50": median_ms(lambda x: x[1]),
        "logits_ms_p50": median_ms(lambda x: x[2]),
        "outside_forward_ms_p50": median_ms(lambda x: x[0] - x[1] - x[2]),
    }
    if fused is not None:
        result["fused_linears_ms_p50"] = median_ms(lambda x: x[3])
        result["fused_attention_ms_p50"] = median_ms(lambda x: x[4])
        result["fused_small_ops_ms_p50"] = median_ms(lambda x: x[1] - x[3] - x[4])
        result["rest_ms_p50"] = median_ms(lambda x: x[0] - x[2] - x[3] - x[4])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
