"""bench/replicas/load.py against an OpenAI-compatible fake: every request logged, a failed turn resent with the
history it had (no empty answer left behind), throughput over the run's wall time."""

from __future__ import annotations

import asyncio

import pytest

from bench.replicas.load import RequestRecord, drive, throughput, warm_up
from bench.replicas.scenario import Scenario
from tests.bench.fake_openai import fake_server

SYSTEMS = ("desk one", "desk two")
SCENARIO = Scenario(SYSTEMS, (0, 1), (("u0 first", "u0 second"), ("u1 first", "u1 second")))
ANSWER = "alpha beta gamma delta "


def run_drive(url: str, resend_failed: bool):
    return asyncio.run(
        drive(
            url,
            "fake",
            SCENARIO,
            ["key-0", "key-1"],
            max_tokens=4,
            staggered=False,
            label="test",
            resend_failed=resend_failed,
        )
    )


def test_a_failed_turn_is_resent_with_the_history_it_had():
    with fake_server("fake", "pagedchat", num_failing=1) as (url, stats):
        load = run_drive(url, resend_failed=True)
    assert all(r.ok and r.text == ANSWER for user in load.per_user for r in user)
    failed = [r for r in load.records if not r.ok]
    assert len(load.records) == 5 and len(failed) == 1
    lost = failed[0]
    assert (lost.conversation, lost.turn, lost.attempt) == (0, 0, 1) and "503" in lost.error
    resent = [r for r in load.records if (r.user, r.turn, r.attempt) == (lost.user, 0, 2)]
    assert len(resent) == 1 and resent[0].ok and resent[0].sent_s >= lost.done_s
    # the first request failed, and the same messages were sent again
    assert stats.messages_asked.count(stats.messages_asked[0]) == 2
    user, system = lost.user, SYSTEMS[lost.user]
    second_turn = [m for m in stats.messages_asked if m[-1]["content"] == f"u{user} second"]
    assert second_turn == [
        [
            {"role": "system", "content": system},
            {"role": "user", "content": f"u{user} first"},
            {"role": "assistant", "content": ANSWER},
            {"role": "user", "content": f"u{user} second"},
        ]
    ]


def test_without_resend_a_failed_turn_stays_failed():
    with fake_server("fake", "pagedchat", num_failing=1) as (url, _):
        load = run_drive(url, resend_failed=False)
    assert len(load.records) == 4 and sum(not r.ok for r in load.records) == 1
    assert sum(not r.ok for user in load.per_user for r in user) == 1


def test_warm_up_sends_each_system_prompt_once_and_a_failure_stops_the_run():
    with fake_server("fake-model", "pagedchat") as (url, stats):
        assert asyncio.run(warm_up(url, "warm", SYSTEMS)) == "fake-model"
    assert [m[0]["content"] for m in stats.messages_asked] == list(SYSTEMS)
    with (
        fake_server("fake-model", "pagedchat", num_failing=1) as (url, _),
        pytest.raises(RuntimeError, match="warm-up request to .* failed"),
    ):
        asyncio.run(warm_up(url, "warm", SYSTEMS))


def test_throughput_over_the_wall_from_first_send_to_last_end():
    records = [
        RequestRecord(0, 0, 0, 1, 10.0, 12.0, True, 30),
        RequestRecord(1, 0, 0, 1, 11.0, 14.0, False, 0, "gone"),
        RequestRecord(1, 0, 0, 2, 14.0, 15.0, True, 20),
    ]
    assert throughput(records) == {
        "wall_s": 5.0,
        "num_requests": 3,
        "num_failed": 1,
        "output_tokens": 50,
        "output_tokens_per_s": 10.0,
        "requests_per_s": 0.4,
    }
