"""`bench speculative`: how many prompt-lookup proposals the model would accept on a chat workload (issue #40).

The workload (bench/speculative/workload.py) was written before any proposer was tuned on it: code edits on pasted
code, quotes and summaries of a pasted document, revisions of the previous answer, and open questions as the
control. Each prompt is answered greedily by the engine as it is (no speculation), then the answer is replayed
through the n-gram proposer (engine/core/ngram.py) as speculative decoding would run it: at each decode step the
proposer offers up to k tokens from the prompt and the answer so far, the target accepts the leading ones it would
have produced itself (with greedy sampling, exactly its own next tokens) and adds one of its own. So the replay's
acceptance is the acceptance greedy speculation gets on this model; what it buys in time also depends on what
verifying 1 + k tokens costs against one (`bench step --batch-sizes 1,5`: the few-row kernels), which this
benchmark does not measure.

Reported per category and k: decode steps without speculation and with it, tokens per step, the share of steps
with a proposal, drafted and accepted tokens (the acceptance rate), and the share of accepted tokens that came from
the prompt rather than the answer's own earlier text.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

from bench.common.report import new_figure, positive_ints, print_report, without_disk_tier, write_results
from bench.speculative.workload import CATEGORIES
from engine.core.ngram import NgramIndex


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench speculative`."""
    parser.add_argument(
        "--replay-k",
        type=positive_ints,
        default=[2, 4, 8],
        help="proposal lengths k to replay, comma-separated (default 2,4,8); the n-gram sizes are the engine's "
        "--ngram-min and --ngram-max",
    )
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens a reply may have (default 256)")
    parser.add_argument(
        "--categories",
        default=",".join(CATEGORIES),
        help=f"workload categories, comma-separated (default all: {','.join(CATEGORIES)})",
    )


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


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Answer every prompt greedily, replay each answer for each k; print, write JSON + PNG."""
    from engine import LLM, SamplingParams

    ks = args.replay_k
    args.ngram_min, args.ngram_max = args.engine_config.ngram_min, args.engine_config.ngram_max
    names = [c.strip() for c in args.categories.split(",") if c.strip()]
    unknown = [c for c in names if c not in CATEGORIES]
    if unknown or not names:
        raise SystemExit(
            f"bench speculative: unknown categories {unknown or names}; choose from {list(CATEGORIES)}"
        )
    if not 1 <= args.ngram_min <= args.ngram_max:
        raise SystemExit(
            f"bench speculative: --ngram-min {args.ngram_min} and --ngram-max {args.ngram_max} must satisfy "
            "1 <= min <= max"
        )
    llm = LLM(**dataclasses.asdict(without_disk_tier(args.engine_config)))
    engine = llm.engine
    prompts = [
        (name, engine.apply_chat_template(messages)) for name in names for messages in CATEGORIES[name]
    ]
    outputs = llm.generate(
        [ids for _, ids in prompts], SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    )
    totals = {(name, k): ReplayStats() for name in names for k in ks}
    for (name, prompt_ids), output in zip(prompts, outputs, strict=True):
        for k in ks:
            totals[name, k].add(
                replay(prompt_ids, output.outputs[0].token_ids, k, args.ngram_min, args.ngram_max)
            )
    points = [{"category": name, "k": k, **totals[name, k].summary()} for name in names for k in ks]
    rows = [
        [
            p["category"],
            p["k"],
            p["decode_tokens"],
            p["steps"],
            _fmt(p["tokens_per_step"], ".2f"),
            _fmt(p["proposal_share"], ".0%"),
            f"{p['accepted']}/{p['drafted']}",
            _fmt(p["acceptance_rate"], ".0%"),
            _fmt(p["prompt_share_of_accepted"], ".0%"),
        ]
        for p in points
    ]
    fig, (ax,) = new_figure()
    width = 0.8 / len(ks)
    for j, k in enumerate(ks):
        values = [totals[name, k].summary()["tokens_per_step"] or 0 for name in names]
        ax.bar([i + j * width for i in range(len(names))], values, width, label=f"k = {k}")
    ax.set_xticks([i + width * (len(ks) - 1) / 2 for i in range(len(names))], names)
    ax.set_ylabel("tokens per decode step (1 = no speculation)")
    ax.set_title(f"prompt lookup (n-grams {args.ngram_min}..{args.ngram_max}), greedy, replayed")
    ax.legend()
    payload = {
        "model": args.engine_config.model,
        "ngram_min": args.ngram_min,
        "ngram_max": args.ngram_max,
        "max_tokens": args.max_tokens,
        "prompts_per_category": {name: len(CATEGORIES[name]) for name in names},
        "points": points,
    }
    paths = write_results("speculative", payload, fig, args.results_dir, args.command_line)
    print_report(
        "prompt-lookup acceptance, greedy answers replayed",
        ["category", "k", "tokens", "steps", "tok/step", "proposed", "accepted", "rate", "from prompt"],
        rows,
        paths=paths,
    )
    return payload


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
