"""Public prompt prefixes: the leading prompt tokens that only the operator wrote, shared in the prefix cache.

With prefix-cache isolation a request's blocks are salted with its tenant (engine.core.hash_chain.ChainKey), except
those wholly inside its public prefix: the chat template's own text (its default system message included) and a
system prompt the operator published (the server's default system prompt, or one of the shared prompt files),
matched exactly on the conversation's first message. Everyone may share those blocks; a cache hit on them tells only
that someone used a published prompt.

The length is token-exact: the public head is rendered with a probe in place of the first non-public content, and
only the leading ids that the real prompt has in common with that head's ids count, so a prompt's public prefix never
covers a token that spells anything the tenant wrote.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.settings import Settings  # (at run time: the chat history imports this module, and no engine)

_PROBE = "PAGEDCHAT_PUBLIC_PREFIX_PROBE"


def published_prompts(settings: Settings) -> tuple[str, ...]:
    """The system prompts the operator published: the default one and each shared prompt file's text.

    A file's final line break is not part of its prompt; a missing file raises ValueError naming it.
    """
    prompts = [settings.default_system_prompt] if settings.default_system_prompt else []
    for name in settings.shared_prompt_files:
        path = Path(name).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"shared prompt file {name!r} cannot be read: {exc.strerror or exc}") from None
        text = text.removesuffix("\n").removesuffix("\r")
        if text:
            prompts.append(text)
    return tuple(prompts)


class PublicPrefixes:
    """How many leading tokens of a chat prompt are public (call it on the tokenizer thread)."""

    def __init__(self, tokenizer: Any, published: Iterable[str]) -> None:
        self.tokenizer = tokenizer
        self.published = frozenset(p for p in published if p)
        # (published system prompt or None, role of the first other message) -> the public head's ids; bounded by
        # the published prompts times the roles
        self._heads: dict[tuple[str | None, str], list[int]] = {}

    def is_published(self, system_prompt: str) -> bool:
        """Whether this system prompt's text is one the operator published."""
        return system_prompt in self.published

    def length(self, messages: Sequence[dict[str, str]], prompt_ids: Sequence[int]) -> int:
        """Public tokens at the start of `prompt_ids`, the template's rendering of `messages`."""
        system = None
        if messages and messages[0]["role"] == "system":
            system = messages[0]["content"]
            if system not in self.published:
                return 0  # what the tenant wrote starts a few template tokens in: never a whole block
        rest = messages[1:] if system is not None else messages
        head = self._head(system, rest[0]["role"] if rest else "user")
        return common_prefix_len(head, prompt_ids)

    def session_length(self, system_prompt: str, prompt_ids: Sequence[int]) -> int:
        """Public tokens of a session turn's prompt (its system prompt, then user turns)."""
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        return self.length(messages, prompt_ids)

    def _head(self, system: str | None, next_role: str) -> list[int]:
        key = (system, next_role)
        head = self._heads.get(key)
        if head is None:
            messages = [{"role": "system", "content": system}] if system is not None else []
            messages.append({"role": next_role, "content": _PROBE})
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
            at = text.find(_PROBE)
            # the template writes any BOS itself (as ConversationBuilder renders prompts)
            head = list(self.tokenizer.encode(text[:at], add_special_tokens=False)) if at > 0 else []
            self._heads[key] = head
        return head


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading token ids two sequences share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
