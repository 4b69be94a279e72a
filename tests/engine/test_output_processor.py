"""OutputProcessor over a real scheduler: exact deltas, finishes, stop strings, aborts, faults, n > 1 samples."""

from __future__ import annotations

import pytest

from engine.core.outputs import Logprob, RequestOutput
from engine.core.scheduler import Scheduler
from engine.core.sequence import FinishReason, SamplingParams, Sequence
from engine.output_processor import OutputProcessor
from tests.engine.scheduler_factories import make_scheduler
from tests.engine.test_detokenizer import make_byte_bpe_tokenizer

TOKENIZER = make_byte_bpe_tokenizer()
PROMPT = TOKENIZER.encode("Hello world!")
QUICK = TOKENIZER.encode(
    " The quick brown fox jumps"
)  # ' ', 'The', ' ', 'qu', 'ick', ' b', 'row', 'n', ' f', 'ox', ...
LAZY = TOKENIZER.encode(
    " over the lazy dog."
)  # ' ', 'ove', 'r', ' the', ' l', 'az', 'y', ' ', 'do', 'g', '.'
ARRIVAL = 1.5


def make_pair() -> tuple[Scheduler, OutputProcessor]:
    sched = make_scheduler()
    return sched, OutputProcessor(TOKENIZER, sched)


def add(
    sched: Scheduler, proc: OutputProcessor, request_id: str, first_seq_id: int, **params: object
) -> list[Sequence]:
    """Add a request of n samples the way the engine does: all n sequences, the scheduler forking 1.. later."""
    p = SamplingParams(ignore_eos=True, **params)  # type: ignore[arg-type]
    seqs = [
        Sequence(first_seq_id + k, request_id, list(PROMPT), len(PROMPT), p, ARRIVAL, k) for k in range(p.n)
    ]
    sched.add_sequence(seqs[0], seqs[1:])
    proc.add_request(seqs)
    return seqs


def step(
    sched: Scheduler, proc: OutputProcessor, scripts: dict[str, list[list[int]]]
) -> dict[str, RequestOutput]:
    """One engine step in which sample k of request r takes the next token of scripts[r][k]."""
    out = sched.schedule()
    seqs, _ = out.sampling_rows()
    sampled = {s.seq_id: scripts[s.request_id][s.sample_index][s.num_output_tokens] for s in seqs}
    proc.process_tokens(sched.update(out, sampled))
    return {o.request_id: o for o in proc.make_outputs()}


def deltas(output: RequestOutput) -> list[tuple[int, str, int]]:
    return [(c.index, c.text_delta, c.num_new_tokens) for c in output.outputs]


def test_each_step_reports_exactly_the_new_text_and_the_last_one_finishes() -> None:
    sched, proc = make_pair()
    add(sched, proc, "r", 0, max_tokens=5)
    reported = [step(sched, proc, {"r": [QUICK]})["r"] for _ in range(5)]
    assert [deltas(o) for o in reported] == [[(0, d, 1)] for d in [" ", "The", " ", "qu", "ick"]]
    assert [o.outputs[0].text for o in reported] == [" ", " The", " The ", " The qu", " The quick"]
    assert [o.finished for o in reported] == [False] * 4 + [True]
    last = reported[-1]
    assert (last.outputs[0].token_ids, last.outputs[0].finish_reason) == (QUICK[:5], FinishReason.LENGTH)
    assert (last.prompt_token_ids, last.num_cached_tokens, last.error) == (PROMPT, 0, None)
    first_token_time = reported[0].metrics.first_token_time
    assert first_token_time is not None
    assert [(o.metrics.arrival_time, o.metrics.first_token_time) for o in reported] == [
        (ARRIVAL, first_token_time)
    ] * 5
    assert [o.metrics.finished_time is None for o in reported] == [True] * 4 + [False]
    assert "r" not in proc and len(proc) == 0 and proc.make_outputs() == []


def test_a_stop_string_is_held_back_then_finishes_the_sequence_through_the_scheduler() -> None:
    sched, proc = make_pair()
    add(sched, proc, "r", 0, max_tokens=20, stop=("fox",))
    reported = [step(sched, proc, {"r": [QUICK]})["r"] for _ in range(10)]
    # ' f' could start "fox": held back until 'ox' completes the stop string, which is never released
    assert [deltas(o)[0][1] for o in reported] == [" ", "The", " ", "qu", "ick", " b", "row", "n", " ", ""]
    last = reported[-1].outputs[0]
    assert (last.text, last.finish_reason, last.stop_reason) == (
        " The quick brown ",
        FinishReason.STOP,
        "fox",
    )
    assert reported[-1].finished and not sched.has_unfinished()
    assert sched.block_manager.stats().num_used_blocks == 0


