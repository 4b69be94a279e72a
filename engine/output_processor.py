"""Per-request output bookkeeping: each sample's detokenizer and logprobs, a step's deltas, the RequestOutputs.

The scheduler alone writes a sequence's status. What ends a request here (a stop string in the text, an abort, a
fault attributable to one request) this module asks the scheduler to carry out, inside the per-request fault
boundary, so that such a fault fails that request only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from engine.core.outputs import (
    CompletionOutput,
    Logprob,
    PromptLogprobs,
    PromptProgress,
    RequestMetrics,
    RequestOutput,
)
from engine.core.scheduler import Scheduler
from engine.core.sequence import FinishReason, SamplingParams, Sequence
from engine.detokenizer import IncrementalDetokenizer

logger = logging.getLogger(__name__)


@dataclass
class SampleState:
    """One of a request's n samples: its sequence, its text so far and what this step added."""

    seq: Sequence
    detokenizer: IncrementalDetokenizer
    logprobs: list[Logprob] | None = None  # None until the first one arrives
    text_delta: str = ""  # text released since the last output
    num_new_tokens: int = 0  # tokens added since the last output

    @property
    def started(self) -> bool:
        """The first sample always; a forked one once it holds a token (only started samples are reported)."""
        return self.seq.sample_index == 0 or self.seq.num_output_tokens > 0


