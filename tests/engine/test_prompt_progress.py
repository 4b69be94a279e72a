"""A request that asks for it (SamplingParams.report_progress) gets its prompt's progress before its first token: how
much is read and cached, and its place in the queue while it waits; no other request sees a progress output."""

from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.core.outputs import RequestOutput
from tests.engine.bench_helpers import make_tiny_model_folder
from tests.engine.test_engine_lifecycle import BLOCK_BYTES


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> LLMEngine:
    model = str(make_tiny_model_folder(tmp_path_factory.mktemp("tiny")))
    config = EngineConfig(
        model=model,
        dtype="float32",
        kv_cache_bytes=256 * BLOCK_BYTES,
        max_model_len=512,
        max_num_seqs=1,  # one runs, the next waits: a place in the queue
        max_num_batched_tokens=64,  # a 200-token prompt is read in four steps
    )
    return LLMEngine(config)


def run(engine: LLMEngine) -> dict[str, list[RequestOutput]]:
    seen: dict[str, list[RequestOutput]] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            seen.setdefault(output.request_id, []).append(output)
    return seen


def params(report: bool) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, report_progress=report)


def test_progress_counts_the_prompt_read_and_the_queue_until_the_first_token(engine):
    prompt = [(7 * j) % 300 + 3 for j in range(200)]
    engine.add_request("first", prompt, params(True))
    engine.add_request("second", [5, 6, 7, *prompt[3:150]], params(True))
    engine.add_request("quiet", [9] * 40, params(False))
    seen = run(engine)

    first = [o.progress for o in seen["first"] if o.progress is not None]
    assert [p.processed for p in first] == [64, 128, 192]  # the fourth step reads the rest and samples
    assert all(p.total == 200 and p.cached == 0 and p.queue_position is None for p in first)
    assert [p.time_ms for p in first] == sorted(p.time_ms for p in first)
    started = next(i for i, o in enumerate(seen["first"]) if o.outputs[0].num_new_tokens)
    assert all(o.progress is None for o in seen["first"][started:])  # tokens speak for it from then on
    assert all(not o.outputs[0].num_new_tokens for o in seen["first"][:started])

    waiting = [o.progress for o in seen["second"] if o.progress is not None]
    assert waiting[0].queue_position == 1 and waiting[0].processed == 0  # next in line while "first" runs
    assert [p.queue_position for p in waiting].count(1) == 1  # sent when it changes, not every step
    assert seen["quiet"] and all(o.progress is None for o in seen["quiet"])


def test_no_progress_is_kept_for_a_request_that_ends_before_its_first_token(engine):
    engine.add_request("gone", [(3 * j) % 300 + 3 for j in range(200)], params(True))
    engine.step()
    engine.abort_request("gone")
    outputs = run(engine)["gone"]
    assert outputs[-1].finished and outputs[-1].progress is None
    assert engine.output_processor._progress_ids == set()
