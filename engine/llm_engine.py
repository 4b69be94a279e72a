"""LLMEngine: the synchronous step loop the service drives."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.core.config import EngineConfig
from engine.core.outputs import (
    CompletionOutput,
    Logprob,
    RequestMetrics,
    RequestOutput,
    ScheduledSequence,
    SchedulerOutput,
)
from engine.core.scheduler import Scheduler
from engine.core.sequence import FinishReason, SamplingParams, Sequence, SequenceStatus
from engine.core.stats import EngineStats, PoolSnapshot
from engine.detokenizer import IncrementalDetokenizer
from engine.loading.loader import (
    eos_token_ids,
    load_generation_config,
    load_hf_config,
    load_model,
    load_tokenizer,
    resolve_model_path,
)
from engine.worker.device import resolve_device, resolve_dtype
from engine.worker.kv_cache import KVCacheSpec, num_blocks_for_budget
from engine.worker.model_runner import ModelRunner
from engine.worker.profile import profile_peak_bytes
from engine.worker.sampler import Sampler, SamplingBatch

logger = logging.getLogger(__name__)


@dataclass
class _Request:
    """Engine-side bookkeeping of one request and its n samples."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    seqs: list[Sequence] = field(default_factory=list)
    detokenizers: dict[int, IncrementalDetokenizer] = field(default_factory=dict)
    logprobs: dict[int, list[Logprob]] = field(default_factory=dict)
    first_token_time: float | None = None
    error: str | None = None
    cache_salt: str | None = None

    @property
    def finished(self) -> bool:
        return len(self.seqs) == self.params.n and all(s.is_finished for s in self.seqs)


