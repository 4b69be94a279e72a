"""`bench multiturn --scenario returning`: users who come back after their KV blocks have left the RAM pool.

N users (each its own API key, so its own prefix-cache tenant) hold session-API conversations of K turns with long
messages, so that a prompt reaches about --history-tokens at turn K. They speak in rounds, one after another (at most
--concurrency at once): between two turns of a user every other user has one, which in a pool of about a quarter of
all histories evicts that user's blocks meanwhile. Three runs, each on its own server:

- in-ram: a pool that holds every history and no disk tier: a returning turn is a RAM hit (the reference);
- no-tier: the quarter pool without a disk tier: an evicted history is recomputed;
- tier: the quarter pool with the disk tier; after turn --restart-after the server is stopped (SIGTERM: it writes
  its queue) and started again on the same database and directories, and the next turn of every conversation
  shows how much of its history the new process reused.

Before each round of the tier run its block files are written back and dropped from the OS page cache
(posix_fadvise DONTNEED), so the tier reads from the disk, not from memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from bench.common import servers
from bench.common.report import print_report, targets_payload, write_results
from bench.common.workload import long_user_turns, system_prompt
from bench.returning.report import HEADERS, make_targets, plot, table_rows, ttft_ratios
from bench.returning.rounds import RunSpec, Script, play, pool_of
from engine.core.config import EngineConfig

RUNS = ("in-ram", "no-tier", "tier")
DEFAULT_USERS, DEFAULT_TURNS = 8, 6  # about 15 min on a 2-core CPU with the default model
ISSUE_SETTING = "64 users x 10 turns (--users 64 --turns 10)"
EXCHANGE_TEMPLATE_TOKENS = 12  # role markers around a user message and its answer
MIN_USER_TOKENS = 16
BENCH_API_KEY = "pagedchat-returning"
TIER_BYTES = 4 * 1024**3  # the tier run's least cap (the server's own default) unless --kv-disk-bytes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the returning scenario (the other `bench multiturn` options it uses: users, turns, system-tokens,
    max-tokens, keep-logs)."""
    group = parser.add_argument_group(
        "--scenario returning",
        f"defaults {DEFAULT_USERS} users x {DEFAULT_TURNS} turns; the issue's full setting is {ISSUE_SETTING}. "
        "Servers, databases and the tier's fresh directory go to --keep-logs (default: a temporary folder): choose "
        "it on the disk to measure (--kv-disk-dir is not used). --kv-disk-bytes caps the tier (default: what every "
        "history takes, at least 4 GiB).",
    )
    group.add_argument(
        "--history-tokens",
        type=int,
        default=2000,
        help="prompt tokens a conversation reaches at its last turn (default: 2000)",
    )
    group.add_argument(
        "--pool-tokens",
        type=int,
        default=None,
        help="RAM pool of the tier and no-tier runs in tokens (default: a quarter of all users' last prompts; "
        "--kv-cache-bytes, if given, sets it in bytes instead)",
    )
    group.add_argument(
        "--restart-after",
        type=int,
        default=None,
        help="restart the tier run's server after this turn (default: turns // 2; 0: no restart)",
    )
    group.add_argument(
        "--concurrency", type=int, default=1, help="users sending at the same time (default: 1)"
    )
    group.add_argument(
        "--runs",
        default=",".join(RUNS),
        help=f"comma-separated subset of {','.join(RUNS)} (default: all; a target needing a run left out is too)",
    )


