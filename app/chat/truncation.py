"""What to leave out when a conversation outgrows the context: never anything the user did not choose.

A prompt that fits is sent whole. One that does not is refused with the choices (`ContextFull`, 409 `context_full`
at the API) unless the send names one: `Truncate.OLDEST` leaves out the oldest exchanges, pinned ones (an exchange
carrying an attachment) included; `Truncate.KEEP_PINNED` leaves out unpinned exchanges only, oldest first. The third
choice, a new chat that starts from a summary, is the page's (POST …/summarize). A new message that does not fit
even alone is a ValueError whose message says what to do.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class Truncate(str, enum.Enum):
    """The user's choice for history that does not fit."""

    OLDEST = "oldest"  # the oldest exchanges go first, pinned ones too
    KEEP_PINNED = "keep_pinned"  # exchanges with attachments stay; the others go, oldest first


SUMMARY_OPTION = "summary"  # a new chat that starts from a summary of this one (the page calls …/summarize)


class Planned(Protocol):
    """What a refusal reads of a built prompt (app/chat/conversation.py's PromptPlan)."""

    @property
    def truncated_turns(self) -> int: ...


class PromptBuilder(Protocol):
    """What a refusal needs of the builder (app/chat/conversation.py's ConversationBuilder)."""

    @property
    def max_model_len(self) -> int: ...

    def render(
        self, system_prompt: str, turns: Sequence[Any], new_user_text: str | None = None
    ) -> list[int]: ...

    def build_prompt(
        self,
        system_prompt: str,
        turns: Sequence[Any],
        new_user_text: str,
        max_tokens: int,
        truncate: Truncate | None = ...,
    ) -> Planned: ...


class TurnLike(Protocol):
    """What cutting a history reads of a turn (app/chat/conversation.py's Turn)."""

    @property
    def role(self) -> str: ...

    @property
    def pinned(self) -> bool: ...


def truncate_value(fields: dict[str, Any]) -> Truncate | None:
    """The `truncate` field of a send (absent or null: no choice made); ValueError naming the accepted values."""
    value = fields.get("truncate")
    if value is None:
        return None
    try:
        return Truncate(value)
    except ValueError:
        accepted = ", ".join(repr(t.value) for t in Truncate)
        raise ValueError(f"truncate must be one of {accepted} or null, got {str(value)[:40]!r}") from None


def exchanges(turns: Sequence[TurnLike]) -> list[tuple[int, int]]:
    """The history cut into exchanges, as [start, end) index ranges: each starts at a user turn (turns before the
    first user turn, if any, form one of their own)."""
    if not turns:
        return []
    starts = sorted({0, *(i for i, t in enumerate(turns) if t.role == "user")})
    return [(s, e) for s, e in zip(starts, [*starts[1:], len(turns)], strict=True)]


def is_pinned(turns: Sequence[TurnLike], span: tuple[int, int]) -> bool:
    """An exchange is pinned when one of its turns is (its user turn carries an attachment)."""
    return any(t.pinned for t in turns[span[0] : span[1]])


def candidates(turns: Sequence[Any], mode: Truncate | None) -> list[tuple[list[Any], int]]:
    """The kept histories to try, in order of more left out: (kept turns, exchanges left out). No choice: only the
    whole history; OLDEST: every suffix of whole exchanges; KEEP_PINNED: unpinned exchanges dropped oldest first."""
    spans = exchanges(turns)
    if mode is None:
        return [(list(turns), 0)]
    if mode is Truncate.OLDEST:
        return [(list(turns[s:]), i) for i, (s, _) in enumerate(spans)] + [([], len(spans))]
    unpinned = [i for i, span in enumerate(spans) if not is_pinned(turns, span)]
    result = []
    for k in range(len(unpinned) + 1):
        dropped = set(unpinned[:k])
        kept = [t for i, (s, e) in enumerate(spans) if i not in dropped for t in turns[s:e]]
        result.append((kept, k))
    return result


@dataclass(frozen=True)
class ContextReport:
    """What sending a message would need (the plan endpoint's answer, and a refused send's details)."""

    prompt_tokens: int  # the whole conversation and the new message, nothing left out
    max_tokens: int
    max_model_len: int
    fits: bool  # the whole conversation fits
    truncated_turns: int  # exchanges that "drop the oldest turns" leaves out
    pinned_turns_dropped: int  # of those, pinned ones (exchanges carrying an attachment)
    options: tuple[str, ...]  # the choices when it does not fit: oldest, keep_pinned, summary; () otherwise
    advice: str | None  # what to do, when the message does not fit as it stands

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "max_tokens": self.max_tokens,
            "max_model_len": self.max_model_len,
            "fits": self.fits,
            "truncated_turns": self.truncated_turns,
            "pinned_turns_dropped": self.pinned_turns_dropped,
            "options": list(self.options),
            "advice": self.advice,
        }


