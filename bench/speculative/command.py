"""`bench speculative`: what prompt-lookup speculation buys in decode speed on a chat workload (issue #40).

The workload (bench/speculative/workload.py) was written before any proposer was tuned on it: code edits on pasted
code, quotes and summaries of a pasted document, revisions of the previous answer, and open questions as the
control. One engine is built from the common engine flags, speculation as they configure it (`--speculative-method
ngram`, `--num-speculative-tokens`, `--ngram-min`, `--ngram-max`; `off` is refused: there would be nothing to
compare). After a warm-up (the first prompt, up to 64 tokens, with speculation and without: on a real model's edits
or quotes that verifies proposals, so the kernels of a step of several rows are warm), every prompt is answered
greedily (temperature 0), one conversation at a time, twice: with `SamplingParams(speculative=False)` and with
`speculative=True` (the order alternates from prompt to prompt). A request's decode speed is (generated tokens - 1)
/ (its last token's time - its first token's) from RequestOutput.metrics: the prefill is left out, so the second run
of a prompt gains nothing on decode from finding the first's blocks in the prefix cache; the engine runs with prefix
caching off all the same, so that the `--concurrency` totals, which include the prefills, are fair too.

Reported per category (and over all of them): decode tok/s without speculation and with it (tokens over seconds,
summed over the category's requests) and their ratio; from the planner's counters (engine/core/speculative.py,
`SpecCounters`) during the speculative runs: drafted and accepted tokens (the acceptance rate), tokens per
verification (1 + the accepted tokens of a verified draft), tokens per decode step, the share of decode steps that
verified a proposal, and the share of accepted tokens whose proposal was copied from the prompt rather than from the
reply's own earlier text; and greedy agreement, the share of prompts whose two answers are the same token for token
(speculative verification must not change a greedy answer).

`--concurrency N` (N > 1) also sends the chosen categories' prompts, cycled to max(N, number of prompts) requests, N
in flight at a time (a closed loop: a finished request's place goes to the next), with speculation on and then off,
and reports generated tokens per second of wall time for each (prefills included) and their ratio.

`--baseline-url URL` (repeatable): a running llama.cpp `llama-server` on the same GGUF, started with or without its
own speculation (`--spec-type ngram-simple ...`): each prompt's very token ids go to its `/completion` (n_predict
`--max-tokens`, temperature 0, cache_prompt false), one at a time after a warm-up, and its decode speed is read from
its own `timings` (predicted_n / predicted_ms, which its predicted_per_second is: it may count the first token,
which ours leaves out, under 0.4% at 256 tokens; draft_n and draft_n_accepted where it drafted). Reported per
baseline and category (a second llama.cpp is named llama.cpp-2), with pagedchat's speculative decode tok/s over it.
The commands that start both kinds are in docs/performance/index.md.

`--replay-k K,...` adds the proposer's ceiling: each answer without speculation replayed through the n-gram proposer
(engine/core/ngram.py) as if every proposal of up to k tokens were verified (no planner weighing what rows cost), the
tokens per decode step and acceptance that would give. Beside the live figures it shows what the planner declines.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import time
from dataclasses import dataclass
from typing import Any

from bench.common.report import (
    format_table,
    new_figure,
    positive_ints,
    print_report,
    without_disk_tier,
    write_results,
)
from bench.speculative.workload import CATEGORIES
from engine.core.ngram import NgramIndex

WARMUP_TOKENS = 64  # the warm-up's reply: long enough, on the edits or quotes, to verify some proposals


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench speculative`."""
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens a reply may have (default 256)")
    parser.add_argument(
        "--categories",
        default=",".join(CATEGORIES),
        help=f"workload categories, comma-separated (default all: {','.join(CATEGORIES)})",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="above 1: also send the prompts (cycled to at least N requests) N at a time, speculation on and then "
        "off, and report generated tokens per second of wall time (default 1: one at a time only)",
    )
    parser.add_argument(
        "--baseline-url",
        action="append",
        default=[],
        help="a running llama.cpp llama-server on the same GGUF (with or without its --spec-type); each prompt's "
        "ids go to its /completion one at a time and its decode tok/s is read from its timings; repeatable",
    )
    parser.add_argument(
        "--replay-k",
        type=positive_ints,
        default=[],
        help="also replay the answers through the n-gram proposer with proposals of up to k tokens, comma-separated "
        "(e.g. 2,4,8): the acceptance if every proposal were verified; default none",
    )


