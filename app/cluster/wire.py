"""What crosses between the ingress and an engine replica: plain dataclasses, small enough to send often.

A replica streams a request as one `Accepted` (or one `Rejected`) and then batches of outputs. Outputs travel
without their prompt token ids (the ingress sent the prompt and puts it back), and at most every
`DELTA_INTERVAL_S` after the first: tokens made in between are merged into one output (text deltas joined), so a
reply crosses the process boundary as a few messages a second, not one per token.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from app.engine_client.protocol import EngineOverloaded, EngineUnavailable
from app.engine_client.request_stream import RequestFailed, RequestTimedOut
from engine.core.outputs import RequestOutput

DELTA_INTERVAL_S = 0.05  # 20 messages a second at most per reply; the first token goes at once


@dataclass(frozen=True)
class Accepted:
    """The replica queued the request."""

    replica: str


@dataclass(frozen=True)
class Rejected:
    """The replica refused the request: `kind` is "invalid" (bad input, 400), "overloaded" (503, retry after
    `retry_after` s) or "unavailable" (its engine is not serving)."""

    kind: str
    message: str
    retry_after: int = 1

    @classmethod
    def from_error(cls, exc: Exception) -> Rejected | None:
        """What the replica's bridge raised on adding a request, for the wire (None: not a refusal)."""
        if isinstance(exc, ValueError):
            return cls("invalid", str(exc))
        if isinstance(exc, EngineOverloaded):
            return cls("overloaded", str(exc), exc.retry_after)
        if isinstance(exc, EngineUnavailable):
            return cls("unavailable", str(exc))
        return None

    def to_error(self) -> Exception:
        """The exception the ingress raises, as the single-process bridge would have."""
        if self.kind == "invalid":
            return ValueError(self.message)
        if self.kind == "overloaded":
            return EngineOverloaded(self.message, self.retry_after)
        return EngineUnavailable(self.message)


@dataclass(frozen=True)
class Failed:
    """The request failed on the replica after it was accepted (`timed_out`: it ran past the request timeout)."""

    message: str
    timed_out: bool = False

    def to_error(self) -> Exception:
        """The exception the ingress fails the request's stream with."""
        return RequestTimedOut(self.message) if self.timed_out else RequestFailed(self.message)


def slim(output: RequestOutput) -> RequestOutput:
    """The output without its prompt token ids (`with_prompt` puts them back on the other side)."""
    return dataclasses.replace(output, prompt_token_ids=[])


def with_prompt(output: RequestOutput, prompt: list[int]) -> RequestOutput:
    """A slimmed output with its prompt token ids again."""
    return dataclasses.replace(output, prompt_token_ids=prompt)
