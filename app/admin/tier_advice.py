"""Plain-words advice on the KV disk tier: too small for the returning traffic, turned off, or dropping writes."""

from __future__ import annotations

from app.admin.advice import AdviceItem, format_bytes
from engine.core.tier import TierStats

MIN_LOOKUPS = 20  # below this many lookups the share that stopped at an evicted block says little
EVICTED_SHARE = 0.1  # from this share of lookups stopping at an evicted block, the tier is too small


def tier_advice(tier: TierStats | None, *, configured: bool) -> list[AdviceItem]:
    """Advice from the tier's counters since start; `configured`: a tier was asked for (kv_disk_bytes not 0)."""
    if tier is None:
        return [_not_opened()] if configured else []
    items = []
    if not tier.enabled:
        items.append(_turned_off(tier))
    if tier.num_lookups >= MIN_LOOKUPS and tier.num_lookups_evicted / tier.num_lookups >= EVICTED_SHARE:
        items.append(_too_small(tier))
    if tier.num_write_drops:
        items.append(_write_drops(tier))
    if not items:
        items.append(
            AdviceItem(
                "ok",
                "Disk tier",
                f"The disk tier holds {tier.num_blocks} blocks ({format_bytes(tier.used_bytes)} of its "
                f"{format_bytes(tier.capacity_bytes)} cap); of {tier.num_lookups} lookups since start, "
                f"{tier.num_lookups_evicted} stopped at a block it had evicted.",
            )
        )
    return items


def _not_opened() -> AdviceItem:
    return AdviceItem(
        "warn",
        "Disk tier off",
        "A disk tier was asked for (kv_disk_bytes is not 0) but could not be opened: serving goes on without it. "
        "The server log's 'KV disk tier off' warning says why (the directory unusable or held by another "
        "process, or the disk too full for one block).",
    )


def _turned_off(tier: TierStats) -> AdviceItem:
    return AdviceItem(
        "warn",
        "Disk tier turned off after an error",
        f"The disk tier turned itself off after an error (write errors since start: {tier.num_write_errors}): no "
        "block is written to or loaded from it until the server restarts. The server log's 'KV disk tier turned "
        "off' warning says why.",
    )


def _too_small(tier: TierStats) -> AdviceItem:
    share = tier.num_lookups_evicted / tier.num_lookups
    return AdviceItem(
        "warn",
        "Disk tier too small for the returning traffic",
        f"{tier.num_lookups_evicted} of {tier.num_lookups} disk lookups since start ({share:.0%}) stopped at a "
        f"block the tier had held but evicted to stay within its cap of {format_bytes(tier.capacity_bytes)} "
        f"({tier.num_evictions} blocks evicted): returning conversations found their blocks gone and recomputed "
        f"them. Raise --kv-disk-bytes (e.g. to {format_bytes(2 * tier.capacity_bytes)}) if the disk has room.",
    )


def _write_drops(tier: TierStats) -> AdviceItem:
    return AdviceItem(
        "warn",
        "Disk tier write queue overflowed",
        f"{tier.num_write_drops} blocks were not written since start because the write queue was full "
        f"({tier.num_writes} written; {tier.write_queue_depth} queued now, the oldest "
        f"{tier.write_lag_seconds:.1f} s old): the disk takes blocks slower than sequences free them. A dropped "
        "block is recomputed when its conversation returns; a faster disk keeps up.",
    )