class ContextFull(Exception):
    """The history must be cut to fit and the send made no choice (the API's 409 `context_full`)."""

    def __init__(self, report: ContextReport) -> None:
        super().__init__(report.advice)
        self.report = report


class PromptTooLong(ValueError):
    """The new message does not fit even with the history left out (the API's 400 `prompt_too_long`)."""

    def __init__(self, report: ContextReport) -> None:
        super().__init__(report.advice)
        self.report = report


def refusal(
    builder: PromptBuilder,
    system_prompt: str,
    turns: Sequence[Any],
    new_user_text: str,
    max_tokens: int,
    truncate: Truncate | None,
    num_tokens: int,
) -> ContextFull | PromptTooLong:
    """Why nothing `truncate` allows fits (`num_tokens`: the least it kept): PromptTooLong when the message alone
    does not fit; else ContextFull with the choices (no choice made), or PromptTooLong naming what the pinned
    exchanges need (keep_pinned)."""
    max_model_len = builder.max_model_len
    whole = num_tokens if truncate is None else len(builder.render(system_prompt, turns, new_user_text))
    alone = len(builder.render(system_prompt, [], new_user_text))
    if alone > max_model_len - max_tokens:
        advice = too_long_advice(alone, max_tokens, max_model_len)
        return PromptTooLong(ContextReport(whole, max_tokens, max_model_len, False, 0, 0, (), advice))
    oldest = builder.build_prompt(system_prompt, turns, new_user_text, max_tokens, Truncate.OLDEST)
    spans = exchanges(turns)
    pinned_dropped = sum(is_pinned(turns, span) for span in spans[: oldest.truncated_turns])

    def cut(options: Sequence[str], advice: str) -> ContextReport:
        """The report of a history that must be cut: what "oldest" would leave out, the choices, the advice."""
        return ContextReport(
            whole,
            max_tokens,
            max_model_len,
            False,
            oldest.truncated_turns,
            pinned_dropped,
            tuple(options),
            advice,
        )

    if truncate is Truncate.KEEP_PINNED:
        num_pinned = sum(is_pinned(turns, span) for span in spans)
        advice = (
            f"the exchanges with attachments ({num_pinned}) and the new message ({num_tokens} tokens) + max_tokens "
            f"({max_tokens}) exceed max_model_len ({max_model_len}): drop the oldest turns (truncate: 'oldest', "
            "attachments too), start a new chat from a summary, or send a shorter message"
        )
        return PromptTooLong(cut((Truncate.OLDEST.value, SUMMARY_OPTION), advice))
    choices = [Truncate.OLDEST.value]
    if pinned_dropped:
        try:
            builder.build_prompt(system_prompt, turns, new_user_text, max_tokens, Truncate.KEEP_PINNED)
            choices.append(Truncate.KEEP_PINNED.value)
        except PromptTooLong:
            pass
    choices.append(SUMMARY_OPTION)
    return ContextFull(cut(choices, full_advice(oldest.truncated_turns, pinned_dropped, choices)))


def too_long_advice(num_tokens: int, max_tokens: int, max_model_len: int) -> str:
    """A new message that cannot fit even with the whole history left out: the numbers and what to do."""
    over = num_tokens + max_tokens - max_model_len
    return (
        f"system prompt + new message ({num_tokens} tokens) + max_tokens ({max_tokens}) exceeds max_model_len "
        f"({max_model_len}) by {over} tokens: send a shorter message (or document), lower this chat's max_tokens "
        "in its settings, or start the server with a larger --max-model-len (up to the model's own limit)"
    )


def full_advice(truncated_turns: int, pinned_dropped: int, options: Sequence[str]) -> str:
    """A history that must be cut: how much, and the choices."""
    plural = "s" if truncated_turns != 1 else ""
    pinned = f", {pinned_dropped} of them with attachments" if pinned_dropped else ""
    choices = ["drop the oldest turns (truncate: 'oldest')"]
    if Truncate.KEEP_PINNED.value in options:
        choices.append("keep the attachments and drop other turns (truncate: 'keep_pinned')")
    if SUMMARY_OPTION in options:
        choices.append("start a new chat from a summary of this one")
    return (
        f"the conversation no longer fits the context: {truncated_turns} earlier exchange{plural} must be left "
        f"out{pinned}; send again choosing to " + "; or ".join(choices)
    )
