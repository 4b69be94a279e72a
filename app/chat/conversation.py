"""Token-exact conversation history: each prompt extends the previous prompt and answer ids instead of re-rendering.

Re-tokenizing an earlier answer's text can give other ids than the model generated, and then the prefix cache misses
and the model reads a history it did not write. So a new prompt is built as
    [template head] + stored ids of the kept turns (+ end-of-turn where an answer lacked it) + new user turn,
where "new user turn" is the token difference between rendering the conversation with and without it. The result is
checked against a full render (decoded text must be equal); when the template does not simply extend, the builder
falls back to the full render and says so. An answer whose ids do not spell its stored text (a stop string cut the
text, the stop button caught text held back, a crash lost the ids) is re-tokenized from its text alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from app.chat.truncation import (
    ContextFull,
    ContextReport,
    PromptTooLong,
    Truncate,
    candidates,
    refusal,
)
from app.db.models import FINAL_ASSISTANT_STATUSES
from app.http.public_prefix import common_prefix_len

logger = logging.getLogger(__name__)

TURN_ROLES = ("user", "assistant")
# Every answer that ended is history, failed ones too: the model sees what the user saw, turns keep alternating.
HISTORY_ASSISTANT_STATUSES = FINAL_ASSISTANT_STATUSES
_PROBE = "PAGEDCHAT_END_OF_TURN_PROBE"


@dataclass(frozen=True)
class Turn:
    """One earlier message: user ids are what its rendering appended; assistant ids are the answer as generated."""

    role: str
    content: str
    token_ids: tuple[int, ...] | None = None
    # this exchange carries an attachment: never dropped to fit unless the user chose so (app/chat/truncation.py)
    pinned: bool = False

    def __post_init__(self) -> None:
        if self.role not in TURN_ROLES:
            raise ValueError(f"turn role must be one of {TURN_ROLES}, got {self.role!r}")
        if self.token_ids is not None:
            object.__setattr__(self, "token_ids", tuple(int(t) for t in self.token_ids))


@dataclass(frozen=True)
class PromptPlan:
    """The prompt for the next answer, and how it was built."""

    token_ids: list[
        int
    ]  # the whole prompt, ending with the generation prompt (a continuation: the answer so far)
    new_user_token_ids: list[int]  # what the new user turn appended after the history and any system prompt:
    #                                store these with the user message
    truncated_turns: (
        int  # exchanges (a user turn and its answers) left out to fit max_model_len, as the user chose
    )
    exact_extension: bool  # True: stored ids were extended; False: the conversation was re-rendered
    num_retokenized_turns: int = 0  # answers whose ids did not spell their text, re-tokenized from the text


class MessageLike(Protocol):
    """The fields of a stored message that history needs (app.db.MessageRecord has them)."""

    role: str
    content: str
    token_ids: Sequence[int] | None
    status: str


def turns_from_messages(messages: Iterable[MessageLike], fingerprint: str | None = None) -> list[Turn]:
    """History turns from stored messages: user turns and every answer that ended (not one still streaming).

    With `fingerprint`, ids recorded under another tokenizer (an answer's `tokenizer_fingerprint` differs) are
    dropped for the whole history, so the prompt is re-rendered instead of mixing vocabularies.
    """
    kept = [
        m
        for m in messages
        if m.role == "user" or (m.role == "assistant" and m.status in HISTORY_ASSISTANT_STATUSES)
    ]
    foreign = fingerprint is not None and any(
        getattr(m, "tokenizer_fingerprint", None) not in (None, fingerprint) for m in kept
    )
    return [
        Turn(
            m.role,
            m.content,
            None if foreign or m.token_ids is None else tuple(m.token_ids),
            pinned=bool(getattr(m, "pinned", False)),  # set by attachments (a stored message may lack it)
        )
        for m in kept
    ]


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A short sha256 of the vocabulary and chat template: stored ids are only valid under the same one."""
    digest = hashlib.sha256()
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: (item[1], item[0]))
    digest.update(json.dumps(vocab, ensure_ascii=False).encode())
    digest.update(b"\0")
    digest.update(json.dumps(tokenizer.chat_template, sort_keys=True, ensure_ascii=False).encode())
    return digest.hexdigest()[:16]


def template_end_of_turn_ids(tokenizer: Any) -> list[int]:
    """The ids the chat template renders right after an assistant message's content (ChatML: `<|im_end|>\\n`)."""
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _PROBE}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    at = text.rfind(_PROBE)
    if at < 0:
        raise ValueError("the chat template does not render the assistant's content verbatim")
    return tokenizer.encode(text[at + len(_PROBE) :], add_special_tokens=False)


