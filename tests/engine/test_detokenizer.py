"""IncrementalDetokenizer on real byte-level BPE and SentencePiece-style tokenizers built in-process."""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from engine.detokenizer import IncrementalDetokenizer, ids_decoder

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "Paged attention keeps the KV cache in fixed-size blocks, like virtual memory.",
    "Emoji 😀 and 🎉 appear here; café, naïve, 你好，世界。",
]
MIXED_TEXT = "Hello 😀 world! 你好，世界 🦀 龍 👍🏽 👨‍👩‍👧 café — naïve ∑ done."
SMOLLM2_DIR = Path.home() / ".cache" / "pagedchat" / "models" / "smollm2-135m-instruct"


@functools.cache
def make_byte_bpe_tokenizer() -> PreTrainedTokenizerFast:
    """GPT-2 style byte-level BPE (like SmolLM2's) with few merges, so multi-byte characters span tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=330,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
        clean_up_tokenization_spaces=False,
    )


@functools.cache
def make_sentencepiece_tokenizer() -> PreTrainedTokenizerFast:
    """Llama-style: "▁" marks a leading space, the decoder strips the first one, unknown characters fall back
    to <0xNN> byte tokens."""
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trained.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=150, show_progress=False))
    model = json.loads(trained.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for piece in model["vocab"]:
        vocab.setdefault(piece, len(vocab))
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    decoder_steps = [
        decoders.Replace("▁", " "),
        decoders.ByteFallback(),
        decoders.Fuse(),
        decoders.Strip(" ", 1, 0),
    ]
    tok.decoder = decoders.Sequence(decoder_steps)
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


def encode(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def stream(detok: IncrementalDetokenizer, chunks: list[list[int]]) -> list[str]:
    """Feed the chunks, then finish unless a stop string ended the stream; the list of deltas."""
    deltas = []
    for chunk in chunks:
        step = detok.step(chunk)
        deltas.append(step.text_delta)
        if step.stop_string is not None:
            return deltas
    deltas.append(detok.finish())
    return deltas


def one_by_one(ids: list[int]) -> list[list[int]]:
    return [[i] for i in ids]


def test_byte_bpe_splits_characters_across_tokens() -> None:
    tok = make_byte_bpe_tokenizer()
    ids = encode(tok, MIXED_TEXT)
    assert any("\ufffd" in tok.decode([i]) for i in ids)  # the cases below really see split characters


@pytest.mark.parametrize("chunking", ["one", "random"])
def test_emoji_and_cjk_never_emit_replacement_chars(chunking: str) -> None:
    tok = make_byte_bpe_tokenizer()
    prompt = encode(tok, "<|im_start|>user\nSay hi 🙂<|im_end|>\n<|im_start|>assistant\n")
    ids = encode(tok, MIXED_TEXT) + encode(tok, "<|im_end|>")
    if chunking == "one":
        chunks = one_by_one(ids)
    else:
        rng, chunks, i = random.Random(0), [], 0
        while i < len(ids):
            n = rng.randint(1, 4)
            chunks.append(ids[i : i + n])
            i += n
    detok = IncrementalDetokenizer(tok, prompt, stop=())
    deltas = stream(detok, chunks)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == detok.text == tok.decode(ids, skip_special_tokens=True) == MIXED_TEXT


def test_sentencepiece_leading_spaces_and_byte_fallback() -> None:
    tok = make_sentencepiece_tokenizer()
    full = encode(tok, "Hello world 日本 😀 龍 the fox")
    split = next(k for k, t in enumerate(tok.convert_ids_to_tokens(full)) if t.startswith("▁w"))
    prompt, ids = full[:split], full[split:]  # the output starts with a "▁w..." token
    assert tok.decode(ids[:1]) == tok.decode(ids[:1]).lstrip()  # decoded alone, its leading space is stripped
    assert any(t.startswith("<0x") for t in tok.convert_ids_to_tokens(ids))
    detok = IncrementalDetokenizer(tok, prompt, stop=())
    deltas = stream(detok, one_by_one(ids))
    assert deltas[0].startswith(" w")
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == detok.text == " world 日本 😀 龍 the fox"


def test_stop_string_spanning_tokens_is_truncated_and_never_emitted() -> None:
    tok = make_byte_bpe_tokenizer()
    pieces = ["Hello", " wor", "ld", "!", " The", " quick"]
    detok = IncrementalDetokenizer(tok, [], stop=("d! The",))
    steps = [detok.step(encode(tok, p)) for p in pieces[:5]]
    assert [s.text_delta for s in steps] == ["Hello", " wor", "l", "", ""]
    assert [s.stop_string for s in steps] == [None, None, None, None, "d! The"]
    assert detok.text == "Hello worl" and detok.stop_string == "d! The"
    assert detok.finish() == ""
    with pytest.raises(RuntimeError, match="after a stop string"):
        detok.step(encode(tok, " quick"))


def test_held_back_text_released_when_it_is_not_a_stop() -> None:
    tok = make_byte_bpe_tokenizer()
    detok = IncrementalDetokenizer(tok, [], stop=("world peace", "!!"))
    deltas = [detok.step(encode(tok, p)).text_delta for p in ["Hello", " wor", "ld", "!", " The"]]
    assert deltas == ["Hello", " ", "", "world", "! The"]  # "wor", "world", "!" could each start a stop
    assert detok.step(encode(tok, " wor")).text_delta == " "  # "wor" could start "world peace"
    assert detok.finish() == "wor"  # the stream ended: release the held-back tail
    assert detok.text == "Hello world! The wor" and detok.stop_string is None


def test_stop_string_at_the_very_start() -> None:
    tok = make_byte_bpe_tokenizer()
    detok = IncrementalDetokenizer(tok, encode(tok, "Say hello"), stop=("Hello",))
    deltas = stream(detok, one_by_one(encode(tok, "Hello world")))
    assert "".join(deltas) == "" and detok.text == "" and detok.stop_string == "Hello"


@pytest.mark.parametrize(
    "stop", [("fox", "quick"), ("quick", "fox"), ("brown fox", "own"), ("own", "brown fox")]
)
def test_several_stop_strings_the_first_to_complete_wins(stop: tuple[str, str]) -> None:
    tok = make_byte_bpe_tokenizer()
    ids = encode(tok, "The quick brown fox jumps")
    expected = {"fox": "The ", "quick": "The ", "own": "The quick br", "brown fox": "The quick br"}[stop[0]]
    for chunks in (one_by_one(ids), [ids]):
        detok = IncrementalDetokenizer(tok, [], stop=stop)
        assert "".join(stream(detok, chunks)) == detok.text == expected
        assert detok.stop_string == ("quick" if "quick" in stop else "own")


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens_skipped(skip: bool) -> None:
    tok = make_byte_bpe_tokenizer()
    ids = encode(tok, "Hi<|im_end|> there<|endoftext|>")
    assert tok.convert_tokens_to_ids("<|im_end|>") in ids
    detok = IncrementalDetokenizer(tok, [], stop=(), skip_special_tokens=skip)
    text = "".join(stream(detok, one_by_one(ids)))
    assert text == ("Hi there" if skip else "Hi<|im_end|> there<|endoftext|>")


def test_prompt_ending_inside_a_character() -> None:
    tok = make_byte_bpe_tokenizer()
    ids = encode(tok, "Look: 🦀 crab")
    split = next(k for k in range(1, len(ids)) if tok.decode(ids[:k]).endswith("\ufffd"))
    detok = IncrementalDetokenizer(tok, ids[:split], stop=())
    assert "".join(stream(detok, one_by_one(ids[split:]))) == "🦀 crab"


def test_decode_window_stays_small() -> None:
    tok = make_byte_bpe_tokenizer()
    decoded_lengths: list[int] = []

    class CountingTokenizer:
        def decode(self, ids: list[int], **kwargs) -> str:
            decoded_lengths.append(len(ids))
            return tok.decode(ids, **kwargs)

    ids = encode(tok, MIXED_TEXT * 20)
    detok = IncrementalDetokenizer(CountingTokenizer(), encode(tok, "prompt " * 50), stop=("never",))
    assert "".join(stream(detok, one_by_one(ids))) == MIXED_TEXT * 20
    assert max(decoded_lengths) <= 12  # the longest split character plus its context, not the whole output


@pytest.mark.skipif(not (SMOLLM2_DIR / "tokenizer.json").exists(), reason="SmolLM2 tokenizer not provisioned")
def test_smollm2_tokenizer_streams_exact_text() -> None:
    tok = PreTrainedTokenizerFast.from_pretrained(SMOLLM2_DIR)
    prompt = encode(tok, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    ids = encode(tok, MIXED_TEXT + " 🧑‍🚀 日本語のテキスト") + [tok.eos_token_id]
    detok = IncrementalDetokenizer(tok, prompt, stop=("テキスト",))
    deltas = stream(detok, one_by_one(ids))
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == detok.text == MIXED_TEXT + " 🧑‍🚀 日本語の"


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("make", [make_byte_bpe_tokenizer, make_sentencepiece_tokenizer])
def test_the_direct_decoder_is_the_tokenizers_decode(make, skip) -> None:
    """The serving path decodes through the Rust tokenizer directly: the very text transformers' decode gives
    (without clean-up), special tokens, split characters and all; a tokenizer with its own _decode keeps it."""
    tok = make()
    ids = encode(tok, MIXED_TEXT + "<|im_end|> 🦀 x<|endoftext|>")
    rng = random.Random(3)
    windows = [ids[i : i + rng.randint(0, 9)] for i in range(len(ids))] + [ids, []]
    direct = ids_decoder(tok, skip)
    assert direct.func == tok.backend_tokenizer.decode  # the fast path is the one taken
    for window in windows:
        assert direct(window) == tok.decode(
            window, skip_special_tokens=skip, clean_up_tokenization_spaces=False
        )

    class OwnDecode(type(tok)):
        def _decode(self, token_ids, **kwargs) -> str:
            return "own"

    own = OwnDecode(tokenizer_object=tok.backend_tokenizer)
    assert ids_decoder(own, skip)(ids) == "own"

    class OwnPublicDecode(type(tok)):
        def decode(self, token_ids, **kwargs) -> str:
            return "own public"

    assert ids_decoder(OwnPublicDecode(tokenizer_object=tok.backend_tokenizer), skip)(ids) == "own public"
