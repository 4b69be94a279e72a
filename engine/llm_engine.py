"""LLMEngine: the synchronous step loop the service drives."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
import weakref

import torch

from engine.core.config import EngineConfig
from engine.core.hash_chain import ChainKey, salt_tag
from engine.core.limits import check_prompt
from engine.core.memory import (
    available_memory_bytes,
    check_kv_pool_fits,
    fitted_max_model_len,
    human_bytes,
    trim_heap,
)
from engine.core.outputs import CachePurge, RequestOutput, SchedulerOutput
from engine.core.resolve import resolve_device
from engine.core.scheduler import Scheduler
from engine.core.sequence import FinishReason, SamplingParams, Sequence
from engine.core.speculative import make_spec_planner
from engine.core.stats import CacheDigest, EngineStats, PoolSnapshot
from engine.core.structured import StructuredOutput
from engine.loading.engine_model import EngineModel, load_draft_model, load_engine_model
from engine.loading.memory import log_memory, weight_memory
from engine.output_processor import OutputProcessor
from engine.tiers.setup import open_disk_tier
from engine.worker.device import probe_machine
from engine.worker.draft import DraftProposer
from engine.worker.grammar import GrammarCompiler
from engine.worker.kv_cache import KVCacheSpec, num_blocks_for_budget
from engine.worker.model_runner import ModelRunner
from engine.worker.profile import profile_peak_bytes
from engine.worker.step_clock import StepClock, StepTimings

logger = logging.getLogger(__name__)

LOAD_POLL_S = 0.002  # how long an idle step waits for a disk load, so new requests and aborts are not held up
# an engine never closed (a script that ends after LLM.generate) writes its disk tier's queue for at most this long when
# it is collected or the interpreter exits: a writer still copying tensors while Python shut down aborted the process
TIER_DRAIN_ON_EXIT_S = 10.0


def kv_spec(loaded: EngineModel) -> KVCacheSpec:
    """The shape of a loaded model's KV pool."""
    args = loaded.model.args
    return KVCacheSpec(
        num_layers=args.num_layers,
        num_kv_heads=args.num_kv_heads,
        head_dim=args.head_dim,
        block_size=loaded.config.block_size,
        dtype=loaded.dtype,
        kv_cache_dtype=loaded.config.kv_cache_dtype,
    )


