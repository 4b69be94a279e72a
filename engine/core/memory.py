"""The machine's available memory, the process's, the KV pool's default budget, and byte counts in words: for the
loader's refusal, the pool's size, the start-up line and /admin."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass

GB = 1e9

# The CPU pool's default (kv_cache_bytes unset; a GPU's is memory_utilization): a share of the memory available once
# the weights are in, within a floor and a cap, as vLLM's CPU backend takes a fixed VLLM_CPU_KVCACHE_SPACE (4 GiB unless
# set) -- and sized to the model: a flat 2 GiB gave SmolLM2-135M 93,200 tokens (2.9 GB resident for 0.3 GB of
# weights) where its chats used a few hundred blocks (the admin page's advice). The pool is resident from the start
# (faulted in, kv_cache.zeros_on_huge_pages), so the share is small: the weights, activations and other processes keep
# the rest; the floor keeps a usable pool on a machine busy at start-up; past the cap, and past KV_BUDGET_SEQUENCES
# full-length sequences, more blocks would mostly hold cold prefixes, which the disk tier keeps instead.
KV_BUDGET_SHARE = 0.10
KV_BUDGET_FLOOR = 256 << 20
KV_BUDGET_CAP = 4 << 30
KV_BUDGET_SEQUENCES = 8  # max_model_len sequences: 32,768 tokens at 4,096


class NotEnoughMemory(ValueError):
    """Loading refused: the weights, or an explicit KV pool beside them, would not fit in the memory available."""


@dataclass(frozen=True)
class WeightMemory:
    """Bytes of the model's weights: kept in quantized blocks, and in float (norms, biases, float linears...)."""

    blocks: int
    float: int

    @property
    def total(self) -> int:
        return self.blocks + self.float


def available_memory_bytes() -> int | None:
    """Memory the machine can still give without swapping: psutil's `available`, else /proc/meminfo's MemAvailable;
    None where neither is known."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def kv_memory_budget(available_bytes: int | None, sequence_bytes: int, *, hold_one: bool = True) -> int:
    """The process's one memory budget for KV blocks when none is set (the CPU's: see KV_BUDGET_SHARE): the share of
    `available_bytes` within the floor and the cap (unknown: the cap), then at most KV_BUDGET_SEQUENCES and (with
    `hold_one`: the user set max_model_len) at least one `sequence_bytes` (the blocks of one max_model_len
    sequence). Without `hold_one` (max_model_len is the model's own limit) a smaller budget shortens max_model_len
    instead (`fitted_max_model_len`). Several models, later, split this budget."""
    budget = KV_BUDGET_CAP
    if available_bytes is not None:
        budget = min(KV_BUDGET_CAP, max(KV_BUDGET_FLOOR, int(KV_BUDGET_SHARE * available_bytes)))
    budget = min(budget, KV_BUDGET_SEQUENCES * sequence_bytes)
    return max(budget, sequence_bytes) if hold_one else budget


def kv_budget_line(
    budget: int,
    available_bytes: int | None,
    sequence_bytes: int,
    max_model_len: int,
    *,
    hold_one: bool = True,
) -> str:
    """The start-up line saying what `kv_memory_budget` chose and by which rule (same arguments, and its result)."""
    from engine.core.options import size_text

    if available_bytes is None:
        rule = f"the memory available is unknown, so the cap of {size_text(KV_BUDGET_CAP)}, kept to"
    else:
        rule = (
            f"{KV_BUDGET_SHARE:.0%} of the {human_bytes(available_bytes)} of memory available, kept within "
            f"{size_text(KV_BUDGET_FLOOR)}..{size_text(KV_BUDGET_CAP)} and to"
        )
    if hold_one:
        sequences, short = f"between 1 and {KV_BUDGET_SEQUENCES}", ""
    else:
        sequences = f"at most {KV_BUDGET_SEQUENCES}"
        short = "; a pool that holds less than one such sequence shortens max_model_len to what it holds"
    return (
        f"KV pool budget {human_bytes(budget)}: {rule} {sequences} sequences of max_model_len {max_model_len} "
        f"({human_bytes(sequence_bytes)} each){short}; --kv-cache-bytes sets it"
    )


def check_kv_pool_fits(pool_bytes: int, weight_bytes: int, available_bytes: int | None, where: str) -> None:
    """NotEnoughMemory when an explicit KV pool (--kv-cache-bytes) would not fit beside the weights: more than the
    memory `where` still has available once they are in (`available_bytes`; None: unknown, no check). The weights
    get the same check before they load (engine/loading/gguf_weights.py)."""
    if available_bytes is not None and pool_bytes > available_bytes:
        raise NotEnoughMemory(
            f"not allocating the KV pool: --kv-cache-bytes asks for {human_bytes(pool_bytes)}, but with the weights "
            f"in ({human_bytes(weight_bytes)}) {where} has {human_bytes(available_bytes)} available, so weights and "
            f"pool ({human_bytes(weight_bytes + pool_bytes)}) would not fit: lower --kv-cache-bytes, or leave it "
            "unset for a pool sized to the memory available"
        )


def fitted_max_model_len(model_max_len: int, pool_tokens: int, block_size: int) -> int:
    """max_model_len left unset: the model's own limit where the pool holds one such sequence, else the longest
    the pool holds (whole blocks); ValueError when that is not even one block."""
    if pool_tokens < block_size:
        raise ValueError(
            f"the KV pool holds {pool_tokens} tokens, less than one block of {block_size}: raise --kv-cache-bytes"
        )
    return min(model_max_len, pool_tokens)


def process_rss_bytes() -> int | None:
    """This process's resident memory: psutil's `rss`, else /proc/self/statm's resident pages; None where neither is
    known."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        pass
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def trim_heap() -> bool:
    """Give the C heap's free pages back to the system (glibc's malloc_trim); False where there is no glibc.

    Loading leaves freed memory in malloc's arenas (the GGUF reader, the tokenizer's construction, staging buffers),
    in the engine thread's own arena where a server loads it; malloc gives that back only from the top of the main
    arena. A 1B Q4_K_M server was 86 MB smaller once healthy with this called after its warm-up request (2-core AMD
    EPYC, `pagedchat serve --kv-cache-bytes 268435456`: 1.63 -> 1.54 GB)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def human_bytes(num_bytes: int | float) -> str:
    """Bytes in decimal units: '1.07 GB', '12.6 MB', '512 kB'."""
    if num_bytes >= 0.1 * GB:
        return f"{num_bytes / GB:.2f} GB"
    if num_bytes >= 1e6:
        return f"{num_bytes / 1e6:.1f} MB"
    return f"{num_bytes / 1e3:.0f} kB"
