"""llguidance matchers for structured output: the engine tokenizer's token table, and compiled grammars by text.

Building llguidance's view of a tokenizer (every token's bytes, a token trie) takes about a second for a 49k
vocabulary, so it happens once, on first use, under a lock: whichever thread asks first (the API's check, or the
engine thread for a direct engine user) builds it. A grammar's first matcher is kept (LRU) and later requests
with the same grammar get a copy, so repeated schemas compile once. A grammar is compiled with its first mask,
which must fit MAX_FIRST_MASK_S of CPU time. A grammar that failed to compile, or whose first mask or a later one
went over its limit (engine/worker/mask_budget.py), is refused from then on (LRU) with the same error, so a costly
grammar sent again costs nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Any

import llguidance
import llguidance.hf

from engine.core.structured import StructuredOutput

logger = logging.getLogger(__name__)

MAX_CACHED_GRAMMARS = 64
# A grammar's first mask builds most of its lexer (shared by every copy of the matcher): it is computed when the
# grammar is compiled, off the engine thread when the API checks a request, and a grammar whose first mask takes
# longer than this (e.g. the regex a{1000000}: ~0.5 s) is refused, so one request cannot stall every step's batch.
MAX_FIRST_MASK_S = 0.25


class GrammarCompiler:
    """Turns a StructuredOutput into a fresh llguidance matcher for one sequence. Thread-safe."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: frozenset[int],
        max_first_mask_s: float = MAX_FIRST_MASK_S,
    ) -> None:
        self._hf_tokenizer = tokenizer
        self.max_first_mask_s = max_first_mask_s
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self._lock = threading.Lock()
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._matchers: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()  # grammar -> pristine matcher
        self._refused: OrderedDict[str, str] = OrderedDict()  # grammar -> why its masks are too costly

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's tokenizer (built on first use): EOS is the engine's EOS ids, the vocabulary the logits'."""
        with self._lock:
            if self._ll_tokenizer is None:
                start = time.perf_counter()
                self._ll_tokenizer = llguidance.hf.from_tokenizer(
                    self._hf_tokenizer, n_vocab=self.vocab_size, eos_token=self.eos_token_ids
                )
                logger.info("grammar tokenizer built in %.2f s", time.perf_counter() - start)
            return self._ll_tokenizer

    def matcher(self, structured: StructuredOutput) -> llguidance.LLMatcher:
        """A matcher at the grammar's start; ValueError when the grammar does not build with this tokenizer."""
        tokenizer = self.ll_tokenizer
        grammar = structured.grammar
        with self._lock:
            refused = self._refused.get(grammar)
            if refused is not None:
                self._refused.move_to_end(grammar)
                raise ValueError(refused)
            pristine = self._matchers.get(grammar)
            if pristine is not None:
                self._matchers.move_to_end(grammar)
                return pristine.deep_copy()
        pristine = llguidance.LLMatcher(tokenizer, grammar, log_level=0)  # drops the GIL while it builds
        if pristine.is_error():
            raise self.refuse(grammar, f"structured output: {pristine.get_error().splitlines()[0]}")
        start = time.thread_time()  # CPU time, as the later masks are counted: not the wait for a busy core
        pristine.compute_bitmask()  # drops the GIL; the lexer states it builds are shared by the copies
        seconds = time.thread_time() - start
        if pristine.is_error():
            raise self.refuse(grammar, f"structured output: {pristine.get_error().splitlines()[0]}")
        if seconds > self.max_first_mask_s:
            raise self.refuse(
                grammar,
                f"structured output: the grammar is too costly: its first token mask took {seconds:.2f} s, over "
                f"the limit of {self.max_first_mask_s} s (e.g. a very large repetition count)",
            )
        with self._lock:
            self._matchers[grammar] = pristine
            while len(self._matchers) > MAX_CACHED_GRAMMARS:
                self._matchers.popitem(last=False)
        return pristine.deep_copy()

    def refuse(self, grammar: str, message: str) -> ValueError:
        """Refuse `grammar` from now on with ValueError(`message`); that error, for a caller to raise now."""
        with self._lock:
            self._matchers.pop(grammar, None)
            self._refused[grammar] = message
            self._refused.move_to_end(grammar)
            while len(self._refused) > MAX_CACHED_GRAMMARS:
                self._refused.popitem(last=False)
        return ValueError(message)
