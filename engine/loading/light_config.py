"""A model folder's config.json read without transformers' model-specific config classes, where that is the same.

Importing any of transformers' model config classes (LlamaConfig, ...) imports its hub-kernel, flash-attention and
weight-conversion integrations, which import torch._dynamo and torch.distributed: ~3.5 s of CPU in every process
that loads a model (a server start, a CLI chat), for attributes we only read. A Llama config.json that names every
value whose default differs between LlamaConfig and transformers' base PretrainedConfig (or that
ModelArgs.from_hf_config has no fallback for) reads the same through the base class; any other config (another
model type, a value left to its class default, rope scaling that LlamaConfig normalizes) takes AutoConfig.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# the values whose LlamaConfig default is not what the base class (or ModelArgs.from_hf_config's fallback) gives:
# max_position_embeddings 2048, rms_norm_eps 1e-6, tie_word_embeddings False (the base class: True), and the shape
LIGHT_LLAMA_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
)


def light_llama_config(values: dict[str, Any]) -> Any | None:
    """`values` as a transformers PretrainedConfig when they are a complete Llama config (see the module
    docstring), else None (the caller takes transformers' own class)."""
    if values.get("model_type") != "llama" or any(values.get(key) is None for key in LIGHT_LLAMA_KEYS):
        return None
    if values.get("rope_scaling"):  # LlamaConfig moves it into rope_parameters and checks it
        return None
    from transformers import PretrainedConfig

    return PretrainedConfig.from_dict(dict(values))


def light_folder_config(folder: Path) -> Any | None:
    """light_llama_config of the folder's config.json (None where it has none or it is not light)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return None
    return light_llama_config(json.loads(path.read_text()))


def names_its_tokenizer(folder: Path) -> bool:
    """Whether the folder's tokenizer_config.json names its tokenizer class: then AutoTokenizer needs no model
    config to choose one."""
    path = Path(folder) / "tokenizer_config.json"
    return path.is_file() and bool(json.loads(path.read_text()).get("tokenizer_class"))