@dataclasses.dataclass(frozen=True)
class Plan:
    """The scenario's sizes, fixed before any server starts (pool bytes follow from the model's bytes per token)."""

    num_users: int
    num_turns: int
    system_tokens: int
    user_tokens: int  # of each user message
    max_tokens: int
    history_tokens: int
    max_model_len: int
    pool_tokens: int  # tier and no-tier runs, whole blocks
    in_ram_pool_tokens: int
    restart_after: int  # 0: none
    concurrency: int
    runs: tuple[str, ...]


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def make_plan(args: argparse.Namespace, system_tokens: int, config: EngineConfig) -> Plan:
    """Sizes from the options and the system prompt's length; ValueError naming the option that leaves no room."""
    users, turns, max_tokens, bs = args.users, args.turns, args.max_tokens, config.block_size
    runs = tuple(r for r in RUNS if r in {name.strip() for name in args.runs.split(",")})
    unknown = {name.strip() for name in args.runs.split(",")} - set(RUNS)
    if unknown or not runs:
        raise ValueError(f"--runs {args.runs!r}: choose from {','.join(RUNS)}")
    if users < 1 or turns < 2 or args.concurrency < 1:
        raise ValueError(
            f"needs --users >= 1, --turns >= 2, --concurrency >= 1; got {users}, {turns}, {args.concurrency}"
        )
    per_exchange = max_tokens + EXCHANGE_TEMPLATE_TOKENS
    user_tokens = (args.history_tokens - system_tokens - (turns - 1) * per_exchange) // turns
    if user_tokens < MIN_USER_TOKENS:
        raise ValueError(
            f"--history-tokens {args.history_tokens} leaves {user_tokens} tokens per user message (at least "
            f"{MIN_USER_TOKENS}) after a {system_tokens}-token system prompt and {turns - 1} answers of {max_tokens}"
        )
    # room for the last prompt (its length is an estimate) and its answer
    max_model_len = config.max_model_len or _round_up(args.history_tokens * 5 // 4 + max_tokens, bs)
    quarter = users * (args.history_tokens + max_tokens) // 4
    pool_tokens = _round_up(args.pool_tokens or max(quarter, max_model_len), bs)
    if pool_tokens < max_model_len:
        raise ValueError(f"--pool-tokens {pool_tokens} holds no max_model_len ({max_model_len}) sequence")
    restart_after = turns // 2 if args.restart_after is None else args.restart_after
    if not 0 <= restart_after < turns:
        raise ValueError(
            f"--restart-after {restart_after} must be 0 (none) or a turn before the last ({turns})"
        )
    in_ram = _round_up((users + args.concurrency) * max_model_len, bs)
    return Plan(
        users, turns, system_tokens, user_tokens, max_tokens, args.history_tokens, max_model_len,
        pool_tokens, in_ram, restart_after, args.concurrency, runs,
    )  # fmt: skip


def _fit_pool(
    started: list[servers.ServerProcess],
    config: EngineConfig,
    pool_tokens: int | None,
    at_least: bool,
    env: dict[str, str],
) -> tuple[int, int]:
    """Make `started[0]`'s pool hold `pool_tokens` (`at_least`: or more; None: as configured), starting it again
    sized from its bytes per token when it does not; returns those bytes and the tokens the pool holds."""
    bytes_per_token, capacity = pool_of(started[0].base_url)
    if pool_tokens is None or capacity == pool_tokens or (at_least and capacity > pool_tokens):
        return bytes_per_token, capacity
    servers.stop_server(started[0])
    sized = dataclasses.replace(config, kv_cache_bytes=pool_tokens * bytes_per_token)
    log_dir = started[0].log_path.parent
    started[0] = servers.wait_ready(servers.start_pagedchat(started[0].name, sized, log_dir, env))
    return pool_of(started[0].base_url)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The runs (servers started here, one after the other), the per-turn table and the targets."""
    from engine.loading.loader import load_tokenizer, resolve_config_model

    config = args.engine_config
    tokenizer = load_tokenizer(resolve_config_model(config))
    system = system_prompt(tokenizer, args.system_tokens)
    try:
        plan = make_plan(args, len(tokenizer.encode(system, add_special_tokens=False)), config)
    except ValueError as exc:
        raise SystemExit(f"bench multiturn --scenario returning: {exc}") from None
    messages = [
        long_user_turns(tokenizer, u, plan.num_turns, plan.user_tokens, args.seed)
        for u in range(plan.num_users)
    ]
    keys = tuple(f"{BENCH_API_KEY}-{u}" for u in range(plan.num_users + 1))
    script = Script(system, messages, keys, plan.max_tokens)
    env = {"PAGEDCHAT_API_KEYS": ",".join(keys), "PAGEDCHAT_PREFIX_CACHE_ISOLATION": "true"}
    base = dataclasses.replace(
        config, enable_prefix_caching=True, max_model_len=plan.max_model_len, kv_disk_bytes=0, kv_disk_dir=""
    )
    runs: dict[str, dict[str, Any]] = {}
    bytes_per_token = 0  # learnt from the first server: none is sized before
    with servers.log_folder(args.keep_logs) as logs:
        # fresh (no earlier run's blocks), and made by the tier itself: its block files lie in it, not in a subdirectory
        tier_dir = Path(tempfile.mkdtemp(prefix="kv-tier-", dir=logs)) / "tier"
        for name in plan.runs:
            # pools in tokens, made bytes once a server told the bytes of a token; --kv-cache-bytes: as given
            pool_tokens = plan.in_ram_pool_tokens if name == "in-ram" else plan.pool_tokens
            cfg = dataclasses.replace(base, kv_cache_bytes=pool_tokens * bytes_per_token or None)
            if name != "in-ram" and config.kv_cache_bytes is not None:
                cfg, pool_tokens = dataclasses.replace(base, kv_cache_bytes=config.kv_cache_bytes), None
            spec = RunSpec(name, plan.concurrency)
            if name == "tier":
                # room for every history (the in-RAM pool's size), so the tier need not evict what users return to
                cap = config.kv_disk_bytes or max(TIER_BYTES, plan.in_ram_pool_tokens * bytes_per_token)
                tiered = {"kv_disk_bytes": cap, "kv_disk_dir": str(tier_dir)}
                cfg = dataclasses.replace(cfg, **tiered)
                spec = RunSpec(name, plan.concurrency, tier_dir, plan.restart_after)
            started = [servers.start_pagedchat(f"returning-{name}", cfg, logs, env)]
            with servers.running(started):  # stops started[0], whichever server that is by then
                bytes_per_token, capacity = _fit_pool(started, cfg, pool_tokens, name == "in-ram", env)
                runs[name] = {"pool_tokens": capacity, **play(started, script, spec)}
    targets = make_targets(runs, plan.restart_after if "tier" in runs else 0)
    payload = {
        "model": config.model,
        "scenario": "returning",
        "workload": _workload(plan, bytes_per_token, len(system)),
        "runs": runs,
        "ttft_ratios": ttft_ratios(runs),
        "targets": targets_payload(targets),
    }
    paths = write_results("multiturn-returning", payload, plot(runs), args.results_dir, args.command_line)
    pools = ", ".join(f"{name} {r['pool_tokens']}" for name, r in runs.items())
    title = (
        f"multiturn, returning users: {plan.num_users} users x {plan.num_turns} turns, ~{plan.history_tokens}-token "
        f"last prompts; pools in tokens: {pools}"
    )
    print_report(title, HEADERS, table_rows(runs), targets, paths)
    return payload


def _workload(plan: Plan, bytes_per_token: int, system_chars: int) -> dict[str, Any]:
    return {
        "label": "synthetic: session-API conversations, each user pasting seeded meeting notes every turn",
        **dataclasses.asdict(plan),
        "kv_bytes_per_token": bytes_per_token,
        "system_prompt_chars": system_chars,
        "temperature": 0.0,
        "order": "rounds: every user's turn k, in user order (at most `concurrency` at once), then turn k + 1; "
        "between two turns of one user every other user has one",
        "identities": "one API key per user (its own prefix-cache tenant); a warm-up turn under its own key before "
        "the first round and after the restart",
        "cold_reads": "before each round of the tier run its block files are fdatasync-ed and dropped from the page "
        "cache (posix_fadvise DONTNEED), once the tier's writer has settled",
        "restart": "tier run only: SIGTERM after turn `restart_after` (the server writes its queue), then the same "
        "command on the same port, database and tier directory",
        "shares": "RAM/disk/recomputed: of the prompt tokens of a turn's replies (usage.cached_tokens); the disk's "
        "part from the server's counters before and after the round (see disk_split_source)",
        "history_reused": "cached prompt tokens / the conversation's previous prompt and answer",
        "issue_setting": ISSUE_SETTING,
    }
