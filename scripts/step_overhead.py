"""Per-step time at batch 1 split into the model (layers + logits) and everything else (scheduling, inputs, sampling,
detokenization): `python scripts/step_overhead.py [--tokens N] [--repeats R] [--quantization none|gguf]`. Prints one
JSON line."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from engine import LLM, SamplingParams


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
    model = engine.runner.model
    forward_s: list[float] = []  # per step: the layers' forward plus the logits matmul

    def timed(inner):
        def wrapper(*a, **k):
            start = time.perf_counter()
            out = inner(*a, **k)
            forward_s.append(time.perf_counter() - start)
            return out

        return wrapper

    model.forward = timed(model.forward)
    model.compute_logits = timed(model.compute_logits)
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    prompt = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
    step_ms, overhead_ms = [], []
    for r in range(args.repeats + 1):
        engine.add_request(f"r{r}", engine.apply_chat_template(prompt), params)
        forward_s.clear()
        steps = []
        while engine.has_unfinished_requests():
            start = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - start)
        if r == 0:
            continue  # warm-up
        decode = steps[1:]  # the first step is the prefill
        step_ms.append(1000 * statistics.median(decode))
        model_s = [a + b for a, b in zip(forward_s[2::2], forward_s[3::2])]  # skip the prefill's pair
        overhead_ms.append(1000 * statistics.median(s - f for s, f in zip(decode, model_s)))
    print(
        json.dumps(
            {
                "threads": torch.get_num_threads(),
                "quantization": engine.config.quantization,
                "int8_activations": engine.config.int8_activations,
                "decode_step_ms_p50": round(statistics.median(step_ms), 3),
                "outside_forward_ms_p50": round(statistics.median(overhead_ms), 3),
            }
        )
    )


if __name__ == "__main__":
    main()
