"""Speculative decoding changes no greedy token (issue #40), through the whole engine with the real SmolLM2.

Each case builds two engines alike but for `speculative_method` and sends both the same requests, twice: cold, then
again, where the prompts hit each engine's own prefix cache (or, with a disk tier and a pool too small to keep them,
load from disk). Outputs must be equal token for token, logprobs bit for bit, and speculation must have run.
"""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from tests.engine.spec_helpers import propose_always

pytestmark = pytest.mark.slow

DOCUMENT = (
    "The backup job of the orders database ran for six hours instead of forty minutes, because the replica it "
    "reads from was being rebuilt at the same time. Nobody was paged: the job has no time limit. Bilal proposed a "
    "limit of two hours and an alert after ninety minutes. Dora will move the maintenance calendar into the "
    "scheduler's configuration by the end of the month."
)
CODE = "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n    return 2 * (width + height)\n"
CONVERSATIONS = [
    [{"role": "user", "content": f"Repeat this text word for word:\n\n{DOCUMENT}"}],
    [{"role": "user", "content": f"Rename `width` to `w` in this code and show all of it:\n\n{CODE}"}],
    [{"role": "user", "content": f"Quote the sentence about the alert from this text:\n\n{DOCUMENT}"}],
    [{"role": "user", "content": "List the days of the week, one a line, twice."}],
]
REQUESTS = [
    # a stop string inside the text it repeats: the tokens accepted after it in the same step are dropped
    SamplingParams(temperature=0.0, max_tokens=48, stop=["paged"]),
    SamplingParams(temperature=0.0, max_tokens=40, logprobs=2),  # the target's logprobs, accepted tokens' too
    SamplingParams(temperature=0.0, max_tokens=40, repetition_penalty=1.1),  # penalties per proposed position
    SamplingParams(temperature=0.0, max_tokens=32, n=2),  # forked samples verify on their own
]


def _pair(tmp_path, **config) -> tuple[LLM, LLM]:
    engines = []
    for method in ("off", "ngram"):
        config["kv_disk_dir"] = str(tmp_path / method)
        # the default model: its GGUF blocks, whose kernels give a row the same bits in any batch
        engines.append(LLM(model="smollm2-135m-instruct", speculative_method=method, **config))
    propose_always(engines[1])  # every token it may propose is verified, whatever the machine's load
    return engines[0], engines[1]


def _tokens(outputs):
    return [[(o.token_ids, o.finish_reason, o.stop_reason, o.text) for o in r.outputs] for r in outputs]


def _logprobs(outputs):
    return [
        [o.logprobs and [(lp.token_id, lp.logprob, lp.top) for lp in o.logprobs] for o in r.outputs]
        for r in outputs
    ]


def _agreement(got, expected) -> float:
    """The share of the expected samples' tokens that the other run has at the same place, up to its first
    difference."""
    same = total = 0
    for got_request, expected_request in zip(got, expected, strict=True):
        for a, b in zip(got_request.outputs, expected_request.outputs, strict=True):
            total += max(len(a.token_ids), len(b.token_ids))
            for x, y in zip(a.token_ids, b.token_ids, strict=False):
                if x != y:
                    break
                same += 1
    return same / total


@pytest.mark.parametrize(
    "config",
    [
        {"kv_cache_bytes": 64 * 2**20},  # the defaults: fp16 KV, int8 activations, the fused step
        {
            "kv_cache_bytes": 64 * 2**20,
            "kv_cache_dtype": "int8",
            "fused_decode": False,
        },  # int8 KV, module path
        # fp32 KV; a pool of ~5 of these sequences, four requests of up to two samples at once: preemptions, and the
        # second pass's prefixes evicted from RAM and read back from the disk tier
        {
            "kv_cache_bytes": 16 * 2**20,
            "kv_cache_dtype": "model",
            "max_model_len": 256,
            "kv_disk_bytes": 64 * 2**20,
        },
    ],
    ids=["default", "kv-int8-module-path", "kv-fp32-preempting-disk-tier"],
)
def test_greedy_output_is_the_same_with_speculation(tmp_path, config):
    preempting = bool(config.get("kv_disk_bytes"))
    off, on = _pair(tmp_path, **config)
    prompts = [off.engine.apply_chat_template(c) for c in CONVERSATIONS]
    for cold in (True, False):  # cold, then from the prefix cache (RAM or disk)
        expected = off.generate(prompts, REQUESTS)
        got = on.generate(prompts, REQUESTS)
        if preempting:
            # a preempted sequence recomputes its tokens' KV through the prefill kernels, and a prompt read in other
            # chunks sums in another order: each engine preempts and chunks at its own steps, so greedy tokens at
            # near-ties move, with or without speculation (without it, this pool's outputs agree with a 64 MiB
            # pool's on about half the tokens: docs/operators/speculative-decoding.md). Reported, not asserted.
            print(f"preempting: {_agreement(got, expected):.0%} of greedy tokens the same with speculation")
            for request, params in zip(got, REQUESTS, strict=True):
                assert all(o.finish_reason is not None for o in request.outputs)
                assert all(len(o.token_ids) <= params.max_tokens for o in request.outputs)
            continue
        if cold:
            assert got[0].outputs[0].stop_reason == "paged"  # the stop string was met
        assert _tokens(got) == _tokens(expected)
        assert _logprobs(got) == _logprobs(expected)
        assert sum(o.num_accepted_tokens for r in got for o in r.outputs) > 0  # each request's own counts
        assert all(o.num_draft_tokens == 0 for r in expected for o in r.outputs)
        if cold:  # alone in its steps: every proposal is verified on 1 + k rows
            assert _tokens(on.generate(prompts[:1], REQUESTS[0])) == _tokens(expected[:1])
    counters = on.engine.spec.counters
    assert counters.num_accepted_tokens > 20 and counters.num_draft_tokens > counters.num_accepted_tokens
    stats = on.engine.stats()
    assert stats.num_used_blocks == 0
    if preempting:
        assert stats.num_preemptions > 0 and stats.disk_hit_tokens > 0
    on.engine.scheduler.block_manager.check_invariants([])


def test_structured_output_verifies_proposals_against_its_grammar_and_changes_no_token():
    """A constrained sequence verifies proposed tokens too: each row masked as if the tokens before it were taken;
    the record repeats the prompt's words, so n-gram proposals are accepted inside the JSON."""
    from engine.core.structured import StructuredOutput

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "items": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "items"],
    }
    record = "name Ana Lopez, items: blue notebook, red pen, green stapler, blue notebook, red pen."
    conversation = [
        {"role": "user", "content": f"Return this record as JSON, each item as written:\n{record}"}
    ]
    params = [
        SamplingParams(temperature=0.0, max_tokens=80, structured=StructuredOutput.json_schema(schema)),
        SamplingParams(
            temperature=0.0,
            max_tokens=40,
            structured=StructuredOutput("regex", "(blue|red) [a-z]+(, (blue|red) [a-z]+)*"),
        ),
    ]
    results = {}
    for method in ("off", "ngram"):
        llm = LLM(speculative_method=method, kv_cache_bytes=64 * 2**20, kv_disk_bytes=0)
        if method != "off":
            propose_always(llm)
        results[method] = _tokens(llm.chat([conversation, conversation], params))
    assert results["ngram"] == results["off"]
    assert llm.engine.spec.counters.num_accepted_tokens >= 5
