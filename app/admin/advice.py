"""Plain-words advice from what the numbers show: pool size (too small or too large), sequence lengths, database size;
and, apart from the advice, what paging saves beside a hypothetical engine reserving max_model_len per sequence."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

SUSTAINED_WINDOW_S = 60.0  # preemption counts as sustained only over at least this much observation
SUSTAINED_PER_MIN = 2.0  # ... and at this rate or more
MIN_LENGTHS_FOR_P99 = 100  # below this many sequences the p99 is the maximum: no tail to cut off
DATABASE_NEAR_FULL = 0.8  # share of max_database_bytes from which the advice warns
OVERSIZED_MIN_WINDOW_S = 120.0  # a pool is called too large only after this much observed traffic
OVERSIZED_PEAK_SHARE = 0.1  # ... when at most this share of it was ever in use
OVERSIZED_HEADROOM = 2  # the suggested pool holds this many times the peak in use
MIB = 1024**2


@dataclass(frozen=True)
class AdviceInputs:
    """What the advice is computed from: the engine's settings, its live counters and a window of traffic."""

    block_size: int
    num_blocks: int
    block_bytes: int  # KV bytes of one block (all layers, K and V)
    max_model_len: int
    max_num_seqs: int
    num_running: int
    num_tokens_stored: int  # tokens held by running sequences now
    num_slots_allocated: int  # block slots allocated to running sequences now
    window_s: float  # seconds of observation behind the window figures below
    num_preemptions: int  # within the window
    peak_running: int  # most sequences running at once within the window
    sequence_lengths: list[int] = field(
        default_factory=list
    )  # prompt + output tokens of sequences that ended
    kv_cache_dtype: str = ""  # what the pool stores: int8, float16, bfloat16, float32
    int8_block_bytes: int | None = (
        None  # the block's bytes with an int8 pool; None: already int8 (or unknown)
    )
    database_bytes: int | None = None  # pages the database uses; None: unknown (no advice on it)
    max_database_bytes: int = 0  # the guard past which new sessions and messages are refused; 0: none
    peak_used_blocks: int = 0  # most blocks in use at once within the window


@dataclass(frozen=True)
class AdviceItem:
    """One piece of advice: `level` is ok, info or warn."""

    level: str
    title: str
    text: str


@dataclass(frozen=True)
class Advice:
    """The advice, what paging saves (not advice: a comparison with a hypothetical engine), the figures behind both."""

    items: list[AdviceItem]
    paging: AdviceItem
    p50: int | None
    p99: int | None
    max_len_sequences_fit: int  # sequences of max_model_len the pool holds at once
    p99_sequences_fit: int | None  # sequences of the observed p99 length the pool holds at once
    preemptions_per_min: float
    suggested_max_model_len: int | None
    suggested_kv_cache_bytes: (
        int | None
    )  # a smaller pool that the window's peak would fit (None: no such advice)
    contiguous_reserved_tokens: int  # what reserving max_model_len per running sequence would hold now
    paged_allocated_tokens: int  # what paging holds now

    def to_json(self) -> dict[str, Any]:
        """The advice as a JSON object."""
        return asdict(self)


def percentile(values: list[int], pct: float) -> int:
    """Nearest-rank percentile (an observed value, never an interpolation); `values` must not be empty."""
    if not values:
        raise ValueError("percentile of an empty list")
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


