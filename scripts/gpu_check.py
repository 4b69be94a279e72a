"""Engine throughput on a Llama-shaped ~1B model with random weights (part 3 of scripts/gpu_check.sh).

    PYTHONPATH=. python scripts/gpu_check.py [--requests 256 --prompt-len 512 --max-tokens 128]
    PYTHONPATH=. python scripts/gpu_check.py --tiny --device cpu --backend torch   # the same flow, on a CPU

Writes a model folder under /tmp (config.json, random bf16 safetensors with HF Llama names, a word-level
tokenizer over the same vocabulary, so no download is needed), runs every prompt as token ids through
`engine.LLMEngine` to completion (greedy, ignore_eos), and prints prompt/generation throughput. Then, on a small
model, it compares greedy tokens from the triton and torch backends (informational: bf16/tf32 rounding can flip
near-ties of random weights).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

LLAMA_1B = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 8192, "vocab_size": 32000}  # fmt: skip
SMALL = {"hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
         "intermediate_size": 1024, "vocab_size": 4096}  # fmt: skip
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 512}  # fmt: skip
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2


def write_random_llama(folder: Path, shape: dict, *, std: float, seed: int = 0, device: str = "cpu") -> Path:
    """An HF-style Llama folder with random weights and a word-level tokenizer; reused when already complete."""
    if (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file():
        return folder
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    hidden, inter, vocab = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    head_dim = hidden // shape["num_attention_heads"]
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", **shape, "head_dim": head_dim,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
        "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*size: int) -> torch.Tensor:
        return (torch.randn(size, generator=gen, device=device) * std).to(torch.bfloat16).cpu()

    kv = shape["num_key_value_heads"] * head_dim
    tensors = {"model.embed_tokens.weight": randn(vocab, hidden), "lm_head.weight": randn(vocab, hidden),
               "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16)}  # fmt: skip
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors |= {
            p + "self_attn.q_proj.weight": randn(hidden, hidden), p + "self_attn.k_proj.weight": randn(kv, hidden),
            p + "self_attn.v_proj.weight": randn(kv, hidden), p + "self_attn.o_proj.weight": randn(hidden, hidden),
            p + "mlp.gate_proj.weight": randn(inter, hidden), p + "mlp.up_proj.weight": randn(inter, hidden),
            p + "mlp.down_proj.weight": randn(hidden, inter),
            p + "input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        }  # fmt: skip
    save_file(tensors, str(folder / "model.safetensors"))
    _write_word_level_tokenizer(folder, vocab)
    return folder


def _write_word_level_tokenizer(folder: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab |= {f"w{i}": i for i in range(len(SPECIAL_TOKENS), vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer.save(str(folder / "tokenizer.json"))
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                        "unk_token": "<unk>", "model_max_length": 4096}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))


@dataclass(frozen=True)
class RunResult:
    """What one engine run produced and how long it took."""

    seconds: float
    num_steps: int
    prompt_tokens: int
    generated_tokens: int
    token_ids: dict[str, list[int]]


def run_engine(engine, prompts: list[list[int]], max_tokens: int) -> RunResult:
    """Greedy-generate max_tokens for every prompt (EOS ignored) in one continuous batch."""
    from engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    steps_before = engine.stats().num_steps
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    token_ids = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                token_ids[output.request_id] = output.outputs[0].token_ids
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    generated = sum(len(ids) for ids in token_ids.values())
    return RunResult(
        seconds, engine.stats().num_steps - steps_before, sum(map(len, prompts)), generated, token_ids
    )


def make_engine(
    folder: Path, backend: str, device: str, dtype: str, max_num_seqs: int, kv_cache_bytes: int | None
):
    from engine import EngineConfig, LLMEngine

    config = EngineConfig(model=str(folder), device=device, dtype=dtype, attention_backend=backend,
                          max_num_seqs=max_num_seqs, max_model_len=2048, kv_cache_bytes=kv_cache_bytes)  # fmt: skip
    return LLMEngine(config)


def free_memory() -> None:
    """Return a deleted engine's model and KV pool to the device before the next engine sizes its pool."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def random_prompts(num: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(len(SPECIAL_TOKENS), vocab_size) for _ in range(length)] for _ in range(num)]


def throughput(args: argparse.Namespace) -> None:
    shape = TINY if args.tiny else LLAMA_1B
    folder = write_random_llama(Path(args.model_dir) / ("tiny" if args.tiny else "llama1b"), shape, std=0.02,
                                device=args.device)  # fmt: skip
    start = time.perf_counter()
    kv_cache_bytes = 2**28 if args.device == "cpu" else None  # on CUDA: sized by memory_utilization
    engine = make_engine(folder, args.backend, args.device, args.dtype, args.requests, kv_cache_bytes)
    print(f"engine ready in {time.perf_counter() - start:.1f} s: {engine.num_blocks} blocks, {engine.config}")
    run_engine(engine, random_prompts(4, 32, shape["vocab_size"], seed=1), 8)  # compile / warm up every path
    prompts = random_prompts(args.requests, args.prompt_len, shape["vocab_size"], seed=2)
    r = run_engine(engine, prompts, args.max_tokens)
    print(f"THROUGHPUT {args.backend} {args.requests} requests x ({args.prompt_len} prompt + {args.max_tokens} "
          f"generated): {r.seconds:.2f} s, {r.num_steps} steps ({1000 * r.seconds / r.num_steps:.1f} ms/step), "
          f"{(r.prompt_tokens + r.generated_tokens) / r.seconds:.0f} tok/s total, "
          f"{r.generated_tokens / r.seconds:.0f} generated tok/s")  # fmt: skip
    del engine
    free_memory()


def backend_agreement(args: argparse.Namespace) -> None:
    shape = TINY if args.tiny else SMALL
    folder = write_random_llama(Path(args.model_dir) / ("tiny-agree" if args.tiny else "small"), shape, std=0.15,
                                device=args.device)  # fmt: skip
    prompts = random_prompts(4, 50, shape["vocab_size"], seed=3)
    results = {}
    for backend in ("triton", "torch"):
        engine = make_engine(folder, backend, args.device, "float32", 8, kv_cache_bytes=2**28)
        results[backend] = run_engine(engine, prompts, 24).token_ids
        del engine
        free_memory()
    torch_ids, triton_ids = results["torch"], results["triton"]
    same = sum(a == b for rid, ids in torch_ids.items() for a, b in zip(ids, triton_ids[rid], strict=True))
    total = sum(len(ids) for ids in torch_ids.values())
    first_diffs = [
        next((i for i, (a, b) in enumerate(zip(ids, triton_ids[rid], strict=True)) if a != b), None)
        for rid, ids in torch_ids.items()
    ]
    print(f"AGREEMENT greedy fp32 triton vs torch backend: {same}/{total} tokens equal; first divergence per "
          f"request: {first_diffs}")  # fmt: skip


def main() -> None:
    """Run the throughput measurement, then the backend agreement check."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default="/tmp/pagedchat_gpu_check")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer toy model: checks the flow on a CPU")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--backend", default="triton", choices=("triton", "torch"))
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--skip-agreement", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    throughput(args)
    if not args.skip_agreement:
        backend_agreement(args)


if __name__ == "__main__":
    main()
