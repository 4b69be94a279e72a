"""Token-exact history that no longer fits: the oldest exchanges go first, the system prompt stays."""

from __future__ import annotations

from typing import Any

import pytest

from app.chat.conversation import (
    Turn,
)
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
    with pytest.raises(ValueError) as info:
        tight.build_prompt("", turns, "Count to five.", max_tokens=10)
    assert str(info.value) == (
        f"system prompt + new message ({alone} tokens) + max_tokens (10) exceeds max_model_len ({alone + 9})"
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
