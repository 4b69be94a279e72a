"""How much a costly structured-output grammar slows another user: one user's 32-token stream, alone and beside
attackers that each keep one `guided_regex` request in flight (re-sent as soon as it ends), on a real
`pagedchat serve` started from this checkout (issue #35, item 8).

Prints the victim's median stream time alone and under attack, and how the attack requests ended (HTTP status, or
the finish reason / error code of a 200). Run it from the checkout to measure (`cd <checkout> && python
scripts/guided_mask_attack.py`); the model is the provisioned default unless --model says otherwise.

    python scripts/guided_mask_attack.py [--regex 'a{100000}' ...] [--distinct] [--attackers 8] [--runs 3]

`--regex ''` sends unconstrained requests of the same length instead: what 8 more sequences cost the victim anyway.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.servers import spawn_pagedchat, stop_server, wait_ready  # noqa: E402
from engine.core.paths import cache_dir  # noqa: E402

PROMPT = [{"role": "user", "content": "Tell me about the sea."}]


def victim_stream_s(base_url: str, max_tokens: int) -> float:
    """Seconds from sending a greedy streamed chat completion to its last chunk."""
    body = {
        "messages": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    start = time.perf_counter()
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for _ in response.iter_lines():
            pass
    return time.perf_counter() - start


def attacker(base_url: str, regex: str, stop: threading.Event, outcomes: collections.Counter) -> None:
    """Keep one attack request in flight until `stop`; count how each ended."""
    body = {"messages": PROMPT, "max_tokens": 256, "temperature": 1.0, "ignore_eos": not regex}
    if regex:  # else plain requests of the same length: the baseline cost of 8 more sequences in the batch
        body["guided_regex"] = regex
    with httpx.Client(timeout=600) as client:
        while not stop.is_set():
            response = client.post(base_url + "/v1/chat/completions", json=body)
            if response.status_code == 200:
                outcomes["200 " + str(response.json()["choices"][0]["finish_reason"])] += 1
            else:
                error = response.json().get("error", {})
                message = re.sub(r"[0-9.]+ (ms|s)\b", "N \\1", error.get("message", ""))  # one key per kind
                outcomes[f"{response.status_code} {error.get('code')}: {message[:110]}"] += 1


def scenario(base: str, regex: str, args: argparse.Namespace) -> dict:
    """The victim's stream alone, then beside the attackers; how the attack requests ended."""
    alone = [victim_stream_s(base, args.victim_tokens) for _ in range(args.runs)]
    stop, outcomes = threading.Event(), collections.Counter()
    # --distinct: a grammar of each attacker's own (`|q{i}` changes no mask), so they share no lexer state
    regexes = [f"{regex}|q{{{i + 1}}}" if args.distinct and regex else regex for i in range(args.attackers)]
    threads = [
        threading.Thread(target=attacker, args=(base, one, stop, outcomes), daemon=True) for one in regexes
    ]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # the attack requests are in flight
    attacked = [victim_stream_s(base, args.victim_tokens) for _ in range(args.runs)]
    stop.set()
    for thread in threads:
        thread.join()
    return {
        "regex": regex,
        "attackers": args.attackers,
        "distinct": args.distinct,
        "victim_alone_s": round(statistics.median(alone), 3),
        "victim_attacked_s": round(statistics.median(attacked), 3),
        "slowdown": round(statistics.median(attacked) / statistics.median(alone), 1),
        "attack_outcomes": dict(outcomes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--regex", action="append", help="the attack's guided_regex (repeat: one scenario each)"
    )
    parser.add_argument("--attackers", type=int, default=8)
    parser.add_argument("--distinct", action="store_true", help="a different grammar per attacker")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--victim-tokens", type=int, default=32)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="guided-attack-"))
    env = {
        "PAGEDCHAT_MODEL": args.model,
        "PAGEDCHAT_CACHE_DIR": str(cache_dir()),
        "PAGEDCHAT_KV_DISK_BYTES": "0",
        "PAGEDCHAT_LOG_LEVEL": "warning",
    }
    server = spawn_pagedchat("server", env, log_dir, isolated=True)
    try:
        wait_ready(server)
        base = server.base_url
        victim_stream_s(base, args.victim_tokens)  # warm-up
        results = [scenario(base, regex, args) for regex in args.regex or ["a{100000}"]]
        print(json.dumps(results, indent=2))
    finally:
        stop_server(server)


if __name__ == "__main__":
    main()
