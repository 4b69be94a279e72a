"""The checks of a request against the engine's limits, in plain Python: the engine runs them when a request is
added, and the app's engine client runs the same ones on the event loop before it queues a request (a bad request
is refused without waiting out a step)."""

from __future__ import annotations

from collections.abc import Sequence

TOO_LONG_ADVICE = "shorten the prompt, lower max_tokens, or start the server with a larger --max-model-len"


def check_max_tokens(num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
    """ValueError when the prompt and the reply it may grow to do not fit in one sequence of max_model_len tokens,
    saying what to do."""
    if num_prompt_tokens + max_tokens > max_model_len:
        raise ValueError(
            f"prompt ({num_prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds max_model_len "
            f"({max_model_len}): {TOO_LONG_ADVICE}"
        )


def check_prompt(
    token_ids: Sequence[int], max_tokens: int, public_prefix_len: int, *, vocab_size: int, max_model_len: int
) -> None:
    """ValueError naming what is wrong with a prompt of token ids: empty, an id outside the vocabulary, too long for
    `max_tokens` more, or a public prefix longer than the prompt."""
    if not token_ids:
        raise ValueError("the prompt is empty")
    bad = next((t for t in token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {vocab_size})")
    check_max_tokens(len(token_ids), max_tokens, max_model_len)
    if not 0 <= public_prefix_len <= len(token_ids):
        raise ValueError(
            f"public_prefix_len {public_prefix_len} is outside [0, {len(token_ids)}] (the prompt)"
        )
