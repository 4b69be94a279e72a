"""The checks of a request against the engine's limits, in plain Python: the app runs them too, before it queues."""

from __future__ import annotations


def check_max_tokens(num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
    """ValueError when the prompt and the reply it may grow to do not fit in one sequence of max_model_len tokens."""
    if num_prompt_tokens + max_tokens > max_model_len:
        raise ValueError(
            f"prompt ({num_prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds max_model_len ({max_model_len})"
        )
