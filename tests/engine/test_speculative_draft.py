"""`speculative_method draft` (issue #40): SmolLM2 Q4_1 (the default file) drafting for SmolLM2 in Q8_0, with real
weights. The draft's tokens may differ from the target's; the target's greedy output may not."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from engine import LLM, SamplingParams
from tests.engine.gguf_factories import write_tiny_chat_gguf
from tests.engine.spec_helpers import propose_always
from tests.engine.test_speculative_exact import CONVERSATIONS, REQUESTS, _logprobs, _tokens

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2_q8_0(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct in Q8_0 (its fp32 folder's weights, quantized by gguf-py), with its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.loading.loader import resolve_model_path
    from tests.engine.gguf_from_hf import write_hf_model_gguf

    folder = resolve_model_path("smollm2-135m-instruct")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32")
    path = tmp_path_factory.mktemp("q8") / "smollm2-135m-instruct-q8_0.gguf"
    q8 = gguf.GGMLQuantizationType.Q8_0
    tokenizer = AutoTokenizer.from_pretrained(folder)
    write_hf_model_gguf(path, model, linear_type=q8, embed_type=q8, head_type=q8, tokenizer=tokenizer)
    return path


def test_a_q4_1_draft_changes_no_greedy_token_of_its_q8_0_target(smollm2_q8_0):
    config = dict(model=str(smollm2_q8_0), kv_cache_bytes=64 * 2**20, kv_disk_bytes=0)
    off = LLM(speculative_method="off", **config)
    # a same-size draft would not pay on this CPU (the planner would rightly stop asking): every token is drafted
    on = propose_always(LLM(speculative_method="draft", speculative_model="smollm2-135m-instruct", **config))
    planner = on.engine.spec
    prompts = [off.engine.apply_chat_template(c) for c in CONVERSATIONS]
    for _ in range(2):  # cold, then from both models' prefix caches
        expected = off.generate(prompts[:3], REQUESTS[:3])
        got = on.generate(prompts[:3], REQUESTS[:3])
        assert _tokens(got) == _tokens(expected)
        assert _logprobs(got) == _logprobs(expected)
    counters = planner.counters
    assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens  # the draft is not the target
    assert counters.num_accepted_tokens > 50
    # the draft's pool comes out of the same budget: as many blocks as the target's, so fewer of each
    assert on.engine.num_blocks < off.engine.num_blocks
    draft_pool = planner.proposer.block_manager
    assert draft_pool.num_blocks == on.engine.num_blocks
    assert draft_pool.stats().num_used_blocks == 0 and not planner.proposer.mirrors  # finished: nothing held
    assert draft_pool.stats().num_cached_blocks > 0  # verified blocks stay cached for the next turn


def test_a_draft_with_another_tokenizer_or_a_shorter_context_is_refused(tmp_path):
    tiny = write_tiny_chat_gguf(
        tmp_path / "tiny.gguf", seed=1
    )  # its own small vocabulary, 256 tokens of context
    config = dict(
        speculative_method="draft", speculative_model=str(tiny), kv_cache_bytes=16 * 2**20, kv_disk_bytes=0
    )
    with pytest.raises(ValueError, match="does not share the target's tokenizer"):
        LLM(max_model_len=256, **config)
    with pytest.raises(ValueError, match=r"the draft model .*tiny.gguf.*: max_model_len \(8192\) exceeds"):
        LLM(**config)


def test_the_draft_method_needs_a_draft_model_and_a_draft_model_needs_the_method():
    from engine.core.config import EngineConfig

    with pytest.raises(ValueError, match="needs speculative_model"):
        EngineConfig(speculative_method="draft")
    with pytest.raises(ValueError, match="needs speculative_model"):
        EngineConfig(speculative_model="smollm2-135m-instruct")
    SamplingParams()  # (the request side has no draft setting)


def test_a_mirror_always_keeps_its_last_token_to_compute_after_the_target_took_the_drafted_tokens():
    """The target may take the draft's tokens without verifying them (a step whose proposals found no slots): the
    mirror, which computed them, must still compute the sequence's last token, whose logits give the next draft."""
    from engine.core.sequence import Sequence
    from engine.worker.draft import DraftProposer

    draft = DraftProposer(None, num_blocks=16, block_size=4, max_chunk=64, salt="", vocab_size=100)  # type: ignore[arg-type]
    seq = Sequence(0, "r", [5, 6, 7, 8, 9, 10], 6, SamplingParams(), 0.0)
    mirror = draft._sync(seq)
    assert mirror.num_computed_tokens == 0  # an empty cache: nothing of it is cached yet
    mirror.token_ids += [11, 12]  # as if the draft had computed 6 tokens and drafted 11, 12
    draft.block_manager.allocate_slots(mirror, len(mirror) - mirror.num_computed_tokens)
    mirror.num_computed_tokens = len(mirror)
    seq.token_ids += [11, 12]  # the target took them, unverified
    assert draft._sync(seq) is mirror and mirror.num_computed_tokens == len(seq) - 1
    draft.forget(0)
    assert draft.block_manager.stats().num_used_blocks == 0
