"""Constrained sampling: each structured sequence's grammar matcher masks its own row of the step's logits.

Per step: `start` hands the masks of the constrained rows to worker threads before the model runs (the masks
depend only on tokens already accepted; llguidance computes them with the GIL released, so they overlap the
forward), `apply` waits for them and sets the disallowed logits of those rows to -inf, and after sampling
`accept` advances each matcher by its row's token. Rows without a constraint are never touched, and a step
without constrained rows does no grammar work at all. EOS is allowed by the mask only where the grammar accepts.

Every mask is timed and charged to its request (engine/worker/mask_budget.py): the step waits for the slowest
mask, so a request whose masks cost more than the limits allow ends with an error instead of slowing everyone.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import llguidance
import torch

from engine.core.sequence import Sequence
from engine.worker.grammar import GrammarCompiler
from engine.worker.mask_budget import MaskAccount, MaskBudget

MASK_THREADS = 2  # threads computing a step's masks, one request's masks at a time each


@dataclass
class MaskJob:
    """The masks of one step's constrained rows, being computed: `rows` index the step's sampling logits."""

    rows: list[int]
    seq_ids: list[int]
    bitmask: torch.Tensor  # [len(rows), ceil(vocab / 32)] int32, bit t of a row set: token t allowed
    futures: list[Future]

    def wait(self) -> None:
        """Block until the masks are filled (re-raises a fault of a mask thread)."""
        for future in self.futures:
            future.result()


class GuidedDecoder:
    """The live matchers of constrained sequences (by seq_id), and the per-step mask work on them."""

    def __init__(self, compiler: GrammarCompiler, budget: MaskBudget) -> None:
        self.compiler = compiler
        self.budget = budget
        self.vocab_size = compiler.vocab_size
        self.eos_token_ids = frozenset(compiler.eos_token_ids)
        self.matchers: dict[int, llguidance.LLMatcher] = {}
        self.accounts: dict[int, MaskAccount] = {}  # seq_id -> its request's account (one per request)
        self._grammars: dict[int, str] = {}  # seq_id -> its grammar, refused from then on if a mask is over
        self._pool: ThreadPoolExecutor | None = None  # started with the first constrained step

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self.matchers

    def __len__(self) -> int:
        return len(self.matchers)

    def add(self, seqs: list[Sequence]) -> None:
        """A matcher for each constrained sequence of one request (its samples), all charging one mask account;
        ValueError when the grammar fails."""
        fresh = {s.seq_id: self.compiler.matcher(s.params.structured) for s in seqs if s.params.structured}
        account = MaskAccount()
        for seq in seqs:
            if seq.seq_id in fresh:
                self.accounts[seq.seq_id] = account
                self._grammars[seq.seq_id] = seq.params.structured.grammar
        self.matchers.update(fresh)

    def release(self, seq_id: int) -> None:
        """Forget a finished sequence's matcher (unknown ids are ignored)."""
        self.matchers.pop(seq_id, None)
        self.accounts.pop(seq_id, None)
        self._grammars.pop(seq_id, None)

    def start(
        self,
        seqs: list[Sequence],
        first_rows: list[int] | None = None,
        proposed: dict[int, tuple[int, ...]] | None = None,
    ) -> MaskJob | None:
        """Begin the masks of the constrained sequences among this step's sampling `seqs` (their logits rows:
        `first_rows`, default in order); None when none is constrained. A sequence verifying proposed tokens
        (`proposed`, by seq_id) has a row per proposed token after its first, each masked as if the proposed tokens
        before it were accepted (its matcher takes them, then gives them back)."""
        rows, seq_ids, before = [], [], []
        for i, seq in enumerate(seqs):
            if seq.seq_id not in self.matchers:
                continue
            first = first_rows[i] if first_rows is not None else i
            tokens = proposed.get(seq.seq_id, ()) if proposed else ()
            for j in range(len(tokens) + 1):
                rows.append(first + j)
                seq_ids.append(seq.seq_id)
                before.append(tokens[:j])
        if not rows:
            return None
        words = (self.vocab_size + 31) // 32
        bitmask = torch.zeros((len(rows), words), dtype=torch.int32)
        # one task per request: its masks in turn, each charged to its account before the next is started
        by_request: dict[
            int, tuple[MaskAccount, list[tuple[llguidance.LLMatcher, int, tuple[int, ...]]]]
        ] = {}
        for j, seq_id in enumerate(seq_ids):
            account = self.accounts[seq_id]
            by_request.setdefault(id(account), (account, []))[1].append((self.matchers[seq_id], j, before[j]))
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=MASK_THREADS, thread_name_prefix="grammar-mask")
        futures = [self._pool.submit(self._fill, *work, bitmask) for work in by_request.values()]
        return MaskJob(rows, seq_ids, bitmask, futures)

    def _fill(
        self,
        account: MaskAccount,
        entries: list[tuple[llguidance.LLMatcher, int, tuple[int, ...]]],
        bitmask: torch.Tensor,
    ) -> None:
        row_bytes = bitmask.shape[1] * 4
        for matcher, j, before in entries:
            row = bitmask.data_ptr() + j * row_bytes
            # a verification row: the matcher as it would be with the proposed tokens before it taken
            if before:
                taken = matcher.validate_tokens(list(before))
                # the grammar refuses one: this row is never used (its token is rejected)
                if taken < len(before):
                    bitmask[j] = -1
                    continue
                matcher.consume_tokens(list(before))
            try:
                if not self.budget.timed(account, partial(matcher.unsafe_compute_mask_ptr, row, row_bytes)):
                    return  # over a limit: the request ends this step, its other masks are not worth computing
            finally:
                if before:
                    matcher.rollback(len(before))

    @torch.inference_mode()  # the runner's logits are inference tensors
    def apply(self, logits: torch.Tensor, job: MaskJob) -> dict[int, str]:
        """Wait for the job's masks and apply them in place to their rows of float32 `logits` [rows, vocab];
        the errors by seq_id of rows whose request went over a mask limit or whose grammar allows no token (those
        rows are left as they were: their requests end this step)."""
        job.wait()
        if logits.shape[1] > self.vocab_size:
            raise RuntimeError(
                f"logits have {logits.shape[1]} columns, the grammar vocabulary {self.vocab_size}"
            )
        allowed = unpack_bitmask(job.bitmask, logits.shape[1])  # [R, V]
        errors: dict[int, str] = {}
        ok = allowed.any(dim=1).tolist()
        for j, seq_id in enumerate(job.seq_ids):
            matcher = self.matchers[seq_id]
            account = self.accounts[seq_id]
            if account.error is not None:
                errors[seq_id] = account.error
                if account.over_ceiling:  # later requests with this grammar are refused before they run
                    reason = account.error.removeprefix("structured output stopped: ")
                    message = f"structured output: the grammar is too costly: a request with it was stopped, {reason}"
                    self.compiler.refuse(self._grammars[seq_id], message)
            elif matcher.is_error():
                errors[seq_id] = f"structured output failed: {matcher.get_error().splitlines()[0]}"
            elif not ok[j]:
                errors[seq_id] = "structured output failed: the grammar allows no token here"
        keep = [j for j, seq_id in enumerate(job.seq_ids) if seq_id not in errors]
        if keep:
            rows = torch.tensor([job.rows[j] for j in keep], device=logits.device)
            sel = torch.tensor(keep)
            mask = allowed.index_select(0, sel).to(logits.device)
            logits[rows] = logits.index_select(0, rows).masked_fill_(~mask, float("-inf"))
        return errors

    def accept(
        self, seqs: list[Sequence], token_ids: list[int] | list[list[int]], failed: dict[int, str]
    ) -> tuple[list[Sequence], dict[int, str]]:
        """Advance each constrained sequence's matcher by its sampled token (or, verifying proposed tokens, by the
        tokens it got: a list), except those `failed` already (their row was not masked). Returns the sequences
        whose grammar is complete with no way to go on (they stop now, without spending a step on EOS), and the
        errors by seq_id of those whose token the grammar refused."""
        ended: list[Sequence] = []
        errors: dict[int, str] = {}
        for seq, got in zip(seqs, token_ids, strict=True):
            matcher = self.matchers.get(seq.seq_id)
            if matcher is None or seq.seq_id in failed:
                continue
            tokens = got if isinstance(got, list) else [got]
            for token_id in tokens:
                if not matcher.consume_token(token_id):
                    errors[seq.seq_id] = f"structured output failed: {matcher.get_error().splitlines()[0]}"
                    break
                if token_id in self.eos_token_ids:  # the sequence ends here: later tokens are cut
                    break
            else:
                if tokens[-1] not in self.eos_token_ids and matcher.is_stopped():
                    ended.append(seq)
        return ended, errors

    def completion_index(self, seq_id: int, tokens: list[int]) -> int | None:
        """The index of the first of `tokens` (proposed tokens a constrained sequence kept) after which its grammar
        is complete, EOS aside, or None: the tokens after that one would not be there without speculation, where the
        sequence stops right after it. The matcher is left as it was."""
        matcher = self.matchers.get(seq_id)
        if matcher is None:
            return None
        taken = 0
        try:
            for i, token_id in enumerate(tokens):
                if token_id in self.eos_token_ids or not matcher.consume_token(token_id):
                    return None
                taken += 1
                if matcher.is_stopped():
                    return i
            return None
        finally:
            matcher.rollback(taken)

    def close(self) -> None:
        """Stop the mask thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bool [R, vocab_size] from an int32 bitmask [R, ceil(vocab / 32)] (bit t % 32 of word t // 32: token t)."""
    shifts = torch.arange(32, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # [R, W, 32]
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()
