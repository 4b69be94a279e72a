"""A byte-level BPE tokenizer ("gpt2" in GGUF) of exactly a model's vocabulary size, as llama.cpp stores one.

Ids 0..255 are the bytes (in GPT-2's printable spelling), then merges: first those a BPE trainer learns from the
English text in this repository (so common words are one or two tokens, as in a real vocabulary), then made-up
merges of letter runs until the vocabulary is full. The special tokens are the model family's: Llama 3's 256
(<|begin_of_text|>, <|eot_id|>, reserved ones) or Qwen2's 22 followed by its [PAD] rows. The chat template is the
family's, shortened (no tools).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from gguf import TokenType

from bench.make_gguf.shapes import ModelShape

ROOT = Path(__file__).resolve().parents[2]
MAX_PIECE_CHARS = 6  # made-up merges join pieces of at most this many characters
LLAMA3_CHAT_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
QWEN2_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA3_SPECIALS = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
] + [f"<|reserved_special_token_{i}|>" for i in range(3, 248)]  # fmt: skip
QWEN2_SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]  # fmt: skip
# the pre-tokenizer split of Llama 3 (and, apart from digits one at a time, Qwen2): merges never cross it
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class Vocab:
    """What goes under tokenizer.* in the file."""

    pre: str  # tokenizer.ggml.pre: which split llama.cpp applies before merging
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_token_id: int
    eos_token_id: int
    padding_token_id: int | None
    add_bos_token: bool
    chat_template: str


def byte_tokens() -> list[str]:
    """The 256 byte tokens in GPT-2's spelling (printable bytes as themselves, the others moved past 255)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    spelling = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in spelling:
            spelling[b] = chr(256 + extra)
            extra += 1
    return [spelling[b] for b in printable] + [spelling[b] for b in range(256) if b not in printable]


def corpus() -> list[str]:
    """English text to learn the first merges from: the repository's documentation and bench data (only the latter
    in an installed package). The merges follow the text, so a file made after the docs changed tokenizes a little
    differently: both engines of a comparison read the same file, which is what matters."""
    files = [
        ROOT / "README.md",
        *sorted((ROOT / "docs").rglob("*.md")),
        *sorted((ROOT / "bench" / "data").glob("*.txt")),
    ]
    return [f.read_text(encoding="utf-8") for f in files if f.is_file()]


def learned_merges(max_merges: int) -> list[tuple[str, str]]:
    """Up to `max_merges` merges a BPE trainer learns from corpus() (deterministic for the same text)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=256 + max_merges,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer)
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    return [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in merges][:max_merges]


def made_up_merges(tokens: list[str], count: int, seed: int) -> list[tuple[str, str]]:
    """`count` more merges: a short word start (letters, maybe after a space) joined to a short run of lower-case
    letters; pieces stay short so that the joined tokens look like word pieces and new ones are easy to find."""
    rng = random.Random(seed)
    known = set(tokens)
    starts = [t for t in tokens if re.fullmatch("Ġ?[A-Za-z]+", t) and len(t) <= MAX_PIECE_CHARS]
    tails = [t for t in tokens if re.fullmatch("[a-z]+", t) and len(t) <= MAX_PIECE_CHARS]
    merges: list[tuple[str, str]] = []
    while len(merges) < count:
        left, right = rng.choice(starts), rng.choice(tails)
        joined = left + right
        if joined in known:
            continue
        known.add(joined)
        merges.append((left, right))
        if len(joined) <= MAX_PIECE_CHARS:
            starts.append(joined)
            if joined.islower() and joined.isalpha():
                tails.append(joined)
    return merges


def make_vocab(shape: ModelShape, seed: int = 0) -> Vocab:
    """The tokenizer of a `shape` model: shape.vocab_size tokens in all."""
    specials = QWEN2_SPECIALS if shape.arch == "qwen2" else LLAMA3_SPECIALS
    num_normal = shape.vocab_size - len(specials) - shape.num_unused_tokens
    if num_normal < 256 + 64:
        raise ValueError(
            f"vocab_size {shape.vocab_size} leaves {num_normal} normal tokens; need at least 320"
        )
    tokens = byte_tokens()
    merges = learned_merges(num_normal - 256)
    tokens += [a + b for a, b in merges]
    extra = made_up_merges(tokens, num_normal - len(tokens), seed)
    tokens += [a + b for a, b in extra]
    merges += extra
    assert len(tokens) == num_normal == len(set(tokens)), (
        "merged tokens must be new and fill the normal range"
    )
    types = [int(TokenType.NORMAL)] * num_normal
    for (
        text
    ) in specials:  # <|...|> is a control token; Qwen2's <tool_call> is user-defined text, as converted
        tokens.append(text)
        types.append(int(TokenType.CONTROL if text.startswith("<|") else TokenType.USER_DEFINED))
    for i in range(len(tokens), shape.vocab_size):
        tokens.append(f"[PAD{i}]")
        types.append(int(TokenType.UNUSED))
    if shape.arch == "qwen2":
        endoftext = tokens.index("<|endoftext|>")
        bos, eos, pad, add_bos, template = (
            endoftext,
            tokens.index("<|im_end|>"),
            endoftext,
            False,
            QWEN2_CHAT_TEMPLATE,
        )
        pre = "qwen2"
    else:
        bos, eos, pad, add_bos, template = (
            num_normal,
            tokens.index("<|eot_id|>"),
            None,
            True,
            LLAMA3_CHAT_TEMPLATE,
        )
        pre = "llama-bpe"
    return Vocab(pre, tokens, types, [f"{a} {b}" for a, b in merges], bos, eos, pad, add_bos, template)
