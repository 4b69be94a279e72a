"""Plain dataclasses that layers pass to each other: what a step schedules and what a request has produced."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.sequence import FinishReason, Sequence


@dataclass(frozen=True)
class CachePurge:
    """What purging a tenant's cached blocks removed: blocks the RAM pool forgot, block files the disk tier deleted."""

    ram_blocks: int
    disk_blocks: int


@dataclass
class ScheduledSequence:
    """One sequence's share of a step: compute tokens [seq.num_computed_tokens, + num_new_tokens)."""

    seq: Sequence
    num_new_tokens: int
    # tokens proposed to follow the sequence's last one (speculative decoding): the step computes them too, one query
    # row each after the real token's, and keeps the KV of those the target model agrees with
    spec_token_ids: tuple[int, ...] = ()

    @property
    def num_rows(self) -> int:
        """Query rows this step runs for the sequence: its new tokens and its proposed ones."""
        return self.num_new_tokens + len(self.spec_token_ids)

    @property
    def samples(self) -> bool:
        """True when this step reaches the end of the sequence's known tokens, so a next token is sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens == len(self.seq.token_ids)

    @property
    def prompt_logprob_positions(self) -> range:
        """Positions this step computes whose next token is a prompt token, where the request asks for prompt
        logprobs: the logits at position p score prompt token p + 1 (the last prompt position samples instead)."""
        seq = self.seq
        if not seq.needs_prompt_logprobs:
            return range(0)
        start = seq.num_computed_tokens
        return range(start, min(start + self.num_new_tokens, seq.num_prompt_tokens - 1))


@dataclass
class SchedulerOutput:
    """What one engine step runs. `block_copies` (src, dst) must be applied to the KV cache before the step's store."""

    scheduled: list[ScheduledSequence] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # samples forked this step from a first sample that completes its prompt: they share its KV (the model does
    # not run them) and draw their first token from its logits
    forked: list[ScheduledSequence] = field(default_factory=list)
    # sequences finished since the previous step, whose per-sequence state (e.g. a seeded generator) can go
    finished_seq_ids: list[int] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        """Query rows of the step: its new tokens and the proposed ones."""
        return sum(s.num_rows for s in self.scheduled)

    @property
    def is_decode(self) -> bool:
        """Every scheduled sequence computes one new token (and maybe proposed ones) past its prompt and samples."""
        return bool(self.scheduled) and all(
            s.num_new_tokens == 1 and s.samples and s.seq.num_output_tokens > 0 for s in self.scheduled
        )

    @property
    def num_spec_tokens(self) -> int:
        return sum(len(s.spec_token_ids) for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    def sampling_rows(self) -> tuple[list[Sequence], list[int]]:
        """The sequences that sample a token this step, and each one's first row of the model's logits (which has a
        row per sampling sequence of `scheduled`, in order, and after it one per proposed token): forked samples come
        last and use their first sample's. Read it before Scheduler.update, which moves the progress that `samples`
        is computed from."""
        seqs, rows, row = [], [], 0
        for s in self.scheduled:
            if s.samples:
                seqs.append(s.seq)
                rows.append(row)
                row += 1 + len(s.spec_token_ids)
        if self.forked:
            row_of_request = {
                seq.request_id: r for seq, r in zip(seqs, rows, strict=True) if seq.sample_index == 0
            }
            for s in self.forked:
                seqs.append(s.seq)
                rows.append(row_of_request[s.seq.request_id])
        return seqs, rows


@dataclass
class Logprob:
    """A token id with its log-probability, and the top alternatives at that position."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)
    rank: int | None = None  # 1 + how many tokens are likelier (prompt logprobs set it; vLLM's meaning)


@dataclass(frozen=True)
class PromptLogprobs:
    """A step's scores of some of a request's prompt tokens: `logprobs[j]` is prompt token `start + j`'s."""

    request_id: str
    start: int
    logprobs: list[Logprob]


@dataclass(frozen=True)
class ModelRunnerOutput:
    """What the model runner produced in a step: for each sequence that sampled (`seqs`, in sampling order), its
    token and, where its request asked, its Logprob; the requests its grammars fail, and the sequences whose grammar
    completed (no step is spent on their EOS)."""

    seqs: list[Sequence] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Logprob | None] = field(default_factory=list)
    # seq_id -> why its request fails this step (the scheduler then appends nothing to it)
    errors: dict[int, str] = field(default_factory=dict)
    grammar_ended: list[Sequence] = field(default_factory=list)
    prompt_logprobs: list[PromptLogprobs] = field(default_factory=list)  # for requests that asked
    # seq_id -> the proposed tokens it accepted, which come before its token of `token_ids` (speculative decoding),
    # and their Logprobs where its request asked
    accepted: dict[int, list[int]] = field(default_factory=dict)
    accepted_logprobs: dict[int, list[Logprob | None]] = field(default_factory=dict)

    def seq_id_to_token_id(self) -> dict[int, int]:
        """seq_id -> its sampled token, as Scheduler.update takes them."""
        return {seq.seq_id: token_id for seq, token_id in zip(self.seqs, self.token_ids, strict=True)}


