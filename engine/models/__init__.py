"""Model definitions: the Llama family (Llama 2/3, SmolLM2, Mistral, Qwen2) in one file."""

from __future__ import annotations

from engine.models.llama import LlamaForCausalLM, ModelArgs

__all__ = ["LlamaForCausalLM", "ModelArgs"]
