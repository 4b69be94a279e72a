"""The terminal chat's conversation: its turns, what each reply took, and /save's JSON and Markdown."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from engine.core.sequence import FinishReason

MARKDOWN_SUFFIXES = (".md", ".markdown")


@dataclass
class Turn:
    """One message. `stopped`: an assistant reply cut short by Ctrl-C; it stays in the conversation as the user saw
    it (as `ollama run` keeps it), so the next message continues from there."""

    role: str  # "user" | "assistant"
    content: str
    stopped: bool = False


@dataclass
class Conversation:
    """The system prompt and the turns since the last /reset."""

    system: str = ""
    turns: list[Turn] = field(default_factory=list)

    def messages(self) -> list[dict[str, str]]:
        """What the chat template renders: the system prompt (when set), then every turn, a stopped reply as is."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [{"role": t.role, "content": t.content} for t in self.turns]

    def reset(self) -> None:
        """Forget every turn; the system prompt stays."""
        self.turns.clear()

    def to_json(self, model: str) -> str:
        """The conversation as OpenAI-style messages; a stopped reply carries `"stopped": true`."""
        messages: list[dict] = self.messages()
        offset = 1 if self.system else 0
        for i, turn in enumerate(self.turns):
            if turn.stopped:
                messages[offset + i]["stopped"] = True
        return json.dumps({"model": model, "messages": messages}, ensure_ascii=False, indent=2) + "\n"

    def to_markdown(self, model: str) -> str:
        """The conversation as a Markdown page: a heading per message, its text as written."""
        parts = [f"# Chat with {model}\n"]
        if self.system:
            parts.append(f"## System\n\n{self.system}\n")
        for turn in self.turns:
            title = "You" if turn.role == "user" else "Assistant"
            note = " (stopped with Ctrl-C)" if turn.stopped else ""
            parts.append(f"## {title}{note}\n\n{turn.content}\n")
        return "\n".join(parts)

    def save(self, path: Path, model: str) -> str:
        """Write it to `path`: Markdown when it ends in .md, else JSON; the format written. OSError when the file
        cannot be written (no such folder, a folder by that name, no permission)."""
        markdown = path.suffix.lower() in MARKDOWN_SUFFIXES
        path.write_text(self.to_markdown(model) if markdown else self.to_json(model), encoding="utf-8")
        return "Markdown" if markdown else "JSON"


@dataclass(frozen=True)
class Reply:
    """What one reply took: tokens, prefix-cache hits, timings (seconds) and how it ended."""

    text: str
    num_prompt_tokens: int
    num_cached_tokens: int
    num_tokens: int
    finish_reason: FinishReason | None
    error: str | None = None
    first_token_s: float | None = None  # from queueing to the first token
    decode_s: float | None = None  # from the first token to the last

    @property
    def stopped(self) -> bool:
        return self.finish_reason is FinishReason.ABORT

    @property
    def tokens_per_s(self) -> float | None:
        """Decode speed: tokens after the first over the time they took."""
        if self.num_tokens < 2 or not self.decode_s:
            return None
        return (self.num_tokens - 1) / self.decode_s

    def summary(self) -> str:
        """One line: tokens, speed, prompt and its prefix-cache hits."""
        speed = f", {self.tokens_per_s:.1f} tokens/s" if self.tokens_per_s is not None else ""
        tokens = "token" if self.num_tokens == 1 else "tokens"
        return (
            f"{self.num_tokens} {tokens}{speed}; {self.num_prompt_tokens} prompt tokens, "
            f"{self.num_cached_tokens} from the prefix cache"
        )