@dataclass
class CompletionOutput:
    """One of a request's n samples, as far as it has come."""

    index: int
    text: str
    token_ids: list[int]
    text_delta: str = ""  # text added since the previous output of this request
    num_new_tokens: int = 0
    logprobs: list[Logprob] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    # speculative decoding: tokens proposed for this sample and verified, and of those the ones it kept
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class RequestMetrics:
    """When a request arrived (queued in the engine), was first scheduled, got its first and its last token, and
    finished (time.monotonic seconds; None until it happens). Of its n samples: the first sample's scheduling and
    first token, the last token of any."""

    arrival_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    first_scheduled_time: float | None = None
    last_token_time: float | None = None

    @property
    def queue_time(self) -> float | None:
        """Waiting before the first step that ran it (a disk-tier load included)."""
        return _span(self.arrival_time, self.first_scheduled_time)

    @property
    def prefill_time(self) -> float | None:
        """From the first step that ran it to its first token."""
        return _span(self.first_scheduled_time, self.first_token_time)

    @property
    def decode_time(self) -> float | None:
        """From its first token to its last."""
        return _span(self.first_token_time, self.last_token_time)

    @property
    def inference_time(self) -> float | None:
        """From the first step that ran it to its last token (prefill + decode)."""
        return _span(self.first_scheduled_time, self.last_token_time)


def _span(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


@dataclass(frozen=True)
class PromptProgress:
    """How far a request's prompt has been read, before its first token: `processed` of `total` prompt tokens have
    their KV (of them `cached` came from the prefix cache), and `queue_position` (1: next) while it waits to be
    scheduled (None once it runs). `time_ms`: since the request arrived."""

    total: int
    cached: int
    processed: int
    queue_position: int | None
    time_ms: float

    def same_state(self, other: PromptProgress | None) -> bool:
        """Nothing moved but the clock."""
        return other is not None and (self.cached, self.processed, self.queue_position) == (
            other.cached,
            other.processed,
            other.queue_position,
        )


@dataclass
class RequestOutput:
    """A request's state after a step: emitted whenever one of its samples produced text or finished."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int
    finished: bool
    error: str | None = None  # set when the request failed (finish_reason ERROR)
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    # with SamplingParams.report_progress, before the first token: the prompt's progress (None otherwise)
    progress: PromptProgress | None = None
    # with SamplingParams.prompt_logprobs, once the prompt is read: one entry per prompt token, None first
    prompt_logprobs: list[Logprob | None] | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_progress_report(self) -> bool:
        """Only the prompt's progress: no token yet, not finished (what a consumer shows as "reading…")."""
        return self.progress is not None and not self.finished and not self.outputs[0].num_new_tokens
