"""`bench models`: several models in one server (issue #41): alternating requests, loads, and a stream during a load.

pagedchat serves the engine flags' `--model` (A, loaded at start) and two more, `--other-model B --other-model C`, in
two sittings, each its own server:
  fits     the memory budget holds all three (B and C load on their first request, then stay);
  reloads  `--models-max 2`: A and one other, so alternating B and C unloads one to load the other every time.
In each: first one streamed request on A (`--max-tokens` 256 with ignore_eos: a conversation running), and while it
streams, the first request to B, which loads B. The gaps between A's tokens before B's request and while B loads
are reported (p50 and the longest): the step loop and the loader share the machine. Then `--rounds` alternating
requests to B and C, one at a time (`--round-tokens` each): each one's time to first token, a load included where
the model was not loaded (as /v1/models said just before). Reported: the TTFT of requests that found their model
loaded (median) and of those that loaded it (median), how many loads, and the whole alternation's wall time; for
pagedchat, what its budget counted as held at the end (/api/admin/models) beside the process's resident memory then
and at its peak.

`--baseline-fits-url` and `--baseline-reloads-url`: llama.cpp's router mode (`llama-server --models-dir DIR
--models-max N`, DIR holding the same three files, N 3 and 1: its router unloads the least recently used model, A
included, so with 2 it would unload A once and then keep B and C) runs the same sequence, its models named as its /v1/models names them (each file's name without .gguf; its `status.value` says
whether one is loaded). The commands are in docs/operators/several-models.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import loadgen, servers
from bench.common.process_memory import process_memory
from bench.common.report import new_figure, print_report, write_results
from bench.common.workload import ChatRequest

LONG_TOKENS = 256
QUESTION = [{"role": "user", "content": "Write a long story about a lighthouse keeper and the sea."}]
SCENARIOS = ("fits", "reloads")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench models`."""
    parser.add_argument(
        "--other-model", action="append", required=True,
        help="a model served beside --model (what --model takes); give two (B and C)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=4, help="alternations B, C (default 4)")
    parser.add_argument("--round-tokens", type=int, default=32, help="tokens of each alternating reply (32)")
    parser.add_argument("--max-tokens", type=int, default=LONG_TOKENS, help="tokens of A's long stream (256)")
    parser.add_argument("--baseline-fits-url", default=None, help="llama.cpp router with --models-max 3")
    parser.add_argument("--baseline-reloads-url", default=None, help="llama.cpp router with --models-max 1")
    parser.add_argument(
        "--keep-logs", default=None, help="keep the servers' logs and databases in this folder"
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    if len(args.other_model) != 2:
        raise SystemExit("bench models: give --other-model twice (B and C)")
    config = args.engine_config
    names = ["a", "b", "c"]  # what this benchmark's pagedchat serves them as
    sources = [config.model, *args.other_model]
    results: dict[str, Any] = {}
    with servers.log_folder(args.keep_logs) as logs:
        for scenario in SCENARIOS:
            env = {"PAGEDCHAT_MODELS": f"b={sources[1]},c={sources[2]}", "PAGEDCHAT_KEEP_ALIVE_S": "0"}
            if scenario == "reloads":
                env["PAGEDCHAT_MODELS_MAX"] = "2"
            env["PAGEDCHAT_MODEL"] = f"a={config.model}"
            server = servers.start_pagedchat(f"pagedchat-{scenario}", config, logs, extra_env=env)
            with servers.running([server]):
                run = asyncio.run(_sequence(server.base_url, names, args))
                # what the server holds: the budget's count, and the process's resident memory now and at its peak
                run["registry"] = httpx.get(server.base_url + "/api/admin/models", timeout=30).json()
                run["memory"] = process_memory(server.process.pid)
                results[f"pagedchat {scenario}"] = run
            baseline = args.baseline_fits_url if scenario == "fits" else args.baseline_reloads_url
            if baseline:
                results[f"llama.cpp {scenario}"] = asyncio.run(
                    _sequence(baseline, _baseline_names(baseline, sources), args)
                )
    rows = [_row(name, r) for name, r in results.items()]
    headers = [
        "run", "A p50 gap before (ms)", "A p50 gap while B loads (ms)", "A longest gap (ms)",
        "B first TTFT (s)", "loaded TTFT p50 (ms)", "loading TTFT p50 (s)", "loads", "alternation (s)",
        "held (MB)", "RSS / peak (MB)",
    ]  # fmt: skip
    payload = {
        "runs": results,
        "sources": dict(zip(names, sources, strict=True)),
        "rows": rows,
        "headers": headers,
    }
    paths = write_results("models", payload, _plot(results), args.results_dir, args.command_line)
    print_report(
        "several models: A streams while B loads; then B and C alternate", headers, rows, paths=paths
    )
    return payload


def _plot(results: dict[str, Any]) -> Any:
    """Each run's alternating requests' TTFT, in order (a load stands out), on a log scale."""
    fig, (ax,) = new_figure()
    for name, r in results.items():
        ax.plot([x["ttft_s"] for x in r["alternation"]], marker="o", label=name)
    ax.set_yscale("log")
    ax.set_xlabel("request (C, B, C, B, ...)")
    ax.set_ylabel("time to first token (s)")
    ax.legend()
    return fig


def _baseline_names(base_url: str, sources: list[str]) -> list[str]:
    """The ids the router gives the three files (each file's name without .gguf, as listed by its /v1/models)."""
    listed = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=30).json()["data"]
    ids = [entry["id"] for entry in listed]
    names = []
    for source in sources:
        stem = Path(source).stem
        match = [i for i in ids if i == stem or stem in i]
        if not match:
            raise SystemExit(f"bench models: the baseline lists no model for {source} (it lists {ids})")
        names.append(match[0])
    return names


async def _sequence(base_url: str, names: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """A's long stream with B's first request (a load) sent a second into it, then B and C alternating."""
    client = loadgen.make_client(base_url, keep_alive=False)
    a, b, c = names
    await loadgen.stream_chat(client, a, ChatRequest(QUESTION, 8, "short"), 0.0)  # A warm
    stream_sent = time.perf_counter()
    long = asyncio.create_task(
        loadgen.stream_chat(client, a, ChatRequest(QUESTION, args.max_tokens, "long"), 0.0, ignore_eos=True)
    )
    await asyncio.sleep(1.0)
    load_sent = time.perf_counter()
    first_b = await loadgen.stream_chat(client, b, ChatRequest(QUESTION, 8, "short"), 0.0)
    load_done = time.perf_counter()
    stream = await long
    alternation: list[dict[str, Any]] = []
    started = time.perf_counter()
    for i in range(args.rounds * 2):
        model = c if i % 2 == 0 else b
        was_loaded = await asyncio.to_thread(_is_loaded, base_url, model)
        r = await loadgen.stream_chat(client, model, ChatRequest(QUESTION, args.round_tokens, "short"), 0.0)
        alternation.append(
            {"model": model, "ok": r.ok, "ttft_s": r.ttft_s, "loaded": was_loaded, "error": r.error}
        )
    wall = time.perf_counter() - started
    await client.close()
    return {
        "a_gaps": _gaps_around(stream, stream_sent, load_sent, load_done),
        "b_first_ttft_s": first_b.ttft_s,
        "b_first_ok": first_b.ok,
        "b_first_error": first_b.error,
        "alternation": alternation,
        "alternation_s": wall,
    }


def _is_loaded(base_url: str, model: str) -> bool:
    """Whether the server lists `model` as loaded: pagedchat's `state`, llama.cpp's router's `status.value`."""
    listed = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=30).json()["data"]
    entry = next(e for e in listed if e["id"] == model)
    state = entry.get("state") or (entry.get("status") or {}).get("value")
    return state == "loaded"


def _gaps_around(
    stream: loadgen.RequestResult, sent: float, load_sent: float, load_done: float
) -> dict[str, Any]:
    """A's token gaps before B's request and while B loaded (the stream's chunk times count from its send, taken as
    `sent`: its task starts at once)."""
    times = [sent + t for t in stream.chunk_times_s]
    gaps = list(zip(times, times[1:], strict=False))
    before = [(y - x) for x, y in gaps if y <= load_sent]
    during = [(y - x) for x, y in gaps if x >= load_sent and y <= load_done]
    return {
        "before_ms": [g * 1e3 for g in before],
        "during_ms": [g * 1e3 for g in during],
        "ok": stream.ok,
        "error": stream.error,
    }


def _row(name: str, r: dict[str, Any]) -> list[Any]:
    gaps = r["a_gaps"]
    loaded = [x["ttft_s"] for x in r["alternation"] if x["ok"] and x["loaded"]]
    loading = [x["ttft_s"] for x in r["alternation"] if x["ok"] and not x["loaded"]]

    def p50(values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    return [
        name,
        round(p50(gaps["before_ms"]), 1),
        round(p50(gaps["during_ms"]), 1),
        round(max(gaps["during_ms"] + gaps["before_ms"], default=float("nan")), 1),
        round(r["b_first_ttft_s"], 2),
        round(p50(loaded) * 1e3, 1),
        round(p50(loading), 2),
        len(loading),
        round(r["alternation_s"], 2),
        round(r["registry"]["held_bytes"] / 1e6) if "registry" in r else "",
        f"{r['memory']['rss_bytes'] / 1e6:.0f} / {r['memory']['peak_rss_bytes'] / 1e6:.0f}"
        if r.get("memory")
        else "",
    ]