@dataclass
class Decode:
    """Requests' decode, summed: tokens after each one's first over the seconds from its first token to its last."""

    requests: int = 0
    tokens: int = 0  # generated, all of them
    decode_tokens: int = 0
    decode_s: float = 0.0

    def add_output(self, output) -> None:
        generated = len(output.outputs[0].token_ids)
        span = output.metrics.decode_time
        self.requests += 1
        self.tokens += generated
        if generated > 1 and span:
            self.decode_tokens += generated - 1
            self.decode_s += span

    @property
    def tokens_per_s(self) -> float | None:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else None


@dataclass
class Spec:
    """The planner's counters over some requests (SpecCounters' differences)."""

    drafts: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_from_prompt: int = 0

    @classmethod
    def between(cls, before, after) -> Spec:
        return cls(
            after.num_drafts - before.num_drafts,
            after.num_draft_tokens - before.num_draft_tokens,
            after.num_accepted_tokens - before.num_accepted_tokens,
            after.accepted_from_prompt - before.accepted_from_prompt,
        )

    def add(self, other: Spec) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


@dataclass
class Category:
    """One category's (or all categories') two runs of each prompt."""

    off: Decode = dataclasses.field(default_factory=Decode)
    on: Decode = dataclasses.field(default_factory=Decode)
    spec: Spec = dataclasses.field(default_factory=Spec)
    identical: int = 0

    def add(self, other: Category) -> None:
        for name in ("off", "on"):
            mine, theirs = getattr(self, name), getattr(other, name)
            for field in dataclasses.fields(mine):
                setattr(mine, field.name, getattr(mine, field.name) + getattr(theirs, field.name))
        self.spec.add(other.spec)
        self.identical += other.identical

    def summary(self) -> dict[str, Any]:
        s, on = self.spec, self.on
        steps = on.decode_tokens - s.accepted  # each decode step: its accepted tokens and one of its own
        return {
            "prompts": self.off.requests,
            "off_tokens": self.off.tokens,
            "off_decode_tokens": self.off.decode_tokens,
            "off_decode_s": self.off.decode_s,
            "off_tokens_per_s": self.off.tokens_per_s,
            "on_tokens": on.tokens,
            "on_decode_tokens": on.decode_tokens,
            "on_decode_s": on.decode_s,
            "on_tokens_per_s": on.tokens_per_s,
            "ratio_on_off": _ratio(on.tokens_per_s, self.off.tokens_per_s),
            "drafts": s.drafts,
            "drafted": s.drafted,
            "accepted": s.accepted,
            "accepted_from_prompt": s.accepted_from_prompt,
            "decode_steps": steps,
            "acceptance_rate": _ratio(s.accepted, s.drafted),
            "tokens_per_verification": _ratio(s.drafts + s.accepted, s.drafts),
            "tokens_per_decode_step": _ratio(on.decode_tokens, steps),
            "proposal_share": _ratio(s.drafts, steps),
            "prompt_share_of_accepted": _ratio(s.accepted_from_prompt, s.accepted),
            "reply_share_of_accepted": _ratio(s.accepted - s.accepted_from_prompt, s.accepted),
            "identical": self.identical,
            "identical_share": _ratio(self.identical, self.off.requests),
        }


@dataclass
class ReplayStats:
    """One answer replayed with proposals of up to k tokens (or a category's answers summed)."""

    decode_tokens: int = 0  # the answer's tokens after the first (which the prefill step gives)
    steps: int = 0  # decode steps with speculation
    steps_with_proposal: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_from_prompt: int = 0

    def add(self, other: ReplayStats) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def summary(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "tokens_per_step": _ratio(self.decode_tokens, self.steps),
            "acceptance_rate": _ratio(self.accepted, self.drafted),
            "proposal_share": _ratio(self.steps_with_proposal, self.steps),
            "prompt_share_of_accepted": _ratio(self.accepted_from_prompt, self.accepted),
        }


