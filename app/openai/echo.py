"""A completion's prompt scoring: `echo` (the prompt before the output, `max_tokens: 0` for the prompt alone), the
prompt tokens' logprobs in the legacy `logprobs` block, and vLLM's `prompt_logprobs` list. Evaluation tools score a
text this way (lm-evaluation-harness's `local-completions`: echo, logprobs 1, max_tokens 1, temperature 0)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from app.http.errors import bad_request
from app.http.sampling import get_bool, get_int
from app.openai.format import completion_logprobs, token_ids_of
from engine.core.outputs import Logprob
from engine.core.sequence import MAX_TOP_LOGPROBS


@dataclass(frozen=True)
class PromptScoring:
    """What a completion asks of its prompt. `echo_only`: max_tokens 0 with echo, so the engine makes one token that
    no one sees (the prompt's last position must run for its logits to exist; OpenAI and vLLM answer the same)."""

    echo: bool
    echo_only: bool
    logprobs: int | None  # the legacy block's top-N (prompt entries too when echo)
    prompt_logprobs: int | None  # vLLM's field

    @property
    def engine_prompt_logprobs(self) -> int | None:
        """The top-N the engine scores the prompt with: enough for both blocks, None when neither wants it."""
        wanted = [n for n in (self.logprobs if self.echo else None, self.prompt_logprobs) if n is not None]
        return max(wanted) if wanted else None


def read_scoring(body: dict[str, Any]) -> tuple[PromptScoring, int]:
    """The completion's prompt scoring and the max_tokens to give the engine (16 when absent); 400 naming the field
    for a value out of range."""
    echo = get_bool(body, "echo", False)
    requested = get_int(body, "max_tokens", 16)
    assert requested is not None
    if requested == 0 and not echo:
        raise bad_request(
            "max_tokens must be a positive integer (0 is allowed only with echo: the prompt alone), got 0",
            "max_tokens",
        )
    prompt_logprobs = get_int(body, "prompt_logprobs", None)
    if prompt_logprobs is not None and not 0 <= prompt_logprobs <= MAX_TOP_LOGPROBS:
        raise bad_request(
            f"prompt_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {prompt_logprobs}",
            "prompt_logprobs",
        )
    logprobs = get_int(body, "logprobs", None)
    scoring = PromptScoring(echo, echo and requested == 0, logprobs, prompt_logprobs)
    return scoring, 1 if scoring.echo_only else requested


def echo_text(body: dict[str, Any]) -> str | None:
    """The prompt as the client wrote it when it is text (a batch of one included); None for token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else None


def scored_prompt_ids(prompt_ids: list[int], scores: list[Logprob | None] | None) -> set[int]:
    """Every token id the prompt's logprob blocks need text for."""
    return set(prompt_ids) | token_ids_of([lp for lp in scores or () if lp is not None])


def prompt_block(
    prompt_ids: list[int], scores: list[Logprob | None] | None, text_of: dict[int, str], num_top: int
) -> dict[str, Any]:
    """The prompt's part of a legacy `logprobs` block: the first token's logprob and top are null (nothing precedes
    it), text offsets count from 0 over the token texts."""
    assert scores is not None and len(scores) == len(prompt_ids), "prompt logprobs missing for an echo"
    assert all(lp is not None for lp in scores[1:]), "only the first prompt token goes unscored"
    first = text_of.get(prompt_ids[0], "")
    rest = [dataclasses.replace(lp, top=lp.top[:num_top]) for lp in scores[1:] if lp is not None]
    head = {"tokens": [first], "token_logprobs": [None], "top_logprobs": [None], "text_offset": [0]}
    return join_blocks(head, completion_logprobs(rest, text_of, len(first)))


def join_blocks(first: dict[str, Any], second: dict[str, Any] | None) -> dict[str, Any]:
    """Two legacy `logprobs` blocks one after the other (the prompt's, then the output's)."""
    if second is None:
        return first
    return {key: first[key] + second[key] for key in first}


def vllm_prompt_logprobs(
    prompt_ids: list[int], scores: list[Logprob | None] | None, text_of: dict[int, str], num_top: int
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's `prompt_logprobs`: None for the first token, then per token {token_id: {logprob, rank, decoded_token}}
    holding the prompt token (its own rank) and the `num_top` likeliest (ranks 1..num_top)."""
    assert scores is not None and len(scores) == len(prompt_ids), "prompt logprobs missing"
    out: list[dict[str, dict[str, Any]] | None] = []
    for t, lp in zip(prompt_ids, scores, strict=True):
        if lp is None:
            out.append(None)
            continue
        entry = {str(t): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": text_of.get(t, "")}}
        for rank, (top_id, value) in enumerate(lp.top[:num_top], start=1):
            if top_id != t:
                entry[str(top_id)] = {
                    "logprob": value,
                    "rank": rank,
                    "decoded_token": text_of.get(top_id, ""),
                }
        out.append(entry)
    return out


def completion_text_and_logprobs(
    scoring: PromptScoring,
    prompt: tuple[list[int], list[Logprob | None] | None, str],
    text: str,
    entries: list[Logprob] | None,
    text_of: dict[int, str],
    offset: int,
    with_prompt: bool,
) -> tuple[str, dict[str, Any] | None]:
    """A completion choice's (or chunk's) text and legacy logprobs: the output's `text` and logprob `entries` (None
    when logprobs were not asked for; offsets from `offset`), after the echoed prompt when `with_prompt` (a choice, or
    a sample's first chunk). `prompt`: its ids, the engine's scores of them, the echoed text. With max_tokens 0 the
    output made to read the prompt is left out."""
    prompt_ids, scores, echoed = prompt
    if scoring.echo_only:
        text, entries = "", None if entries is None else []
    block = None if entries is None else completion_logprobs(entries, text_of, offset)
    if with_prompt and scoring.echo:
        text = echoed + text
        if block is not None:
            block = join_blocks(prompt_block(prompt_ids, scores, text_of, scoring.logprobs or 0), block)
    return text, block