class LLMEngine:
    """Continuous-batching engine over a paged KV cache. Not thread-safe: one thread calls every method."""

    def __init__(self, config: EngineConfig) -> None:
        machine = probe_machine(config.device)
        if config.num_threads is not None and resolve_device(config.device, machine) == "cpu":
            torch.set_num_threads(config.num_threads)  # before the weights load: dequantizing uses them
        loaded = load_engine_model(config, machine)  # `config` resolved (engine/core/resolve.py)
        self.config, self.model_name = loaded.config, loaded.model_name
        model, hf_config, self.tokenizer = loaded.model, loaded.hf_config, loaded.tokenizer
        self.eos_token_ids = loaded.eos_token_ids
        # what the model's generation config sets (a request's own fields and the server's flags win)
        self.sampling_defaults = loaded.sampling_defaults
        self.vocab_size = int(hf_config.vocab_size)
        spec = kv_spec(loaded)
        # a draft model (speculative_method draft) loads before the pools are sized: its KV pool, as many tokens as
        # the target's, comes out of the same budget
        draft = None
        if self.config.speculative_method == "draft":
            draft = load_draft_model(config, self.config, machine, self.tokenizer)
        draft_spec = kv_spec(draft) if draft is not None else None
        # max_model_len unset: the model's own limit, or the longest sequence the pool holds
        num_blocks = self._num_blocks(
            model, spec, fit_max_len=config.max_model_len is None, draft_spec=draft_spec
        )
        self.kv_block_bytes = spec.block_bytes
        self.kv_cache_dtype = spec.dtype_name
        # what a block would take in an int8 pool (None: it is one), for the advice on a pool that preempts
        self.kv_int8_block_bytes = (
            None if spec.quantized else dataclasses.replace(spec, kv_cache_dtype="int8").block_bytes
        )
        self.num_blocks = num_blocks
        self.weight_memory = weight_memory(model)
        self.grammars = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_token_ids)
        self.runner = ModelRunner(self.config, model, spec, num_blocks, self.grammars)
        log_memory(self.weight_memory, num_blocks * spec.block_bytes, num_blocks)
        source = loaded.source
        self.tier = open_disk_tier(
            self.config,
            (source.gguf, source.folder),
            self._kv_settings(spec),
            self.runner.kv_cache,
            self.runner.kv_scales,
        )
        if self.tier is not None:  # its threads hold it (and the pool): close it when the engine goes
            weakref.finalize(self, self.tier.close, TIER_DRAIN_ON_EXIT_S)
        proposer = None
        if draft is not None:
            draft_runner = ModelRunner(draft.config, draft.model, draft_spec, num_blocks)
            proposer = DraftProposer(
                draft_runner, num_blocks, self.config.block_size, self.config.max_num_batched_tokens,
                self.config.prefix_cache_salt, self.vocab_size,
            )  # fmt: skip
        self.spec = make_spec_planner(self.config, self.runner.verify_max_rows, proposer)
        self.scheduler = Scheduler(
            self.config,
            num_blocks,
            self.eos_token_ids,
            kv_cache_dtype=self.kv_cache_dtype,
            kv_block_bytes=self.kv_block_bytes,
            tier=self.tier,
            spec=self.spec,
        )
        self.output_processor = OutputProcessor(self.tokenizer, self.scheduler)
        self._seq_ids = itertools.count()
        # step_timing: each decode-only step's linears, attention and the rest, per batch size (stats().step_timings)
        self._step_clock = StepClock(self.runner) if self.config.step_timing else None
        self._step_timings = StepTimings()
        trim_heap()  # loading's freed memory back to the system (engine.core.memory.trim_heap)
        logger.info("engine ready: %s", self.config)

    def _num_blocks(
        self,
        model: torch.nn.Module,
        spec: KVCacheSpec,
        *,
        fit_max_len: bool,
        draft_spec: KVCacheSpec | None = None,
    ) -> int:
        """The KV pool's blocks within the memory budget (a draft model's pool, `draft_spec`, takes as many blocks
        out of it). With `fit_max_len` (max_model_len unset: the model's own limit so far) a pool that holds less
        shortens max_model_len to what it holds, said in one line; an explicit max_model_len the pool cannot hold is
        a ValueError."""
        peak = profile_peak_bytes(self.config, model, spec) if self.config.device == "cuda" else None
        draft_bytes = draft_spec.block_bytes if draft_spec is not None else 0
        num_blocks = num_blocks_for_budget(
            self.config, spec, peak, hold_one=not fit_max_len, draft_block_bytes=draft_bytes
        )
        if self.config.kv_cache_bytes is not None:  # the default budgets are shares of what is free already
            self._check_pool_fits(model, num_blocks * (spec.block_bytes + draft_bytes))
        max_len = self.config.max_model_len
        assert max_len is not None, "the config is resolved"
        pool_tokens = num_blocks * spec.block_size
        if pool_tokens >= max_len:
            return num_blocks
        if not fit_max_len:
            raise ValueError(
                f"the KV pool holds {pool_tokens} tokens ({num_blocks} blocks of {spec.block_size}), less than one "
                f"max_model_len sequence ({max_len}): raise --kv-cache-bytes (GPU: --memory-utilization) or lower "
                "--max-model-len"
            )
        fitted = fitted_max_model_len(max_len, pool_tokens, spec.block_size)
        logger.warning(
            "max_model_len %d, not the model's %d: the KV pool (%s) holds %d tokens; --max-model-len and "
            "--kv-cache-bytes change it",
            fitted,
            max_len,
            human_bytes(num_blocks * spec.block_bytes),
            pool_tokens,
        )
        self.config = dataclasses.replace(self.config, max_model_len=fitted)
        return num_blocks

    def _check_pool_fits(self, model: torch.nn.Module, pool_bytes: int) -> None:
        """An explicit pool must fit in what the machine (or the GPU) has left with the weights in."""
        if self.config.device == "cpu":
            available, where = available_memory_bytes(), "the machine"
        else:
            available, where = torch.cuda.mem_get_info(torch.device(self.config.device))[0], "the GPU"
        check_kv_pool_fits(pool_bytes, weight_memory(model).total, available, where)

    def _kv_settings(self, spec: KVCacheSpec) -> dict[str, object]:
        """What shapes a stored KV block beside the weights: part of the disk tier's fingerprint."""
        return {
            "dtype": str(spec.dtype),
            "kv_cache_dtype": spec.dtype_name,
            "quantization": self.config.quantization,
            "int8_activations": self.config.int8_activations,
            "batch_gemm": self.config.batch_gemm,  # a prefill's KV follows its GEMM's rounding
            "device": self.config.device,
            "layout": [spec.num_layers, 2, spec.block_size, spec.num_kv_heads, spec.head_dim],
        }

    # ---- requests -------------------------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        *,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
        public_prefix_len: int = 0,
    ) -> None:
        """Queue a request; bad input raises ValueError naming the problem and the limit.

        `cache_salt` (e.g. a tenant id) keeps its prefix-cache hits among requests with the same salt, except for
        the blocks wholly inside its first `public_prefix_len` tokens (a published prompt), which anyone shares.
        """
        if request_id in self.output_processor:
            raise ValueError(f"request id {request_id!r} is already in use")
        if isinstance(prompt, str):
            token_ids = self.tokenizer.encode(prompt, add_special_tokens=False) if prompt else []
        else:
            token_ids = [int(t) for t in prompt]
        check_prompt(
            token_ids,
            params.max_tokens,
            public_prefix_len,
            vocab_size=self.vocab_size,
            max_model_len=self.config.max_model_len,
        )
        chain_key = ChainKey(cache_salt, public_prefix_len)
        now = time.monotonic() if arrival_time is None else arrival_time
        # all n samples now; the scheduler forks samples 1.. from sample 0 in the step that completes the prompt
        seqs = [
            Sequence(
                seq_id=next(self._seq_ids),
                request_id=request_id,
                token_ids=list(token_ids),
                num_prompt_tokens=len(token_ids),
                params=params,
                arrival_time=now,
                sample_index=k,
                chain_key=chain_key,
            )
            for k in range(params.n)
        ]
        # ValueError before anything is queued when the grammar does not build
        self.runner.add_sequences(seqs)
        try:
            self.scheduler.add_sequence(seqs[0], forks=seqs[1:])
        except BaseException:
            for seq in seqs:
                self.runner.release(seq.seq_id)
            raise
        self.output_processor.add_request(seqs)

    def abort_request(self, request_id: str) -> None:
        """Stop a request now and free its blocks; unknown or finished ids are ignored."""
        seqs = self.scheduler.get_sequences(request_id)
        seqs += [fork for seq in seqs for fork in self.scheduler.unforked.get(seq.seq_id, ())]
        self.output_processor.abort(request_id)
        for seq in seqs:  # now, not at the next step: an idle engine takes none
            self.runner.release(seq.seq_id)

    def has_unfinished_requests(self) -> bool:
        """True while a request is live, or a disk load of an aborted one still holds pool blocks (the next steps
        take it and free them)."""
        return len(self.output_processor) > 0 or bool(self.scheduler.loading)

    def num_unfinished_requests(self) -> int:
        return len(self.output_processor)

    # ---- the step -------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One iteration: schedule, run the model, sample, detokenize; outputs of the requests that moved."""
        started = time.perf_counter()
        if self._step_clock is not None:
            self._step_clock.reset()
        out = self.scheduler.schedule()
        for seq_id in out.finished_seq_ids:
            self.runner.release(seq_id)
        if out.is_empty and self.scheduler.loading and self.tier is not None:
            self.tier.wait_for_load(LOAD_POLL_S)  # only loads are in flight: wait for one instead of spinning
        if not out.is_empty:
            try:
                got_token = self._run(out)
                self.output_processor.process_tokens(got_token)
            except Exception as exc:  # a batched fault fails the requests of this step, not the engine
                logger.exception("engine step failed; failing %d requests", len(out.scheduled))
                for item in out.scheduled:
                    self.output_processor.fail(
                        item.seq.request_id, f"engine step failed: {type(exc).__name__}: {exc}"
                    )
        self.output_processor.note_progress(self.scheduler.waiting)
        outputs = self.output_processor.make_outputs()
        if self.spec is not None and out.is_decode:  # what a step of so many rows costs, for the next plans
            elapsed = time.perf_counter() - started - self.spec.proposing_seconds  # a draft's rounds: apart
            self.spec.step_times.add(out.num_batched_tokens, elapsed)
        if self._step_clock is not None and out.scheduled and out.num_batched_tokens == len(out.scheduled):
            self._step_timings.add(
                len(out.scheduled), time.perf_counter() - started, *self._step_clock.read()
            )
        return outputs

    def _run(self, out: SchedulerOutput) -> list[Sequence]:
        """Run the model and sample (the runner), fail the requests its grammars refused, advance the sequences;
        those that got a token."""
        result = self.runner.execute(out)
        for seq in result.seqs:  # failed before update: the scheduler then appends nothing to them
            if seq.seq_id in result.errors:
                self.output_processor.fail(seq.request_id, result.errors[seq.seq_id])
        self.output_processor.add_prompt_logprobs(result.prompt_logprobs)
        got_token = self.scheduler.update(out, result.seq_id_to_token_id(), accepted=result.accepted)
        self.output_processor.add_logprobs(result.seqs, result.logprobs, result.accepted_logprobs)
        # the grammar is complete and cannot go on: stop now instead of sampling EOS next
        for seq in result.grammar_ended:
            if seq.finish_reason is FinishReason.LENGTH:  # its last allowed token completed it: not cut
                seq.finish_reason = FinishReason.STOP
            self.scheduler.finish(seq, FinishReason.STOP)
        return got_token

    def check_structured(self, structured: StructuredOutput) -> None:
        """Build (and cache) the constraint's matcher with this engine's tokenizer; ValueError when it fails.
        Thread-safe: the service calls it off the engine thread, so a new grammar's build never stalls a step."""
        self.grammars.matcher(structured)

    def close(self, timeout: float = 10.0) -> None:
        """Write the disk tier's queued blocks (within `timeout` seconds) and release its directory."""
        self.runner.close()
        if self.tier is not None:
            self.tier.close(timeout)

    def purge_cache_salt(self, cache_salt: str) -> CachePurge:
        """Forget a tenant's cached blocks (e.g. when its account goes), in the RAM pool and on the disk tier: every
        salt whose first line is `cache_salt`'s (see hash_chain.salt_tag). Blocks its running requests hold are
        theirs: abort those first."""
        tag = salt_tag(cache_salt)
        ram = self.scheduler.block_manager.purge_salt(tag)
        return CachePurge(ram_blocks=ram, disk_blocks=self.tier.purge(tag) if self.tier is not None else 0)

    # ---- introspection ---------------------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        """Counters for metrics and the admin page: the scheduler's, the weights' bytes and the memory left."""
        return self._with_engine_figures(self.scheduler.stats())

    def _with_engine_figures(self, stats: EngineStats) -> EngineStats:
        """The scheduler's stats with the weights' bytes, the memory left and (step_timing on) the step timings."""
        stats = dataclasses.replace(
            stats,
            weight_bytes_blocks=self.weight_memory.blocks,
            weight_bytes_float=self.weight_memory.float,
            memory_available_bytes=available_memory_bytes() or 0,
        )
        if self._step_clock is None:
            return stats
        return dataclasses.replace(stats, step_timings=self._step_timings.snapshot())

    def cache_digest(self) -> CacheDigest:
        """The RAM pool's cached hash prefixes and the queue and pool counts a replica router scores against; cheap
        (one copy of 8 bytes a block, none while nothing changed). Call on the engine thread, like every other method."""
        return self.scheduler.cache_digest()

    def snapshot(self, hash_block_ids: range | None = None) -> PoolSnapshot:
        """Every block's state and every live sequence's block table, consistent between steps (block hashes of
        `hash_block_ids` only, when given)."""
        snap = self.scheduler.snapshot(hash_block_ids)
        return dataclasses.replace(snap, stats=self._with_engine_figures(snap.stats))

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of a chat rendered with the model's template."""
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
        )
        return list(ids)
