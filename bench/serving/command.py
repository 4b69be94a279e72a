"""`bench serving`: one OpenAI-API load, Poisson rates then closed-loop concurrency, against pagedchat and a baseline:
the HF one-request-at-a-time server started here, or any OpenAI-compatible server (llama.cpp's `llama-server`).

With `--step-timing` (an engine flag: the pagedchat started here times its decode steps; a pagedchat given by --url
must run with it), each point also records the decode steps the server ran meanwhile, per batch size, split into
matmuls, attention and the rest, and the point of one request at a time the client's TPOT less the matmuls and
attention: what everything else costs a token as served."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx

from bench.common import loadgen, servers
from bench.common import session_client as sc
from bench.common.process_memory import process_memory
from bench.common.report import print_report, progress, write_results
from bench.common.workload import WORKLOAD_LABEL, chat_requests
from bench.serving.report import (
    HEADERS,
    MEMORY_HEADERS,
    RATIOS_MEANING,
    STEP_HEADERS,
    decode_steps,
    memory_rows,
    plot,
    ratios,
    served_rest_ms,
    step_rows,
    table_rows,
)

DEFAULT_RATES = [0.5, 1.0, 2.0, 4.0, 8.0]
DEFAULT_CONCURRENCY = [1, 16, 64]
CLOSED_LOOP_REQUESTS = "max(num_requests_per_point, 2 x concurrency)"


@dataclass(frozen=True)
class LoadPoint:
    """Poisson arrivals at `value` req/s (kind "rate"), or `value` requests in flight, each one that ends replaced by
    the next (kind "concurrency"); `num_requests` requests, the first ones of the shared workload."""

    kind: str
    value: float
    num_requests: int


def _positive_list(cast: Callable[[str], float]) -> Callable[[str], list]:
    """An argparse type: comma-separated positive numbers, or `none` for an empty list (that kind skipped)."""

    def parse(text: str) -> list:
        if text.strip().lower() == "none":
            return []
        try:
            values = [cast(v) for v in text.split(",") if v.strip()]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected numbers or none, got {text!r}") from exc
        if not values or any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"expected positive numbers or none, got {text!r}")
        return values

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench serving`."""
    parser.add_argument("--url", default=None, help="a running pagedchat server (default: start one)")
    parser.add_argument("--api-key", default=None, help="API key for a pagedchat server given by --url")
    parser.add_argument(
        "--baseline-url",
        default=None,
        help="any running OpenAI-compatible server to put the same load on, e.g. llama.cpp's llama-server; its "
        "model is the first of its /v1/models (default: start the HF one-request-at-a-time baseline)",
    )
    parser.add_argument(
        "--baseline-name",
        default=None,
        help="the baseline's name in the report and JSON (default: hf_baseline for the one started here; for "
        "--baseline-url, llama.cpp when its /v1/models says owned_by llamacpp, else baseline)",
    )
    parser.add_argument(
        "--baseline-pid",
        type=int,
        default=None,
        help="the process id of the server at --baseline-url: its resident memory (now and at peak) is read after the "
        "sweep and put beside pagedchat's",
    )
    parser.add_argument(
        "--pid",
        type=int,
        default=None,
        help="the process id of the pagedchat at --url, for the same memory figures",
    )
    parser.add_argument("--no-baseline", action="store_true", help="measure pagedchat only")
    parser.add_argument(
        "--rates",
        type=_positive_list(float),
        default=DEFAULT_RATES,
        help="Poisson request rates per second, run first; none skips them (default 0.5,1,2,4,8)",
    )
    parser.add_argument(
        "--concurrency",
        type=_positive_list(int),
        default=DEFAULT_CONCURRENCY,
        help="closed-loop points after the rates: this many requests in flight, each that ends replaced by the "
        "next; a point sends max(--num-requests, 2 x concurrency) requests, so the concurrency is really reached; "
        "none skips them (default 1,16,64)",
    )
    parser.add_argument(
        "--num-requests",
        type=int,
        default=48,
        help="requests per load point (closed loop: at least 2 x concurrency)",
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--keep-logs", default=None, help="keep server logs and databases in this folder")


def load_points(args: argparse.Namespace) -> list[LoadPoint]:
    """The Poisson rates, then the closed-loop concurrencies (each with at least 2 x concurrency requests)."""
    points = [LoadPoint("rate", r, args.num_requests) for r in args.rates]
    return points + [LoadPoint("concurrency", c, max(args.num_requests, 2 * c)) for c in args.concurrency]


async def sweep(
    url: str,
    name: str,
    model: str,
    requests,
    points: list[LoadPoint],
    seed: int,
    api_key: str | None = None,
    step_timing: bool = False,
) -> list[dict[str, Any]]:
    """Every load point against one server, a warm-up request first; no connection is kept alive between requests,
    so every server sees one TCP connection per request. `step_timing`: read the server's decode-step timings
    (pagedchat with --step-timing) before and after each point."""
    client = loadgen.make_client(url, api_key or "bench", keep_alive=False)
    admin = httpx.AsyncClient(
        base_url=url, headers={**sc.auth_headers(api_key), "Connection": "close"}, timeout=30.0
    )
    try:
        warm = await loadgen.stream_chat(client, model, requests[0], 0.0)
        if not warm.ok:
            raise RuntimeError(f"{name} at {url} failed the warm-up request: {warm.error}")
        out = []
        for point in points:
            timings_before = await step_timings(admin) if step_timing else None
            with progress(point.num_requests, f"{name} {point.kind}={point.value:g}") as bar:

                async def send(i: int, start_s: float) -> loadgen.RequestResult:
                    return await loadgen.stream_chat(client, model, requests[i], start_s)

                results, duration = await loadgen.run_load(
                    send,
                    point.num_requests,
                    rate=point.value if point.kind == "rate" else None,
                    concurrency=int(point.value) if point.kind == "concurrency" else None,
                    seed=seed,
                    on_done=lambda: bar.update(1),
                )
            summary = {"load": point.kind, "value": point.value, **loadgen.summarise(results, duration)}
            timings_after = await step_timings(admin) if step_timing else None
            if timings_after is not None:
                summary["decode_steps"] = decode_steps(timings_before or [], timings_after)
                if point.kind == "concurrency" and point.value == 1:
                    summary["served_rest_ms"] = served_rest_ms(summary)
            out.append(summary)
        return out
    finally:
        await client.close()
        await admin.aclose()


async def step_timings(admin: httpx.AsyncClient) -> list[dict[str, Any]] | None:
    """The server's decode-step timings (pagedchat with --step-timing: /api/admin/state's stats.step_timings), or
    None where it has none (off, or the admin surface refused us)."""
    timings = (await sc.admin_stats(admin) or {}).get("step_timings")
    return list(timings) if timings else None


def _measure(
    name: str | None,
    url: str | None,
    start: Callable[[], servers.ServerProcess],
    api_key: str | None,
    requests,
    points: list[LoadPoint],
    seed: int,
    step_timing: bool = False,
    pid: int | None = None,
) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """Sweep the server at `url`, or one `start()`ed here and stopped after; (name, where and what it served, points).
    A name of None: derived from the server's /v1/models entry. The server's memory after the sweep is read from
    process `pid` (or the one started here) where it can be."""
    with contextlib.ExitStack() as stack:
        started = url is None
        if started:
            server = start()
            stack.enter_context(servers.running([server]))
            url, pid = server.base_url, server.process.pid
        entry = servers.served_model(url, api_key)
        name = name or servers.baseline_name(entry)
        pts = asyncio.run(sweep(url, name, entry["id"], requests, points, seed, api_key, step_timing))
        memory = None if pid is None else process_memory(pid)
    return name, {"url": url, "model": entry["id"], "started_here": started, "memory": memory}, pts


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Sweep pagedchat, then the baseline (each started here unless its URL is given); print, write JSON + PNG."""
    points = load_points(args)
    if not points:
        raise SystemExit("bench serving: --rates none and --concurrency none leave no load point")
    if args.baseline_name == "pagedchat":
        raise SystemExit("bench serving: --baseline-name must differ from pagedchat")
    requests = chat_requests(max(p.num_requests for p in points), seed=args.seed, max_tokens=args.max_tokens)
    config = args.engine_config
    systems: dict[str, list[dict[str, Any]]] = {}
    served: dict[str, dict[str, Any]] = {}
    with servers.log_folder(args.keep_logs) as logs:
        targets = [
            (
                "pagedchat",
                args.url,
                args.api_key,
                partial(servers.start_pagedchat, "pagedchat", config, logs),
                args.pid,
            )
        ]  # --step-timing: the pagedchat started here times its decode steps; one given by --url is read for them
        if not args.no_baseline:
            name = args.baseline_name or (None if args.baseline_url else "hf_baseline")
            start = partial(servers.start_hf_baseline, "hf_baseline", config.model, config.dtype, logs)
            targets.append((name, args.baseline_url, None, start, args.baseline_pid))
        for given_name, url, key, start, pid in targets:
            timed = config.step_timing and given_name == "pagedchat"
            name, info, pts = _measure(given_name, url, start, key, requests, points, args.seed, timed, pid)
            served[name], systems[name] = info, pts
    payload: dict[str, Any] = {
        "model": config.model,
        "workload": {
            "label": WORKLOAD_LABEL,
            "num_requests_per_point": args.num_requests,
            "closed_loop_num_requests": CLOSED_LOOP_REQUESTS,
            "max_tokens": [r.max_tokens for r in requests],  # a point sends the first num_requests of these
            "temperature": 0.0,
            "ignore_eos": False,
            "keep_alive": False,  # one TCP connection per request, for every server
        },
        "servers": served,
        "systems": systems,
        "targets": [],
    }
    baseline = next((name for name in systems if name != "pagedchat"), None)
    if baseline is not None:
        payload["baseline"] = {"name": baseline, **served[baseline]}
        payload["ratios_meaning"] = RATIOS_MEANING
        payload["ratios"] = ratios(systems["pagedchat"], systems[baseline])
        ours, theirs = served["pagedchat"]["memory"], served[baseline]["memory"]
        if ours and theirs:  # pagedchat / baseline, as the memory targets are stated
            payload["memory_ratios"] = {key: ours[key] / theirs[key] for key in ours}
    paths = write_results("serving", payload, plot(systems), args.results_dir, args.command_line)
    title = f"serving: {args.num_requests} chat requests per load point (closed loop: {CLOSED_LOOP_REQUESTS})"
    steps, memory = step_rows(systems["pagedchat"]), memory_rows(served)
    print_report(title, HEADERS, table_rows(systems), (), () if steps or memory else paths)
    if memory:
        print_report("server memory after the sweep", MEMORY_HEADERS, memory, (), () if steps else paths)
    if steps:
        print_report(
            "pagedchat's decode steps, timed inside the served engine", STEP_HEADERS, steps, (), paths
        )
    return payload
