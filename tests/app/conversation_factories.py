"""Tokenizers and scripted conversations for the history tests: a tiny ChatML tokenizer, SmolLM2's when present."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.chat.conversation import (
    ConversationBuilder,
    Turn,
    template_end_of_turn_ids,
)

SMOLLM2_PATH = Path.home() / ".cache" / "pagedchat" / "models" / "smollm2-135m-instruct"
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Numbers every message from the end, so adding a turn re-renders all the earlier ones differently.
REVINDEX_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + ' ' + loop.revindex|string + '\\n' + m['content'] }}"
    "{{ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CORPUS = [
    "hello world, how are you today? I am fine, thank you. What is the capital of France? Paris is.",
    "user assistant system Tell me a joke about cats. Why did the cat sit on the computer?",
    "The quick brown fox jumps over the lazy dog. Count to five: one two three four five.",
]
SCRIPT = [  # (question, answer, how the answer ended)
    ("What is the capital of France?", "Paris is the capital of France.", "eos"),
    (
        "Tell me a joke about cats.",
        "Why did the cat sit on the computer? To keep an eye on the mouse",
        "length",
    ),
    ("Count to five.", "one two three four five", "eos"),
    ("Say hello world.", "hello world", "stop_button"),
    ("How are you today?", "I am fine, thank you.", "eos"),
]


def make_chatml_tokenizer(template: str = CHATML) -> Any:
    """A small byte-level BPE tokenizer with ChatML special tokens (no download needed)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")
    hf.chat_template = template
    return hf


def make_builder(tok: Any, max_model_len: int = 2048) -> ConversationBuilder:
    return ConversationBuilder(tok, max_model_len, template_end_of_turn_ids(tok))


def answer_ids(tok: Any, text: str, ended: str) -> list[int]:
    """Ids as the engine reports them: an answer ended by EOS carries the EOS id."""
    ids = tok.encode(text, add_special_tokens=False)
    return ids + [tok.convert_tokens_to_ids("<|im_end|>")] if ended == "eos" else ids


def run_script(builder: ConversationBuilder, system_prompt: str, max_tokens: int = 64) -> list[Turn]:
    turns: list[Turn] = []
    for question, answer, ended in SCRIPT[:2]:
        plan = builder.build_prompt(system_prompt, turns, question, max_tokens)
        ids = answer_ids(builder.tokenizer, answer, ended)
        turns += [Turn("user", question, plan.new_user_token_ids), Turn("assistant", answer, ids)]
    return turns