def format_bytes(num_bytes: int) -> str:
    """1536 -> '1.5 KiB'; binary units, one decimal below 100."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _blocks_for(num_tokens: int, block_size: int) -> int:
    return max(1, -(-num_tokens // block_size))


def advise(inp: AdviceInputs) -> Advice:
    """Advice on the pool size, concurrency and max_model_len, from one set of inputs (pure)."""
    pool_tokens = inp.num_blocks * inp.block_size
    max_len_fit = inp.num_blocks // _blocks_for(inp.max_model_len, inp.block_size)
    lengths = inp.sequence_lengths
    p50 = percentile(lengths, 50) if lengths else None
    p99 = percentile(lengths, 99) if lengths else None
    p99_fit = inp.num_blocks // _blocks_for(p99, inp.block_size) if p99 is not None else None
    per_min = inp.num_preemptions * 60.0 / inp.window_s if inp.window_s > 0 else 0.0
    sustained = inp.window_s >= SUSTAINED_WINDOW_S and per_min >= SUSTAINED_PER_MIN
    items = [_capacity(inp, pool_tokens, max_len_fit, p99, p99_fit)]
    items.append(_lengths(inp, p50, p99))
    items.append(_preemption(inp, per_min, sustained, p99, p99_fit))
    suggested = None
    if (
        sustained
        and p99 is not None
        and len(lengths) >= MIN_LENGTHS_FOR_P99
        and max(lengths) > p99
        and 2 * p99 <= inp.max_model_len
    ):
        suggested = _blocks_for(p99, inp.block_size) * inp.block_size
        fit = inp.num_blocks // _blocks_for(suggested, inp.block_size)
        items.append(
            AdviceItem(
                "warn",
                "Rare long requests drive the preemption",
                f"99% of sequences end within {p99} tokens, yet max_model_len is {inp.max_model_len} and the longest "
                f"reached {max(lengths)}. A max_model_len of {suggested} (the p99, rounded up to a block) would refuse "
                f"the longest 1% with a clear error instead of letting them evict everyone else; the pool holds {fit} "
                f"sequences of that length.",
            )
        )
    smaller = _smaller_pool_blocks(inp)
    suggested_bytes = None
    if smaller is not None:
        suggested_bytes = -(-smaller * inp.block_bytes // MIB) * MIB  # whole MiB, rounded up
        items.append(_oversized(inp, suggested_bytes))
    reserved = inp.num_running * inp.max_model_len
    if inp.database_bytes is not None:
        items.append(_database(inp.database_bytes, inp.max_database_bytes))
    return Advice(
        items,
        _paging(inp, reserved, pool_tokens, p50),
        p50,
        p99,
        max_len_fit,
        p99_fit,
        round(per_min, 2),
        suggested,
        suggested_bytes,
        reserved,
        inp.num_slots_allocated,
    )


def _capacity(
    inp: AdviceInputs, pool_tokens: int, max_len_fit: int, p99: int | None, p99_fit: int | None
) -> AdviceItem:
    dtype = f" of {inp.kv_cache_dtype} KV" if inp.kv_cache_dtype else ""
    text = (
        f"{inp.num_blocks} blocks of {inp.block_size} tokens hold {pool_tokens} tokens{dtype} "
        f"({format_bytes(inp.num_blocks * inp.block_bytes)}): {max_len_fit} sequences of max_model_len "
        f"({inp.max_model_len}) at once"
    )
    if p99 is not None:
        text += f", or {p99_fit} of the observed p99 length ({p99} tokens)"
    return AdviceItem("info", "Pool capacity", text + f"; up to {inp.max_num_seqs} may run (max_num_seqs).")


def _lengths(inp: AdviceInputs, p50: int | None, p99: int | None) -> AdviceItem:
    if p50 is None or p99 is None:
        return AdviceItem(
            "info",
            "Sequence lengths",
            "No sequence has ended yet in the window; p50 and p99 of "
            "sequence lengths appear once requests finish.",
        )
    share = p99 / inp.max_model_len
    return AdviceItem(
        "info",
        "Sequence lengths",
        f"{len(inp.sequence_lengths)} sequences ended in the last {_duration(inp.window_s)}: p50 {p50} tokens, "
        f"p99 {p99} tokens, beside a max_model_len of {inp.max_model_len} (p99 is {share:.0%} of it).",
    )


def _preemption(
    inp: AdviceInputs, per_min: float, sustained: bool, p99: int | None, p99_fit: int | None
) -> AdviceItem:
    if inp.num_preemptions == 0:
        return AdviceItem(
            "ok",
            "No preemption",
            f"No sequence was preempted in the last {_duration(inp.window_s)}: "
            "the pool is large enough for this concurrency.",
        )
    if not sustained:
        return AdviceItem(
            "info",
            "Occasional preemption",
            f"{inp.num_preemptions} preemptions in the last {_duration(inp.window_s)} "
            f"({per_min:.1f} per minute): a burst, not yet a pattern.",
        )
    text = (
        f"{per_min:.1f} preemptions per minute over the last {_duration(inp.window_s)}: the pool is too small "
        f"for the concurrency (up to {inp.peak_running} sequences ran at once)."
    )
    if p99 is None or p99_fit is None:
        text += " Lower max_num_seqs or raise the KV memory budget."
    elif p99_fit < inp.max_num_seqs:
        needed = inp.max_num_seqs * _blocks_for(p99, inp.block_size)
        extra = needed - inp.num_blocks  # > 0: the pool holds fewer p99 sequences than may run
        text += (
            f" At the p99 length ({p99} tokens) the pool holds {p99_fit} sequences but up to {inp.max_num_seqs} "
            f"may run: lower max_num_seqs to {max(1, p99_fit)}, or raise the KV budget by {extra} blocks "
            f"({format_bytes(extra * inp.block_bytes)}) to {needed} blocks."
        )
    else:
        text += (
            f" The pool holds {p99_fit} sequences of the p99 length ({p99} tokens), at least max_num_seqs "
            f"({inp.max_num_seqs}): the sequences longer than the p99 are the ones crowding it out."
        )
    if inp.int8_block_bytes:
        ratio = inp.block_bytes / inp.int8_block_bytes
        text += (
            f" An int8 KV cache (--kv-cache-dtype int8) holds {ratio:.2f}x the tokens in the same bytes "
            f"({inp.num_blocks * inp.block_bytes // inp.int8_block_bytes} blocks instead of {inp.num_blocks}); "
            "`pagedchat bench quality` shows what it costs in logits."
        )
    return AdviceItem("warn", "Sustained preemption", text)


def _smaller_pool_blocks(inp: AdviceInputs) -> int | None:
    """The blocks a pool needs for the window's traffic, when that is well under this pool; else None.

    Twice the peak in use, and at least one max_model_len sequence (the engine refuses a smaller pool). Only after
    OVERSIZED_MIN_WINDOW_S of traffic that used at most OVERSIZED_PEAK_SHARE of the pool: an idle window says
    nothing about what the pool is for.
    """
    if inp.window_s < OVERSIZED_MIN_WINDOW_S or inp.peak_used_blocks == 0:
        return None
    if inp.peak_used_blocks > OVERSIZED_PEAK_SHARE * inp.num_blocks:
        return None
    needed = max(OVERSIZED_HEADROOM * inp.peak_used_blocks, _blocks_for(inp.max_model_len, inp.block_size))
    return needed if 2 * needed <= inp.num_blocks else None


def _oversized(inp: AdviceInputs, suggested_bytes: int) -> AdviceItem:
    pool_bytes = inp.num_blocks * inp.block_bytes
    blocks = suggested_bytes // inp.block_bytes
    peak = inp.peak_used_blocks
    return AdviceItem(
        "info",
        "Pool larger than the traffic needs",
        f"The {format_bytes(pool_bytes)} pool ({inp.num_blocks} blocks) was at most "
        f"{_share(peak / inp.num_blocks)} in use ({peak} blocks) over the last {_duration(inp.window_s)}: "
        f"--kv-cache-bytes {suggested_bytes} ({format_bytes(suggested_bytes)}, {blocks} blocks: "
        f"{OVERSIZED_HEADROOM}x that peak, and room for a max_model_len sequence) would do and free "
        f"{format_bytes(pool_bytes - suggested_bytes)}. A smaller pool keeps fewer finished prompts cached for reuse "
        f"({inp.num_blocks - peak} blocks may hold them now).",
    )


def _share(fraction: float) -> str:
    """0.004 -> '0.4%', 0.25 -> '25%': one decimal below 10%."""
    return f"{fraction:.1%}" if fraction < 0.1 else f"{fraction:.0%}"


def _paging(inp: AdviceInputs, reserved: int, pool_tokens: int, p50: int | None) -> AdviceItem:
    stored, allocated = inp.num_tokens_stored, inp.num_slots_allocated
    peak_reserved = inp.peak_running * inp.max_model_len
    text = (
        f"Now: {inp.num_running} running sequences store {stored} tokens in {allocated} paged slots "
        f"(waste {allocated - stored}). A hypothetical engine reserving max_model_len ({inp.max_model_len}) per "
        f"sequence, as a contiguous KV cache does, would hold {reserved} slots "
        f"({format_bytes(reserved * inp.block_bytes // inp.block_size)}, waste {reserved - stored})."
    )
    if inp.peak_running:
        share = peak_reserved / pool_tokens
        text += (
            f" At the peak of {inp.peak_running} running it would have needed {peak_reserved} tokens, "
            f"{share:.0%} of this pool"
        )
        text += (
            "."
            if p50 is None
            else f", where the median sequence used {p50 / inp.max_model_len:.0%} of its reservation."
        )
    return AdviceItem("info", "What paging saves", text)


def _database(used: int, guard: int) -> AdviceItem:
    if not guard:
        return AdviceItem(
            "info",
            "Database size",
            f"The database uses {format_bytes(used)}; no size guard (max_database_bytes 0).",
        )
    share = used / guard
    figures = f"The database uses {format_bytes(used)}, {share:.0%} of its guard of {format_bytes(guard)} (max_database_bytes)"
    if share >= 1:
        return AdviceItem(
            "warn",
            "Database full",
            f"{figures}: new sessions and messages are refused with 507. Raise max_database_bytes, or lower the "
            "per-owner quotas and delete old sessions (their pages are reused).",
        )
    if share >= DATABASE_NEAR_FULL:
        return AdviceItem(
            "warn",
            "Database nears its size guard",
            f"{figures}; at the guard new sessions and messages are refused with 507. Raise max_database_bytes, "
            "or lower the per-owner quotas and delete old sessions.",
        )
    return AdviceItem("ok", "Database size", f"{figures}.")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"