def test_an_abort_gives_one_final_output_without_new_text() -> None:
    sched, proc = make_pair()
    add(sched, proc, "a", 0, max_tokens=8)
    add(sched, proc, "b", 1, max_tokens=8)
    scripts = {"a": [QUICK], "b": [LAZY]}
    step(sched, proc, scripts)
    proc.abort("a")
    reported = step(sched, proc, scripts)
    assert list(reported) == ["a", "b"]  # the aborted request first: it moved before the step
    assert deltas(reported["a"]) == [(0, "", 0)] and reported["a"].finished
    assert reported["a"].outputs[0].finish_reason is FinishReason.ABORT
    assert reported["a"].outputs[0].text == " " and deltas(reported["b"]) == [(0, "ove", 1)]
    proc.abort("a")  # already gone: ignored
    assert list(step(sched, proc, scripts)) == ["b"]


def test_an_abort_before_the_first_token_reports_the_first_sample_only() -> None:
    sched, proc = make_pair()
    seqs = add(sched, proc, "r", 0, n=3)
    proc.abort("r")
    (output,) = proc.make_outputs()
    assert deltas(output) == [(0, "", 0)] and output.finished
    assert output.outputs[0].finish_reason is FinishReason.ABORT and output.metrics.first_token_time is None
    assert [s.finish_reason for s in seqs] == [FinishReason.ABORT] * 3  # the scheduler finished all three
    assert not sched.has_unfinished() and len(proc) == 0


def test_a_fault_fails_its_request_only_and_keeps_the_first_error() -> None:
    sched, proc = make_pair()
    bad_seqs = add(sched, proc, "bad", 0, max_tokens=8, n=2)
    add(sched, proc, "good", 2, max_tokens=8)
    scripts = {"bad": [QUICK, LAZY], "good": [LAZY]}
    step(sched, proc, scripts)

    def explode(new_token_ids: list[int]) -> None:
        raise UnicodeError("boom")

    proc.request_states["bad"].samples[1].detokenizer.step = explode  # type: ignore[method-assign]
    reported = step(sched, proc, scripts)
    bad = reported["bad"]
    assert bad.finished and bad.error == "detokenization failed: UnicodeError: boom"
    # sample 0 got its text before sample 1 failed; every sample reports ERROR
    assert deltas(bad) == [(0, "The", 1), (1, "", 0)]
    assert [c.finish_reason for c in bad.outputs] == [FinishReason.ERROR] * 2
    assert [s.finish_reason for s in bad_seqs] == [FinishReason.ERROR] * 2 and "bad" not in proc
    assert not reported["good"].finished and sched.get_sequences("bad") == []
    proc.fail("good", "first")
    proc.fail("good", "second")
    (good,) = proc.make_outputs()
    assert (good.error, good.finished, deltas(good)) == ("first", True, [(0, "", 0)])
    assert not sched.has_unfinished() and sched.block_manager.stats().num_used_blocks == 0


def test_parallel_samples_report_their_own_deltas_and_finish_apart() -> None:
    sched, proc = make_pair()
    add(sched, proc, "r", 0, max_tokens=6, n=2, stop=("brown",))
    scripts = {"r": [LAZY, QUICK]}
    reported = [step(sched, proc, scripts)["r"] for _ in range(6)]
    assert [deltas(o) for o in reported] == [
        [(0, " ", 1), (1, " ", 1)],
        [(0, "ove", 1), (1, "The", 1)],
        [(0, "r", 1), (1, " ", 1)],
        [(0, " the", 1), (1, "qu", 1)],
        [(0, " l", 1), (1, "ick", 1)],
        [(0, "az", 1), (1, " b", 1)],  # "b" could start "brown", but the length limit ends the text here
    ]
    final = reported[-1]
    assert [o.finished for o in reported] == [False] * 5 + [True]
    assert [(c.text, c.finish_reason) for c in final.outputs] == [
        (" over the laz", FinishReason.LENGTH),
        (" The quick b", FinishReason.LENGTH),
    ]


def test_a_sample_that_stops_early_waits_for_its_sibling() -> None:
    sched, proc = make_pair()
    add(sched, proc, "r", 0, max_tokens=6, n=2, stop=("ove",))
    reported = [step(sched, proc, {"r": [QUICK, LAZY]})["r"] for _ in range(6)]
    assert deltas(reported[1]) == [(0, "The", 1), (1, "", 1)]
    assert reported[1].outputs[1].finish_reason is FinishReason.STOP and not reported[1].finished
    assert [deltas(o)[1] for o in reported[2:]] == [(1, "", 0)] * 4  # finished: nothing new
    assert reported[-1].finished and reported[-1].outputs[0].finish_reason is FinishReason.LENGTH


@pytest.mark.parametrize("asked", [None, 1])
def test_logprobs_are_reported_only_when_asked_for(asked: int | None) -> None:
    sched, proc = make_pair()
    seqs = add(sched, proc, "r", 0, max_tokens=2, logprobs=asked)
    lp = Logprob(QUICK[0], -0.5, [(QUICK[0], -0.5)])
    out = sched.schedule()
    got = sched.update(out, {0: QUICK[0]})
    proc.add_logprobs(seqs, [lp if asked is not None else None])  # after update: it knows the tokens appended
    proc.process_tokens(got)
    (output,) = proc.make_outputs()
    assert output.outputs[0].logprobs == ([lp] if asked is not None else None)
