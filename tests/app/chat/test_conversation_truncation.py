"""Token-exact history that no longer fits: the oldest exchanges go first, the system prompt stays."""

from __future__ import annotations

from typing import Any

import pytest

from app.chat.conversation import (
    Turn,
)
from app.chat.truncation import ContextFull, PromptTooLong, Truncate
from tests.app.conversation_factories import (
    answer_ids,
    make_builder,
    run_script,
)


def test_truncation_drops_the_oldest_exchange_and_keeps_the_system_prompt(tokenizer: Any) -> None:
    system_prompt = "You answer in one sentence."
    turns = run_script(make_builder(tokenizer), system_prompt)
    question, max_tokens = "Count to five.", 32
    renderer = make_builder(tokenizer)
    whole = len(renderer.render(system_prompt, turns, question))
    without_first = len(renderer.render(system_prompt, turns[2:], question))
    assert whole > without_first
    builder = make_builder(
        tokenizer, max_model_len=without_first + max_tokens
    )  # fits only without exchange 1
    plan = builder.build_prompt(system_prompt, turns, question, max_tokens)
    assert (plan.truncated_turns, plan.exact_extension) == (1, True)
    assert plan.token_ids == renderer.render(system_prompt, turns[2:], question)
    assert tokenizer.decode(plan.token_ids).count(system_prompt) == 1
    assert "capital of France" not in tokenizer.decode(plan.token_ids)
    # one token less room drops the second exchange too; room for everything keeps everything
    tighter = make_builder(tokenizer, max_model_len=without_first + max_tokens - 1)
    assert tighter.build_prompt(system_prompt, turns, question, max_tokens).truncated_turns == 2
    roomy = make_builder(tokenizer, max_model_len=whole + max_tokens)
    plan = roomy.build_prompt(system_prompt, turns, question, max_tokens)
    assert (plan.truncated_turns, len(plan.token_ids)) == (0, whole)


@pytest.mark.parametrize("with_ids", [True, False])
def test_truncation_matches_a_brute_force_search(tokenizer: Any, with_ids: bool) -> None:
    renderer = make_builder(tokenizer)
    turns: list[Turn] = []
    for i in range(12):
        question, answer = f"Question {i}: how are you?", "I am fine, thank you. " * (1 + i % 3)
        plan = renderer.build_prompt("Be brief.", turns, question, max_tokens=8)
        user_ids = plan.new_user_token_ids if with_ids else None
        ids = answer_ids(tokenizer, answer, "eos") if with_ids else None
        turns += [Turn("user", question, user_ids), Turn("assistant", answer, ids)]
    for max_model_len in (150, 200, 333, 400):
        budget = max_model_len - 8
        expected = next(
            k for k in range(13) if len(renderer.render("Be brief.", turns[2 * k :], "Hi")) <= budget
        )
        plan = make_builder(tokenizer, max_model_len).build_prompt("Be brief.", turns, "Hi", max_tokens=8)
        assert (plan.truncated_turns, plan.exact_extension) == (expected, with_ids or expected == 12)
        assert plan.token_ids == renderer.render("Be brief.", turns[2 * expected :], "Hi")


def test_prompt_that_cannot_fit_raises_naming_the_numbers(tokenizer: Any) -> None:
    builder = make_builder(tokenizer)
    turns = run_script(builder, "")
    alone = len(builder.render("", [], "Count to five."))
    tight = make_builder(tokenizer, max_model_len=alone + 9)
    for truncate in (None, Truncate.OLDEST, Truncate.KEEP_PINNED):
        with pytest.raises(PromptTooLong) as info:
            tight.build_prompt("", turns, "Count to five.", max_tokens=10, truncate=truncate)
        assert str(info.value) == (
            f"system prompt + new message ({alone} tokens) + max_tokens (10) exceeds max_model_len ({alone + 9}) "
            "by 1 tokens: send a shorter message (or document), lower this chat's max_tokens in its settings, or "
            "start the server with a larger --max-model-len (up to the model's own limit)"
        )
        whole = len(builder.render("", turns, "Count to five."))
        assert (info.value.report.prompt_tokens, info.value.report.fits, info.value.report.options) == (
            whole,
            False,
            (),
        )
    plan = tight.build_prompt("", turns, "Count to five.", max_tokens=9)
    assert (plan.truncated_turns, len(plan.token_ids)) == (2, alone)


