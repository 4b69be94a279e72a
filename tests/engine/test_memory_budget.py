"""The CPU pool's default budget (engine/core/memory.py's kv_memory_budget) with plain numbers, and the process's
resident memory."""

from __future__ import annotations

import pytest

from engine.core.memory import (
    KV_BUDGET_CAP,
    KV_BUDGET_FLOOR,
    KV_BUDGET_SEQUENCES,
    fitted_max_model_len,
    kv_memory_budget,
    process_rss_bytes,
)

GiB, MiB = 2**30, 2**20
# SmolLM2-135M's fp16 pool (30 layers x 3 KV heads x 64 x 2 bytes x K and V): 368,640-byte blocks of 16 tokens;
# one max_model_len sequence of 4,096 tokens is 256 of them
SMOLLM2_SEQUENCE = 256 * 368_640


def test_the_default_model_gets_eight_sequences_not_a_flat_share():
    # 24 GiB machine, ~22 GiB available after the weights: 10% is 2.2 GiB, but eight sequences are 720 MiB
    assert kv_memory_budget(22 * GiB, SMOLLM2_SEQUENCE) == 8 * SMOLLM2_SEQUENCE == 754_974_720


def test_a_big_model_gets_the_share_of_available_memory_within_the_floor_and_cap():
    big_sequence = 4096 * 128 * 1024  # 128 KiB a token (8B-class, 32 layers x 8 KV heads x 128 x 2 bytes x 2)
    assert kv_memory_budget(20 * GiB, big_sequence) == 2 * GiB  # 10% of 20 GiB
    assert kv_memory_budget(100 * GiB, big_sequence) == KV_BUDGET_CAP == 4 * GiB
    assert kv_memory_budget(1 * GiB, big_sequence) == big_sequence  # the floor (256 MiB) < one sequence
    sequence = 64 * MiB
    assert kv_memory_budget(1 * GiB, sequence) == KV_BUDGET_FLOOR == 256 * MiB  # 10% is below the floor
    assert kv_memory_budget(3 * GiB, sequence) == 3 * GiB // 10  # 307 MiB: under eight sequences (512 MiB)
    assert kv_memory_budget(20 * GiB, sequence) == 8 * sequence
    assert kv_memory_budget(1 * GiB, 16 * MiB) == 8 * 16 * MiB  # eight sequences bound the floor too


def test_at_least_one_sequence_and_the_cap_when_memory_is_unknown():
    assert kv_memory_budget(0, 5 * GiB) == 5 * GiB  # one max_model_len sequence, whatever the machine says
    assert kv_memory_budget(None, 100 * MiB) == KV_BUDGET_SEQUENCES * 100 * MiB
    assert kv_memory_budget(None, 1 * GiB) == KV_BUDGET_CAP


def test_the_process_rss_is_read():
    rss = process_rss_bytes()
    assert rss is not None and 10 * MiB < rss < 64 * GiB


def test_a_model_limit_the_pool_cannot_hold_is_not_forced_into_memory():
    # max_model_len unset, a 128k-token model at 128 KiB a token: one sequence is 16 GiB; the budget stays the
    # share (2 GiB of 20 GiB) and max_model_len shortens to what it holds
    long_sequence = 131_072 * 128 * 1024
    assert kv_memory_budget(20 * GiB, long_sequence) == long_sequence  # set by the user: held
    assert kv_memory_budget(20 * GiB, long_sequence, hold_one=False) == 2 * GiB
    assert fitted_max_model_len(131_072, 2 * GiB // (128 * 1024), 16) == 16_384
    # SmolLM2 at its own 8,192: the pool holds it, max_model_len is the model's
    assert kv_memory_budget(22 * GiB, 2 * SMOLLM2_SEQUENCE, hold_one=False) == 16 * SMOLLM2_SEQUENCE
    assert fitted_max_model_len(8192, 16 * 4096 * 8, 16) == 8192
    with pytest.raises(
        ValueError, match=r"holds 8 tokens, less than one block of 16: raise --kv-cache-bytes"
    ):
        fitted_max_model_len(8192, 8, 16)