@dataclass
class RequestState:
    """A live request as outputs see it: its samples in index order, and the error that failed it, if any."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    samples: list[SampleState]
    error: str | None = None
    progress: PromptProgress | None = None  # the prompt's progress for the next output (report_progress)
    progress_sent: PromptProgress | None = None  # ... and the last one sent
    # with params.prompt_logprobs: one entry per prompt token (None first), filled as the prompt is read
    prompt_logprobs: list[Logprob | None] | None = None

    @property
    def finished(self) -> bool:
        return all(s.seq.is_finished for s in self.samples)


class OutputProcessor:
    """Turns the tokens of each step into text deltas and one RequestOutput per request that moved."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, scheduler: Scheduler) -> None:
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.request_states: dict[str, RequestState] = {}
        self._moved: dict[str, RequestState] = {}  # requests with news for the next outputs, in order of news
        self._progress_ids: set[str] = (
            set()
        )  # requests that report their prompt's progress until their first token

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.request_states

    def __len__(self) -> int:
        return len(self.request_states)

    def add_request(self, seqs: list[Sequence]) -> None:
        """Track a new request from its n sequences (sample order), a detokenizer for each."""
        first = seqs[0]
        prompt = first.token_ids[: first.num_prompt_tokens]
        if first.request_id in self.request_states:
            raise RuntimeError(f"request {first.request_id!r} is already tracked")
        samples = [
            SampleState(seq, IncrementalDetokenizer(self.tokenizer, prompt, seq.params.stop)) for seq in seqs
        ]
        state = RequestState(first.request_id, prompt, first.params, samples)
        if first.params.prompt_logprobs is not None:
            state.prompt_logprobs = [None] * len(prompt)
        self.request_states[first.request_id] = state
        if first.params.report_progress:
            self._progress_ids.add(first.request_id)

    def note_progress(self, waiting: Iterable[Sequence]) -> None:
        """After a step: an output for each request that asked for its prompt's progress (report_progress), has no
        token yet, and moved since its last one (more prompt read, or another place in the queue)."""
        if not self._progress_ids:
            return
        queue = {seq.request_id: place for place, seq in enumerate(waiting, 1) if seq.sample_index == 0}
        now = time.monotonic()
        for request_id in list(self._progress_ids):
            state = self.request_states.get(request_id)
            seq = state.samples[0].seq if state is not None else None
            if state is None or seq is None or seq.num_output_tokens or state.finished:
                self._progress_ids.discard(request_id)  # gone, or its tokens speak for it from now on
                continue
            total = len(state.prompt_token_ids)
            progress = PromptProgress(
                total=total,
                cached=seq.num_cached_tokens,
                processed=min(seq.num_computed_tokens, total),
                queue_position=queue.get(request_id),
                time_ms=round((now - seq.arrival_time) * 1000, 1),
            )
            if not progress.same_state(state.progress_sent):
                state.progress = state.progress_sent = progress
                self._moved[request_id] = state

    def add_logprobs(
        self,
        seqs: list[Sequence],
        logprobs: list[Logprob | None],
        accepted: dict[int, list[Logprob | None]] | None = None,
    ) -> None:
        """Record the logprobs of the tokens each sequence got this step (call after Scheduler.update): those of its
        accepted proposed tokens (`accepted`, by seq_id), then its sampled token's; None where its request did not
        ask for logprobs."""
        for seq, lp in zip(seqs, logprobs, strict=True):
            if lp is None:
                continue
            sample = self.request_states[seq.request_id].samples[seq.sample_index]
            if sample.logprobs is None:
                sample.logprobs = []
            got = [*(accepted or {}).get(seq.seq_id, ()), lp][: seq.num_new_tokens]
            sample.logprobs.extend(x for x in got if x is not None)

    def add_prompt_logprobs(self, scores: list[PromptLogprobs]) -> None:
        """Record a step's prompt-token scores (a prompt read again after a preemption scores the same tokens)."""
        for score in scores:
            state = self.request_states.get(score.request_id)
            if state is None or state.prompt_logprobs is None:
                continue
            state.prompt_logprobs[score.start : score.start + len(score.logprobs)] = score.logprobs

    def process_tokens(self, seqs: list[Sequence]) -> None:
        """Add the token each sequence just got to its text; a fault fails only that sequence's request."""
        for seq in seqs:
            state = self.request_states[seq.request_id]
            if state.error is not None:
                continue
            try:
                self._detokenize(state, state.samples[seq.sample_index])
            except Exception as exc:  # a fault attributable to one request fails only that request
                logger.exception("request %s failed in detokenization", seq.request_id)
                self.fail(seq.request_id, f"detokenization failed: {type(exc).__name__}: {exc}")

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its blocks; its final output comes next. Unknown ids are ignored."""
        state = self.request_states.get(request_id)
        if state is not None:
            self.scheduler.abort(request_id)
            self._moved[request_id] = state

    def fail(self, request_id: str, message: str) -> None:
        """End a request with an error (finish reason ERROR); only the first error of a request counts."""
        state = self.request_states.get(request_id)
        if state is None or state.error is not None:
            return
        state.error = message
        self.scheduler.abort(request_id, FinishReason.ERROR)
        self._moved[request_id] = state

    def make_outputs(self) -> list[RequestOutput]:
        """One output per request that moved since the last call; finished requests are forgotten after theirs."""
        outputs = []
        for state in self._moved.values():
            output = self._make_output(state)
            if output.finished:
                del self.request_states[state.request_id]
            outputs.append(output)
        self._moved.clear()
        return outputs

    def _detokenize(self, state: RequestState, sample: SampleState) -> None:
        """Add the sample's new tokens to its text, one at a time; a completed stop string finishes the sequence,
        and the tokens after the one that completed it (accepted proposed tokens of the same step) are dropped."""
        seq = sample.seq
        num_new = seq.num_new_tokens
        first = len(seq.token_ids) - num_new
        delta = ""
        for i in range(first, first + num_new):
            step = sample.detokenizer.step([seq.token_ids[i]])
            delta += step.text_delta
            if step.stop_string is not None:
                dropped = first + num_new - (i + 1)
                if dropped:
                    del seq.token_ids[i + 1 :]
                    num_new -= dropped
                    if sample.logprobs is not None and state.params.logprobs is not None:
                        del sample.logprobs[len(sample.logprobs) - dropped :]
                if not seq.is_finished:
                    self.scheduler.finish(seq, FinishReason.STOP, step.stop_string)
                elif dropped:  # a dropped token had finished it (EOS, max_tokens): the stop string came first
                    seq.finish_reason, seq.stop_reason = FinishReason.STOP, step.stop_string
                break
        else:
            if seq.is_finished:
                delta += (
                    sample.detokenizer.finish()
                )  # the held-back tail: no stop string can complete any more
        sample.text_delta += delta
        sample.num_new_tokens += num_new
        self._moved[state.request_id] = state

    def _make_output(self, state: RequestState) -> RequestOutput:
        finished = state.finished
        assert state.error is None or finished, f"request {state.request_id} failed but still runs"
        outputs = []
        for sample in state.samples:
            if not sample.started:
                continue
            seq = sample.seq
            outputs.append(
                CompletionOutput(
                    index=seq.sample_index,
                    text=sample.detokenizer.text,
                    token_ids=seq.output_token_ids,
                    text_delta=sample.text_delta,
                    num_new_tokens=sample.num_new_tokens,
                    logprobs=sample.logprobs if state.params.logprobs is not None else None,
                    finish_reason=FinishReason.ERROR if state.error is not None else seq.finish_reason,
                    stop_reason=seq.stop_reason,
                    num_draft_tokens=seq.num_draft_tokens,
                    num_accepted_tokens=seq.num_accepted_tokens,
                )
            )
            sample.text_delta, sample.num_new_tokens = "", 0
        first = state.samples[0].seq
        last_token_times = [s.seq.last_token_time for s in state.samples if s.seq.last_token_time is not None]
        metrics = RequestMetrics(
            arrival_time=first.arrival_time,
            first_token_time=first.first_token_time,
            finished_time=time.monotonic() if finished else None,
            first_scheduled_time=first.first_scheduled_time,
            last_token_time=max(last_token_times, default=None),
        )
        prompt_logprobs = None
        if state.prompt_logprobs is not None and first.num_output_tokens > 0:  # the prompt has been read
            missing = [i for i, lp in enumerate(state.prompt_logprobs) if lp is None and i > 0]
            assert not missing, f"request {state.request_id}: prompt tokens {missing[:8]} were never scored"
            prompt_logprobs = state.prompt_logprobs
        return RequestOutput(
            request_id=state.request_id,
            prompt_token_ids=state.prompt_token_ids,
            outputs=outputs,
            num_cached_tokens=first.num_cached_tokens,
            finished=finished,
            error=state.error,
            metrics=metrics,
            progress=_take_progress(state),
            prompt_logprobs=prompt_logprobs,
        )


def _take_progress(state: RequestState) -> PromptProgress | None:
    progress, state.progress = state.progress, None
    return progress
