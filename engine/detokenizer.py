"""Incremental detokenization of one output stream: text deltas that never split a character, and stop strings.

Each step decodes only a small window of recent tokens (vLLM's prefix/read offsets): `prefix_offset` starts the
window, `read_offset` ends the part already turned into text. The new text is decode(window) minus
decode(window up to read_offset), so decoder context such as SentencePiece's leading-space stripping or a byte-level
BPE character split across tokens is seen the same way in both, and the cost per token does not grow with the
output. While the decoded window ends in U+FFFD (an incomplete UTF-8 sequence) nothing is released.

Stop strings are matched on the text; a tail that could still grow into a stop string is held back, so a stop
string is never emitted and the deltas always concatenate to `text`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

INITIAL_CONTEXT_TOKENS = 5  # prompt tokens decoded with the first output tokens, for leading-space context
REPLACEMENT_CHAR = "\ufffd"


def ids_decoder(tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """`tokenizer.decode(ids, skip_special_tokens=..., clean_up_tokenization_spaces=False)` as one call. For a
    tokenizer backed by the `tokenizers` library whose `decode` and `_decode` are transformers' own, that is the Rust
    tokenizer's decode of the same ids (what `_decode` returns when no clean-up is asked for), without transformers'
    argument handling around it (`to_py_obj` walks every id): the detokenizer decodes twice a token."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    kind = type(tokenizer)
    if (
        backend is not None
        and getattr(kind, "_decode", None) is PreTrainedTokenizerFast._decode
        and getattr(kind, "decode", None) is PreTrainedTokenizerFast.decode
    ):
        return functools.partial(backend.decode, skip_special_tokens=skip_special_tokens)
    return functools.partial(
        tokenizer.decode, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
    )


@dataclass
class DetokenizerStep:
    """Text released by one step; `stop_string` is set when a stop string completed (the stream is then over)."""

    text_delta: str
    stop_string: str | None = None


class IncrementalDetokenizer:
    """Turns one sequence's output token ids into text deltas, truncating at the first completed stop string.

    When several stop strings match, the one that completes first in the text wins (on a tie, the one that starts
    earlier): the same answer whether the text arrives one character or many tokens at a time.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: list[int],
        stop: tuple[str, ...] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        if any(not s for s in stop):
            raise ValueError(f"stop strings must be non-empty, got {stop!r}")
        self._decode = ids_decoder(tokenizer, skip_special_tokens)
        self._stop = tuple(stop)
        self._ids: list[int] = list(prompt_token_ids[-INITIAL_CONTEXT_TOKENS:])  # the decode window and after
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._prefix_text: str | None = None  # decode(ids[prefix_offset:read_offset]); None until needed
        self._prefix_is_prompt = True  # the window's read part is still the prompt's tail
        self._pending = ""  # decoded text held back because it could be the start of a stop string
        self._text = ""  # everything released so far
        self._stop_string: str | None = None
        self._done = False

    @property
    def text(self) -> str:
        """The text released so far: the concatenation of all deltas (never a stop string)."""
        return self._text

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the stream, if one did."""
        return self._stop_string

    def step(self, new_token_ids: list[int]) -> DetokenizerStep:
        """Add output tokens; return the text that became final and whether a stop string completed."""
        if self._done:
            raise RuntimeError("IncrementalDetokenizer.step called after a stop string or finish()")
        self._ids.extend(new_token_ids)
        return self._release(self._decode_new(final=False), final=False)

    def finish(self) -> str:
        """End of stream without a stop string: release the held-back tail and any incomplete character."""
        if self._done:
            return ""
        return self._release(self._decode_new(final=True), final=True).text_delta

    def _decode_new(self, final: bool) -> str:
        """Text of the tokens after read_offset, or "" while it ends in an incomplete character (unless final)."""
        if len(self._ids) == self._read_offset:
            return ""
        if self._prefix_text is None:
            self._prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
            if self._prefix_is_prompt:
                # A prompt that ends inside a character: the output completes it, so it belongs to the output.
                self._prefix_text = self._prefix_text.rstrip(REPLACEMENT_CHAR)
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) <= len(self._prefix_text) or (full.endswith(REPLACEMENT_CHAR) and not final):
            return ""
        new_text = full[len(self._prefix_text) :]
        # Slide the window: what was just read becomes the next step's decoding context.
        del self._ids[: self._read_offset]
        self._prefix_offset, self._read_offset = 0, len(self._ids)
        self._prefix_text = None
        self._prefix_is_prompt = False
        return new_text

    def _release(self, new_text: str, final: bool) -> DetokenizerStep:
        """Match stop strings in held-back + new text, then release all but a possible stop-string start."""
        text = self._pending + new_text
        old_len = len(self._pending)
        best: tuple[int, int, str] | None = None  # (end, start, stop string)
        for s in self._stop:
            # Matches ending inside the new text; earlier ones were checked by earlier steps.
            start = text.find(s, max(0, old_len - len(s) + 1))
            if start >= 0 and (best is None or (start + len(s), start) < best[:2]):
                best = (start + len(s), start, s)
        if best is not None:
            delta = text[: best[1]]
            self._text += delta
            self._pending = ""
            self._stop_string = best[2]
            self._done = True
            return DetokenizerStep(delta, best[2])
        keep = 0 if final else self._held_back_len(text)
        delta = text[: len(text) - keep]
        self._pending = text[len(text) - keep :]
        self._text += delta
        self._done = final
        return DetokenizerStep(delta)

    def _held_back_len(self, text: str) -> int:
        """Length of the longest suffix of text that is a proper prefix of some stop string."""
        if not text:
            return 0
        best = 0
        last = text[-1]
        for s in self._stop:
            # Only prefixes ending in text's last character can match; try them longest first.
            j = s.rfind(last, 0, len(s) - 1)
            while j + 1 > best:
                if text.endswith(s[: j + 1]):
                    best = j + 1
                    break
                j = s.rfind(last, 0, j)
        return best
