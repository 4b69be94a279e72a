"""`bench multiturn --replicas`'s conversations: long published system prompts that users share, and per-user
histories that grow turn by turn, resent whole through /v1 (no session id: nothing to stick a user to a replica).

User u talks to desk u mod G (G published system prompts, each about --system-tokens long): G > 1 gives KV-aware
routing a choice to make for the shared part too, not only for each user's own history. Desk 0's prompt is the
plain `workload.system_prompt`; desk g > 0's starts with its own tag, so two desks share no leading block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.workload import long_user_turns, system_prompt, user_turns

DESK_TAG = "[Desk {number}] "  # the start of desk g > 0's system prompt


@dataclass(frozen=True)
class Scenario:
    """Who says what: the published system prompts, each user's desk and the messages each user sends."""

    system_prompts: tuple[str, ...]
    desk_of_user: tuple[int, ...]
    scripts: tuple[tuple[str, ...], ...]  # [user][turn]

    @property
    def num_users(self) -> int:
        return len(self.scripts)

    @property
    def num_turns(self) -> int:
        return len(self.scripts[0]) if self.scripts else 0

    def system_of(self, user: int) -> str:
        """The system prompt user `user` chats under."""
        return self.system_prompts[self.desk_of_user[user]]


def desk_prompts(tokenizer: Any, num_desks: int, num_tokens: int) -> tuple[str, ...]:
    """`num_desks` system prompts of about `num_tokens` tokens that share no leading text."""
    if num_desks < 1:
        raise ValueError(f"--system-prompts must be at least 1, got {num_desks}")
    base = system_prompt(tokenizer, num_tokens)
    return tuple(base if g == 0 else DESK_TAG.format(number=g + 1) + base for g in range(num_desks))


def make_scenario(
    tokenizer: Any,
    *,
    num_users: int,
    num_turns: int,
    num_desks: int,
    system_tokens: int,
    user_tokens: int,
    seed: int,
) -> Scenario:
    """The conversations: user u at desk u mod `num_desks`; `user_tokens` 0: short questions and follow-ups,
    else messages of about that many tokens (pasted notes and a question about them)."""
    if num_users < 1 or num_turns < 1:
        raise ValueError(f"needs --users >= 1 and --turns >= 1, got {num_users} and {num_turns}")
    if user_tokens < 0:
        raise ValueError(f"--user-tokens must be 0 (short questions) or more, got {user_tokens}")
    prompts = desk_prompts(tokenizer, num_desks, system_tokens)
    scripts = tuple(
        tuple(
            long_user_turns(tokenizer, u, num_turns, user_tokens, seed)
            if user_tokens
            else user_turns(u, num_turns, seed)
        )
        for u in range(num_users)
    )
    return Scenario(prompts, tuple(u % num_desks for u in range(num_users)), scripts)


def write_prompt_files(prompts: Sequence[str], folder: Path) -> tuple[Path, ...]:
    """One file per system prompt in `folder` (what `--shared-prompt-file` publishes); their paths."""
    paths = []
    for g, text in enumerate(prompts):
        path = folder / f"desk-{g + 1}-system-prompt.txt"
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return tuple(paths)


def server_env(prompt_files: Sequence[Path], api_keys: Sequence[str]) -> dict[str, str]:
    """PAGEDCHAT_* variables of the servers this scenario starts: its API keys and its published prompts."""
    return {
        "PAGEDCHAT_API_KEYS": ",".join(api_keys),
        "PAGEDCHAT_SHARED_PROMPT_FILES": ",".join(str(p) for p in prompt_files),
    }
