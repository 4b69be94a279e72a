"""A sequence's progress through the engine, and the sampling parameters a request asks for."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from engine.core.hash_chain import ChainKey
from engine.core.structured import StructuredOutput

MAX_N = 16
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_LEN = 256
MAX_TOP_LOGPROBS = 20
MIN_TEMPERATURE = 1e-5  # below this, sampling is greedy


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop. Validated on construction: bad values raise ValueError naming the field."""

    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    n: int = 1
    seed: int | None = None
    logprobs: int | None = None  # number of top logprobs to return per token (0: only the sampled token's)
    # vLLM's: each prompt token's logprob given the tokens before it, and this many top alternatives (the first
    # token has none); such a request computes its whole prompt (no prefix-cache hit: a hit has no logits)
    prompt_logprobs: int | None = None
    structured: StructuredOutput | None = None  # the output must match this grammar (engine/worker/guided.py)
    # until the first token: an output whenever the prompt's progress changes (RequestOutput.progress)
    report_progress: bool = False
    # False: this request never takes speculative tokens (engine/core/speculative.py), whatever the engine's method
    speculative: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        _check_finite("temperature", self.temperature)
        _check_finite("top_p", self.top_p)
        _check_finite("min_p", self.min_p)
        _check_finite("repetition_penalty", self.repetition_penalty)
        _check_finite("presence_penalty", self.presence_penalty)
        _check_finite("frequency_penalty", self.frequency_penalty)
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if self.temperature < MIN_TEMPERATURE:
            # dividing logits by a denormal-small temperature overflows to inf/NaN: such a value means greedy
            object.__setattr__(self, "temperature", 0.0)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (disabled) or a positive integer, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0.01 <= self.repetition_penalty <= 10.0:
            raise ValueError(f"repetition_penalty must be in [0.01, 10], got {self.repetition_penalty}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens}")
        if not isinstance(self.n, int) or not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be an integer in [1, {MAX_N}], got {self.n}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop may hold at most {MAX_STOP_STRINGS} strings, got {len(self.stop)}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
            if len(s) > MAX_STOP_STRING_LEN:
                raise ValueError(
                    f"a stop string may be at most {MAX_STOP_STRING_LEN} characters, got {len(s)}"
                )
        for t in self.stop_token_ids:
            if not isinstance(t, int) or t < 0:
                raise ValueError(f"stop_token_ids must be non-negative integers, got {t!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed < 2**63):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed}")
        if self.logprobs is not None and (
            not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS
        ):
            raise ValueError(f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs}")
        if self.prompt_logprobs is not None and (
            not isinstance(self.prompt_logprobs, int)
            or isinstance(self.prompt_logprobs, bool)
            or not 0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS
        ):
            raise ValueError(
                f"prompt_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {self.prompt_logprobs!r}"
            )
        if self.structured is not None:
            self._check_structured()

    def _check_structured(self) -> None:
        """A stop other than the grammar's own end would cut a constrained output that must parse."""
        if not isinstance(self.structured, StructuredOutput):
            raise ValueError(f"structured must be a StructuredOutput, got {type(self.structured).__name__}")
        for name in ("stop", "stop_token_ids"):
            if getattr(self, name):
                raise ValueError(f"{name} cannot be combined with structured output: it would cut the output")
        if self.ignore_eos:
            raise ValueError("ignore_eos cannot be combined with structured output: EOS ends it")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _check_finite(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    LOADING = "loading"  # its prefix is being read from the disk tier into pinned pool blocks
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens or max_model_len
    ABORT = "abort"  # the client went away or asked to stop
    ERROR = "error"  # a fault attributable to this request


@dataclass(eq=False)
class Sequence:
    """One token stream: its ids, how many of them have KV in the cache, and where that KV lives.

    `num_computed_tokens` is the single progress counter: tokens [0, num_computed_tokens) have their KV stored in the
    blocks listed by `block_table`. There is no separate prefill/decode phase: a sequence whose computed count is
    behind its length has tokens to compute.
    """

    seq_id: int
    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    arrival_time: float
    sample_index: int = 0  # which of the request's n samples (seeded with seed + sample_index)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at the last admission
    block_table: list[int] = field(default_factory=list)
    num_hashed_blocks: int = 0  # leading blocks of block_table that are full and registered by hash
    block_hashes: list[bytes] = field(default_factory=list)  # hash chain of the leading full blocks
    # blocks of its prefix loaded from the disk tier (and the RAM hits before them), held until it is admitted
    pinned_block_ids: list[int] = field(default_factory=list)
    num_disk_cached_tokens: int = 0  # of num_cached_tokens, those read from the disk tier
    num_preemptions: int = 0
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or stop token that ended it
    # time.monotonic() of its first admission to the running batch (kept across preemptions), first and last token
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    chain_key: ChainKey = field(
        default_factory=ChainKey
    )  # its tenant's salt and public prefix (hash_chain.py)
    num_new_tokens: int = (
        0  # tokens the last step appended (more than one where proposed tokens were accepted)
    )
    num_draft_tokens: int = 0  # tokens proposed for it and verified (speculative decoding)
    num_accepted_tokens: int = 0  # ... and of those, the ones it kept

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Its request asks for prompt logprobs and they are not complete: it computes its whole prompt (no prefix
        hit) and the runner scores every prompt position. The first sample only: the others are forked after."""
        return (
            self.params.prompt_logprobs is not None and self.sample_index == 0 and self.num_output_tokens == 0
        )
