"""A flood of wrong sign-ins against `pagedchat serve --auth local` (issue #35, item 3): how long a real user's
sign-in from another address takes, and the pace of a chat stream, while the flood lasts.

    python -m bench.tools.signin_flood [--repo DIR] [--flood 80] [--addresses 1] [--max-tokens 96]

`--repo`: the checkout whose server runs (an old one, to compare); the model is the default (SmolLM2-135M) from the
cache dir. Prints one JSON line: the quiet baseline, then the same under the flood.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common.servers import free_port

ADMIN, ADMIN_PASSWORD = "root", "root password 1"
USER, PASSWORD = "alice", "alice password 1"


def client(base: str, address: str = "127.0.0.1") -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=address)
    return httpx.Client(base_url=base, transport=transport, headers={"Origin": base}, timeout=300)


def timed_sign_in(base: str, address: str) -> dict[str, Any]:
    """A correct sign-in, retried after Retry-After while refused: seconds until signed in, and the refusals."""
    start, refusals = time.perf_counter(), []
    with client(base, address) as c:
        while True:
            response = c.post("/auth/login", json={"username": USER, "password": PASSWORD})
            if response.status_code == 200:
                return {"seconds": round(time.perf_counter() - start, 3), "refusals": refusals}
            refusals.append(response.status_code)
            time.sleep(float(response.headers.get("retry-after", "1")))


def stream_rate(chat: httpx.Client, max_tokens: int) -> dict[str, float]:
    """One streamed reply: tokens per second after the first, and the longest gap between two tokens."""
    body = {
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    times = []
    with chat.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]" and '"content"' in line:
                times.append(time.perf_counter())
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return {
        "tokens": len(times),
        "tokens_per_s": round((len(times) - 1) / (times[-1] - times[0]), 1),
        "max_gap_s": round(max(gaps), 3),
    }


def flood(base: str, num: int, num_addresses: int, statuses: list[int]) -> list[threading.Thread]:
    """`num` concurrent wrong sign-ins from `num_addresses` addresses (127.0.2.x), started now, each for a username
    of its own (spraying: no account's counter stops them, only the addresses' and the hashing queue)."""

    def guess(i: int) -> None:
        with client(base, f"127.0.2.{1 + i % num_addresses}") as c:
            statuses.append(
                c.post("/auth/login", json={"username": f"user{i}", "password": "a guess 1"}).status_code
            )

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(num)]
    for thread in threads:
        thread.start()
    return threads


def measure(base: str, chat: httpx.Client, args: argparse.Namespace, flooded: bool) -> dict[str, Any]:
    statuses: list[int] = []
    threads = flood(base, args.flood, args.addresses, statuses) if flooded else []
    time.sleep(0.2 if flooded else 0)  # the flood is queued before the real user comes
    result: dict[str, Any] = {}
    streamer = threading.Thread(target=lambda: result.update(stream=stream_rate(chat, args.max_tokens)))
    streamer.start()
    result["sign_in"] = timed_sign_in(base, "127.0.3.1")
    streamer.join()
    flood_start = time.perf_counter()
    for thread in threads:
        thread.join()
    if flooded:
        result["flood"] = {str(s): statuses.count(s) for s in sorted(set(statuses))}
        result["flood_left_s"] = round(time.perf_counter() - flood_start, 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--flood", type=int, default=80)
    parser.add_argument("--addresses", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="signin-flood-"))
    port = free_port()
    env = {
        **os.environ,
        "PAGEDCHAT_AUTH": "local",
        "PAGEDCHAT_FIRST_ADMIN": ADMIN,
        "PAGEDCHAT_FIRST_ADMIN_PASSWORD": ADMIN_PASSWORD,
        "PAGEDCHAT_KV_DISK_DIR": str(home / "kv"),
        "PAGEDCHAT_LOG_LEVEL": "warning",
    }
    cmd = [sys.executable, "-m", "pagedchat", "serve", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--database-url", f"sqlite:///{home / 'db.sqlite'}"]
    with open(home / "server.log", "wb") as log:
        server = subprocess.Popen(
            cmd, env=env, cwd=args.repo, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        admin = client(base)
        assert (
            admin.post("/auth/login", json={"username": ADMIN, "password": ADMIN_PASSWORD}).status_code == 200
        )
        assert admin.post("/api/users", json={"username": USER, "password": PASSWORD}).status_code == 201
        stream_rate(admin, 8)  # warm up
        quiet = measure(base, admin, args, flooded=False)
        flooded = measure(base, admin, args, flooded=True)
        print(
            json.dumps(
                {
                    "repo": args.repo,
                    "flood": args.flood,
                    "addresses": args.addresses,
                    "quiet": quiet,
                    "flooded": flooded,
                }
            )
        )
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
