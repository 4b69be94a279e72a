"""Structured output in the engine: the constraint compiler, the bitmask, and constrained sampling on a tiny model."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from engine import LLM, SamplingParams
from engine.core.sequence import FinishReason
from engine.core.structured import MAX_JSON_WHITESPACE, StructuredOutput
from engine.worker.grammar import GrammarCompiler
from engine.worker.guided import unpack_bitmask
from tests.engine.bench_helpers import make_tiny_model_folder, make_tiny_tokenizer

BLOCK_BYTES = 2 * 2 * 2 * 16 * 16 * 4
SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
    },
    "required": ["color", "ok"],
    "additionalProperties": False,
}
PROMPTS = ["hello there", "the cat sat on the mat", "what is"]


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    folder = make_tiny_model_folder(tmp_path_factory.mktemp("tiny"))
    return LLM(model=str(folder), dtype="float32", kv_cache_bytes=512 * BLOCK_BYTES, kv_disk_bytes=0)


def constrained(temperature: float, seed: int | None = None, **kw) -> SamplingParams:
    kw.setdefault("structured", StructuredOutput.json_schema(SCHEMA))
    kw.setdefault("max_tokens", 200)
    return SamplingParams(temperature=temperature, seed=seed, **kw)


def assert_valid(text: str, schema: dict) -> None:
    value = json.loads(text)
    jsonschema.validate(value, schema)
    assert not re.search(rf"\s{{{MAX_JSON_WHITESPACE + 1},}}", text), f"whitespace run in {text!r}"


def test_unpack_bitmask_reads_bit_t_of_word_t_div_32() -> None:
    bitmask = torch.tensor([[0b101, 0], [0, -(2**31)]], dtype=torch.int32)  # -(2**31): only bit 31
    allowed = unpack_bitmask(bitmask, 64)
    assert allowed[0].nonzero().flatten().tolist() == [0, 2]
    assert allowed[1].nonzero().flatten().tolist() == [63]
    assert unpack_bitmask(bitmask, 40).shape == (2, 40)


@pytest.mark.parametrize(
    ("kind", "spec", "message"),
    [
        ("json_schema", '{"type": "foo"}', "invalid JSON schema: Invalid type: foo"),
        ("json_schema", '{"type": "string", "format": "weird"}', "Unknown format: weird"),
        ("json_schema", "[1, 2]", "a JSON schema must be an object, got list"),
        ("json_schema", "{bad", "the JSON schema is not valid JSON"),
        ("regex", "a(b", "invalid regex"),
        ("grammar", "start: foo", 'unknown name: "foo"'),
        ("yaml", "x", "structured output kind must be one of json_object, json_schema, regex, grammar"),
        ("regex", "", "a regex constraint needs a non-empty spec"),
        ("regex", "a{100000}", "the regex asks for 100000 repetitions ('{100000}'), over the limit of 2000"),
        ("regex", "x{3}(ab){2500,9000}", "the regex asks for 2500 repetitions ('{2500,9000}')"),
        ("regex", r"\\{2001,}", "the regex asks for 2001 repetitions"),  # an escaped backslash, then a count
        ("grammar", "start: /a{50000}/", "the Lark grammar asks for 50000 repetitions"),
        ("grammar", 'start: "a" ~ 5..20000', "the Lark grammar asks for 20000 repetitions ('~ 5..20000')"),
        (
            "json_schema",
            '{"type": "object", "patternProperties": {"^k{99999}$": {"pattern": "a{2}"}}}',
            "the JSON schema's pattern asks for 99999 repetitions",
        ),
        (
            "json_schema",
            '{"type": "array", "items": {"type": "string", "pattern": "^a{100000}$"}}',
            "the JSON schema's pattern asks for 100000 repetitions",
        ),
    ],
)
def test_a_bad_constraint_is_a_value_error_naming_the_problem(kind: str, spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        StructuredOutput(kind, spec)


@pytest.mark.parametrize(
    ("kind", "spec"),
    [
        ("regex", "a{2000}"),
        ("regex", "a{0,100000}"),  # only a minimum count makes masks costly
        ("regex", r"a\{100000}"),  # an escaped brace: the text "{100000}", not a count
        ("regex", "[0-9]{3}-[a-z]{2}"),
        ("grammar", 'start: "a" ~ 3..2000'),
        (
            "json_schema",
            '{"type": "string", "description": "{100000} is not a pattern", "maxLength": 100000}',
        ),
    ],
)
def test_counts_up_to_the_limit_upper_bounds_and_escaped_braces_are_accepted(kind: str, spec: str) -> None:
    assert StructuredOutput(kind, spec).grammar


@pytest.mark.parametrize(
    ("field", "value"), [("stop", ("}",)), ("stop_token_ids", (5,)), ("ignore_eos", True)]
)
def test_stops_that_would_cut_a_constrained_output_are_refused(field: str, value) -> None:
    with pytest.raises(ValueError, match=f"{field} cannot be combined with structured output"):
        SamplingParams(structured=StructuredOutput("json_object"), **{field: value})


def test_eos_is_allowed_only_where_the_grammar_accepts() -> None:
    tokenizer = make_tiny_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    compiler = GrammarCompiler(tokenizer, len(tokenizer), frozenset({eos}))
    matcher = compiler.matcher(StructuredOutput.json_schema(SCHEMA))
    text = '{"color":"red","ok":true}'
    ids = tokenizer.encode(text, add_special_tokens=False)
    for i, token_id in enumerate(ids):
        allowed = unpack_bitmask(
            torch.frombuffer(bytearray(matcher.compute_bitmask()), dtype=torch.int32)[None], len(tokenizer)
        )[0]
        assert bool(allowed[token_id]), f"token {i} of a valid instance is masked"
        assert not bool(allowed[eos]), f"EOS allowed after {tokenizer.decode(ids[:i])!r}"
        assert matcher.consume_token(token_id)
    assert matcher.is_stopped()  # `}` closes the object: nothing may follow, so the engine stops at once
    # a second matcher for the same grammar comes from the cache, at the start again
    again = compiler.matcher(StructuredOutput.json_schema(SCHEMA))
    assert not again.is_stopped() and again.consume_token(ids[0])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_random_model_under_a_schema_stops_with_valid_json(llm: LLM, temperature: float) -> None:
    params = [constrained(temperature, seed=s) for s in range(len(PROMPTS))]
    outputs = llm.generate(PROMPTS, params)
    for out in outputs:
        sample = out.outputs[0]
        assert sample.finish_reason is FinishReason.STOP, sample.text
        assert_valid(sample.text, SCHEMA)
    assert (
        len(llm.engine.runner.guided) == 0 or llm.engine.step() == [] and len(llm.engine.runner.guided) == 0
    )


def test_parallel_samples_each_follow_the_grammar(llm: LLM) -> None:
    out = llm.generate(["hello"], constrained(1.0, seed=3, n=3))[0]
    assert [s.index for s in out.outputs] == [0, 1, 2]
    for sample in out.outputs:
        assert sample.finish_reason is FinishReason.STOP
        assert_valid(sample.text, SCHEMA)


def test_regex_and_lark_grammar(llm: LLM) -> None:
    kinds = [
        StructuredOutput("regex", r"[0-9]{3}-[a-z]{2}"),
        StructuredOutput("grammar", 'start: "yes" | "no" | "maybe " NUM\nNUM: /[0-9]/'),
    ]
    outs = llm.generate(["hello"] * 2, [constrained(1.0, seed=5, structured=k) for k in kinds])
    texts = [o.outputs[0].text for o in outs]
    assert all(o.outputs[0].finish_reason is FinishReason.STOP for o in outs), texts
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", texts[0]), texts[0]
    assert re.fullmatch(r"yes|no|maybe [0-9]", texts[1]), texts[1]


def test_json_object_output_that_stops_is_an_object(llm: LLM) -> None:
    # a random model writes keys of random length: some samples run out of tokens (length), the rest must parse
    params = [
        constrained(1.0, seed=s, structured=StructuredOutput("json_object"), max_tokens=40) for s in range(6)
    ]
    outs = [o.outputs[0] for o in llm.generate(["hello there"] * 6, params)]
    stopped = [o for o in outs if o.finish_reason is FinishReason.STOP]
    assert stopped, [o.text for o in outs]
    for o in stopped:
        assert isinstance(json.loads(o.text), dict)
    for o in outs:
        assert o.finish_reason in (FinishReason.STOP, FinishReason.LENGTH) and o.text.startswith("{")


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_an_unconstrained_sequence_is_unchanged_beside_constrained_ones(llm: LLM, temperature: float) -> None:
    free = SamplingParams(temperature=temperature, max_tokens=30, seed=11, ignore_eos=True)
    alone = llm.generate(["the cat sat"], free)[0].outputs[0].token_ids
    outs = llm.generate(
        ["hello there", "the cat sat", "what is"], [constrained(temperature, seed=1), free, constrained(0.0)]
    )
    assert outs[1].outputs[0].token_ids == alone
    assert_valid(outs[0].outputs[0].text, SCHEMA)


def test_a_grammar_fault_fails_only_its_own_request(llm: LLM) -> None:
    engine = llm.engine
    engine.add_request("guided", "hello", constrained(0.0))
    engine.add_request("free", "hello", SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    engine.step()  # prefill and the first token of both
    (seq,) = engine.scheduler.get_sequences("guided")
    bad = engine.tokenizer.encode("zzz", add_special_tokens=False)[0]
    matcher = engine.runner.guided.matchers[seq.seq_id]
    assert not matcher.consume_token(bad)  # puts the matcher in its error state
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    assert finals["guided"].outputs[0].finish_reason is FinishReason.ERROR
    assert "structured output failed" in finals["guided"].error
    assert finals["free"].outputs[0].finish_reason is FinishReason.LENGTH
    assert len(finals["free"].outputs[0].token_ids) == 8
    engine.step()
    assert len(engine.runner.guided) == 0


def test_a_length_cut_is_reported_as_length(llm: LLM) -> None:
    out = llm.generate(["hello"], constrained(1.0, seed=0, max_tokens=3))[0].outputs[0]
    assert out.finish_reason is FinishReason.LENGTH
    assert len(out.token_ids) == 3 and out.text.startswith("{")


def test_a_grammar_completed_by_the_last_allowed_token_is_a_stop(llm: LLM) -> None:
    one_digit = StructuredOutput("regex", r"[0-9]")  # a digit is one token of SmolLM2's tokenizer
    out = llm.generate(["hello"], constrained(0.0, structured=one_digit, max_tokens=1))[0].outputs[0]
    assert re.fullmatch(r"[0-9]", out.text) and out.finish_reason is FinishReason.STOP


def test_an_abort_releases_the_matchers_at_once_even_when_the_engine_goes_idle(llm: LLM) -> None:
    engine = llm.engine
    engine.add_request("gone", "hello", constrained(0.7, seed=3, n=3))
    engine.step()
    assert len(engine.runner.guided) == 3
    engine.abort_request("gone")
    assert len(engine.runner.guided) == 0 and not engine.runner.seeded_generators
    (out,) = engine.step()  # the abort's final output
    assert out.finished and not engine.has_unfinished_requests()


def test_a_grammar_whose_first_mask_is_too_costly_is_refused_before_it_runs(llm: LLM, monkeypatch) -> None:
    # a limit 6x below what this grammar's first mask takes here (~0.65 s) and far above a plain grammar's (~2 ms);
    # nested counts, each under MAX_REPEAT_COUNT, which refuses a{200000} before it compiles
    monkeypatch.setattr(llm.engine.grammars, "max_first_mask_s", 0.1)
    llm.engine.check_structured(StructuredOutput("regex", "[0-9]{3}-x"))
    costly = StructuredOutput("regex", "(a{100}){2000}")
    with pytest.raises(
        ValueError, match=r"too costly: its first token mask took .* over the limit of 0.1 s"
    ) as info:
        llm.engine.check_structured(costly)
    # remembered as refused: the same error again, without compiling it again (it would fit this limit now)
    monkeypatch.setattr(llm.engine.grammars, "max_first_mask_s", 100.0)
    with pytest.raises(ValueError) as again:
        llm.engine.add_request("costly", "hello", constrained(0.0, structured=costly))
    assert str(again.value) == str(info.value)
    assert llm.engine.scheduler.get_sequences("costly") == []


def test_a_grammar_completed_on_a_kept_proposed_token_ends_there_and_the_matcher_is_left_as_it_was() -> None:
    """Speculative decoding (issue #40): a constrained sequence whose grammar completes on one of the proposed tokens
    it kept stops with that token (no EOS after it, as without speculation); accept() consumes up to an EOS only."""
    from engine.core.sequence import Sequence
    from engine.worker.guided import GuidedDecoder
    from engine.worker.mask_budget import MaskBudget

    tokenizer = make_tiny_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    guided = GuidedDecoder(
        GrammarCompiler(tokenizer, len(tokenizer), frozenset({eos})), MaskBudget(1.0, 10.0)
    )
    params = SamplingParams(structured=StructuredOutput.json_schema(SCHEMA))
    seq = Sequence(0, "r", [1, 2], 2, params, 0.0)
    guided.add([seq])
    ids = tokenizer.encode('{"color":"red","ok":true}', add_special_tokens=False)
    assert guided.completion_index(0, ids[:-1]) is None  # not complete before the closing brace
    assert guided.completion_index(0, [*ids, eos, ids[0]]) == len(ids) - 1  # the brace completes it
    ended, errors = guided.accept([seq], [[*ids[:-1], ids[-1]]], {})  # the matcher was left at the start
    assert (ended, errors) == ([seq], {})
    other = Sequence(1, "r2", [1, 2], 2, params, 0.0)
    guided.add([other])
    schema_free = Sequence(
        2, "r3", [1, 2], 2, SamplingParams(structured=StructuredOutput("regex", "[a-z]+")), 0.0
    )
    guided.add([schema_free])
    word = tokenizer.encode("abc", add_special_tokens=False)
    # an accepted EOS ends the sequence: the token after it (the scheduler cuts it) is not given to the matcher
    assert guided.accept([schema_free], [[*word, eos, ids[0]]], {}) == ([], {})
    ended, errors = guided.accept([other], [[ids[0], eos]], {})  # EOS where the grammar does not accept it
    assert other.seq_id in errors
    guided.close()