def replay(prompt_ids: list[int], output_ids: list[int], k: int, min_n: int, max_n: int) -> ReplayStats:
    """Greedy speculative decoding of `output_ids` after `prompt_ids`, proposals of up to k tokens: each step
    accepts the proposal's leading tokens that equal the answer's and adds the answer's next token."""
    stats = ReplayStats(decode_tokens=max(0, len(output_ids) - 1))
    index = NgramIndex(min_n, max_n, prompt_ids)
    index.extend(output_ids[:1])
    done = min(1, len(output_ids))
    while done < len(output_ids):
        remaining = len(output_ids) - done
        proposal = index.propose(min(k, remaining))
        accepted = 0
        for token in proposal.token_ids:
            if token != output_ids[done + accepted]:
                break
            accepted += 1
        emitted = min(accepted + 1, remaining)
        stats.steps += 1
        stats.steps_with_proposal += bool(proposal.token_ids)
        stats.drafted += len(proposal.token_ids)
        stats.accepted += accepted
        if 0 <= proposal.source < len(prompt_ids):
            stats.accepted_from_prompt += accepted
        index.extend(output_ids[done : done + emitted])
        done += emitted
    return stats


def _check(args: argparse.Namespace) -> list[str]:
    """The chosen categories; bad arguments end the command with a line."""
    names = [c.strip() for c in args.categories.split(",") if c.strip()]
    unknown = [c for c in names if c not in CATEGORIES]
    if unknown or not names:
        raise SystemExit(
            f"bench speculative: unknown categories {unknown or names}; choose from {list(CATEGORIES)}"
        )
    config = args.engine_config
    if config.speculative_method == "off":
        raise SystemExit(
            "bench speculative: --speculative-method off leaves nothing to compare; use ngram (the default)"
        )
    if not 1 <= config.ngram_min <= config.ngram_max:
        raise SystemExit(
            f"bench speculative: --ngram-min {config.ngram_min} and --ngram-max {config.ngram_max} must satisfy "
            "1 <= min <= max"
        )
    if args.max_tokens < 2:
        raise SystemExit(
            f"bench speculative: --max-tokens must be at least 2 (a decode step), got {args.max_tokens}"
        )
    if args.concurrency < 1:
        raise SystemExit(f"bench speculative: --concurrency must be at least 1, got {args.concurrency}")
    return names


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Each prompt without speculation and with it, one at a time; optionally N at a time, llama-server baselines
    and the replay; print, write JSON + PNG."""
    from engine import LLM, SamplingParams

    names = _check(args)
    config = dataclasses.replace(without_disk_tier(args.engine_config), enable_prefix_caching=False)
    llm = LLM(**dataclasses.asdict(config))
    engine = llm.engine
    if engine.spec is None:
        raise SystemExit(f"bench speculative: the engine built no planner for {config.speculative_method!r}")
    prompts = [
        (name, engine.apply_chat_template(messages)) for name in names for messages in CATEGORIES[name]
    ]

    def params(speculative: bool, max_tokens: int = args.max_tokens) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, speculative=speculative)

    for speculative in (True, False):  # warm-up: the kernels of a step with proposed rows, and the plain ones
        llm.generate([prompts[0][1]], params(speculative, min(WARMUP_TOKENS, args.max_tokens)))

    by_category = {name: Category() for name in names}
    requests, answers = [], []
    for i, (name, ids) in enumerate(prompts):
        runs = {}
        for speculative in (False, True) if i % 2 == 0 else (True, False):
            before = dataclasses.replace(engine.spec.counters)
            (output,) = llm.generate([ids], params(speculative))
            runs[speculative] = (output, Spec.between(before, engine.spec.counters))
        (off, _), (on, spec) = runs[False], runs[True]
        one = Category(spec=spec)
        one.off.add_output(off)
        one.on.add_output(on)
        one.identical = int(off.outputs[0].token_ids == on.outputs[0].token_ids)
        by_category[name].add(one)
        answers.append(off.outputs[0].token_ids)
        requests.append({"category": name, "prompt_tokens": len(ids), **one.summary()})
    total = Category()
    for category in by_category.values():
        total.add(category)
    points = [{"category": name, **by_category[name].summary()} for name in names]
    points.append({"category": "all", **total.summary()})

    resolved = engine.config
    payload: dict[str, Any] = {
        "model": resolved.model,
        "config": {
            "speculative_method": resolved.speculative_method,
            "num_speculative_tokens": resolved.num_speculative_tokens,
            "ngram_min": resolved.ngram_min,
            "ngram_max": resolved.ngram_max,
            "max_num_seqs": resolved.max_num_seqs,
            "quantization": resolved.quantization,
            "dtype": resolved.dtype,
            "enable_prefix_caching": False,
        },
        "max_tokens": args.max_tokens,
        "temperature": 0.0,
        "prompts_per_category": {name: len(CATEGORIES[name]) for name in names},
        "points": points,
        "requests": requests,
        "concurrency": None,
        "baselines": [],
    }
    if args.concurrency > 1:
        payload["concurrency"] = _concurrent(llm, [ids for _, ids in prompts], args.concurrency, params)
    on_speed = {p["category"]: p["on_tokens_per_s"] for p in points}
    for j, url in enumerate(args.baseline_url):
        baseline = _baseline(url, prompts, args.max_tokens, names, on_speed)
        if j and any(b["name"] == baseline["name"] for b in payload["baselines"]):
            baseline["name"] = f"{baseline['name']}-{j + 1}"
        payload["baselines"].append(baseline)
    if args.replay_k:
        payload["replay"] = _replay(prompts, answers, args.replay_k, resolved.ngram_min, resolved.ngram_max)

    paths = write_results("speculative", payload, _plot(payload), args.results_dir, args.command_line)
    _print(payload, paths)
    return payload


def _concurrent(llm, prompts: list[list[int]], concurrency: int, params) -> dict[str, Any]:
    """The prompts cycled to max(concurrency, len(prompts)) requests, `concurrency` in flight at a time, with
    speculation on and then off: generated tokens per second of wall time."""
    engine = llm.engine
    cycled = list(itertools.islice(itertools.cycle(prompts), max(concurrency, len(prompts))))
    result: dict[str, Any] = {"concurrency": concurrency, "requests": len(cycled)}
    outputs = {}
    for label, speculative in (("on", True), ("off", False)):
        before = dataclasses.replace(engine.spec.counters)
        pending = list(enumerate(cycled))
        done: dict[int, list[int]] = {}
        in_flight = 0
        start = time.perf_counter()
        while pending or in_flight:
            while pending and in_flight < concurrency:
                i, ids = pending.pop(0)
                engine.add_request(f"bench-spec-{label}-{i}", ids, params(speculative))
                in_flight += 1
            for output in engine.step():
                if output.finished:
                    done[int(output.request_id.rsplit("-", 1)[1])] = output.outputs[0].token_ids
                    in_flight -= 1
        seconds = time.perf_counter() - start
        spec = Spec.between(before, engine.spec.counters)
        tokens = sum(len(t) for t in done.values())
        outputs[label] = done
        result[label] = {
            "tokens": tokens,
            "seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds > 0 else None,
            **dataclasses.asdict(spec),
            "acceptance_rate": _ratio(spec.accepted, spec.drafted),
        }
    result["ratio_on_off"] = _ratio(result["on"]["tokens_per_s"], result["off"]["tokens_per_s"])
    identical = sum(outputs["on"][i] == outputs["off"][i] for i in range(len(cycled)))
    result["identical"], result["identical_share"] = identical, identical / len(cycled)
    return result


def _baseline(
    url: str,
    prompts: list[tuple[str, list[int]]],
    max_tokens: int,
    names: list[str],
    on_speed: dict[str, float | None],
) -> dict[str, Any]:
    """Every prompt's ids on a llama-server's /completion, one at a time after a warm-up, greedy, its prompt cache
    off; its decode speed and drafts from its own `timings`, summed per category."""
    import httpx

    from bench.common import servers

    name = servers.baseline_name(servers.served_model(url))
    sums = {n: dict.fromkeys(("requests", "tokens", "ms", "draft_n", "draft_n_accepted"), 0) for n in names}
    speculates = False
    with httpx.Client(base_url=url, timeout=3600) as client:
        for i, (category, ids) in enumerate([prompts[0], *prompts]):
            body = {
                "prompt": ids,
                "n_predict": min(WARMUP_TOKENS, max_tokens) if i == 0 else max_tokens,
                "temperature": 0.0,
                "cache_prompt": False,
            }
            response = client.post("/completion", json=body)
            response.raise_for_status()
            timings = response.json()["timings"]
            if timings.get("prompt_n") not in (None, len(ids)):
                raise RuntimeError(f"{name} read {timings['prompt_n']} prompt tokens, not {len(ids)}")
            if i == 0:  # the warm-up
                continue
            s = sums[category]
            s["requests"] += 1
            s["tokens"] += timings["predicted_n"]
            s["ms"] += timings["predicted_ms"]
            if "draft_n" in timings:
                speculates = True
                s["draft_n"] += timings["draft_n"]
                s["draft_n_accepted"] += timings.get("draft_n_accepted", 0)
    all_sums = {key: sum(s[key] for s in sums.values()) for key in next(iter(sums.values()))}
    points = []
    for category, s in [*sums.items(), ("all", all_sums)]:
        speed = 1000 * s["tokens"] / s["ms"] if s["ms"] > 0 else None
        points.append(
            {
                "category": category,
                "requests": s["requests"],
                "tokens": s["tokens"],
                "decode_ms": s["ms"],
                "tokens_per_s": speed,
                "draft_n": s["draft_n"] if speculates else None,
                "draft_n_accepted": s["draft_n_accepted"] if speculates else None,
                "acceptance_rate": _ratio(s["draft_n_accepted"], s["draft_n"]) if speculates else None,
                "ratio_pagedchat_on": _ratio(on_speed.get(category), speed),
            }
        )
    return {"name": name, "url": url, "speculates": speculates, "points": points}


def _replay(
    prompts: list[tuple[str, list[int]]], answers: list[list[int]], ks: list[int], min_n: int, max_n: int
) -> list[dict[str, Any]]:
    totals: dict[tuple[str, int], ReplayStats] = {}
    for (name, ids), answer in zip(prompts, answers, strict=True):
        for k in ks:
            totals.setdefault((name, k), ReplayStats()).add(replay(ids, answer, k, min_n, max_n))
    return [{"category": name, "k": k, **stats.summary()} for (name, k), stats in totals.items()]


def _plot(payload: dict[str, Any]):
    points = [p for p in payload["points"] if p["category"] != "all"]
    names = [p["category"] for p in points]
    concurrency = payload["concurrency"]
    fig, axes = new_figure(ncols=3 if concurrency else 2)
    ax = axes[0]
    series = [
        ("pagedchat, speculation off", [p["off_tokens_per_s"] for p in points]),
        ("pagedchat, speculation on", [p["on_tokens_per_s"] for p in points]),
    ]
    for b in payload["baselines"]:
        series.append((b["name"], [q["tokens_per_s"] for q in b["points"] if q["category"] != "all"]))
    width = 0.8 / len(series)
    for j, (label, values) in enumerate(series):
        ax.bar([i + j * width for i in range(len(names))], [v or 0 for v in values], width, label=label)
    ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(names))], names)
    ax.set_ylabel("decode tokens/s, one conversation at a time")
    ax.set_title(f"greedy, {payload['max_tokens']} tokens at most")
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.bar(names, [p["tokens_per_decode_step"] or 0 for p in points], 0.6, label="live (planner)")
    for k in sorted({r["k"] for r in payload.get("replay", [])}):
        replayed = {r["category"]: r["tokens_per_step"] or 0 for r in payload["replay"] if r["k"] == k}
        ax.plot(names, [replayed[n] for n in names], "o", label=f"replay, k = {k}")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_ylabel("tokens per decode step (1 = no speculation)")
    c = payload["config"]
    ax.set_title(f"n-grams {c['ngram_min']}..{c['ngram_max']}, up to {c['num_speculative_tokens']} proposed")
    ax.legend(fontsize=8)
    if concurrency:
        ax = axes[2]
        ax.bar(
            ["off", "on"],
            [concurrency["off"]["tokens_per_s"] or 0, concurrency["on"]["tokens_per_s"] or 0],
            0.6,
        )
        ax.set_ylabel("generated tokens/s of wall time")
        ax.set_title(f"{concurrency['requests']} requests, {concurrency['concurrency']} at a time")
    return fig


def _print(payload: dict[str, Any], paths) -> None:
    points = payload["points"]
    headers = ["category", "prompts", "tokens off/on", "off tok/s", "on tok/s", "on/off"]
    for b in payload["baselines"]:
        headers += [f"{b['name']} tok/s", f"on/{b['name']}"]
    rows = []
    for p in points:
        row = [
            p["category"],
            p["prompts"],
            f"{p['off_tokens']}/{p['on_tokens']}",
            _fmt(p["off_tokens_per_s"], ".1f"),
            _fmt(p["on_tokens_per_s"], ".1f"),
            _fmt(p["ratio_on_off"], ".2f"),
        ]
        for b in payload["baselines"]:
            q = next(q for q in b["points"] if q["category"] == p["category"])
            row += [_fmt(q["tokens_per_s"], ".1f"), _fmt(q["ratio_pagedchat_on"], ".2f")]
        rows.append(row)
    _table("decode speed, one conversation at a time (greedy)", headers, rows)
    _table(
        "speculation (the runs with it)",
        ["category", "accepted", "rate", "tok/verify", "tok/step", "proposed", "from prompt", "identical"],
        [
            [
                p["category"],
                f"{p['accepted']}/{p['drafted']}",
                _fmt(p["acceptance_rate"], ".0%"),
                _fmt(p["tokens_per_verification"], ".2f"),
                _fmt(p["tokens_per_decode_step"], ".2f"),
                _fmt(p["proposal_share"], ".0%"),
                _fmt(p["prompt_share_of_accepted"], ".0%"),
                f"{p['identical']}/{p['prompts']}",
            ]
            for p in points
        ],
    )
    for b in payload["baselines"]:
        if b["speculates"]:
            _table(
                f"{b['name']}'s own drafts ({b['url']})",
                ["category", "accepted", "rate"],
                [
                    [
                        q["category"],
                        f"{q['draft_n_accepted']}/{q['draft_n']}",
                        _fmt(q["acceptance_rate"], ".0%"),
                    ]
                    for q in b["points"]
                ],
            )
    if payload.get("replay"):
        _table(
            "replay: every proposal of up to k tokens verified (the proposer's ceiling)",
            ["category", "k", "tok/step", "accepted", "rate", "from prompt"],
            [
                [
                    r["category"],
                    r["k"],
                    _fmt(r["tokens_per_step"], ".2f"),
                    f"{r['accepted']}/{r['drafted']}",
                    _fmt(r["acceptance_rate"], ".0%"),
                    _fmt(r["prompt_share_of_accepted"], ".0%"),
                ]
                for r in payload["replay"]
            ],
        )
    c = payload["concurrency"]
    if c:
        print_report(
            f"{c['requests']} requests, {c['concurrency']} at a time: generated tokens per second of wall time",
            ["speculation", "tokens", "seconds", "tok/s", "accepted", "on/off", "identical"],
            [
                [
                    label,
                    c[label]["tokens"],
                    _fmt(c[label]["seconds"], ".1f"),
                    _fmt(c[label]["tokens_per_s"], ".1f"),
                    f"{c[label]['accepted']}/{c[label]['drafted']}",
                    _fmt(c["ratio_on_off"], ".2f") if label == "on" else "",
                    f"{c['identical']}/{c['requests']}" if label == "on" else "",
                ]
                for label in ("off", "on")
            ],
            paths=paths,
        )
    else:
        for path in paths:
            print(f"wrote {path}")


def _table(title: str, headers: list[str], rows: list[list[Any]]) -> None:
    print(f"\n== {title} ==")
    print(format_table(headers, rows))


def _ratio(part: float | None, whole: float | None) -> float | None:
    return part / whole if part is not None and whole else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
