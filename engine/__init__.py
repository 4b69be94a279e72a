"""pagedchat's synchronous serving engine: paged KV cache, prefix caching, continuous batching."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.core.config import EngineConfig
from engine.core.sequence import FinishReason, SamplingParams

if TYPE_CHECKING:
    from engine.llm import LLM
    from engine.llm_engine import LLMEngine

__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "FinishReason"]


def __getattr__(name: str):
    # torch and transformers load only when the engine itself is asked for
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    if name == "LLMEngine":
        from engine.llm_engine import LLMEngine

        return LLMEngine
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
