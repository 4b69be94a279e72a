"""A tiny random Llama folder (byte-level BPE tokenizer with a ChatML template) for the benchmark smoke tests."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat.",
    "You are a helpful assistant. Answer the user's questions clearly and briefly.",
    "Explain how a hash table works, then give an example in Python with a dictionary.",
    "Summarise the meeting notes: budget approved, launch moved to March, hiring two engineers.",
    "What is the capital of France? Paris is the capital and the largest city of France.",
]


def make_tiny_tokenizer():
    """A byte-level BPE tokenizer (~400 tokens) trained on a few sentences, with a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_TRAINING_TEXT * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def make_tiny_model_folder(path: Path, *, seed: int = 0, max_position_embeddings: int = 4096) -> Path:
    """Write a 2-layer random Llama with a trained byte-level BPE tokenizer into `path`; returns `path`."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tiny_tokenizer()
    tokenizer.save_pretrained(str(path))
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # larger weights than the default init, so greedy outputs vary between prompts
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    model.save_pretrained(str(path))
    GenerationConfig(eos_token_id=eos_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(str(path))
    return path


@functools.cache
def shared_tiny_model() -> str:
    """One tiny model folder per test process, shared by the benchmark test modules (removed at exit)."""
    folder = tempfile.TemporaryDirectory(prefix="pagedchat-tiny-")
    _KEEP_ALIVE.append(folder)
    return str(make_tiny_model_folder(Path(folder.name) / "model"))


_KEEP_ALIVE: list[tempfile.TemporaryDirectory] = []
