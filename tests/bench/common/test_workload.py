"""bench/common/workload.py: seeded chat requests, a length mix that fits the model, per-user turns."""

from __future__ import annotations

from bench.common import workload


def test_chat_requests_are_seeded_and_bounded():
    first = workload.chat_requests(40, seed=3, max_tokens=128)
    assert first == workload.chat_requests(40, seed=3, max_tokens=128)
    assert first != workload.chat_requests(40, seed=4, max_tokens=128)
    assert all(32 <= r.max_tokens <= 128 for r in first)
    assert {r.kind for r in first} == {"short", "medium", "long"}
    assert all(r.messages[0]["role"] == "user" and r.messages[0]["content"] for r in first)


def test_length_mix_fits_max_model_len():
    mix = workload.length_mix(500, seed=0, max_model_len=4096)
    assert all(4 <= p <= 2048 and o >= 1 and p + o <= 4096 for p, o in mix)
    assert workload.lognormal_lengths(3, 0, median=100, sigma=0.0, lo=1, hi=1000) == [100, 100, 100]
    assert workload.lognormal_lengths(2, 0, median=100, sigma=0.0, lo=1, hi=50) == [50, 50]


def test_user_turns_are_seeded_per_user():
    assert workload.user_turns(0, 10, seed=1) == workload.user_turns(0, 10, seed=1)
    assert workload.user_turns(0, 10, seed=1) != workload.user_turns(1, 10, seed=1)
    assert len(workload.user_turns(5, 10, seed=1)) == 10
