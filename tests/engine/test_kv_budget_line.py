"""The start-up line about the default KV pool budget reads as a sentence, under both rules (it used to say "at most
8 (fewer than 1 shortens max_model_len) sequences")."""

from __future__ import annotations

from engine.core.memory import kv_budget_line


def test_with_max_model_len_set_the_budget_holds_between_one_and_eight_sequences():
    line = kv_budget_line(1_510_000_000, 21_500_000_000, 190_000_000, 8192, hold_one=True)
    assert line == (
        "KV pool budget 1.51 GB: 10% of the 21.50 GB of memory available, kept within 256MiB..4GiB and to between 1 "
        "and 8 sequences of max_model_len 8192 (0.19 GB each); --kv-cache-bytes sets it"
    )


def test_without_max_model_len_a_smaller_pool_shortens_it_said_in_its_own_clause():
    line = kv_budget_line(3_200_000_000, None, 400_000_000, 32768, hold_one=False)
    assert line == (
        "KV pool budget 3.20 GB: the memory available is unknown, so the cap of 4GiB, kept to at most 8 sequences "
        "of max_model_len 32768 (0.40 GB each); a pool that holds less than one such sequence shortens "
        "max_model_len to what it holds; --kv-cache-bytes sets it"
    )
