"""How much a costly structured-output grammar slows another user: one user's 32-token stream, alone and beside
attackers that each keep one `guided_regex` request in flight (re-sent as soon as it ends), on a real
`pagedchat serve` started from this checkout (issue #35, item 8).

Prints the victim's stream times alone and under attack (in alternating rounds, so that each pair sees the same load
from whatever else runs on the machine), the ratio of their medians, and how the attack requests ended (HTTP status
and error, or the finish reason of a 200). Run it from the checkout to measure (`cd <checkout> && python -m
bench.tools.guided_mask_attack`); the model is the provisioned default unless --model says otherwise.

    python -m bench.tools.guided_mask_attack [--regex 'a{100000}' ...] [--distinct] [--attackers 8] [--runs 5]

`--regex ''` sends unconstrained requests of the same length instead: what 8 more sequences cost the victim anyway.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.common.servers import spawn_pagedchat, stop_server, wait_ready
from engine.core.paths import cache_dir

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


class Attack:
    """Attackers that each keep one request in flight while `running` is set (re-sent as soon as it ends)."""

    def __init__(self, base_url: str, regexes: list[str], max_tokens: int) -> None:
        self.base_url, self.max_tokens = base_url, max_tokens
        self.running, self.done = threading.Event(), threading.Event()
        self.in_flight = 0
        self.lock = threading.Lock()
        self.outcomes: collections.Counter = collections.Counter()
        self.threads = [threading.Thread(target=self._loop, args=(r,), daemon=True) for r in regexes]
        for thread in self.threads:
            thread.start()

    def _loop(self, regex: str) -> None:
        body = {
            "messages": PROMPT,
            "max_tokens": self.max_tokens,
            "temperature": 1.0,
            "ignore_eos": not regex,
        }
        if regex:  # else plain requests of the same length: the baseline cost of more sequences in the batch
            body["guided_regex"] = regex
        with httpx.Client(timeout=600) as client:
            while not self.done.is_set():
                if not self.running.wait(0.05):
                    continue
                with self.lock:
                    self.in_flight += 1
                try:
                    response = client.post(self.base_url + "/v1/chat/completions", json=body)
                finally:
                    with self.lock:
                        self.in_flight -= 1
                self._count(response)

    def _count(self, response: httpx.Response) -> None:
        if response.status_code == 200:
            self.outcomes["200 " + str(response.json()["choices"][0]["finish_reason"])] += 1
            return
        error = response.json().get("error", {})
        message = re.sub(r"[0-9.]+ (ms|s)\b", "N \\1", error.get("message", ""))  # one key per kind of error
        self.outcomes[f"{response.status_code} {error.get('code')}: {message[:110]}"] += 1

    def pause(self) -> None:
        """Stop sending and wait until no attack request is in flight."""
        self.running.clear()
        while self.in_flight:
            time.sleep(0.02)

    def stop(self) -> None:
        self.pause()
        self.done.set()
        for thread in self.threads:
            thread.join()


def scenario(base: str, regex: str, args: argparse.Namespace) -> dict:
    """Rounds of: the victim's stream alone, then beside the attackers (so each pair sees the same machine load);
    the medians, and how the attack requests ended."""
    # --distinct: a grammar of each attacker's own (`|q{i}` changes no mask), so they share no lexer state
    regexes = [f"{regex}|q{{{i + 1}}}" if args.distinct and regex else regex for i in range(args.attackers)]
    attack = Attack(base, regexes, args.attack_tokens)
    alone, attacked = [], []
    for _ in range(args.runs):
        alone.append(victim_stream_s(base, args.victim_tokens))
        attack.running.set()
        time.sleep(1.0)  # the attack requests are in flight
        attacked.append(victim_stream_s(base, args.victim_tokens))
        attack.pause()
    attack.stop()
    return {
        "regex": regex,
        "attackers": args.attackers,
        "distinct": args.distinct,
        "victim_alone_s": [round(t, 3) for t in alone],
        "victim_attacked_s": [round(t, 3) for t in attacked],
        "slowdown": round(statistics.median(attacked) / statistics.median(alone), 1),
        "attack_outcomes": dict(attack.outcomes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--regex", action="append", help="the attack's guided_regex (repeat: one scenario each)"
    )
    parser.add_argument("--attackers", type=int, default=8)
    parser.add_argument("--distinct", action="store_true", help="a different grammar per attacker")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--victim-tokens", type=int, default=32)
    parser.add_argument("--attack-tokens", type=int, default=64, help="max_tokens of each attack request")
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
