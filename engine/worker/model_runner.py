"""Owns the model, its paged KV cache, the sampler and the grammar masks: runs a step and samples its tokens."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

import torch

from engine.attention.backend import make_attention_backend
from engine.attention.metadata import AttentionMetadata
from engine.core.config import EngineConfig
from engine.core.outputs import Logprob, ModelRunnerOutput, PromptLogprobs, SchedulerOutput
from engine.core.sequence import Sequence
from engine.core.utils import cdiv
from engine.models.fused_decode import FusedDecoder, FusedStep
from engine.native.huge_pages import zeros_on_huge_pages
from engine.worker.grammar import GrammarCompiler
from engine.worker.guided import GuidedDecoder, MaskJob
from engine.worker.kv_cache import KVCacheSpec
from engine.worker.mask_budget import MaskBudget
from engine.worker.sampler import Sampler, SamplingBatch, score_rows

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepLogits:
    """A step's float32 logits [num_sampling_seqs, vocab] in the order of out.scheduled's sampling items, valid until
    the next step (the fused step's are a buffer it reuses); `argmax`, when the step computed it, is each row's first
    maximum: greedy's tokens, so the sampler need not search the logits again. `prompt_logprobs`: the scores of the
    prompt tokens this step's positions predict, for the requests that asked."""

    logits: torch.Tensor
    argmax: list[int] | None = None
    prompt_logprobs: list[PromptLogprobs] = field(default_factory=list)


DEFAULT_VERIFY_ROWS = (
    16  # a float model's bound on a verifying step's rows (QuantLinear's GEMV bound otherwise)
)
PROMPT_LOGITS_ROWS = (
    256  # prompt positions scored at once: bounds the [rows, vocab] logits a long prompt needs
)


class ModelRunner:
    """Runs one scheduled step: KV copies, input preparation, forward, grammar masks, sampling.

    `grammars`: the compiler of structured output's matchers; without it (a runner that only profiles the forward)
    no sequence may be constrained."""

    def __init__(
        self,
        config: EngineConfig,
        model: torch.nn.Module,
        spec: KVCacheSpec,
        num_blocks: int,
        grammars: GrammarCompiler | None = None,
    ) -> None:
        self.config = config
        self.model = model
        self.spec = spec
        self.num_blocks = num_blocks
        self.device = torch.device(config.device)
        self.backend = make_attention_backend(config.attention_backend)
        if self.device.type == "cpu" and hasattr(model, "use_cpu_fast_paths"):
            num_packed, fused = model.use_cpu_fast_paths()
            logger.info("CPU fast paths: %d prepacked linear weights, fused ops %s", num_packed, fused)
        # [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]; an int8 pool's fp16 scales beside it
        self.kv_cache, self.kv_scales = spec.allocate(num_blocks, self.device, zeros=zeros_on_huge_pages)
        self.kv_caches = spec.layers(self.kv_cache, self.kv_scales)
        self.fused: FusedDecoder | None = None
        if config.fused_decode and self.device.type == "cpu" and config.attention_backend == "torch":
            max_blocks_per_seq = cdiv(config.max_model_len, spec.block_size)
            self.fused = FusedDecoder.build(model, self.kv_caches, max_blocks_per_seq, config.max_num_seqs)
        self.sampler = Sampler()
        self.guided: GuidedDecoder | None = None
        if grammars is not None:
            budget = MaskBudget(config.guided_mask_max_s, config.guided_mask_budget_s)
            self.guided = GuidedDecoder(grammars, budget)
        self.generator = torch.Generator().manual_seed(config.seed)  # the draws of unseeded rows
        self.seeded_generators: dict[int, torch.Generator] = {}  # seq_id -> its own generator
        logger.info(
            "KV cache: %s, %d blocks x %d tokens (%.1f MiB, %d tokens)",
            spec.dtype_name,
            num_blocks,
            spec.block_size,
            num_blocks * spec.block_bytes / 2**20,
            num_blocks * spec.block_size,
        )

    @property
    def verify_max_rows(self) -> int:
        """The most query rows a decode step may have with proposed tokens: those that the linears still take on
        their few-row GEMV (engine/native/quant_linear.py), whose result for a row does not depend on the others; a
        float model's linears have no such bound (their rows are not bit-exact across counts: see the docs)."""
        qkv = self.model.layers[0].self_attn.qkv_proj if hasattr(self.model, "layers") else None
        max_rows = getattr(qkv, "gemv_max_rows", DEFAULT_VERIFY_ROWS)
        if self.fused is not None and self.fused.head_rows:
            max_rows = min(max_rows, self.fused.head_rows)
        return max_rows

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Apply copy-on-write block copies to every layer before the step stores new K/V."""
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], dtype=torch.long, device=self.device)
        dst = torch.tensor([d for _, d in copies], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            self.kv_cache[:, :, dst] = self.kv_cache[:, :, src]
            if self.kv_scales is not None:
                self.kv_scales[:, :, dst] = self.kv_scales[:, :, src]

    def prepare(
        self, out: SchedulerOutput
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """Flatten the step into input ids, positions and attention metadata; rows of the tokens that sample."""
        input_ids: list[int] = []
        positions: list[int] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        sample_rows: list[int] = []
        for item in out.scheduled:
            seq = item.seq
            start = seq.num_computed_tokens
            end = start + item.num_new_tokens
            if item.spec_token_ids:  # a decode row and one per proposed token, each attending as a decode
                input_ids.append(seq.token_ids[start])
                input_ids.extend(item.spec_token_ids)
                for pos in range(start, start + item.num_rows):
                    positions.append(pos)
                    query_lens.append(1)
                    seq_lens.append(pos + 1)
                    tables.append(seq.block_table)
                    sample_rows.append(len(positions) - 1)
                continue
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            query_lens.append(item.num_new_tokens)
            seq_lens.append(end)
            tables.append(seq.block_table)
            if item.samples:
                sample_rows.append(len(input_ids) - 1)
        dev = self.device
        meta = AttentionMetadata.build(query_lens, seq_lens, tables, self.spec.block_size, dev)
        ids = torch.tensor(input_ids, dtype=torch.long, device=dev)
        pos = torch.tensor(positions, dtype=torch.long, device=dev)
        return ids, pos, meta, sample_rows

    def _fused_decode(self, out: SchedulerOutput) -> FusedStep | None:
        """A step of one new token per sequence, few enough for the fused C step: what it computed (the logits too
        when every sequence samples), from plain lists (FusedDecoder.decode); None for any other step."""
        items = out.scheduled
        if self.fused is None or not items or any(item.num_new_tokens != 1 for item in items):
            return None
        if any(item.prompt_logprob_positions for item in items):  # the fused step has no logits for those
            return None
        token_ids: list[int] = []
        positions: list[int] = []
        tables: list[list[int]] = []
        for item in items:  # a proposed token is one more decode row of its sequence
            seq, pos = item.seq, item.seq.num_computed_tokens
            token_ids.append(seq.token_ids[pos])
            token_ids.extend(item.spec_token_ids)
            positions.extend(range(pos, pos + item.num_rows))
            tables.extend([seq.block_table] * item.num_rows)
        return self.fused.decode(token_ids, positions, tables, logits=all(item.samples for item in items))

    def add_sequences(self, seqs: list[Sequence]) -> None:
        """A grammar matcher for each constrained sequence of one request; ValueError when its grammar fails."""
        if self.guided is not None:
            self.guided.add(seqs)
        elif any(seq.params.structured for seq in seqs):
            raise RuntimeError("this runner has no grammar compiler: it cannot take structured output")

    def release(self, seq_id: int) -> None:
        """Forget a finished sequence's matcher and generator (unknown ids are ignored)."""
        if self.guided is not None:
            self.guided.release(seq_id)
        self.seeded_generators.pop(seq_id, None)

    def close(self) -> None:
        """Stop the grammar mask threads."""
        if self.guided is not None:
            self.guided.close()

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Run the step and sample the sequences that reached their last token (see ModelRunnerOutput)."""
        seqs, rows = out.sampling_rows()
        proposed = {item.seq.seq_id: item.spec_token_ids for item in out.scheduled if item.spec_token_ids}
        # constrained rows' grammar masks (a verification row's as if the proposed tokens before it were taken),
        # computed while the model runs
        # (without proposals the masks index the sampling rows in order, as _sample picks them from the logits)
        masks = None
        if self.guided is not None:
            masks = self.guided.start(seqs, rows, proposed) if proposed else self.guided.start(seqs)
        try:
            step = self.forward(out)
        finally:
            if masks is not None:
                masks.wait()  # never leave the mask thread holding matchers past this step
        if not seqs:
            return ModelRunnerOutput(prompt_logprobs=step.prompt_logprobs)
        if proposed:
            result = self._verify(seqs, rows, step, proposed, masks)
        else:
            result = self._sample(seqs, rows, step, masks)
        return dataclasses.replace(result, prompt_logprobs=step.prompt_logprobs)

    def _verify(
        self,
        seqs: list[Sequence],
        rows: list[int],
        step: StepLogits,
        proposed: dict[int, tuple[int, ...]],
        masks: MaskJob | None = None,
    ) -> ModelRunnerOutput:
        """A step whose sequences (some of them) verify proposed tokens: each such sequence has a row per proposed
        token after its own, and keeps its proposed tokens up to the first its model does not take (Sampler.verify);
        its token is the one sampled at that row (or, all kept, at the row after the last). The other sequences
        sample as in any step. Constrained rows are masked first (a proposed token the grammar refuses is
        rejected), and each constrained sequence's matcher then takes the tokens it got."""
        errors: dict[int, str] = {}
        argmax = step.argmax
        if masks is not None:
            errors, argmax = self.guided.apply(step.logits, masks), None  # masked in place: argmax is stale
        plain = [i for i, seq in enumerate(seqs) if seq.seq_id not in proposed]
        token_ids: list[int] = [0] * len(seqs)
        logprobs: list[Logprob | None] = [None] * len(seqs)
        if plain:
            picked = torch.tensor([rows[i] for i in plain])
            plain_argmax = None if argmax is None else [argmax[rows[i]] for i in plain]
            batch = SamplingBatch.from_sequences(
                [seqs[i] for i in plain], self.seeded_generators, self.generator
            )
            sampled = self.sampler(step.logits.index_select(0, picked), batch, plain_argmax)
            for i, token, lp in zip(plain, sampled.token_ids, sampled.logprobs, strict=True):
                token_ids[i], logprobs[i] = token, lp
        verifying = [i for i, seq in enumerate(seqs) if seq.seq_id in proposed]
        row_seqs, row_ids, proposals, histories = [], [], [], []
        for i in verifying:
            spec = proposed[seqs[i].seq_id]
            for j in range(len(spec) + 1):
                row_seqs.append(seqs[i])
                row_ids.append(rows[i] + j)
                proposals.append(spec[j] if j < len(spec) else -1)
                histories.append(spec[:j])
        batch = SamplingBatch.from_sequences(row_seqs, self.seeded_generators, self.generator, histories)
        verdict = self.sampler.verify(step.logits.index_select(0, torch.tensor(row_ids)), batch, proposals)
        accepted: dict[int, list[int]] = {}
        accepted_logprobs: dict[int, list[Logprob | None]] = {}
        row = 0
        for i in verifying:
            seq_id = seqs[i].seq_id
            spec = proposed[seq_id]
            num_kept = 0
            while num_kept < len(spec) and verdict.accepted[row + num_kept]:
                num_kept += 1
            accepted[seq_id] = list(spec[:num_kept])
            accepted_logprobs[seq_id] = verdict.logprobs[row : row + num_kept]
            token_ids[i], logprobs[i] = verdict.token_ids[row + num_kept], verdict.logprobs[row + num_kept]
            row += len(spec) + 1
        ended: list[Sequence] = []
        if masks is not None:
            for i in verifying:  # a grammar complete on a kept token: the sequence stops with that token
                seq_id = seqs[i].seq_id
                end = self.guided.completion_index(seq_id, accepted[seq_id])
                if end is not None and seq_id not in errors:
                    token_ids[i], logprobs[i] = accepted[seq_id][end], accepted_logprobs[seq_id][end]
                    accepted[seq_id] = accepted[seq_id][:end]
                    accepted_logprobs[seq_id] = accepted_logprobs[seq_id][:end]
            got = [[*accepted.get(seq.seq_id, ()), token] for seq, token in zip(seqs, token_ids, strict=True)]
            ended, refused = self.guided.accept(seqs, got, errors)
            errors.update(refused)
        return ModelRunnerOutput(
            seqs, token_ids, logprobs, errors, ended, accepted=accepted, accepted_logprobs=accepted_logprobs
        )

    def _sample(
        self, seqs: list[Sequence], rows: list[int], step: StepLogits, masks: MaskJob | None
    ) -> ModelRunnerOutput:
        """The sampled tokens of `seqs` from their `rows` of the step's logits, their grammars masked and advanced."""
        logits, argmax = step.logits, step.argmax
        if len(rows) != logits.shape[0]:  # samples forked this step draw from their first sample's row
            logits = logits[torch.tensor(rows)]
            argmax = None if argmax is None else [argmax[r] for r in rows]
        errors: dict[int, str] = {}
        ended: list[Sequence] = []
        if masks is not None:
            errors, argmax = self.guided.apply(logits, masks), None  # masked in place: argmax is stale
        batch = SamplingBatch.from_sequences(seqs, self.seeded_generators, self.generator)
        sampled = self.sampler(logits, batch, argmax)
        if masks is not None:
            ended, refused = self.guided.accept(seqs, sampled.token_ids, errors)
            errors.update(refused)
        return ModelRunnerOutput(seqs, sampled.token_ids, sampled.logprobs, errors, ended)

    def forward(self, out: SchedulerOutput) -> StepLogits:
        """Run the step's forward; the logits of the sequences that sample (see StepLogits)."""
        self.copy_blocks(out.block_copies)
        fused = self._fused_decode(out)
        if fused is not None and fused.logits is not None:  # no torch call at all (not even inference_mode's)
            return StepLogits(fused.logits, fused.argmax)
        return self._logits(out, fused)

    @torch.inference_mode()
    def _logits(self, out: SchedulerOutput, fused: FusedStep | None) -> StepLogits:
        """The step's logits through the modules: its forward too, unless the fused step ran it."""
        if fused is not None:
            hidden = fused.hidden
            sample_rows, row = [], 0
            for item in out.scheduled:
                if item.samples:
                    sample_rows.extend(range(row, row + item.num_rows))
                row += item.num_rows
        else:
            ids, pos, meta, sample_rows = self.prepare(out)
            self.backend.prepare(meta)
            hidden = self.model(ids, pos, self.kv_caches, meta, self.backend)
        prompt_logprobs = self._prompt_logprobs(out, hidden) if fused is None else []
        if not sample_rows:
            return StepLogits(torch.empty(0, 0), prompt_logprobs=prompt_logprobs)
        if len(sample_rows) != hidden.shape[0]:  # a decode step samples every row, in order: nothing to pick
            hidden = hidden.index_select(0, torch.tensor(sample_rows, dtype=torch.long, device=self.device))
        return StepLogits(self.model.compute_logits(hidden).float().cpu(), prompt_logprobs=prompt_logprobs)

    def _prompt_logprobs(self, out: SchedulerOutput, hidden: torch.Tensor) -> list[PromptLogprobs]:
        """Score the prompt tokens that this step's positions predict, for each sequence whose request asked
        (`hidden`: [num_batched_tokens, hidden] of the step, in out.scheduled's order)."""
        scores: list[PromptLogprobs] = []
        first_row = 0
        for item in out.scheduled:
            positions = item.prompt_logprob_positions
            if positions:
                seq = item.seq
                row0 = first_row + positions.start - seq.num_computed_tokens
                logprobs = []
                for lo in range(0, len(positions), PROMPT_LOGITS_ROWS):
                    hi = min(lo + PROMPT_LOGITS_ROWS, len(positions))
                    logits = self.model.compute_logits(hidden[row0 + lo : row0 + hi]).float().cpu()
                    targets = seq.token_ids[positions.start + lo + 1 : positions.start + hi + 1]
                    logprobs += score_rows(logits, targets, seq.params.prompt_logprobs or 0)
                scores.append(PromptLogprobs(seq.request_id, positions.start + 1, logprobs))
            first_row += item.num_rows
        return scores