def test_truncation_steps_past_a_cut_where_only_the_plain_render_fits(tokenizer: Any) -> None:
    builder = make_builder(tokenizer)
    spelled = [i for ch in "hello world" for i in tokenizer.encode(ch, add_special_tokens=False)]
    script = [
        ("Hi", "Hello", None),
        ("Say hello world.", "hello world", spelled),
        ("Thanks", "You are welcome", None),
    ]
    turns: list[Turn] = []
    for question, answer, ids in script:
        plan = builder.build_prompt("", turns, question, max_tokens=8)
        ids = ids or answer_ids(tokenizer, answer, "eos")
        turns += [Turn("user", question, plan.new_user_token_ids), Turn("assistant", answer, ids)]
    question = "Now please count from one to five, then tell me a joke about cats and the lazy dog. " * 2
    exact_from_2nd = len(builder.build_prompt("", turns[2:], question, max_tokens=8).token_ids)
    budget = len(builder.render("", turns[2:], question))  # the plain render from exchange 2 on fits exactly
    stored = sum(len(t.token_ids or ()) for t in turns)
    # the preconditions that send the search through the plain-render fit at cut 1 and on to cut 2
    assert stored <= budget < len(builder.render("", turns, question)) and exact_from_2nd > budget
    plan = make_builder(tokenizer, max_model_len=budget + 8).build_prompt("", turns, question, max_tokens=8)
    assert (plan.truncated_turns, plan.exact_extension) == (2, True)
    assert plan.token_ids == builder.render("", turns[4:], question)


def _pinned_history(tokenizer: Any) -> tuple[list[Turn], str]:
    """Three exchanges, the first pinned (it carries an attachment), and a new message."""
    builder = make_builder(tokenizer)
    turns: list[Turn] = []
    script = [
        ("Here is my document: " + "apples and pears " * 12, True),
        ("What is the capital of France?", False),
        ("And of Spain?", False),
    ]
    for question, pinned in script:
        plan = builder.build_prompt("", turns, question, max_tokens=8)
        turns += [
            Turn("user", question, plan.new_user_token_ids, pinned=pinned),
            Turn("assistant", "Paris, I think.", answer_ids(tokenizer, "Paris, I think.", "eos")),
        ]
    return turns, "Summarise the document."


def test_without_a_choice_a_history_that_must_be_cut_is_refused_with_the_choices(tokenizer: Any) -> None:
    turns, question = _pinned_history(tokenizer)
    renderer = make_builder(tokenizer)
    whole = len(renderer.render("", turns, question))
    without_first = len(renderer.render("", turns[2:], question))
    builder = make_builder(
        tokenizer, max_model_len=whole + 8 - 1
    )  # one token short of the whole conversation
    with pytest.raises(ContextFull) as info:
        builder.build_prompt("", turns, question, max_tokens=8, truncate=None)
    report = info.value.report
    assert (report.prompt_tokens, report.fits, report.truncated_turns, report.pinned_turns_dropped) == (
        whole,
        False,
        1,
        1,
    )
    assert report.options == ("oldest", "keep_pinned", "summary")
    assert report.advice.startswith("the conversation no longer fits the context: 1 earlier exchange must be")
    assert builder.context_report("", turns, question, max_tokens=8) == report
    # oldest: the pinned exchange goes; keep_pinned: it stays and the oldest unpinned one goes
    oldest = builder.build_prompt("", turns, question, max_tokens=8, truncate=Truncate.OLDEST)
    assert (oldest.truncated_turns, len(oldest.token_ids)) == (1, without_first)
    assert "apples and pears" not in tokenizer.decode(oldest.token_ids)
    kept = builder.build_prompt("", turns, question, max_tokens=8, truncate=Truncate.KEEP_PINNED)
    assert kept.truncated_turns == 1
    assert kept.token_ids == renderer.render("", [*turns[:2], *turns[4:]], question)
    assert "apples and pears" in tokenizer.decode(kept.token_ids)
    assert "capital of France" not in tokenizer.decode(kept.token_ids)
    # room for everything: sent whole, nothing to choose
    roomy = make_builder(tokenizer, max_model_len=whole + 8)
    assert roomy.build_prompt("", turns, question, max_tokens=8, truncate=None).truncated_turns == 0
    fits = roomy.context_report("", turns, question, max_tokens=8)
    assert (fits.fits, fits.prompt_tokens, fits.options, fits.advice) == (True, whole, (), None)


def test_keep_pinned_that_cannot_fit_the_attachments_is_refused_and_not_offered(tokenizer: Any) -> None:
    turns, question = _pinned_history(tokenizer)
    renderer = make_builder(tokenizer)
    pinned_only = len(renderer.render("", turns[:2], question))
    builder = make_builder(tokenizer, max_model_len=pinned_only + 8 - 1)
    report = builder.context_report("", turns, question, max_tokens=8)
    assert (report.truncated_turns, report.pinned_turns_dropped, report.options) == (
        1,
        1,
        ("oldest", "summary"),
    )
    with pytest.raises(PromptTooLong) as info:
        builder.build_prompt("", turns, question, max_tokens=8, truncate=Truncate.KEEP_PINNED)
    assert str(info.value).startswith("the exchanges with attachments (1) and the new message")
