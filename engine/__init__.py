"""pagedchat's synchronous serving engine: paged KV cache, prefix caching, continuous batching."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.config import EngineConfig
from engine.sequence import FinishReason, SamplingParams

if TYPE_CHECKING:
    from engine.llm_engine import LLM, LLMEngine

__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "FinishReason"]


def __getattr__(name: str):
    # torch and transformers load only when the engine itself is asked for
    if name in ("LLM", "LLMEngine"):
        from engine import llm_engine

        return getattr(llm_engine, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
