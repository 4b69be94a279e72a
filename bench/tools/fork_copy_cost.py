"""A branch that forks inside a cached block: copy that block, or recompute the tokens before the fork?

    python -m bench.tools.fork_copy_cost [--model smollm2-135m-instruct] [--repeat 5] [--threads 2]

Regenerate is the sharpest case: the same prompt again, whose last block the first reply filled. For each number of
prompt tokens in that block (1..16), the prefill step of the second request (the step that yields its first token)
is timed on two engines, one copying the block (`copy_partial_blocks`, the default) and one recomputing its tokens.
Both engines serve the model as `pagedchat serve` does on this machine (no disk tier). Minimum of --repeat runs,
each on a fresh random prompt; the time of one block copy is printed too.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time

from engine.core.config import EngineConfig
from engine.core.sequence import SamplingParams
from engine.llm_engine import LLMEngine

PREFIX_BLOCKS = 13  # prompts of 13 full blocks and then 1..16 tokens


def first_step_s(engine: LLMEngine, request_id: str, prompt: list[int], max_tokens: int) -> tuple[float, int]:
    """Seconds of the request's first step (its prefill) and the prompt tokens it found cached."""
    engine.add_request(request_id, prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    began, first, cached = time.perf_counter(), None, 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            if first is None:
                first, cached = time.perf_counter() - began, output.num_cached_tokens
    assert first is not None
    return first, cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    engines = {
        copy: LLMEngine(
            EngineConfig(
                model=args.model,
                device="cpu",
                kv_cache_bytes=256 << 20,
                kv_disk_bytes=0,
                max_model_len=2048,
                num_threads=args.threads,
                copy_partial_blocks=copy,
            )
        )
        for copy in (True, False)
    }
    block_size = engines[True].config.block_size
    rng, ids = random.Random(1), itertools.count()
    runs: dict[tuple[bool, int], list[tuple[float, int]]] = {}
    for _ in range(args.repeat):
        for tail in range(1, block_size + 1):
            prompt = [rng.randrange(100, 40_000) for _ in range(PREFIX_BLOCKS * block_size + tail)]
            for copy, engine in engines.items():
                first_step_s(
                    engine, f"first-{next(ids)}", prompt, block_size + 4
                )  # the reply fills the block
                runs.setdefault((copy, tail), []).append(
                    first_step_s(engine, f"again-{next(ids)}", prompt, 1)
                )
    for tail in range(1, block_size + 1):
        (t_copy, c_copy), (t_none, c_none) = min(runs[True, tail]), min(runs[False, tail])
        print(
            f"{tail:2d} prompt tokens in the last block: copy {t_copy * 1e3:5.1f} ms ({c_copy} cached), "
            f"recompute {t_none * 1e3:5.1f} ms ({c_none} cached)"
        )
    for copy in (True, False):
        mean = statistics.mean(min(runs[copy, tail])[0] for tail in range(1, block_size + 1))
        print(f"mean over the {block_size} cases, {'copy' if copy else 'recompute'}: {mean * 1e3:.1f} ms")
    runner = engines[True].runner
    copies = []
    for _ in range(50):
        began = time.perf_counter()
        runner.copy_blocks([(3, 7)])
        copies.append(time.perf_counter() - began)
    print(f"one block copy (every layer's K and V): {min(copies) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