class ConversationBuilder:
    """Builds each turn's prompt as an exact extension of the previous prompt and answer."""

    def __init__(self, tokenizer: Any, max_model_len: int, end_of_turn_ids: Sequence[int]) -> None:
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be at least 2, got {max_model_len}")
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.end_of_turn_ids = tuple(end_of_turn_ids)
        self._end_of_turn_text = self._decode(list(self.end_of_turn_ids))

    def build_prompt(
        self,
        system_prompt: str,
        turns: Sequence[Turn],
        new_user_text: str,
        max_tokens: int,
        truncate: Truncate | None = Truncate.OLDEST,
    ) -> PromptPlan:
        """The prompt for answering `new_user_text`. History that does not fit with max_tokens more is cut as
        `truncate` says (app/chat/truncation.py); with no choice (None) it raises ContextFull. A message that does
        not fit alone raises PromptTooLong, saying what to do."""
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        budget = self.max_model_len - max_tokens
        options = candidates(turns, truncate)
        index = self._first_within_stored(options, budget)
        searched = False
        while True:
            kept, num_dropped = options[index]
            plan = self._plan(system_prompt, kept, new_user_text, num_dropped)
            if len(plan.token_ids) <= budget:
                if num_dropped:
                    logger.info("left out %d exchanges (%s) to fit max_model_len", num_dropped, truncate)
                return plan
            if index == len(options) - 1:
                self._refuse(system_prompt, turns, new_user_text, max_tokens, truncate, len(plan.token_ids))
            if searched:  # the exact ids came out longer than the plain render: one exchange more
                index += 1
            else:
                index = self._first_fitting(system_prompt, options, new_user_text, budget, index + 1)
                searched = True

    def context_report(
        self, system_prompt: str, turns: Sequence[Turn], new_user_text: str, max_tokens: int
    ) -> ContextReport:
        """What sending `new_user_text` needs: whether it fits, what each choice would leave out, what to do."""
        try:
            plan = self.build_prompt(system_prompt, turns, new_user_text, max_tokens, truncate=None)
        except (ContextFull, PromptTooLong) as refused:
            return refused.report
        return ContextReport(len(plan.token_ids), max_tokens, self.max_model_len, True, 0, 0, (), None)

    def _refuse(
        self,
        system_prompt: str,
        turns: Sequence[Turn],
        new_user_text: str,
        max_tokens: int,
        truncate: Truncate | None,
        num_tokens: int,
    ) -> NoReturn:
        """Nothing kept fits: ContextFull or PromptTooLong, as app/chat/truncation.py's `refusal` decides."""
        raise refusal(self, system_prompt, turns, new_user_text, max_tokens, truncate, num_tokens)

    def render(
        self, system_prompt: str, turns: Sequence[Turn], new_user_text: str | None = None
    ) -> list[int]:
        """The template's full rendering of the conversation (with the generation prompt when a new turn is given)."""
        messages = self._messages(system_prompt, turns)
        if new_user_text is None:
            return self._encode(messages, add_generation_prompt=False)
        return self._encode(
            [*messages, {"role": "user", "content": new_user_text}], add_generation_prompt=True
        )

    def build_continuation(
        self,
        system_prompt: str,
        turns: Sequence[Turn],
        user_text: str,
        answer: Turn,
        max_tokens: int,
        truncate: Truncate | None = Truncate.OLDEST,
    ) -> tuple[PromptPlan, list[int]]:
        """The prompt that continues `answer` (the reply to `user_text` after `turns`) where it stopped: the prompt
        that answered `user_text`, then the answer's ids, with no end of turn and no new assistant header; and those
        answer ids (its stored ids where they spell its text, else its text tokenized)."""
        answer_ids, _ = self.answer_ids(answer)
        try:
            plan = self.build_prompt(system_prompt, turns, user_text, max_tokens + len(answer_ids), truncate)
        except PromptTooLong:
            raise ValueError(
                f"the reply is already {len(answer_ids)} tokens long: continuing it by max_tokens ({max_tokens}) "
                f"more does not fit max_model_len ({self.max_model_len})"
            ) from None
        return dataclasses.replace(plan, token_ids=plan.token_ids + answer_ids), answer_ids

    def answer_ids(self, turn: Turn) -> tuple[list[int], bool]:
        """An answer's ids as the model generated them, and True; or, where they do not spell its text (a stop
        string cut the text, a crash lost the ids), its text tokenized, and False."""
        answer = list(turn.token_ids) if turn.token_ids is not None else None
        if answer is not None and (
            self._decode(answer + self.closing_ids(answer)) == turn.content + self._end_of_turn_text
        ):
            return answer, True
        return self.tokenizer.encode(turn.content, add_special_tokens=False), False

    def closing_ids(self, answer_ids: Sequence[int]) -> list[int]:
        """The end-of-turn ids still missing after an answer (all of them after a length/stop-string/button end)."""
        eot = self.end_of_turn_ids
        for overlap in range(min(len(eot), len(answer_ids)), 0, -1):
            if tuple(answer_ids[-overlap:]) == eot[:overlap]:
                return list(eot[overlap:])
        return list(eot)

    def _plan(
        self, system_prompt: str, kept: Sequence[Turn], new_user_text: str, num_dropped: int
    ) -> PromptPlan:
        full = self.render(system_prompt, kept, new_user_text)
        has_history = bool(kept) or bool(system_prompt)
        base = self.render(system_prompt, kept) if has_history else []
        extends = full[: len(base)] == base
        appended = full[len(base) :] if extends else full[common_prefix_len(base, full) :]
        if not kept:  # nothing stored to extend: the render is the prompt
            return PromptPlan(full, appended, num_dropped, True)
        stored = self._stored_ids(system_prompt, kept) if extends else None
        if stored is not None:
            candidate = stored[0] + appended
            if candidate == full or self._decode(candidate) == self._decode(full):
                return PromptPlan(candidate, appended, num_dropped, True, stored[1])
        logger.debug(
            "prompt re-rendered: template extends=%s, stored ids usable=%s", extends, stored is not None
        )
        return PromptPlan(full, appended, num_dropped, False)

    def _stored_ids(self, system_prompt: str, kept: Sequence[Turn]) -> tuple[list[int], int] | None:
        """Template head + the kept turns' stored ids, and how many answers were re-tokenized; None when unusable."""
        first = kept[0]
        if first.role != "user" or any(t.token_ids is None for t in kept if t.role == "user"):
            return None
        # The head is whatever the template renders before the first kept user turn (system prompt, defaults).
        head = self.render(system_prompt, [], first.content)
        first_ids = list(first.token_ids or ())
        if len(first_ids) > len(head) or head[len(head) - len(first_ids) :] != first_ids:
            return None
        ids = head[: len(head) - len(first_ids)]
        num_retokenized = 0
        for turn in kept:
            if turn.role == "user":
                ids.extend(turn.token_ids or ())
                continue
            answer, exact = self.answer_ids(turn)
            num_retokenized += not exact
            ids.extend(answer)
            ids.extend(self.closing_ids(answer))
        return ids, num_retokenized

    @staticmethod
    def _first_within_stored(options: list[tuple[list[Turn], int]], budget: int) -> int:
        """The first candidate whose kept turns' stored ids alone fit the budget: earlier ones cannot fit exactly.

        (A re-render could, in theory, come out shorter than non-canonical stored ids; then this drops an
        exchange that a fallback render might have kept. Stored ids are the prompt's ids in the normal case.)
        """
        for index, (kept, _) in enumerate(options):
            if sum(len(t.token_ids or ()) for t in kept) <= budget:
                return index
        return len(options) - 1

    def _first_fitting(
        self,
        system_prompt: str,
        options: list[tuple[list[Turn], int]],
        new_user_text: str,
        budget: int,
        lo: int,
    ) -> int:
        """Binary search over options[lo:] for the first whose full render fits (renders shrink as more goes)."""
        hi = len(options) - 1  # the answer is in [lo, hi]; hi (the least kept) is the last resort
        while lo < hi:
            mid = (lo + hi) // 2
            if len(self.render(system_prompt, options[mid][0], new_user_text)) <= budget:
                hi = mid
            else:
                lo = mid + 1
        return lo

    @staticmethod
    def _messages(system_prompt: str, turns: Sequence[Turn]) -> list[dict[str, str]]:
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.extend({"role": t.role, "content": t.content} for t in turns)
        return messages

    def _encode(self, messages: list[dict[str, str]], *, add_generation_prompt: bool) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        # The template writes any BOS itself; add_special_tokens would add a second one.
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
