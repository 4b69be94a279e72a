"""Mask time per request: a ceiling on each grammar mask and a budget for all of a request's masks, charged by an
injected clock (each mask costs exactly TICK of it), never measured against the wall."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from engine import LLM, SamplingParams
from engine.core.config import EngineConfig
from engine.core.sequence import FinishReason
from engine.core.structured import StructuredOutput
from engine.llm_engine import LLMEngine
from engine.worker.mask_budget import MaskAccount, MaskBudget
from tests.engine.bench_helpers import make_tiny_model_folder

BLOCK_BYTES = 2 * 2 * 2 * 16 * 16 * 4
TICK = 2.0**-10  # one mask's cost on the fake clock: a power of two, so sums of it are exact
LETTERS = StructuredOutput("regex", "[a-z]{200}")  # never complete within the tests' max_tokens


def thread_clock(tick: float) -> Callable[[], float]:
    """A per-thread clock (as time.thread_time is) that moves `tick` at each read: every mask costs `tick`."""
    local = threading.local()

    def clock() -> float:
        local.now = getattr(local, "now", 0.0) + tick
        return local.now

    return clock


def scripted_clock(readings: list[float]) -> Callable[[], float]:
    """A clock that returns `readings` in turn."""
    it = iter(readings)
    return lambda: next(it)


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    folder = make_tiny_model_folder(tmp_path_factory.mktemp("tiny"))
    return LLM(
        model=str(folder),
        dtype="float32",
        kv_cache_bytes=512 * BLOCK_BYTES,
        kv_disk_bytes=0,
        guided_mask_max_s=0.25,
        guided_mask_budget_s=3.0,
    )


@pytest.fixture
def use_budget(llm: LLM, monkeypatch) -> Iterator[Callable[[float, float], LLMEngine]]:
    """Give the engine a budget of `max_mask_s` / `budget_s` whose masks each cost TICK."""

    def use(max_mask_s: float, budget_s: float) -> LLMEngine:
        monkeypatch.setattr(
            llm.engine.runner.guided, "budget", MaskBudget(max_mask_s, budget_s, thread_clock(TICK))
        )
        return llm.engine

    yield use
    assert not llm.engine.has_unfinished_requests()


def run_to_end(engine: LLMEngine) -> dict:
    """Step until every request has finished; the final outputs by request id."""
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    return finals


def letters(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, structured=LETTERS, **kw)


def test_the_limits_are_engine_config_knobs(llm: LLM) -> None:
    budget = llm.engine.runner.guided.budget
    assert (budget.max_mask_s, budget.budget_s) == (0.25, 3.0)
    assert (EngineConfig().guided_mask_max_s, EngineConfig().guided_mask_budget_s) == (0.01, 1.0)
    for name in ("guided_mask_max_s", "guided_mask_budget_s"):
        with pytest.raises(ValueError, match=f"{name} must be positive, got 0"):
            EngineConfig(**{name: 0})


def test_a_mask_over_the_ceiling_stops_the_account_and_no_later_mask_runs() -> None:
    budget = MaskBudget(0.01, 1.0, scripted_clock([0.0, 0.004, 1.0, 1.016]))
    account, computed = MaskAccount(), []
    assert budget.timed(account, lambda: computed.append(1))  # 4 ms: under 10 ms
    assert not budget.timed(account, lambda: computed.append(2))  # 16 ms
    assert account.error == (
        "structured output stopped: a token mask took 16.0 ms, over the limit of 10 ms a mask "
        "(setting guided_mask_max_s)"
    )
    assert account.over_ceiling
    assert not budget.timed(account, lambda: computed.append(3))  # stopped: not even computed
    assert computed == [1, 2] and account.num_masks == 2


def test_masks_of_any_number_per_step_draw_from_one_budget() -> None:
    # as a step verifying 3 drafts needs 4 masks of a row: 4 masks a step, 0.25 s each, a budget of 1.9 s
    budget = MaskBudget(0.5, 1.9, thread_clock(0.25))
    account = MaskAccount()
    first_step = [budget.timed(account, lambda: None) for _ in range(4)]
    second_step = [budget.timed(account, lambda: None) for _ in range(4)]
    assert first_step == [True] * 4
    assert second_step == [True, True, True, False]  # the 8th mask takes the total to 2 s
    assert (account.num_masks, account.spent_s, account.over_ceiling) == (8, 2.0, False)
    assert account.error == (
        "structured output stopped: the request's 8 token masks took 2.000 s in all, over the budget of 1.9 s "
        "a request (setting guided_mask_budget_s)"
    )


def test_mask_time_is_counted_per_request_across_its_samples_and_steps(use_budget) -> None:
    engine = use_budget(1.0, 1.0)
    engine.add_request("three", "hello", letters(8, n=3))
    engine.add_request("one", "the cat", letters(8))
    for _ in range(4):
        engine.step()
    three = [engine.runner.guided.accounts[s.seq_id] for s in engine.scheduler.get_sequences("three")]
    (one,) = [engine.runner.guided.accounts[s.seq_id] for s in engine.scheduler.get_sequences("one")]
    assert len(three) == 3 and all(a is three[0] for a in three) and one is not three[0]
    # 4 steps: each of the 3 samples masked once a step; the other request on its own account
    assert (three[0].num_masks, three[0].spent_s) == (12, 12 * TICK)
    assert (one.num_masks, one.spent_s) == (4, 4 * TICK)
    finals = run_to_end(engine)
    assert {len(s.token_ids) for s in finals["three"].outputs} == {8}
    assert len(engine.runner.guided) == 0 or engine.step() == [] and len(engine.runner.guided) == 0


def test_a_request_over_its_budget_ends_with_the_error_and_frees_its_blocks(use_budget) -> None:
    engine = use_budget(1.0, 10.5 * TICK)  # 10 masks fit, the 11th is over
    engine.add_request("guided", "hello there", letters(40))
    engine.add_request("free", "the cat", SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    finals = run_to_end(engine)
    guided = finals["guided"]
    assert guided.outputs[0].finish_reason is FinishReason.ERROR
    assert guided.error == (
        "structured output stopped: the request's 11 token masks took 0.011 s in all, over the budget of "
        f"{10.5 * TICK:g} s a request (setting guided_mask_budget_s)"
    )
    assert len(guided.outputs[0].token_ids) == 10  # the 11th step's token is dropped with the request
    assert finals["free"].outputs[0].finish_reason is FinishReason.LENGTH
    assert len(finals["free"].outputs[0].token_ids) == 30
    engine.step()
    assert len(engine.runner.guided) == 0 and not engine.runner.guided.accounts
    assert engine.stats().num_used_blocks == 0


def test_a_mask_over_the_ceiling_ends_the_request_and_its_grammar_is_refused_from_then_on(use_budget) -> None:
    engine = use_budget(TICK / 2, 1.0)  # every mask is over
    costly = StructuredOutput("regex", "[a-z]{150}")
    engine.add_request("costly", "hello", SamplingParams(temperature=0.0, max_tokens=20, structured=costly))
    engine.add_request("free", "hello", SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    finals = run_to_end(engine)
    assert finals["costly"].outputs[0].finish_reason is FinishReason.ERROR
    assert finals["costly"].outputs[0].token_ids == []  # its first mask was over: nothing sampled under it
    assert finals["costly"].error == (
        f"structured output stopped: a token mask took {TICK * 1000:.1f} ms, over the limit of {TICK / 2 * 1000:g} "
        "ms a mask (setting guided_mask_max_s)"
    )
    assert len(finals["free"].outputs[0].token_ids) == 5
    with pytest.raises(
        ValueError,
        match=r"the grammar is too costly: a request with it was stopped, a token mask took .*guided_mask_max_s\)$",
    ):
        engine.check_structured(costly)
    with pytest.raises(ValueError, match="too costly"):
        engine.add_request("again", "hello", SamplingParams(max_tokens=5, structured=costly))
    assert engine.scheduler.get_sequences("again") == []
    engine.check_structured(LETTERS)  # another grammar is not refused
    engine.step()
    assert engine.stats().num_used_blocks == 0