class LLMEngine:
    """Continuous-batching engine over a paged KV cache. Not thread-safe: one thread calls every method."""

    def __init__(self, config: EngineConfig) -> None:
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device)
        if config.num_threads is not None and device.type == "cpu":
            torch.set_num_threads(config.num_threads)
        path = resolve_model_path(config.model)
        self.model_name = path.name if Path(config.model).exists() else config.model
        hf_config = load_hf_config(path)
        self.config = config.resolve(
            model_max_len=int(hf_config.max_position_embeddings),
            device=str(device.type),
            dtype=str(dtype).removeprefix("torch."),
        )
        model, hf_config = load_model(path, dtype, device, max_model_len=self.config.max_model_len)
        self.tokenizer = load_tokenizer(path)
        self.eos_token_ids = eos_token_ids(hf_config, load_generation_config(path), self.tokenizer)
        self.vocab_size = int(hf_config.vocab_size)
        spec = KVCacheSpec(
            num_layers=model.args.num_layers,
            num_kv_heads=model.args.num_kv_heads,
            head_dim=model.args.head_dim,
            block_size=self.config.block_size,
            dtype=dtype,
        )
        peak = profile_peak_bytes(self.config, model, spec) if device.type == "cuda" else None
        num_blocks = num_blocks_for_budget(self.config, spec, peak)
        max_len = self.config.max_model_len
        if num_blocks * spec.block_size < max_len:
            raise ValueError(
                f"the KV pool holds {num_blocks * spec.block_size} tokens ({num_blocks} blocks of "
                f"{spec.block_size}), less than one max_model_len sequence ({max_len}): raise kv_cache_bytes / "
                f"memory_utilization or lower max_model_len"
            )
        self.kv_block_bytes = spec.block_bytes
        self.num_blocks = num_blocks
        self.runner = ModelRunner(self.config, model, spec, num_blocks)
        self.scheduler = Scheduler(self.config, num_blocks, self.eos_token_ids)
        self.sampler = Sampler()
        self._generator = torch.Generator().manual_seed(self.config.seed)
        self._seeded_generators: dict[int, torch.Generator] = {}
        self._requests: dict[str, _Request] = {}
        self._seq_ids = itertools.count()
        self._num_prompt_tokens_total = 0
        self._num_generation_tokens_total = 0
        self._num_steps = 0
        self._aborted: list[_Request] = []  # aborted since the last step: their final output is still owed
        logger.info("engine ready: %s", self.config)

    # ---- requests -------------------------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        *,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
    ) -> None:
        """Queue a request; bad input raises ValueError naming the problem and the limit.

        `cache_salt` (e.g. a tenant id) keeps its prefix-cache hits among requests with the same salt.
        """
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if isinstance(prompt, str):
            token_ids = self.tokenizer.encode(prompt, add_special_tokens=False) if prompt else []
        else:
            token_ids = [int(t) for t in prompt]
        if not token_ids:
            raise ValueError("the prompt is empty")
        bad = next((t for t in token_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        max_len = self.config.max_model_len
        if len(token_ids) + params.max_tokens > max_len:
            raise ValueError(
                f"prompt ({len(token_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds max_model_len "
                f"({max_len})"
            )
        now = time.monotonic() if arrival_time is None else arrival_time
        request = _Request(request_id, token_ids, params, now, cache_salt=cache_salt)
        seq = self._new_sequence(request, list(token_ids), sample_index=0)
        self._requests[request_id] = request
        self.scheduler.add_sequence(seq)

    def abort_request(self, request_id: str) -> None:
        """Stop a request now and free its blocks; unknown or finished ids are ignored."""
        request = self._requests.get(request_id)
        if request is None:
            return
        self.scheduler.abort(request_id)
        for seq in request.seqs:
            if not seq.is_finished:
                seq.status = SequenceStatus.FINISHED
                seq.finish_reason = FinishReason.ABORT
        self._aborted.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def num_unfinished_requests(self) -> int:
        return len(self._requests)

    # ---- the step -------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One iteration: schedule, run the model, sample, detokenize; outputs of the requests that moved."""
        touched: dict[str, dict[int, tuple[str, int]]] = {}
        for request in self._aborted:
            touched.setdefault(request.request_id, {})
        self._aborted.clear()
        out = self.scheduler.schedule()
        if not out.is_empty:
            self._num_steps += 1
            try:
                self._run(out, touched)
            except Exception as exc:  # a batched fault fails the requests of this step, not the engine
                logger.exception("engine step failed; failing %d requests", len(out.scheduled))
                for item in out.scheduled:
                    self._fail(
                        item.seq.request_id, f"engine step failed: {type(exc).__name__}: {exc}", touched
                    )
        return [self._make_output(rid, deltas) for rid, deltas in touched.items() if rid in self._requests]

    def _run(self, out: SchedulerOutput, touched: dict[str, dict[int, tuple[str, int]]]) -> None:
        self._num_prompt_tokens_total += sum(
            it.num_new_tokens for it in out.scheduled if it.seq.num_computed_tokens < it.seq.num_prompt_tokens
        )
        logits = self.runner.execute(out)
        rows: list[Sequence] = [item.seq for item in out.scheduled if item.samples]
        row_of: list[int] = list(range(len(rows)))
        for i, parent in enumerate(list(rows)):
            request = self._requests[parent.request_id]
            if (
                parent.sample_index == 0
                and parent.num_output_tokens == 0
                and len(request.seqs) < request.params.n
            ):
                for k in range(len(request.seqs), request.params.n):
                    child = self._new_sequence(request, list(parent.token_ids), sample_index=k)
                    child.num_computed_tokens = parent.num_computed_tokens
                    self.scheduler.fork(parent, child)
                    item = next(it for it in out.scheduled if it.seq is parent)
                    out.scheduled.append(ScheduledSequence(child, item.num_new_tokens))
                    rows.append(child)
                    row_of.append(i)
        if not rows:
            self.scheduler.update(out, {})
            return
        if len(row_of) != logits.shape[0]:
            logits = logits[torch.tensor(row_of)]
        batch = SamplingBatch.from_sequences(rows, self._seeded_generators, self._generator)
        sampled = self.sampler(logits, batch)
        token_of = {seq.seq_id: tok for seq, tok in zip(rows, sampled.token_ids)}
        newly = self.scheduler.update(out, token_of)
        self._num_generation_tokens_total += len(newly)
        now = time.monotonic()
        for seq, lp in zip(rows, sampled.logprobs):
            if lp is not None:
                self._requests[seq.request_id].logprobs.setdefault(seq.seq_id, []).append(lp)
        for seq in newly:
            request = self._requests.get(seq.request_id)
            if request is None or request.error is not None:
                continue
            if request.first_token_time is None:
                request.first_token_time = now
            try:
                self._detokenize(request, seq, touched)
            except Exception as exc:  # a fault attributable to one request fails only that request
                logger.exception("request %s failed in detokenization", seq.request_id)
                self._fail(seq.request_id, f"detokenization failed: {type(exc).__name__}: {exc}", touched)

    def _detokenize(
        self, request: _Request, seq: Sequence, touched: dict[str, dict[int, tuple[str, int]]]
    ) -> None:
        detok = request.detokenizers[seq.seq_id]
        result = detok.step([seq.token_ids[-1]])
        delta = result.text_delta
        if result.stop_string is not None and not seq.is_finished:
            self.scheduler.finish(seq, FinishReason.STOP, result.stop_string)
        if seq.is_finished and result.stop_string is None:
            delta += detok.finish()
        prev, n = touched.setdefault(request.request_id, {}).get(seq.sample_index, ("", 0))
        touched[request.request_id][seq.sample_index] = (prev + delta, n + 1)

    def _fail(self, request_id: str, message: str, touched: dict[str, dict[int, tuple[str, int]]]) -> None:
        request = self._requests.get(request_id)
        if request is None or request.error is not None:
            return
        request.error = message
        self.scheduler.abort(request_id)
        for seq in request.seqs:
            if not seq.is_finished:
                seq.status = SequenceStatus.FINISHED
            seq.finish_reason = FinishReason.ERROR
        touched.setdefault(request_id, {})

    def _make_output(self, request_id: str, deltas: dict[int, tuple[str, int]]) -> RequestOutput:
        request = self._requests[request_id]
        finished = (
            request.error is not None
            or request.finished
            or any(s.finish_reason is FinishReason.ABORT for s in request.seqs)
        )
        outputs = []
        for seq in request.seqs:
            delta, num_new = deltas.get(seq.sample_index, ("", 0))
            outputs.append(
                CompletionOutput(
                    index=seq.sample_index,
                    text=request.detokenizers[seq.seq_id].text,
                    token_ids=seq.output_token_ids,
                    text_delta=delta,
                    num_new_tokens=num_new,
                    logprobs=request.logprobs.get(seq.seq_id)
                    if request.params.logprobs is not None
                    else None,
                    finish_reason=seq.finish_reason,
                    stop_reason=seq.stop_reason,
                )
            )
        metrics = RequestMetrics(
            request.arrival_time, request.first_token_time, time.monotonic() if finished else None
        )
        if finished:
            del self._requests[request_id]
            for seq in request.seqs:
                self._seeded_generators.pop(seq.seq_id, None)
        return RequestOutput(
            request_id=request_id,
            prompt_token_ids=request.prompt_token_ids,
            outputs=outputs,
            num_cached_tokens=request.seqs[0].num_cached_tokens,
            finished=finished,
            error=request.error,
            metrics=metrics,
        )

    def _new_sequence(self, request: _Request, token_ids: list[int], sample_index: int) -> Sequence:
        seq = Sequence(
            seq_id=next(self._seq_ids),
            request_id=request.request_id,
            token_ids=token_ids,
            num_prompt_tokens=len(request.prompt_token_ids),
            params=request.params,
            arrival_time=request.arrival_time,
            sample_index=sample_index,
            cache_salt=request.cache_salt,
        )
        request.seqs.append(seq)
        request.detokenizers[seq.seq_id] = IncrementalDetokenizer(
            self.tokenizer, request.prompt_token_ids, request.params.stop
        )
        return seq

    # ---- introspection ---------------------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        """Counters for metrics and the admin page."""
        return dataclasses.replace(
            self.scheduler.stats(),
            num_prompt_tokens_total=self._num_prompt_tokens_total,
            num_generation_tokens_total=self._num_generation_tokens_total,
            num_steps=self._num_steps,
        )

    def snapshot(self) -> PoolSnapshot:
        """Every block's state and every live sequence's block table, consistent between steps."""
        snap = self.scheduler.snapshot()
        return dataclasses.replace(snap, stats=self.stats())

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of a chat rendered with the model's template."""
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
        )
        return list(ids)
