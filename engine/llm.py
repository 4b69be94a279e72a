"""LLM: offline batch generation over an LLMEngine, for scripts and notebooks."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from engine.core.config import EngineConfig
from engine.core.outputs import RequestOutput
from engine.core.sampling_defaults import BUILTIN
from engine.core.sequence import SamplingParams
from engine.llm_engine import LLMEngine


class LLM:
    """Offline batch generation: `LLM(model=..., **config_overrides).generate(prompts, params)`."""

    def __init__(self, model: str | None = None, **overrides) -> None:
        if model is not None:
            overrides["model"] = model
        self.engine = LLMEngine(EngineConfig(**overrides))
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Iterable[str | list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion in one continuous batch; outputs in prompt order."""
        prompts = list(prompts)
        if params is None:  # the model's generation config, else built-in values, as the server and CLI use
            params = SamplingParams(**self.engine.sampling_defaults.over(BUILTIN).given())
        per_prompt = params if isinstance(params, list) else [params] * len(prompts)
        if len(per_prompt) != len(prompts):
            raise ValueError(f"got {len(per_prompt)} sampling params for {len(prompts)} prompts")
        order = []
        for prompt, p in zip(prompts, per_prompt):
            rid = f"llm-{next(self._ids)}"
            self.engine.add_request(rid, prompt, p)
            order.append(rid)
        done: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished_requests():
            for output in self.engine.step():
                if output.finished:
                    done[output.request_id] = output
        return [done[rid] for rid in order]

    def chat(
        self,
        conversations: list[list[dict]],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Apply the chat template to each conversation and generate replies."""
        prompts = [self.engine.apply_chat_template(messages) for messages in conversations]
        return self.generate(prompts, params)
