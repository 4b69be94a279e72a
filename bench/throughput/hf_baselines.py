"""HF transformers baselines on the same weights: one at a time, one static padded batch, its continuous batching."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from app.chat.conversation import common_prefix_len


@dataclass
class GenerationRun:
    """What one system produced for the whole request list, and how long it took."""

    name: str
    token_ids: list[list[int]]  # per request, up to and including its EOS, at most its max_tokens
    elapsed_s: float

    @property
    def num_output_tokens(self) -> int:
        return sum(len(t) for t in self.token_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.num_output_tokens / self.elapsed_s if self.elapsed_s > 0 else float("nan")


def load_hf_model(path: Path, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.nn.Module:
    """`AutoModelForCausalLM.from_pretrained(path, dtype=dtype)` on `device`, in eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model.to(device).eval()


def trim_output(tokens: Sequence[int], eos_ids: frozenset[int], max_tokens: int) -> list[int]:
    """The tokens a request keeps: up to and including the first EOS, at most max_tokens (the engine's rule)."""
    out: list[int] = []
    for tok in tokens[:max_tokens]:
        out.append(int(tok))
        if tok in eos_ids:
            break
    return out


class PerRowMaxTokens(StoppingCriteria):
    """A stopping criterion that finishes row i once it has max_tokens[i] new tokens (so rows stop like requests)."""

    def __init__(self, prompt_width: int, max_tokens: Sequence[int], device: torch.device) -> None:
        self.prompt_width = prompt_width
        self.max_tokens = torch.tensor(list(max_tokens), device=device)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        return (input_ids.shape[1] - self.prompt_width) >= self.max_tokens


def _generate_kwargs(eos_ids: frozenset[int], pad_id: int) -> dict:
    return {
        "do_sample": False,
        "eos_token_id": sorted(eos_ids),
        "pad_token_id": pad_id,
        "top_p": None,
        "top_k": None,
    }


@torch.inference_mode()
def hf_sequential(
    model: torch.nn.Module,
    prompts: list[list[int]],
    max_tokens: list[int],
    eos_ids: frozenset[int],
    pad_id: int,
    on_done: Callable[[], None] | None = None,
) -> GenerationRun:
    """`model.generate` one request at a time, each with its own max_new_tokens."""
    outputs, start = [], time.perf_counter()
    for ids, limit in zip(prompts, max_tokens, strict=True):
        x = torch.tensor([ids], device=model.device)
        out = model.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=limit, **_generate_kwargs(eos_ids, pad_id)
        )
        outputs.append(trim_output(out[0, len(ids) :].tolist(), eos_ids, limit))
        if on_done is not None:
            on_done()
    return GenerationRun("hf_sequential", outputs, time.perf_counter() - start)


@torch.inference_mode()
def hf_static_batch(
    model: torch.nn.Module,
    prompts: list[list[int]],
    max_tokens: list[int],
    eos_ids: frozenset[int],
    pad_id: int,
) -> GenerationRun:
    """All requests in one `model.generate` batch: left padding, attention mask, per-row max_tokens and EOS."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(
        prompts
    ):  # left padding: the pad id may equal a real token, so the mask is what counts
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    ids, mask = ids.to(model.device), mask.to(model.device)
    criterion = PerRowMaxTokens(width, max_tokens, model.device)
    start = time.perf_counter()
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=max(max_tokens),
        stopping_criteria=StoppingCriteriaList([criterion]),
        **_generate_kwargs(eos_ids, pad_id),
    )
    elapsed = time.perf_counter() - start
    outputs = [trim_output(out[i, width:].tolist(), eos_ids, limit) for i, limit in enumerate(max_tokens)]
    return GenerationRun("hf_static", outputs, elapsed)


@torch.inference_mode()
def hf_continuous(
    model: torch.nn.Module,
    prompts: list[list[int]],
    max_tokens: list[int],
    eos_ids: frozenset[int],
    pad_id: int,
    *,
    page_size: int = 32,
    max_batch_tokens: int = 512,
    on_done: Callable[[], None] | None = None,
) -> GenerationRun:
    """transformers' continuous batching (the manager behind `generate_batch`), with per-request max_new_tokens."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    # generate_batch takes a single max_new_tokens; its manager's add_request takes one per request, so use that
    num_pages = sum(-(-(len(p) + m) // page_size) for p, m in zip(prompts, max_tokens, strict=True)) + 8
    cb_config = ContinuousBatchingConfig(
        page_size=page_size, num_blocks=num_pages, max_batch_tokens=max_batch_tokens
    )
    gen_config = GenerationConfig(max_new_tokens=max(max_tokens), **_generate_kwargs(eos_ids, pad_id))
    eos = sorted(eos_ids)
    results = {}
    start = time.perf_counter()
    with model.continuous_batching_context_manager(
        generation_config=gen_config,
        continuous_batching_config=cb_config,
        warmup=False,
        block=True,
        timeout=10,
    ) as manager:
        for i, (p, limit) in enumerate(zip(prompts, max_tokens, strict=True)):
            manager.add_request(list(p), request_id=f"r{i}", max_new_tokens=limit, eos_token_id=eos)
        while len(results) < len(prompts):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                if result.error is not None:
                    raise RuntimeError(
                        f"transformers continuous batching failed {result.request_id}: {result.error}"
                    )
                results[result.request_id] = result
                if on_done is not None:
                    on_done()
            elif result is None and not manager.is_running():
                raise RuntimeError("transformers' continuous batching thread stopped before finishing")
        elapsed = time.perf_counter() - start
    outputs = [trim_output(results[f"r{i}"].generated_tokens, eos_ids, m) for i, m in enumerate(max_tokens)]
    return GenerationRun("hf_continuous", outputs, elapsed)


def agreement(ours: list[list[int]], theirs: list[list[int]]) -> dict[str, float]:
    """Identical outputs and the mean shared prefix (a sanity check of equal EOS / max_tokens handling)."""
    identical = sum(a == b for a, b in zip(ours, theirs, strict=True))
    shared = [
        common_prefix_len(a, b) / max(1, min(len(a), len(b))) for a, b in zip(ours, theirs, strict=True)
    ]
    return {"identical_outputs": identical, "mean_shared_prefix_fraction": sum(shared) / max(1, len(shared))}
