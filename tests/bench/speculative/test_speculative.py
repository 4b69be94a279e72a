"""`bench speculative`: the replay of an answer through the n-gram proposer, by hand, and the benchmark end to end
on a tiny random GGUF model (speculation off and on one at a time, N at a time, a fake llama-server baseline)."""

from __future__ import annotations

import json
import shlex

import pytest

from bench.cli import bench_main
from bench.speculative.command import replay
from engine.core import speculative
from tests.bench.fake_openai import LLAMA_TIMINGS, fake_server
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


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # seed 1: greedy replies to the code edits that repeat their own earlier tokens within 32 (the random model
    # copies nothing from the prompt), so some proposals are made and accepted; the documents are ~800 tokens
    return write_tiny_chat_gguf(tmp_path_factory.mktemp("m") / "tiny.gguf", seed=1, context_length=2048)


def _run(argv: str, out) -> dict:
    assert bench_main(shlex.split(f"{argv} --kv-cache-bytes {2**24} --results-dir {out}")) == 0
    (json_path,) = out.glob("speculative-*.json")
    assert len(list(out.glob("speculative-*.png"))) == 1
    return json.loads(json_path.read_text())


def test_one_at_a_time_with_and_without_speculation_beside_a_llama_cpp_baseline(model, tmp_path, monkeypatch):
    # extra rows cost nothing and step times are not measured: the planner verifies every proposal, whatever this
    # machine's load, so what is proposed and accepted depends on the tokens alone
    monkeypatch.setattr(speculative, "EXTRA_ROW_COST", 0.0)
    monkeypatch.setattr(speculative.StepTimes, "add", lambda self, rows, seconds: None)
    timings = {**LLAMA_TIMINGS, "predicted_n": 32, "predicted_ms": 160.0, "draft_n": 8, "draft_n_accepted": 6}
    with fake_server("tiny.gguf", "llamacpp", timings) as (url, theirs):
        doc = _run(
            f"speculative --model {model} --max-tokens 32 --categories edit,open --num-speculative-tokens 4 "
            f"--baseline-url {url} --replay-k 2,4",
            tmp_path,
        )
    assert doc["config"]["speculative_method"] == "ngram" and doc["config"]["enable_prefix_caching"] is False
    assert doc["concurrency"] is None
    assert [p["category"] for p in doc["points"]] == ["edit", "open", "all"]
    assert len(doc["requests"]) == 6  # three prompts a category, each alone with speculation and without
    for p in doc["points"]:
        assert p["off_tokens"] <= p["prompts"] * 32 and p["on_tokens"] == p["off_tokens"]
        assert p["off_decode_tokens"] > 0 and p["off_tokens_per_s"] > 0 and p["on_tokens_per_s"] > 0
        assert p["ratio_on_off"] == pytest.approx(p["on_tokens_per_s"] / p["off_tokens_per_s"])
        assert p["on_tokens_per_s"] == pytest.approx(p["on_decode_tokens"] / p["on_decode_s"])
        assert p["accepted"] <= p["drafted"] and p["accepted_from_prompt"] <= p["accepted"]
        assert p["drafts"] <= p["decode_steps"] == p["on_decode_tokens"] - p["accepted"]
        # greedy: speculation gives the same answers (the engine's verification rows are the plain rows' bits)
        assert p["identical"] == p["prompts"] and p["identical_share"] == 1.0
    edit, _, total = doc["points"]
    assert edit["accepted"] > 0  # speculation ran
    # every proposal verified, up to 4 tokens: what the replay with k = 4 accepts (it may propose one token more
    # at the very end of a reply, where the engine leaves room for the verifying step's own token)
    replayed = next(r for r in doc["replay"] if (r["category"], r["k"]) == ("edit", 4))
    assert replayed["accepted"] - 3 <= edit["accepted"] <= replayed["accepted"]
    assert edit["acceptance_rate"] == edit["accepted"] / edit["drafted"]
    assert edit["tokens_per_verification"] == (edit["drafts"] + edit["accepted"]) / edit["drafts"]
    assert edit["tokens_per_decode_step"] == edit["on_decode_tokens"] / edit["decode_steps"] > 1
    assert edit["proposal_share"] == edit["drafts"] / edit["decode_steps"]
    assert edit["prompt_share_of_accepted"] + edit["reply_share_of_accepted"] == pytest.approx(1.0)
    assert total["prompts"] == 6 and total["drafted"] == sum(p["drafted"] for p in doc["points"][:2])

    (b,) = doc["baselines"]
    assert b["name"] == "llama.cpp" and b["speculates"] is True
    # a warm-up, then each prompt once, greedy, n_predict the reply's limit, the prompt cache off, as token ids
    bodies = theirs.completion_bodies
    assert len(bodies) == 7 and all(x["temperature"] == 0 and x["cache_prompt"] is False for x in bodies)
    assert [x["n_predict"] for x in bodies[1:]] == [32] * 6
    assert [r["prompt_tokens"] for r in doc["requests"]] == [len(x["prompt"]) for x in bodies[1:]]
    assert all(isinstance(t, int) for t in bodies[1]["prompt"])
    for q, p in zip(b["points"], doc["points"], strict=True):
        assert q["category"] == p["category"]
        assert q["tokens_per_s"] == pytest.approx(200.0)  # the fake's 32 tokens in 160 ms
        assert q["ratio_pagedchat_on"] == pytest.approx(p["on_tokens_per_s"] / 200.0)
        assert q["acceptance_rate"] == pytest.approx(0.75)
    assert b["points"][-1]["draft_n"] == 6 * 8

    assert [(r["category"], r["k"]) for r in doc["replay"]] == [
        ("edit", 2),
        ("edit", 4),
        ("open", 2),
        ("open", 4),
    ]
    for r in doc["replay"]:
        # each step: its accepted tokens and one more, but for an answer's last step if that accepted the rest
        assert r["steps"] + r["accepted"] - 3 <= r["decode_tokens"] <= r["steps"] + r["accepted"]
        off = next(p for p in doc["points"] if p["category"] == r["category"])
        assert r["decode_tokens"] == off["off_decode_tokens"]  # the answers without speculation, replayed


def test_n_at_a_time_with_and_without_speculation(model, tmp_path):
    doc = _run(f"speculative --model {model} --max-tokens 8 --categories open --concurrency 4", tmp_path)
    assert doc["baselines"] == [] and "replay" not in doc
    assert [p["category"] for p in doc["points"]] == ["open", "all"]
    c = doc["concurrency"]
    assert (c["concurrency"], c["requests"]) == (4, 4)  # three prompts cycled to four requests
    for label in ("on", "off"):
        assert 0 < c[label]["tokens"] <= 4 * 8
        assert c[label]["tokens_per_s"] == pytest.approx(c[label]["tokens"] / c[label]["seconds"])
    assert c["off"]["drafted"] == 0  # speculative=False: no proposal
    assert c["ratio_on_off"] == pytest.approx(c["on"]["tokens_per_s"] / c["off"]["tokens_per_s"])
    assert c["identical"] == 4 and c["identical_share"] == 1.0


@pytest.mark.parametrize(
    "argv",
    [
        "speculative --replay-k 0",
        "speculative --categories poems",
        "speculative --ngram-min 3 --ngram-max 2",
        "speculative --speculative-method off",
        "speculative --concurrency 0",
        "speculative --max-tokens 1",
    ],
)
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        bench_main(shlex.split(argv))
