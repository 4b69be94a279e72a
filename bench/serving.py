"""`bench serving`: OpenAI-API load sweep against pagedchat and an HF one-request-at-a-time server."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from bench import loadgen, servers
from bench.common import new_figure, print_report, progress, write_results
from bench.workload import WORKLOAD_LABEL, chat_requests


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from exc
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench serving`."""
    parser.add_argument("--url", default=None, help="a running pagedchat server (default: start one)")
    parser.add_argument(
        "--baseline-url", default=None, help="a running HF baseline server (default: start one)"
    )
    parser.add_argument("--no-baseline", action="store_true", help="measure pagedchat only")
    parser.add_argument("--api-key", default=None, help="API key for a pagedchat server given by --url")
    load = parser.add_mutually_exclusive_group()
    load.add_argument(
        "--rates", type=_floats, default=None, help="Poisson request rates per second (default 0.5,1,2,4,8)"
    )
    load.add_argument(
        "--concurrency", type=_floats, default=None, help="fixed numbers of requests in flight, e.g. 1,8"
    )
    parser.add_argument("--num-requests", type=int, default=48, help="requests per load point")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--keep-logs", default=None, help="keep server logs and databases in this folder")


def load_points(args: argparse.Namespace) -> list[tuple[str, float]]:
    """("rate", r) or ("concurrency", c) for each point of the sweep (default: rates 0.5, 1, 2, 4, 8)."""
    if args.concurrency:
        return [("concurrency", c) for c in args.concurrency]
    return [("rate", r) for r in (args.rates or [0.5, 1.0, 2.0, 4.0, 8.0])]


async def sweep(
    url: str, name: str, requests, points, seed: int, api_key: str | None = None
) -> list[dict[str, Any]]:
    """Every load point against one server; a warm-up request first."""
    client = loadgen.make_client(url, api_key or "bench")
    model = (await client.models.list()).data[0].id
    warm = await loadgen.stream_chat(client, model, requests[0], 0.0)
    if not warm.ok:
        raise RuntimeError(f"{name} at {url} failed the warm-up request: {warm.error}")
    out = []
    for kind, value in points:
        with progress(len(requests), f"{name} {kind}={value:g}") as bar:

            async def send(i: int, start_s: float) -> loadgen.RequestResult:
                return await loadgen.stream_chat(client, model, requests[i], start_s)

            results, duration = await loadgen.run_load(
                send,
                len(requests),
                rate=value if kind == "rate" else None,
                concurrency=int(value) if kind == "concurrency" else None,
                seed=seed,
                on_done=lambda: bar.update(1),
            )
        out.append({"load": kind, "value": value, **loadgen.summarise(results, duration)})
    await client.close()
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Sweep both servers (started here unless URLs are given), print, write JSON + PNG."""
    requests = chat_requests(args.num_requests, seed=args.seed, max_tokens=args.max_tokens)
    points = load_points(args)
    config = args.engine_config
    systems: dict[str, list[dict[str, Any]]] = {}
    with servers.log_folder(args.keep_logs) as logs:
        targets = [("pagedchat", args.url)]
        if not args.no_baseline:
            targets.append(("hf_baseline", args.baseline_url))
        for name, url in targets:
            if url is not None:
                key = args.api_key if name == "pagedchat" else None
                systems[name] = asyncio.run(sweep(url, name, requests, points, args.seed, key))
                continue
            if name == "pagedchat":
                server = servers.start_pagedchat(name, config, logs)
            else:
                server = servers.start_hf_baseline(name, config.model, config.dtype, logs)
            with servers.running([server]):
                systems[name] = asyncio.run(sweep(server.base_url, name, requests, points, args.seed))
    payload = {
        "model": config.model,
        "workload": {
            "label": WORKLOAD_LABEL,
            "num_requests_per_point": len(requests),
            "max_tokens": [r.max_tokens for r in requests],
            "temperature": 0.0,
            "ignore_eos": False,
        },
        "systems": systems,
        "targets": [],
    }
    if "hf_baseline" in systems:
        payload["ratios"] = {
            f"{p['load']}={p['value']:g}": {
                "output_tokens_per_s": p["output_tokens_per_s"] / b["output_tokens_per_s"],
                "ttft_p50": b["ttft_ms"]["p50"] / p["ttft_ms"]["p50"],
            }
            for p, b in zip(systems["pagedchat"], systems["hf_baseline"], strict=True)
        }
    paths = write_results("serving", payload, _plot(systems), args.results_dir, args.command_line)
    rows = [
        [
            name,
            f"{p['load']}={p['value']:g}",
            p["requests_per_s"],
            p["output_tokens_per_s"],
            p["ttft_ms"]["p50"],
            p["ttft_ms"]["p99"],
            p["tpot_ms"]["p50"],
            p["itl_ms"]["p50"],
            p["itl_ms"]["p99"],
            p["e2e_ms"]["p50"],
            p["e2e_ms"]["p99"],
            p["num_failed"],
        ]
        for name, pts in systems.items()
        for p in pts
    ]
    headers = [
        "server",
        "load",
        "req/s",
        "out tok/s",
        "TTFT p50 ms",
        "TTFT p99",
        "TPOT p50 ms",
        "ITL p50 ms",
        "ITL p99",
        "E2E p50 ms",
        "E2E p99",
        "failed",
    ]
    print_report(f"serving: {len(requests)} chat requests per load point", headers, rows, (), paths)
    return payload


def _plot(systems: dict[str, list[dict[str, Any]]]):
    fig, (ax_ttft, ax_tpot) = new_figure(ncols=2)
    for name, pts in systems.items():
        x = [p["output_tokens_per_s"] for p in pts]
        line = ax_ttft.plot(x, [p["ttft_ms"]["p50"] for p in pts], "o-", label=f"{name} p50")[0]
        ax_ttft.plot(
            x, [p["ttft_ms"]["p99"] for p in pts], "x--", color=line.get_color(), label=f"{name} p99"
        )
        ax_tpot.plot(x, [p["tpot_ms"]["p50"] for p in pts], "o-", color=line.get_color(), label=f"{name} p50")
        for p, xi in zip(pts, x, strict=True):
            ax_ttft.annotate(f"{p['value']:g}", (xi, p["ttft_ms"]["p50"]), fontsize=7)
    for ax, title in ((ax_ttft, "time to first token"), (ax_tpot, "time per output token")):
        ax.set_xlabel("output tokens / s")
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        ax.set_title(f"{title} vs throughput (points: load)")
        ax.legend(fontsize=8)
    return fig
