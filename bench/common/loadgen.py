"""The one load generator of benchmarks and tests: requests at Poisson arrivals or a fixed concurrency as tasks on
one event loop, streamed OpenAI chat calls timed chunk by chunk, and their latency summary."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bench.common.report import mean, percentiles
from bench.common.workload import ChatRequest

CLIENT_TIMEOUT_S = 1800.0
R = TypeVar("R")


@dataclass
class RequestResult:
    """What the client saw of one streamed request (times in seconds from the request's send)."""

    ok: bool
    start_s: float  # when it was sent, from the start of the load point
    e2e_s: float = float("nan")
    ttft_s: float = float("nan")
    chunk_times_s: list[float] = field(default_factory=list)  # arrival of every chunk that carried text
    num_output_tokens: int = 0
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    text: str = ""
    error: str = ""
    server_timings: dict[str, Any] | None = None  # llama.cpp's own `timings` of the request (last chunk)

    @property
    def itl_s(self) -> list[float]:
        """Gaps between successive text chunks."""
        return [b - a for a, b in zip(self.chunk_times_s, self.chunk_times_s[1:], strict=False)]

    @property
    def tpot_s(self) -> float:
        """Time per output token after the first: (e2e - ttft) / (tokens - 1); NaN for one-token replies."""
        if self.num_output_tokens < 2:
            return float("nan")
        return (self.e2e_s - self.ttft_s) / (self.num_output_tokens - 1)


def poisson_offsets(num: int, rate: float, seed: int) -> list[float]:
    """Send times of `num` requests at Poisson arrivals of `rate` per second (the first at 0)."""
    rng = random.Random(seed)
    offsets, t = [], 0.0
    for i in range(num):
        if i:
            t += rng.expovariate(rate)
        offsets.append(t)
    return offsets


def make_client(base_url: str, api_key: str = "bench", *, keep_alive: bool = True):
    """An async OpenAI client for `base_url` (the server root; /v1 is appended), shared by all requests.

    `keep_alive=False`: every request opens its own TCP connection and asks the server to close it afterwards
    (`Connection: close`), so no idle connection holds a server thread between requests (llama.cpp's small HTTP
    thread pool starves otherwise) and every server sees the same connection pattern.
    """
    import httpx
    from openai import AsyncOpenAI  # the `bench` extra: imported only when a benchmark runs

    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024 if keep_alive else 0)
    http = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(CLIENT_TIMEOUT_S, connect=30.0))
    return AsyncOpenAI(
        base_url=base_url.rstrip("/") + "/v1",
        api_key=api_key,
        http_client=http,
        max_retries=0,
        default_headers=None if keep_alive else {"Connection": "close"},
    )


async def stream_chat(
    client: Any,
    model: str,
    request: ChatRequest,
    start_s: float,
    *,
    ignore_eos: bool = False,
    messages: list[dict] | None = None,
) -> RequestResult:
    """One streamed /v1/chat/completions call, timed chunk by chunk."""
    sent = time.perf_counter()
    result = RequestResult(ok=False, start_s=start_s)
    pieces: list[str] = []
    num_chunks = 0
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=messages or request.messages,
            max_tokens=request.max_tokens,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": ignore_eos},
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta and chunk.choices[0].delta.content:
                result.chunk_times_s.append(time.perf_counter() - sent)
                pieces.append(chunk.choices[0].delta.content)
                num_chunks += 1
            if getattr(chunk, "usage", None):
                result.num_output_tokens = chunk.usage.completion_tokens
                result.num_prompt_tokens = chunk.usage.prompt_tokens
                details = getattr(chunk.usage, "prompt_tokens_details", None)
                result.num_cached_tokens = int(getattr(details, "cached_tokens", 0) or 0)
            timings = (chunk.model_extra or {}).get("timings")  # llama.cpp: an extra field, the last one wins
            if isinstance(timings, dict):
                result.server_timings = timings
        if not result.num_cached_tokens and result.server_timings:  # llama.cpp builds without cached_tokens
            result.num_cached_tokens = int(result.server_timings.get("cache_n", 0) or 0)
        result.ok = True
    except Exception as exc:  # noqa: BLE001 - a failed request is a data point, not a crash of the benchmark
        result.error = f"{type(exc).__name__}: {exc}"
    result.e2e_s = time.perf_counter() - sent
    result.text = "".join(pieces)
    if not result.num_output_tokens:
        result.num_output_tokens = num_chunks  # a server without usage: count text chunks
    if result.chunk_times_s:
        result.ttft_s = result.chunk_times_s[0]
    return result


async def run_load(
    send: Callable[[int, float], Awaitable[R]],
    num: int,
    *,
    rate: float | None = None,
    concurrency: int | None = None,
    seed: int = 0,
    on_done: Callable[[], None] | None = None,
) -> tuple[list[R], float]:
    """Send requests 0..num-1 at Poisson `rate` (whatever is in flight) or with `concurrency` in flight, in order;
    `send(i, seconds since the start)` makes request i. Returns the results in request order and the wall seconds."""
    if (rate is None) == (concurrency is None):
        raise ValueError("give exactly one of rate and concurrency")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    start = time.perf_counter()

    async def one(i: int) -> R:
        result = await send(i, time.perf_counter() - start)
        if on_done is not None:
            on_done()
        return result

    if rate is not None:
        tasks = []
        for i, offset in enumerate(poisson_offsets(num, rate, seed)):
            delay = offset - (time.perf_counter() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        results = list(await asyncio.gather(*tasks))
    else:
        slots: list[Any] = [None] * num

        async def worker(
            indices: Iterator[int],
        ) -> None:  # each takes the next request when its last one ends
            for i in indices:
                slots[i] = await one(i)

        indices = iter(range(num))
        await asyncio.gather(*(worker(indices) for _ in range(min(concurrency, num))))
        results = slots
    return results, time.perf_counter() - start


def summarise(results: list[RequestResult], duration_s: float) -> dict[str, Any]:
    """Latency percentiles (ms), throughput and failure count of one load point."""
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.num_output_tokens for r in ok)
    summary: dict[str, Any] = {
        "num_requests": len(results),
        "num_failed": len(results) - len(ok),
        "duration_s": duration_s,
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / duration_s if duration_s > 0 else float("nan"),
        "requests_per_s": len(ok) / duration_s if duration_s > 0 else float("nan"),
    }
    series = {
        "ttft_ms": [1000 * r.ttft_s for r in ok if r.chunk_times_s],
        "tpot_ms": [1000 * r.tpot_s for r in ok if r.chunk_times_s and r.num_output_tokens >= 2],
        "itl_ms": [1000 * gap for r in ok for gap in r.itl_s],
        "e2e_ms": [1000 * r.e2e_s for r in ok],
    }
    server_ms = [
        float(r.server_timings["predicted_per_token_ms"])
        for r in ok
        if isinstance((r.server_timings or {}).get("predicted_per_token_ms"), (int, float))
    ]
    if server_ms:  # the server's own decode time per token (llama.cpp's timings), where it reports one
        series["server_predicted_per_token_ms"] = server_ms
    for name, values in series.items():
        summary[name] = {"mean": mean(values), **percentiles(values)}
    errors = sorted({r.error for r in results if not r.ok})
    if errors:
        summary["errors"] = errors[:5]
    return summary
