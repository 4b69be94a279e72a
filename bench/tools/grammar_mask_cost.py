"""Per-token mask cost of the grammar engines (llguidance, xgrammar, outlines-core) on this CPU.

The tokenizer is the served model's (default: the provisioned SmolLM2-135M-Instruct, vocab 49152), loaded through
the engine's loader. Each engine compiles the same small JSON schema with bounded whitespace, then walks the token
ids of a valid instance: per token it computes the allowed-token bitmask and consumes the token. The figures are
the compile time and the mean / median / p99 microseconds of the mask and of the consume step. Engines that are not
installed are skipped with a note.

    python -m bench.tools.grammar_mask_cost [--model PATH] [--repeats 20]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 4},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "active"],
    "additionalProperties": False,
}
INSTANCE = {"name": "Ada Lovelace", "age": 36, "tags": ["red", "blue"], "active": True}
MAX_WHITESPACE = 4


def _stats(samples_s: list[float]) -> str:
    us = sorted(s * 1e6 for s in samples_s)
    p99 = us[min(len(us) - 1, int(len(us) * 0.99))]
    return f"mean {statistics.fmean(us):7.1f}  p50 {statistics.median(us):7.1f}  p99 {p99:7.1f} us"


def _walk(
    name: str,
    compile_fn: Callable[[], Any],
    mask_fn: Callable[[Any, torch.Tensor], None],
    consume_fn: Callable[[Any, int], bool],
    token_ids: list[int],
    vocab: int,
    repeats: int,
) -> None:
    t0 = time.perf_counter()
    compile_fn()
    compile_s = time.perf_counter() - t0
    bitmask = torch.zeros((1, (vocab + 31) // 32), dtype=torch.int32)
    mask_times: list[float] = []
    consume_times: list[float] = []
    for _ in range(repeats):
        state = compile_fn()
        for tok in token_ids:
            t0 = time.perf_counter()
            mask_fn(state, bitmask)
            t1 = time.perf_counter()
            allowed = bool((bitmask[0, tok // 32] >> (tok % 32)) & 1)
            if not allowed:
                raise RuntimeError(f"{name}: the mask forbids token {tok} of the valid instance")
            t2 = time.perf_counter()
            if not consume_fn(state, tok):
                raise RuntimeError(f"{name}: token {tok} of the valid instance was refused")
            consume_times.append(time.perf_counter() - t2)
            mask_times.append(t1 - t0)
    print(f"{name:14s} compile {compile_s * 1e3:8.1f} ms (the schema's first matcher)")
    print(f"{'':14s} mask    {_stats(mask_times)}   ({len(mask_times)} masks)")
    print(f"{'':14s} consume {_stats(consume_times)}")


def bench_llguidance(
    tokenizer: Any, token_ids: list[int], vocab: int, repeats: int, json_slices: bool, copy: bool = False
) -> None:
    """llguidance; `copy`: each walk copies one cached matcher, as the engine does for a repeated schema."""
    import llguidance
    import llguidance.hf

    t0 = time.perf_counter()
    slices = llguidance.LLTokenizer.json_slices() if json_slices else None
    ll_tok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, slices=slices)
    name = (
        "llguidance"
        + (" (json slices)" if json_slices else "")
        + (" (cached matcher, copied)" if copy else "")
    )
    print(f"{name} tokenizer {(time.perf_counter() - t0) * 1e3:.0f} ms")
    options = {"whitespace_pattern": f"[\\x20\\x0A\\x0D\\x09]{{0,{MAX_WHITESPACE}}}"}
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, overrides=options)

    cached: list[Any] = []

    def compile_fn() -> Any:
        if copy and cached:
            return cached[0].deep_copy()
        m = llguidance.LLMatcher(ll_tok, grammar)
        if m.is_error():
            raise RuntimeError(m.get_error())
        cached.append(m)
        return m.deep_copy() if copy else m

    def mask_fn(m: Any, bitmask: torch.Tensor) -> None:
        m.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.numel() * 4)

    _walk(name, compile_fn, mask_fn, lambda m, t: m.consume_token(t), token_ids, vocab, repeats)


def bench_xgrammar(tokenizer: Any, token_ids: list[int], vocab: int, repeats: int) -> None:
    import xgrammar

    t0 = time.perf_counter()
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    print(f"xgrammar       tokenizer {(time.perf_counter() - t0) * 1e3:.0f} ms")
    schema = json.dumps(SCHEMA)

    def compile_fn() -> Any:
        compiled = compiler.compile_json_schema(
            schema, any_whitespace=True, max_whitespace_cnt=MAX_WHITESPACE
        )
        return xgrammar.GrammarMatcher(compiled)

    def mask_fn(m: Any, bitmask: torch.Tensor) -> None:
        m.fill_next_token_bitmask(bitmask)

    _walk("xgrammar", compile_fn, mask_fn, lambda m, t: m.accept_token(t), token_ids, vocab, repeats)


def bench_outlines(tokenizer: Any, token_ids: list[int], vocab: int, repeats: int) -> None:
    import outlines_core
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    eos = tokenizer.eos_token_id
    special = set(tokenizer.all_special_ids)
    by_bytes: dict[bytes, list[int]] = {}
    for tok, tid in tokenizer.get_vocab().items():
        if tid in special or tid >= vocab:
            continue
        by_bytes.setdefault(bytes(byte_of[c] for c in tok), []).append(tid)
    t0 = time.perf_counter()
    vocabulary = outlines_core.Vocabulary(eos, by_bytes)
    print(f"outlines-core  tokenizer {(time.perf_counter() - t0) * 1e3:.0f} ms")
    regex = outlines_core.json_schema.build_regex_from_schema(
        json.dumps(SCHEMA), whitespace_pattern=f"[ \\n\\r\\t]{{0,{MAX_WHITESPACE}}}"
    )
    index_holder: list[Any] = []

    def compile_fn() -> Any:
        if not index_holder:  # the index is the compiled grammar; a guide is the per-sequence state
            index_holder.append(outlines_core.Index(regex, vocabulary))
        return outlines_core.Guide(index_holder[0])

    def mask_fn(g: Any, bitmask: torch.Tensor) -> None:
        g.write_mask_into(bitmask.data_ptr(), bitmask.numel(), 4)

    def consume_fn(g: Any, tok: int) -> bool:
        g.advance(tok, return_tokens=False)
        return True

    _walk("outlines-core", compile_fn, mask_fn, consume_fn, token_ids, vocab, repeats)


def main() -> None:
    """Measure every installed grammar engine on the same schema and token walk."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="smollm2-135m-instruct", help="a model folder, .gguf or default name"
    )
    parser.add_argument("--repeats", type=int, default=20, help="walks of the instance per engine")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the engines mask on one)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from engine.loading.loader import load_hf_config, load_tokenizer, resolve_model_path

    path = resolve_model_path(args.model)
    tokenizer = load_tokenizer(path)
    vocab = int(load_hf_config(path).vocab_size)
    text = json.dumps(INSTANCE, separators=(",", ":"))
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    print(f"model {path.name}: vocab {vocab}; instance {text!r} = {len(token_ids)} tokens")
    runs = [
        ("llguidance", lambda: bench_llguidance(tokenizer, token_ids, vocab, args.repeats, False)),
        ("llguidance", lambda: bench_llguidance(tokenizer, token_ids, vocab, args.repeats, True)),
        ("llguidance", lambda: bench_llguidance(tokenizer, token_ids, vocab, args.repeats, False, copy=True)),
        ("xgrammar", lambda: bench_xgrammar(tokenizer, token_ids, vocab, args.repeats)),
        ("outlines_core", lambda: bench_outlines(tokenizer, token_ids, vocab, args.repeats)),
    ]
    for module, run in runs:
        if importlib.util.find_spec(module) is None:
            print(f"{module}: not installed, skipped")
        else:
            run()


if __name__ == "__main__":
    main()
