"""Public prefixes: which leading prompt tokens only the template and the operator wrote (SmolLM2's tokenizer)."""

from __future__ import annotations

import dataclasses

import pytest

from app.http.public_prefix import PublicPrefixes, published_prompts
from app.settings import Settings
from tests.app.factories import make_tiny_model_dir

PUBLISHED = "You answer questions about the city library's opening hours and loans."
TEMPLATE_DEFAULT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(make_tiny_model_dir()))


def render(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_published_system_prompt_and_the_user_header_are_public(tokenizer):
    prefixes = PublicPrefixes(tokenizer, [PUBLISHED])
    messages = [{"role": "system", "content": PUBLISHED}, {"role": "user", "content": "When do you open?"}]
    prompt = render(tokenizer, messages)
    head = ids(tokenizer, f"<|im_start|>system\n{PUBLISHED}<|im_end|>\n<|im_start|>user\n")
    assert prompt[: len(head)] == head
    assert prefixes.length(messages, prompt) == len(head)
    assert prefixes.session_length(PUBLISHED, prompt) == len(head)
    # exact match only: another system prompt, even one character off, is the caller's own text
    other = [{"role": "system", "content": PUBLISHED + " "}, messages[1]]
    assert prefixes.length(other, render(tokenizer, other)) == 0
    assert PublicPrefixes(tokenizer, []).length(messages, prompt) == 0


def test_the_templates_own_default_system_message_is_public(tokenizer):
    prefixes = PublicPrefixes(tokenizer, [])
    messages = [{"role": "user", "content": "When do you open?"}]
    head = ids(tokenizer, f"<|im_start|>system\n{TEMPLATE_DEFAULT}<|im_end|>\n<|im_start|>user\n")
    assert prefixes.length(messages, render(tokenizer, messages)) == len(head) > 16
    assert prefixes.session_length("", render(tokenizer, messages)) == len(head)


def test_the_public_prefix_never_covers_a_token_of_the_callers_text(tokenizer):
    prefixes = PublicPrefixes(tokenizer, [PUBLISHED])
    head = ids(tokenizer, f"<|im_start|>system\n{PUBLISHED}<|im_end|>\n<|im_start|>user\n")
    for content in ["\n\nHi", "\nHi", " Hi", "Hi"]:
        messages = [{"role": "system", "content": PUBLISHED}, {"role": "user", "content": content}]
        prompt = render(tokenizer, messages)
        n = prefixes.length(messages, prompt)
        assert prompt[:n] == head[:n] and len(head) - 1 <= n <= len(head), content
        # the public tokens spell only text before the caller's
        assert tokenizer.decode(prompt[:n]) == tokenizer.decode(head)[: len(tokenizer.decode(prompt[:n]))]
    # ids that are not the rendering (a caller's token list) share nothing they do not start with
    assert prefixes.length([{"role": "system", "content": PUBLISHED}], [5, 6, 7]) == 0


def test_published_prompts_come_from_the_default_and_the_files(tmp_path):
    (tmp_path / "a.txt").write_text("First prompt.\n")
    (tmp_path / "b.txt").write_text("Second\nprompt, with a comma.")
    settings = Settings(
        default_system_prompt="Default.",
        shared_prompt_files=(str(tmp_path / "a.txt"), str(tmp_path / "b.txt")),
    )
    assert published_prompts(settings) == ("Default.", "First prompt.", "Second\nprompt, with a comma.")
    assert published_prompts(Settings()) == ()
    missing = dataclasses.replace(settings, shared_prompt_files=(str(tmp_path / "none.txt"),))
    with pytest.raises(ValueError, match="none.txt"):
        published_prompts(missing)


def test_isolation_is_the_default():
    assert Settings().prefix_cache_isolation is True
    assert Settings(api_keys=("k",)).prefix_cache_isolation is True
