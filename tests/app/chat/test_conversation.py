"""Token-exact history: prompts extend the previous prompt and answer, fallback, fingerprints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from app.chat.conversation import (
    Turn,
    template_end_of_turn_ids,
    tokenizer_fingerprint,
    turns_from_messages,
)
from tests.app.conversation_factories import (
    REVINDEX_TEMPLATE,
    SCRIPT,
    answer_ids,
    make_builder,
    make_chatml_tokenizer,
    run_script,
)


def test_end_of_turn_ids_of_smollm2(smollm2: Any) -> None:
    assert smollm2.convert_tokens_to_ids("<|im_end|>") == 2
    assert template_end_of_turn_ids(smollm2) == [2, 198]  # "<|im_end|>" "\n"


@pytest.mark.parametrize("system_prompt", ["", "You answer in one sentence."])
def test_five_turns_each_prompt_extends_the_previous_prompt_and_answer(
    tokenizer: Any, system_prompt: str
) -> None:
    builder = make_builder(tokenizer)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    newline = tokenizer.encode("\n", add_special_tokens=False)
    assert builder.end_of_turn_ids == (im_end, *newline)
    turns: list[Turn] = []
    # before the first turn, only the system prompt's rendering (if any) precedes the new user turn
    previous = builder.render(system_prompt, []) if system_prompt else []
    for question, answer, ended in SCRIPT:
        plan = builder.build_prompt(system_prompt, turns, question, max_tokens=64)
        assert (plan.exact_extension, plan.truncated_turns, plan.num_retokenized_turns) == (True, 0, 0)
        assert plan.token_ids[: len(previous)] == previous
        assert plan.token_ids[len(previous) :] == plan.new_user_token_ids
        assert plan.token_ids == builder.render(
            system_prompt, turns, question
        )  # canonical answers: equal ids
        ids = answer_ids(tokenizer, answer, ended)
        # what the next prompt must start with: this prompt, the answer, and the end-of-turn it lacked
        closing = newline if ended == "eos" else [im_end, *newline]
        previous = plan.token_ids + ids + closing
        turns += [Turn("user", question, plan.new_user_token_ids), Turn("assistant", answer, ids)]
    assert len(turns) == 10


def test_length_ended_answer_gets_im_end_and_newline(smollm2: Any) -> None:
    builder = make_builder(smollm2)
    first = builder.build_prompt("", [], "Hi", max_tokens=16)
    cut_answer = smollm2.encode("Hello! How can I", add_special_tokens=False)
    turns = [Turn("user", "Hi", first.new_user_token_ids), Turn("assistant", "Hello! How can I", cut_answer)]
    second = builder.build_prompt("", turns, "Go on", max_tokens=16)
    n = len(first.token_ids) + len(cut_answer)
    assert second.token_ids[:n] == first.token_ids + cut_answer
    assert second.token_ids[n : n + 2] == [2, 198]
    assert (
        smollm2.decode(second.new_user_token_ids)
        == "<|im_start|>user\nGo on<|im_end|>\n<|im_start|>assistant\n"
    )
    assert builder.closing_ids([5, 2]) == [198]
    assert builder.closing_ids([5, 2, 198]) == []
    assert builder.closing_ids([]) == [2, 198]


def test_generated_ids_are_kept_even_when_retokenizing_differs(tokenizer: Any) -> None:
    builder = make_builder(tokenizer)
    first = builder.build_prompt("", [], "Say hello world.", max_tokens=16)
    # the model spelled the answer character by character: same text, other ids than a re-render
    spelled = [i for ch in "hello world" for i in tokenizer.encode(ch, add_special_tokens=False)]
    assert spelled != tokenizer.encode("hello world", add_special_tokens=False)
    turns = [
        Turn("user", "Say hello world.", first.new_user_token_ids),
        Turn("assistant", "hello world", spelled),
    ]
    plan = builder.build_prompt("", turns, "Thanks", max_tokens=16)
    full = builder.render("", turns, "Thanks")
    assert plan.exact_extension is True
    assert plan.token_ids[: len(first.token_ids) + len(spelled)] == first.token_ids + spelled
    assert plan.token_ids != full
    assert tokenizer.decode(plan.token_ids) == tokenizer.decode(full)


def test_template_that_does_not_extend_falls_back_to_a_full_render() -> None:
    tok = make_chatml_tokenizer(REVINDEX_TEMPLATE)
    builder = make_builder(tok)
    turns = run_script(builder, "Be brief.")
    plan = builder.build_prompt("Be brief.", turns, "Count to five.", max_tokens=16)
    assert plan.exact_extension is False
    assert plan.token_ids == builder.render("Be brief.", turns, "Count to five.")
    assert tok.decode(plan.token_ids).startswith("<|im_start|>system 6\nBe brief.")


def test_a_system_prompt_edit_keeps_the_turns_ids_but_stale_user_ids_fall_back(tokenizer: Any) -> None:
    builder = make_builder(tokenizer)
    turns = run_script(builder, "Be brief.")
    plan = builder.build_prompt("Be verbose.", turns, "Count to five.", max_tokens=16)
    assert plan.exact_extension is True  # the head is re-rendered; the turns' ids still line up
    assert plan.token_ids == builder.render("Be verbose.", turns, "Count to five.")
    for stale in (
        [turns[0], turns[1], Turn("user", "Tell me a joke about dogs.", turns[2].token_ids), turns[3]],
        [Turn("user", "What is the capital of Spain?", turns[0].token_ids), *turns[1:]],
        [Turn("user", turns[0].content, None), *turns[1:]],
    ):
        plan = builder.build_prompt("Be brief.", stale, "Next", max_tokens=16)
        assert (plan.exact_extension, plan.num_retokenized_turns) == (False, 0)
        assert plan.token_ids == builder.render("Be brief.", stale, "Next")


def test_answers_whose_ids_do_not_spell_their_text_are_retokenized_alone(tokenizer: Any) -> None:
    builder = make_builder(tokenizer)
    spelled = [i for ch in "hello world" for i in tokenizer.encode(ch, add_special_tokens=False)]
    cut_by_stop = tokenizer.encode(
        "one two three\n\nfour", add_special_tokens=False
    )  # stop="\n\n" cut the text
    script = [
        ("Say hello world.", "hello world", spelled),
        ("Count to five.", "one two three", cut_by_stop),
        ("Tell me a joke.", "Why did the cat", None),  # interrupted by a crash: no ids stored
    ]
    turns: list[Turn] = []
    for question, answer, ids in script:
        plan = builder.build_prompt("", turns, question, max_tokens=8)
        turns += [Turn("user", question, plan.new_user_token_ids), Turn("assistant", answer, ids)]
    plan = builder.build_prompt("", turns, "Thanks", max_tokens=8)
    assert (plan.exact_extension, plan.num_retokenized_turns) == (True, 2)
    assert tokenizer.decode(plan.token_ids) == tokenizer.decode(builder.render("", turns, "Thanks"))
    first_answer_at = len(turns[0].token_ids or ())  # no system prompt: the first user ids start the prompt
    assert plan.token_ids[first_answer_at : first_answer_at + len(spelled)] == spelled  # kept as generated
    assert "four" not in tokenizer.decode(plan.token_ids)


def test_tokenizer_fingerprint_tracks_vocab_and_template(smollm2: Any) -> None:
    fp = tokenizer_fingerprint(smollm2)
    assert len(fp) == 16 and int(fp, 16) >= 0
    assert tokenizer_fingerprint(make_chatml_tokenizer()) == tokenizer_fingerprint(make_chatml_tokenizer())
    assert tokenizer_fingerprint(make_chatml_tokenizer()) != tokenizer_fingerprint(
        make_chatml_tokenizer(REVINDEX_TEMPLATE)
    )
    assert tokenizer_fingerprint(make_chatml_tokenizer()) != fp


def test_turns_from_messages_keeps_user_turns_and_ended_answers() -> None:
    def msg(role: str, status: str, ids: list[int] | None = None) -> SimpleNamespace:
        return SimpleNamespace(role=role, content=f"{role}-{status}", token_ids=ids, status=status)

    messages = [
        msg("system", "complete"),
        msg("user", "complete", [1, 2]),
        msg("assistant", "finished", [3]),
        msg("user", "complete", [4]),
        msg("assistant", "failed", []),
        msg("user", "complete", [6]),
        msg("assistant", "stopped", [5]),
        msg("user", "complete", [7]),
        msg("assistant", "interrupted"),
        msg("user", "complete", [8]),
        msg("assistant", "streaming"),
    ]
    assert turns_from_messages(messages) == [
        Turn("user", "user-complete", (1, 2)),
        Turn("assistant", "assistant-finished", (3,)),
        Turn("user", "user-complete", (4,)),
        Turn("assistant", "assistant-failed", ()),
        Turn("user", "user-complete", (6,)),
        Turn("assistant", "assistant-stopped", (5,)),
        Turn("user", "user-complete", (7,)),
        Turn("assistant", "assistant-interrupted", None),
        Turn("user", "user-complete", (8,)),
    ]
    with pytest.raises(ValueError, match="turn role must be one of"):
        Turn("system", "x")
    # ids recorded under another tokenizer are dropped for the whole history
    mine = SimpleNamespace(
        role="assistant", content="a", token_ids=[3], status="finished", tokenizer_fingerprint="f1"
    )
    theirs = SimpleNamespace(
        role="assistant", content="b", token_ids=[4], status="finished", tokenizer_fingerprint="f0"
    )
    user = msg("user", "complete", [1])
    assert [t.token_ids for t in turns_from_messages([user, mine, user, theirs], "f1")] == [None] * 4
    assert [t.token_ids for t in turns_from_messages([user, mine, user, mine], "f1")] == [
        (1,),
        (3,),
        (1,),
        (3,),
    ]
    assert [t.token_ids for t in turns_from_messages([user, theirs])] == [(1,), (4,)]


def test_a_user_turn_with_files_reads_them_before_its_question_and_is_pinned() -> None:
    files = (SimpleNamespace(filename="a.md", text="# A"), SimpleNamespace(filename="b.csv", text="x,y"))
    asked = SimpleNamespace(
        role="user", content="Compare them.", token_ids=[1], status="complete", attachments=files
    )
    answer = SimpleNamespace(role="assistant", content="ok", token_ids=[2], status="finished", attachments=())
    plain = SimpleNamespace(role="user", content="Thanks.", token_ids=[3], status="complete")
    assert turns_from_messages([asked, answer, plain]) == [
        Turn(
            "user",
            '<document name="a.md">\n# A\n</document>\n\n<document name="b.csv">\nx,y\n</document>\n\nCompare them.',
            (1,),
            pinned=True,
        ),
        Turn("assistant", "ok", (2,)),
        Turn("user", "Thanks.", (3,)),
    ]


def test_failed_and_interrupted_answers_keep_the_prompt_exact(tokenizer: Any) -> None:
    builder = make_builder(tokenizer)
    first = builder.build_prompt("", [], "Hi", max_tokens=8)
    failed = [
        Turn("user", "Hi", first.new_user_token_ids),
        Turn("assistant", "", ()),
    ]  # failed before any token
    second = builder.build_prompt("", failed, "Hello?", max_tokens=8)
    assert second.exact_extension is True
    assert second.token_ids == first.token_ids + builder.closing_ids(()) + second.new_user_token_ids
    # an answer cut off by a crash has its text but no ids: its text's tokenization stands in
    turns = [
        *failed,
        Turn("user", "Hello?", second.new_user_token_ids),
        Turn("assistant", "Hello world", None),
    ]
    third = builder.build_prompt("", turns, "Thanks", max_tokens=8)
    assert third.exact_extension is True
    assert third.token_ids == builder.render("", turns, "Thanks")
    prefix = second.token_ids + tokenizer.encode("Hello world", add_special_tokens=False)
    assert third.token_ids[: len(prefix)] == prefix


def test_app_storage_and_history_import_neither_torch_nor_engine() -> None:
    code = (
        "import sys, app.chat.conversation, app.db; "
        "bad = sorted(m for m in sys.modules if m == 'torch' or m == 'engine' or m.startswith('engine.')); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[3])
