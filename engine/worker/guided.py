"""Constrained sampling: each structured sequence's grammar matcher masks its own row of the step's logits.

Per step: `start` hands the masks of the constrained rows to a worker thread before the model runs (the masks
depend only on tokens already accepted; llguidance computes them with the GIL released, so they overlap the
forward), `apply` waits for them and sets the disallowed logits of those rows to -inf, and after sampling
`accept` advances each matcher by its row's token. Rows without a constraint are never touched, and a step
without constrained rows does no grammar work at all. EOS is allowed by the mask only where the grammar accepts.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import llguidance
import torch

from engine.core.sequence import Sequence
from engine.worker.grammar import GrammarCompiler

MASK_THREADS = 2  # llguidance's threads for a batch of masks (a step rarely has many constrained rows)


@dataclass
class MaskJob:
    """The masks of one step's constrained rows, being computed: `rows` index the step's sampling logits."""

    rows: list[int]
    seq_ids: list[int]
    bitmask: torch.Tensor  # [len(rows), ceil(vocab / 32)] int32, bit t of a row set: token t allowed
    future: Future

    def wait(self) -> None:
        """Block until the masks are filled (re-raises a fault of the mask thread)."""
        self.future.result()


class GuidedDecoder:
    """The live matchers of constrained sequences (by seq_id), and the per-step mask work on them."""

    def __init__(self, compiler: GrammarCompiler) -> None:
        self.compiler = compiler
        self.vocab_size = compiler.vocab_size
        self.eos_token_ids = frozenset(compiler.eos_token_ids)
        self.matchers: dict[int, llguidance.LLMatcher] = {}
        self._pool: ThreadPoolExecutor | None = None  # started with the first constrained step
        self._executor: llguidance.LLExecutor | None = None

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self.matchers

    def __len__(self) -> int:
        return len(self.matchers)

    def add(self, seqs: list[Sequence]) -> None:
        """A matcher for each constrained sequence (a request's samples); ValueError when its grammar fails."""
        fresh = {s.seq_id: self.compiler.matcher(s.params.structured) for s in seqs if s.params.structured}
        self.matchers.update(fresh)

    def release(self, seq_id: int) -> None:
        """Forget a finished sequence's matcher (unknown ids are ignored)."""
        self.matchers.pop(seq_id, None)

    def start(self, seqs: list[Sequence]) -> MaskJob | None:
        """Begin the masks of the constrained sequences among this step's sampling `seqs` (in logits row order);
        None when none is constrained."""
        rows = [i for i, s in enumerate(seqs) if s.seq_id in self.matchers]
        if not rows:
            return None
        seq_ids = [seqs[i].seq_id for i in rows]
        words = (self.vocab_size + 31) // 32
        bitmask = torch.zeros((len(rows), words), dtype=torch.int32)
        pairs = [(self.matchers[seq_id], j) for j, seq_id in enumerate(seq_ids)]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-mask")
            self._executor = llguidance.LLExecutor(num_threads=MASK_THREADS)
        future = self._pool.submit(self._fill, pairs, bitmask)
        return MaskJob(rows, seq_ids, bitmask, future)

    def _fill(self, pairs: list[tuple[llguidance.LLMatcher, int]], bitmask: torch.Tensor) -> None:
        assert self._executor is not None, "the mask executor starts with the pool"
        self._executor.unsafe_compute_mask_ptr(pairs, bitmask.data_ptr(), bitmask.shape[1] * 4, len(pairs))

    @torch.inference_mode()  # the runner's logits are inference tensors
    def apply(self, logits: torch.Tensor, job: MaskJob) -> dict[int, str]:
        """Wait for the job's masks and apply them in place to their rows of float32 `logits` [rows, vocab];
        the errors by seq_id of rows whose grammar allows no token (those rows are left as they were)."""
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
            if matcher.is_error():
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

    def accept(self, seqs: list[Sequence], token_ids: list[int]) -> tuple[list[Sequence], dict[int, str]]:
        """Advance each constrained sequence's matcher by its sampled token. Returns the sequences whose grammar
        is complete with no way to go on (they stop now, without spending a step on EOS), and the errors by seq_id
        of those whose token the grammar refused."""
        ended: list[Sequence] = []
        errors: dict[int, str] = {}
        for seq, token_id in zip(seqs, token_ids, strict=True):
            matcher = self.matchers.get(seq.seq_id)
            if matcher is None:
                continue
            if not matcher.consume_token(token_id):
                errors[seq.seq_id] = f"structured output failed: {matcher.get_error().splitlines()[0]}"
            elif token_id not in self.eos_token_ids and matcher.is_stopped():
                ended.append(seq)
        return ended, errors

    def close(self) -> None:
        """Stop the mask thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bool [R, vocab_size] from an int32 bitmask [R, ceil(vocab / 32)] (bit t % 32 of word t // 32: token t)."""
    shifts = torch.arange(32, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # [R, W, 32]
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()
