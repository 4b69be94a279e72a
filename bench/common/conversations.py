"""`bench multiturn`'s users: a conversation through the session API or /v1, and one user's turns around it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import httpx

from bench.common import loadgen
from bench.common import session_client as sc
from bench.common.workload import ChatRequest, user_turns

FILLER_SEED = 1_000_003  # conversations outside the measured ones (lead-in, keep-busy) use other scripts


class Conversation:
    """One user's conversation through one API: a session (token-exact history) or /v1 (history resent as text)."""

    def __init__(self, http: httpx.AsyncClient, oa: Any, model: str, system: str, max_tokens: int) -> None:
        self.http, self.oa, self.model, self.max_tokens = http, oa, model, max_tokens
        self.history: list[dict[str, str]] = [{"role": "system", "content": system}]
        self.session_id: str | None = None

    @classmethod
    async def open(
        cls, api: str, http: httpx.AsyncClient, oa: Any, model: str, system: str, max_tokens: int
    ) -> Conversation:
        """A new conversation; through the session API ("session") it starts with creating the session."""
        conversation = cls(http, oa, model, system, max_tokens)
        if api == "session":
            settings = {"temperature": 0.0, "max_tokens": max_tokens}
            conversation.session_id = await sc.create_session(
                http, settings, system_prompt=system, title="bench"
            )
        return conversation

    async def send(self, content: str) -> sc.TurnResult:
        if self.session_id is not None:
            return await sc.send_message(self.http, self.session_id, content)
        self.history.append({"role": "user", "content": content})
        r = await loadgen.stream_chat(
            self.oa, self.model, ChatRequest(list(self.history), self.max_tokens, "turn"), 0.0
        )
        self.history.append({"role": "assistant", "content": r.text})  # history resent as text
        return sc.TurnResult(
            ok=r.ok,
            ttft_s=r.ttft_s,
            e2e_s=r.e2e_s,
            prompt_tokens=r.num_prompt_tokens,
            cached_tokens=r.num_cached_tokens,
            completion_tokens=r.num_output_tokens,
            text=r.text,
            error=r.error,
        )


def bearer_tokens(api_keys: Sequence[str], num_users: int, api: str) -> tuple[str, list[str | None]]:
    """The warm-up's token and each user's: one identity per user, so each user is its own cache tenant.

    With API keys the first is the warm-up's and user u sends key u + 1 (modulo their number: give users + 1 keys
    for one each). Without keys, session users are their own browser cookies (None) and /v1 users send a token of
    their own, which on a server without keys tells callers from one address apart.
    """
    if api_keys:
        return api_keys[0], [api_keys[(u + 1) % len(api_keys)] for u in range(num_users)]
    return "bench-warm-up", [None if api == "session" else f"bench-user-{u}" for u in range(num_users)]


@contextlib.asynccontextmanager
async def user_clients(
    url: str, tokens: list[str | None], *, keep_alive: bool = True
) -> AsyncIterator[list[tuple[httpx.AsyncClient, Any]]]:
    """Per user: a session-API client (its own cookie jar, its token if any) and an OpenAI client (`keep_alive`: see
    loadgen.make_client); closed after."""
    opened: list[tuple[httpx.AsyncClient, Any]] = []
    try:
        for token in tokens:
            # the Origin a browser on the server's pages sends: cookie-authenticated writes need it
            headers = {**sc.auth_headers(token), "Origin": sc.origin_of(url)}
            http = httpx.AsyncClient(base_url=url, headers=headers, timeout=loadgen.CLIENT_TIMEOUT_S)
            opened.append((http, loadgen.make_client(url, token or "bench", keep_alive=keep_alive)))
        yield opened
    finally:
        for http, oa in opened:
            await http.aclose()
            await oa.close()


class Latch:
    """Counts the users whose measured conversation is still going (all users share one event loop)."""

    def __init__(self, count: int) -> None:
        self._left = count

    def count_down(self) -> None:
        self._left -= 1

    @property
    def open(self) -> bool:
        return self._left <= 0


async def run_user(
    index: int,
    start: Callable[[], Awaitable[Any]],
    script: list[str],
    staggered: bool,
    measured: Latch,
    on_turn: Callable[[], None],
    before_turn: Callable[[int], None] | None = None,
) -> list[sc.TurnResult]:
    """One user's measured conversation (its turn results); `start()` opens a conversation; `before_turn(k)` is
    called before the measured turn k (0-based) is sent.

    Staggered: it starts after `index mod turns` unmeasured turns of another conversation, and the user goes on
    with unmeasured turns until every user's measured conversation is done. So all users chat all the time, and
    turn 1 and turn K of the measured conversations run under the same load.
    """
    fillers = 0

    async def chat_unmeasured(go_on: Callable[[int], bool]) -> None:
        """Turns of fresh conversations (as long as the measured one) while `go_on(turns sent so far)`."""
        nonlocal fillers
        sent, conversation, messages = 0, None, script
        while go_on(sent):
            if sent % len(script) == 0:
                messages = user_turns(index, len(script), FILLER_SEED + fillers)
                conversation, fillers = await start(), fillers + 1
            await conversation.send(messages[sent % len(script)])
            sent += 1

    try:
        if staggered:
            await chat_unmeasured(lambda sent: sent < index % len(script))
        conversation, out = await start(), []
        for k, content in enumerate(script):
            if before_turn is not None:
                before_turn(k)
            out.append(await conversation.send(content))
            on_turn()
    finally:  # even when this user failed, the others must not keep chatting forever
        measured.count_down()
    if staggered:
        await chat_unmeasured(lambda _: not measured.open)
    return out
