"""`bench speculative`: the replay of an answer through the n-gram proposer, by hand, and the benchmark end to end
on a tiny random GGUF model."""

from __future__ import annotations

import json
import shlex

import pytest

from bench.cli import bench_main
from bench.speculative.command import replay
from tests.engine.gguf_factories import write_tiny_chat_gguf


def test_a_quoted_run_is_accepted_up_to_where_the_answer_leaves_it():
    prompt = [10, 11, 12, 13]
    answer = [10, 11, 12, 13, 99]  # quotes the prompt, then leaves it
    stats = replay(prompt, answer, k=4, min_n=1, max_n=2)
    # after the first token (10, from the prefill) the proposal is what followed 10 in the prompt: 11, 12, 13 and
    # then 10 again (the answer's own first token); three are the answer's, and 99 is the step's own token
    assert (stats.decode_tokens, stats.steps, stats.drafted, stats.accepted) == (4, 1, 4, 3)
    assert stats.accepted_from_prompt == 3 and stats.steps_with_proposal == 1
    assert stats.summary()["tokens_per_step"] == 4.0


def test_without_matches_every_step_makes_one_token():
    stats = replay([1, 2, 3], [4, 5, 6, 7], k=4, min_n=1, max_n=3)
    assert (stats.steps, stats.drafted, stats.accepted) == (3, 0, 0)
    assert stats.summary()["acceptance_rate"] is None and stats.summary()["tokens_per_step"] == 1.0


def test_proposals_stop_at_the_answers_end():
    stats = replay([7, 7, 7, 7], [7, 7], k=8, min_n=1, max_n=1)
    assert (stats.steps, stats.drafted, stats.accepted) == (1, 1, 1)


def test_the_benchmark_on_a_tiny_model(tmp_path):
    model = write_tiny_chat_gguf(
        tmp_path / "tiny.gguf", seed=5, context_length=2048
    )  # the documents are ~800 tokens
    argv = (
        f"speculative --model {model} --kv-cache-bytes {2**24} --max-tokens 12 --replay-k 2,4 "
        f"--categories edit,open --results-dir {tmp_path / 'out'}"
    )
    assert bench_main(shlex.split(argv)) == 0
    (json_path,) = (tmp_path / "out").glob("speculative-*.json")
    assert len(list((tmp_path / "out").glob("speculative-*.png"))) == 1
    doc = json.loads(json_path.read_text())
    assert [(p["category"], p["k"]) for p in doc["points"]] == [
        ("edit", 2),
        ("edit", 4),
        ("open", 2),
        ("open", 4),
    ]
    for p in doc["points"]:
        assert (
            0 < p["steps"] <= p["decode_tokens"] <= 3 * 11
        )  # three prompts a category, 12 tokens each at most
        assert p["accepted"] <= p["drafted"] and p["accepted_from_prompt"] <= p["accepted"]
        assert p["decode_tokens"] == p["steps"] + p["accepted"]  # each step: its accepted tokens and one more
    by_category = {p["category"]: p["decode_tokens"] for p in doc["points"]}
    assert all(
        p["decode_tokens"] == by_category[p["category"]] for p in doc["points"]
    )  # same answers for every k


@pytest.mark.parametrize(
    "argv",
    [
        "speculative --replay-k 0",
        "speculative --categories poems",
        "speculative --ngram-min 3 --ngram-max 2",
    ],
)
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        bench_main(shlex.split(argv))
