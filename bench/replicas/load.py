"""`bench multiturn --replicas`' load: every user's /v1 conversation (bench/common/conversations.py's users,
staggered or together), each request logged with when it was sent and when it ended; in a failover run a
failed turn is sent once more (a user pressing "retry"), so the conversation goes on."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.common import loadgen
from bench.common import session_client as sc
from bench.common.conversations import Conversation, Latch, run_user, user_clients
from bench.common.report import progress
from bench.common.workload import ChatRequest
from bench.replicas.scenario import Scenario

WARM_UP_TOKENS = 8
MAX_ATTEMPTS = 2  # a failed turn of a failover run is sent once more


@dataclass(frozen=True)
class RequestRecord:
    """One /v1 request of a run as the client saw it (times: time.perf_counter())."""

    user: int
    conversation: int  # the user's n-th conversation, unmeasured lead-in and keep-busy ones included
    turn: int  # 0-based, in its conversation
    attempt: int  # 1; 2: the second sending of a failed turn
    sent_s: float
    done_s: float
    ok: bool
    completion_tokens: int = 0
    error: str = ""


@dataclass
class LoadResult:
    """Each user's measured turns (the last attempt of each) and every request sent, in the order they ended."""

    per_user: list[list[sc.TurnResult]]
    records: list[RequestRecord] = field(default_factory=list)


class LoggedConversation:
    """A /v1 Conversation whose every request goes to a shared log; `resend_failed`: a failed turn is sent once
    more, its user message and empty answer taken out of the history first."""

    def __init__(
        self, inner: Conversation, log: list[RequestRecord], user: int, number: int, resend_failed: bool
    ) -> None:
        self.inner, self.log, self.user, self.number = inner, log, user, number
        self.resend_failed = resend_failed
        self.num_sent = 0  # turns sent, a resent one once

    async def send(self, content: str) -> sc.TurnResult:
        turn, self.num_sent = self.num_sent, self.num_sent + 1
        attempt = 1
        while True:
            sent = time.perf_counter()
            result = await self.inner.send(content)
            done = time.perf_counter()
            self.log.append(
                RequestRecord(
                    self.user,
                    self.number,
                    turn,
                    attempt,
                    sent,
                    done,
                    result.ok,
                    result.completion_tokens,
                    result.error,
                )
            )
            if result.ok or not self.resend_failed or attempt == MAX_ATTEMPTS:
                return result
            del self.inner.history[
                -2:
            ]  # Conversation.send appended the message and the failed (empty) answer
            attempt += 1


async def warm_up(url: str, token: str, system_prompts: tuple[str, ...]) -> str:
    """One short request per system prompt (the model loaded, the prompts computed once); the served model's id."""
    oa = loadgen.make_client(url, token)
    try:
        model = (await oa.models.list()).data[0].id
        for system in system_prompts:
            hello = [{"role": "system", "content": system}, {"role": "user", "content": "Hello!"}]
            warm = await loadgen.stream_chat(oa, model, ChatRequest(hello, WARM_UP_TOKENS, "warm"), 0.0)
            if not warm.ok:
                raise RuntimeError(f"warm-up request to {url} failed: {warm.error}")
    finally:
        await oa.close()
    return model


async def drive(
    url: str,
    model: str,
    scenario: Scenario,
    tokens: list[str | None],
    *,
    max_tokens: int,
    staggered: bool,
    label: str,
    resend_failed: bool = False,
    before_turn: Callable[[int, int], None] | None = None,
) -> LoadResult:
    """All users' conversations at once, user u under `tokens[u]`; `before_turn(user, k)` before measured turn k."""
    log: list[RequestRecord] = []
    measured = Latch(scenario.num_users)
    num_conversations = [0] * scenario.num_users

    async def start(user: int, http: Any, oa: Any) -> LoggedConversation:
        inner = await Conversation.open("v1", http, oa, model, scenario.system_of(user), max_tokens)
        number, num_conversations[user] = num_conversations[user], num_conversations[user] + 1
        return LoggedConversation(inner, log, user, number, resend_failed)

    async with user_clients(url, tokens) as clients:
        with progress(scenario.num_users * scenario.num_turns, label, unit="turn") as bar:
            per_user = await asyncio.gather(
                *(
                    run_user(
                        u,
                        functools.partial(start, u, http, oa),
                        list(scenario.scripts[u]),
                        staggered,
                        measured,
                        functools.partial(bar.update, 1),
                        functools.partial(before_turn, u) if before_turn else None,
                    )
                    for u, (http, oa) in enumerate(clients)
                )
            )
    return LoadResult(list(per_user), log)


def throughput(records: list[RequestRecord]) -> dict[str, Any]:
    """Requests and output tokens per second over the run's wall time (first send to last end), all requests
    counted (unmeasured ones too: they are load like the others)."""
    ok = [r for r in records if r.ok]
    wall = max(r.done_s for r in records) - min(r.sent_s for r in records) if records else 0.0
    tokens = sum(r.completion_tokens for r in ok)
    return {
        "wall_s": wall,
        "num_requests": len(records),
        "num_failed": len(records) - len(ok),
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / wall if wall > 0 else float("nan"),
        "requests_per_s": len(ok) / wall if wall > 0 else float("nan"),
    }
