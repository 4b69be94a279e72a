"""`bench multiturn --scenario document`: questions about an attached document.

Every user sends a document of `--document-tokens` tokens (seeded meeting notes, one document per user) with a first
question, then asks `--turns - 1` more questions about it. A chat service on a prefix cache should read the document
once: later turns take their prompt from the cache and their time to first token stays short. Both of pagedchat's
APIs run (the session API: token-exact history; /v1: history resent as text each turn), and with `--baseline-url`
the same /v1 conversations go to another server (llama.cpp's `llama-server` reuses each slot's longest common prefix,
so give it a slot per user: `-np USERS -c USERS x CONTEXT`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from typing import Any

from bench.common import servers
from bench.common.report import Target, new_figure, print_report, targets_payload, write_results
from bench.common.workload import document_turns
from bench.multiturn.baseline import ratios
from bench.multiturn.runs import (
    SYSTEM_PROMPT_FILE,
    TARGET_CACHE_HIT_PCT,
    later_turns_cache_pct,
    later_turns_ttft_ms,
    run_mode,
    workload_fields,
)

DEFAULT_USERS, DEFAULT_TURNS, DEFAULT_DOCUMENT_TOKENS = 8, 6, 4000
TARGET_LATER_TTFT_RATIO = 0.5  # later turns' TTFT p50, pagedchat ÷ the baseline
MODES = ("session", "v1")


def scripts(args: argparse.Namespace, seed: int) -> list[list[str]]:
    """Each user's messages: the document with a first question, then the other questions."""
    from engine.loading.loader import load_tokenizer, resolve_model_path

    config = args.engine_config
    tokenizer = load_tokenizer(
        resolve_model_path(config.model, revision=config.model_revision, gguf_file=config.gguf_file)
    )
    return [document_turns(tokenizer, u, args.turns, args.document_tokens, seed) for u in range(args.users)]


def run(args: argparse.Namespace, system: str, bench_keys: tuple[str, ...]) -> dict[str, Any]:
    """pagedchat's two APIs (started here with prefix caching on and the system prompt published, unless --url),
    then the baseline's /v1 if --baseline-url; print, write JSON + PNG."""
    # one user is one identity on both APIs: the session run's users send other documents than the /v1 run's
    # (which the baseline gets too), so no run finds another's documents in the cache
    per_mode = {"session": scripts(args, args.seed + 1), "v1": scripts(args, args.seed)}
    entry = servers.served_model(args.baseline_url) if args.baseline_url else None
    name = (args.baseline_name or servers.baseline_name(entry)) if entry is not None else None
    url_keys = tuple(k.strip() for k in (args.api_key or "").split(",") if k.strip())
    systems: dict[str, dict[str, Any]] = {}

    def measure(url: str, keys: tuple[str, ...]) -> None:
        for i, mode in enumerate(MODES):
            systems[f"pagedchat {mode}"] = asyncio.run(
                run_mode(
                    url,
                    mode,
                    keys,
                    system,
                    args,
                    f"pagedchat {mode}",
                    1000 * i,
                    keep_alive=False,
                    scripts=per_mode[mode],
                )
            )

    with servers.log_folder(args.keep_logs) as logs:
        if args.url is not None:
            measure(args.url, url_keys)
        else:
            prompt_file = logs / SYSTEM_PROMPT_FILE
            prompt_file.write_text(system, encoding="utf-8")
            cfg = dataclasses.replace(args.engine_config, enable_prefix_caching=True, kv_disk_bytes=0)
            env = {
                "PAGEDCHAT_API_KEYS": ",".join(bench_keys),
                "PAGEDCHAT_SHARED_PROMPT_FILES": str(prompt_file),
            }
            server = servers.start_pagedchat("pagedchat", cfg, logs, env)
            with servers.running([server]):
                measure(server.base_url, bench_keys)
        if args.baseline_url is not None:
            assert name is not None
            systems[name] = asyncio.run(
                run_mode(
                    args.baseline_url,
                    "v1",
                    (),
                    system,
                    args,
                    f"{name} /v1",
                    0,
                    keep_alive=False,
                    scripts=per_mode["v1"],
                )
            )
    targets = [
        Target(
            f"pagedchat {mode}: turns 2-{args.turns} prompt from the cache %",
            later_turns_cache_pct(r),
            TARGET_CACHE_HIT_PCT,
        )
        for mode, r in ((m, systems[f"pagedchat {m}"]) for m in MODES)
    ]
    payload: dict[str, Any] = {
        "model": args.engine_config.model,
        "workload": {
            "label": "synthetic: one seeded document of meeting notes per user, then questions about it",
            **workload_fields(args, system),
            "document_tokens": args.document_tokens,
            "keep_alive": False,
            "same_scripts": "the baseline gets the very messages of pagedchat's /v1 run; the session run's users send "
            "other documents (one identity per user on both APIs: no run finds another's documents cached)",
        },
        "systems": systems,
        "later_turns": {
            n: {"cache_hit_pct": later_turns_cache_pct(r), "ttft_p50_ms": later_turns_ttft_ms(r)}
            for n, r in systems.items()
        },
    }
    if name is not None:
        ours, theirs = systems["pagedchat v1"], systems[name]
        later_ratio = later_turns_ttft_ms(ours) / later_turns_ttft_ms(theirs)
        targets.append(
            Target(
                f"later turns' TTFT p50, pagedchat /v1 ÷ {name}", later_ratio, TARGET_LATER_TTFT_RATIO, "<="
            )
        )
        payload["baseline"] = {
            "name": name,
            "url": args.baseline_url,
            "model": entry.get("id") if entry else None,
        }
        payload["ratios"] = {**ratios(ours, theirs), "later_turns_ttft_pagedchat_over_baseline": later_ratio}
    payload["targets"] = targets_payload(targets)
    paths = write_results("multiturn-document", payload, _plot(systems), args.results_dir, args.command_line)
    names = list(systems)
    headers = ["turn", *(f"{n} TTFT p50 ms" for n in names), *(f"{n} cached %" for n in names)]
    rows = [
        [
            k + 1,
            *(systems[n]["turns"][k]["ttft_ms"]["p50"] for n in names),
            *(systems[n]["turns"][k]["cache_hit_pct"] for n in names),
        ]
        for k in range(args.turns)
    ]
    title = (
        f"multiturn, questions about a document: {args.users} users x {args.turns} turns, "
        f"{args.document_tokens}-token documents"
    )
    print_report(title, headers, rows, targets, paths)
    return payload


def _plot(systems: dict[str, dict[str, Any]]):
    fig, (ax_ttft, ax_cache) = new_figure(ncols=2)
    for name, r in systems.items():
        x = [t["turn"] for t in r["turns"]]
        ax_ttft.plot(x, [t["ttft_ms"]["p50"] for t in r["turns"]], "o-", label=name)
        ax_cache.plot(x, [t["cache_hit_pct"] for t in r["turns"]], "o-", label=name)
    ax_ttft.set_title("time to first token (p50 over users)")
    ax_ttft.set_ylabel("ms")
    ax_ttft.set_yscale("log")
    ax_cache.set_title("prompt tokens from the cache")
    ax_cache.set_ylabel("%")
    for ax in (ax_ttft, ax_cache):
        ax.set_xlabel("turn")
        ax.legend(fontsize=8)
    return fig
