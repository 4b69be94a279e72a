"""Microbenchmarks of the paged-attention kernels on one CUDA GPU: decode bandwidth, prefill FLOP rate.

    python -m bench.tools.kernel_bench [--sweep] [--peak-gbps 4800] [--kv-cache-dtype int8] [--json out.json]

Decode: achieved GB/s of K/V read (the bytes that bound it) against the HBM peak, for batch x context with
Hq=32, Hkv=8, D=128, block 16, bf16; the split-K variant against the plain one where it applies; torch's SDPA
over a contiguous (unpaged) bf16 cache as a yardstick, and the per-sequence torch twin where it is cheap.
--kv-cache-dtype int8 runs the kernels over int8 caches with fp16 scales (q stays bf16); GB/s then counts the
int8 values plus the 2-byte scale of each (token, kv head) row.
Prefill: TFLOP/s of causal attention for 8 x 2048-token prompts against SDPA (flash) on contiguous tensors.
--sweep also times a grid of tile configs at the target shapes, to choose the launchers' defaults.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from functools import partial

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from kernels.paged_decode import DEFAULT_TILE, choose_num_splits, num_sms, paged_decode_attention
from kernels.paged_prefill import default_tile, paged_prefill_attention
from kernels.reference import paged_decode_attention_ref
from kernels.runtime import TileConfig

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
DTYPE = torch.bfloat16
DECODE_TARGET = (256, 4096, 0.60)  # batch, context, fraction of peak HBM bandwidth


def make_paged_cache(
    num_seqs: int, context: int, device: torch.device, kv_cache_dtype: torch.dtype = DTYPE
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """K/V caches holding num_seqs contexts of `context` tokens in shuffled blocks, their block tables and lengths,
    and the kernels' k_scale/v_scale arguments (empty unless int8)."""
    blocks_per_seq = -(-context // BLOCK_SIZE)
    num_blocks = num_seqs * blocks_per_seq + 1
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    scales = {}
    if kv_cache_dtype == torch.int8:
        k_cache = torch.randint(-127, 128, shape, dtype=torch.int8, device=device)
        v_cache = torch.randint(-127, 128, shape, dtype=torch.int8, device=device)
        scales = {
            name: torch.rand(shape[:3], device=device).mul(0.03).to(torch.float16)
            for name in ("k_scale", "v_scale")
        }
    else:
        k_cache = torch.randn(shape, dtype=kv_cache_dtype, device=device)
        v_cache = torch.randn(shape, dtype=kv_cache_dtype, device=device)
    block_tables = torch.randperm(num_blocks - 1, device=device)[: num_seqs * blocks_per_seq] + 1
    block_tables = block_tables.view(num_seqs, blocks_per_seq).to(torch.int32)
    seq_lens = torch.full((num_seqs,), context, dtype=torch.int32, device=device)
    return k_cache, v_cache, block_tables, seq_lens, scales


def kv_bytes_per_token(k_cache: torch.Tensor) -> int:
    """Bytes of K and V one context token occupies: values, plus an fp16 scale per kv head when int8."""
    scale_bytes = 2 if k_cache.dtype == torch.int8 else 0
    return 2 * NUM_KV_HEADS * (HEAD_DIM * k_cache.element_size() + scale_bytes)


def bench_ms(fn) -> float:
    return do_bench(fn, warmup=10, rep=40)


def decode_rows(
    peak_gbps: float, device: torch.device, sweep: bool, kv_cache_dtype: torch.dtype = DTYPE
) -> list[dict]:
    rows = []
    for num_seqs, context in itertools.product((1, 32, 256), (512, 4096)):
        k_cache, v_cache, block_tables, seq_lens, scales = make_paged_cache(
            num_seqs, context, device, kv_cache_dtype
        )
        q = torch.randn(num_seqs, NUM_HEADS, HEAD_DIM, dtype=DTYPE, device=device)
        scale = HEAD_DIM**-0.5
        kv_bytes = num_seqs * context * kv_bytes_per_token(k_cache)
        args = (q, k_cache, v_cache, block_tables, seq_lens, scale)
        auto_splits = choose_num_splits(num_seqs, NUM_KV_HEADS, context, num_sms(device))
        row = {"batch": num_seqs, "context": context, "splits": auto_splits}
        row["ms"] = bench_ms(partial(paged_decode_attention, *args, **scales))
        if auto_splits > 1:
            row["ms_no_split"] = bench_ms(partial(paged_decode_attention, *args, num_splits=1, **scales))
        # the yardstick: SDPA over a contiguous cache of the same size (no paging)
        k = torch.randn(num_seqs, NUM_KV_HEADS, context, HEAD_DIM, dtype=DTYPE, device=device)
        sdpa = partial(
            F.scaled_dot_product_attention, q.unsqueeze(2), k, torch.randn_like(k), enable_gqa=True
        )
        row["ms_sdpa_contiguous"] = bench_ms(sdpa)
        del k, sdpa
        if num_seqs * context <= 32 * 4096:
            row["ms_torch_twin"] = bench_ms(partial(paged_decode_attention_ref, *args, **scales))
        row["gbps"] = kv_bytes / row["ms"] / 1e6
        row["peak_fraction"] = row["gbps"] / peak_gbps
        if sweep and (num_seqs, context) == (256, 4096):
            row["sweep"] = sweep_decode(args, kv_bytes, scales)
        rows.append(row)
        del k_cache, v_cache, scales
        torch.cuda.empty_cache()
    return rows


def sweep_decode(args: tuple, kv_bytes: int, scales: dict[str, torch.Tensor]) -> list[dict]:
    results = []
    for tile_n, num_warps, num_stages in itertools.product((32, 64, 128), (4, 8), (2, 3)):
        tile = TileConfig(tile_n=tile_n, num_warps=num_warps, num_stages=num_stages)
        ms = bench_ms(partial(paged_decode_attention, *args, num_splits=1, tile=tile, **scales))
        results.append({"tile_n": tile_n, "num_warps": num_warps, "num_stages": num_stages, "ms": ms,
                        "gbps": kv_bytes / ms / 1e6})  # fmt: skip
    return sorted(results, key=lambda r: r["ms"])


def prefill_rows(device: torch.device, sweep: bool, kv_cache_dtype: torch.dtype = DTYPE) -> list[dict]:
    rows = []
    quantized = kv_cache_dtype == torch.int8
    for num_seqs, prompt_len in ((8, 2048), (1, 8192)):
        k_cache, v_cache, block_tables, seq_lens, scales = make_paged_cache(
            num_seqs, prompt_len, device, kv_cache_dtype
        )
        q = torch.randn(num_seqs * prompt_len, NUM_HEADS, HEAD_DIM, dtype=DTYPE, device=device)
        query_start_loc = torch.arange(
            0, num_seqs * prompt_len + 1, prompt_len, dtype=torch.int32, device=device
        )
        args = (q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, HEAD_DIM**-0.5, prompt_len)
        flops = (
            4 * num_seqs * NUM_HEADS * HEAD_DIM * prompt_len * (prompt_len + 1) / 2
        )  # QK^T and PV, causal half
        row = {
            "batch": num_seqs,
            "prompt_len": prompt_len,
            "tile": str(default_tile(prompt_len, 4, HEAD_DIM, quantized)),
        }
        row["ms"] = bench_ms(partial(paged_prefill_attention, *args, **scales))
        q4 = q.view(num_seqs, prompt_len, NUM_HEADS, HEAD_DIM).transpose(1, 2)
        k = torch.randn(num_seqs, NUM_KV_HEADS, prompt_len, HEAD_DIM, dtype=DTYPE, device=device)
        sdpa = partial(
            F.scaled_dot_product_attention, q4, k, torch.randn_like(k), is_causal=True, enable_gqa=True
        )
        row["ms_sdpa_contiguous"] = bench_ms(sdpa)
        row["tflops"] = flops / row["ms"] / 1e9
        row["tflops_sdpa"] = flops / row["ms_sdpa_contiguous"] / 1e9
        if sweep and num_seqs == 8:
            row["sweep"] = sweep_prefill(args, flops, scales)
        rows.append(row)
        del k_cache, v_cache, scales, k, sdpa
        torch.cuda.empty_cache()
    return rows


def sweep_prefill(args: tuple, flops: float, scales: dict[str, torch.Tensor]) -> list[dict]:
    results = []
    for block_m, tile_n, num_warps in itertools.product((64, 128), (32, 64, 128), (4, 8)):
        tile = TileConfig(tile_n=tile_n, block_m=block_m, num_warps=num_warps)
        try:
            ms = bench_ms(partial(paged_prefill_attention, *args, tile=tile, **scales))
        except Exception as error:  # e.g. out of shared memory: report it and go on
            results.append(
                {"block_m": block_m, "tile_n": tile_n, "num_warps": num_warps, "error": str(error)[:80]}
            )
            continue
        results.append({"block_m": block_m, "tile_n": tile_n, "num_warps": num_warps, "ms": ms,
                        "tflops": flops / ms / 1e9})  # fmt: skip
    return sorted(results, key=lambda r: r.get("ms", math.inf))


def print_report(decode: list[dict], prefill: list[dict], peak_gbps: float, cache_name: str = "bf16") -> None:
    print(
        f"decode  Hq={NUM_HEADS} Hkv={NUM_KV_HEADS} D={HEAD_DIM} block={BLOCK_SIZE} bf16 q, {cache_name} cache, "
        f"peak {peak_gbps:.0f} GB/s"
    )
    print(f"{'batch':>6} {'ctx':>6} {'splits':>6} {'ms':>8} {'GB/s':>8} {'%peak':>6} {'no-split ms':>11} "
          f"{'sdpa-contig ms':>14} {'torch twin ms':>13}")  # fmt: skip
    for r in decode:
        print(f"{r['batch']:>6} {r['context']:>6} {r['splits']:>6} {r['ms']:>8.3f} {r['gbps']:>8.0f} "
              f"{100 * r['peak_fraction']:>5.1f}% {r.get('ms_no_split', float('nan')):>11.3f} "
              f"{r['ms_sdpa_contiguous']:>14.3f} {r.get('ms_torch_twin', float('nan')):>13.3f}")  # fmt: skip
        for s in r.get("sweep", [])[:6]:
            print(f"{'':>14} sweep tile_n={s['tile_n']:>3} warps={s['num_warps']} stages={s['num_stages']}: "
                  f"{s['ms']:.3f} ms {s['gbps']:.0f} GB/s")  # fmt: skip
    print(f"prefill causal Hq={NUM_HEADS} Hkv={NUM_KV_HEADS} D={HEAD_DIM} bf16 q, {cache_name} cache")
    for r in prefill:
        print(f"  {r['batch']} x {r['prompt_len']}: {r['ms']:.3f} ms {r['tflops']:.0f} TFLOP/s "
              f"(SDPA contiguous {r['ms_sdpa_contiguous']:.3f} ms {r['tflops_sdpa']:.0f} TFLOP/s) {r['tile']}")  # fmt: skip
        for s in r.get("sweep", [])[:6]:
            print(f"      sweep {s}")
    batch, context, target = DECODE_TARGET
    (hit,) = [r for r in decode if (r["batch"], r["context"]) == (batch, context)]
    verdict = "PASS" if hit["peak_fraction"] >= target else "FAIL"
    print(f"DECODE TARGET {batch}x{context}: {hit['gbps']:.0f} GB/s = {100 * hit['peak_fraction']:.1f}% of peak "
          f"(target >= {100 * target:.0f}%): {verdict}")  # fmt: skip


def main() -> None:
    """Run the benchmarks and print the tables (and write JSON when asked)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--peak-gbps", type=float, default=4800.0, help="HBM peak bandwidth (H200: 4800 GB/s)"
    )
    parser.add_argument("--sweep", action="store_true", help="also time a grid of tile configs")
    parser.add_argument(
        "--kv-cache-dtype",
        choices=("bf16", "int8"),
        default="bf16",
        help="the paged caches' dtype (q stays bf16)",
    )
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args()
    kv_cache_dtype = {"bf16": torch.bfloat16, "int8": torch.int8}[args.kv_cache_dtype]
    if not torch.cuda.is_available():
        raise SystemExit("kernel_bench needs a CUDA device")
    device = torch.device("cuda")
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name(device)}, {num_sms(device)} SMs; decode default {DEFAULT_TILE}")
    decode = decode_rows(args.peak_gbps, device, args.sweep, kv_cache_dtype)
    prefill = prefill_rows(device, args.sweep, kv_cache_dtype)
    print_report(decode, prefill, args.peak_gbps, args.kv_cache_dtype)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"kv_cache_dtype": args.kv_cache_dtype, "decode": decode, "prefill": prefill}, f, indent=1
            )


if __name__ == "__main__":
    main()
