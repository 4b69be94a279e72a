"""Sampler.verify (speculative sampling, issue #40): each row's token is distributed exactly as `Sampler.__call__`
would draw it, whether its proposal is likely, unlikely or impossible; greedy rows keep the argmax; penalties see
the proposals before each row; logprobs are the rows' own; a seeded sequence gets the same tokens with speculation
as without.

Reference distributions here are computed independently (float64, one full sort), not with the sampler's code.
Statistical tests use fixed seeds, so they are deterministic; their thresholds would fail a biased sampler.
"""

from __future__ import annotations

import math
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from engine import LLM
from engine.core.sequence import SamplingParams, Sequence
from engine.worker import sampler as sampler_module
from engine.worker.model_runner import ModelRunner, StepLogits
from engine.worker.sampler import Sampler, SamplingBatch, make_generator
from tests.engine.gguf_factories import write_tiny_chat_gguf
from tests.engine.test_sampler import make_batch

P_VALUE = 1e-3  # chi-square threshold: with fixed seeds a test passes or fails the same way every run


def make_seq(seq_id: int, token_ids: list[int], num_prompt: int, params: SamplingParams) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", token_ids, num_prompt, params, 0.0)


def reference_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution [V] the settings define, in float64 from one descending sort: temperature, then top-k, then
    top-p over the top-k tokens (the smallest prefix whose mass reaches top_p), then min-p, renormalised."""
    z = logits.double() / p.temperature
    vals, order = torch.sort(z, descending=True, stable=True)
    vocab = z.numel()
    keep = torch.ones(vocab, dtype=torch.bool)
    if 0 < p.top_k < vocab:
        keep[p.top_k :] = False
    q = torch.softmax(vals.masked_fill(~keep, -math.inf), dim=0)
    if p.top_p < 1.0:
        keep &= (torch.cumsum(q, dim=0) - q) < p.top_p
        q = q * keep
    if p.min_p > 0.0:
        keep &= q >= p.min_p * q.max()
        q = q * keep
    out = torch.zeros(vocab, dtype=torch.float64)
    out[order] = q / q.sum()
    return out


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's test of `counts` [V] against `probs` [V] over the tokens of positive probability; a count where the
    probability is 0 fails outright."""
    support = probs > 0
    assert int(counts[~support].sum()) == 0, f"draws of impossible tokens: {counts[~support].tolist()}"
    n = float(counts.sum())
    expected = probs[support].double() * n
    stat = float(((counts[support].double() - expected) ** 2 / expected).sum())
    dof = int(support.sum()) - 1
    if dof == 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2)))


def controlled_uniforms(monkeypatch, *draws: torch.Tensor) -> None:
    """Make the sampler's successive `_uniforms` calls return `draws` in turn (each [rows])."""
    queue = list(draws)

    def fake(gens, device):
        u = queue.pop(0)
        assert u.shape == (len(gens),), "a controlled draw has one uniform per row"
        return u.clone()

    monkeypatch.setattr(sampler_module, "_uniforms", fake)


def grid(n: int) -> torch.Tensor:
    """n uniforms at the midpoints of n equal cells of [0, 1): a perfectly even sample."""
    return (torch.arange(n, dtype=torch.float32) + 0.5) / n


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.0, top_k=100),
        SamplingParams(temperature=1.0, min_p=0.2),
        SamplingParams(temperature=1.0, top_p=0.02),  # a nucleus within 256 candidates
        SamplingParams(temperature=1.0, top_p=0.3),  # ... within 4,096
        SamplingParams(temperature=1.0, top_p=0.9, min_p=0.5),  # ... only in the whole vocabulary
        SamplingParams(temperature=1.1, top_k=200, top_p=0.6, min_p=0.6),
    ],
    ids=["temperature", "top-k", "min-p", "top-p-256", "top-p-4096", "top-p-vocab", "all"],
)
def test_call_draws_from_the_reference_distribution(monkeypatch, params: SamplingParams) -> None:
    """The reference is what __call__ samples: fed an even grid of n uniforms, inverse-CDF sampling (in any token
    order) draws each token within one of n * p(token) times, and never a token of probability 0."""
    vocab, n = 5000, 2048
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(1)) * 0.15
    expected = reference_probs(logits, params)
    controlled_uniforms(monkeypatch, grid(n))
    tokens = Sampler()(logits.expand(n, vocab).contiguous(), make_batch([params] * n)).token_ids
    counts = torch.bincount(torch.tensor(tokens), minlength=vocab)
    assert int(counts[expected == 0].sum()) == 0
    assert float((counts - n * expected).abs().max()) <= 1.5


def test_verify_takes_the_token_call_draws_and_accepts_it_iff_proposed(monkeypatch) -> None:
    """The mechanism, with controlled uniforms: a verify row's token is the one __call__ draws with the same uniform,
    and it accepts its proposal x iff that token is x. On an even grid of n uniforms (__call__ draws each token
    within one of n * p(token) times: the test above), n * p(x) rows accept, within one, and the rejected rows
    hold each other token n * p(token) times, within one: P(accept) = p(x), P(y | reject) = p(y) / (1 - p(x))."""
    vocab, n = 40, 4096
    gen = torch.Generator().manual_seed(2)
    for params in (
        SamplingParams(temperature=0.8),
        SamplingParams(temperature=1.0, top_k=6, top_p=0.9),
        SamplingParams(temperature=1.2, min_p=0.05),
    ):
        logits = torch.randn(vocab, generator=gen) * 2
        rows = logits.expand(n, vocab).contiguous()
        p = reference_probs(logits, params)
        ranked = torch.argsort(p, descending=True).tolist()
        controlled_uniforms(monkeypatch, grid(n))
        drawn = torch.tensor(Sampler()(rows, make_batch([params] * n)).token_ids)
        for x in (
            ranked[0],
            ranked[2],
            ranked[-1],
            -1,
        ):  # likely, less likely, impossible (but for plain), none
            controlled_uniforms(monkeypatch, grid(n))
            out = Sampler().verify(rows, make_batch([params] * n), [x] * n)
            tokens, accepted = torch.tensor(out.token_ids), torch.tensor(out.accepted)
            assert torch.equal(tokens, drawn), f"{params}, proposal {x}"
            assert torch.equal(accepted, tokens == x), f"{params}, proposal {x}"
            p_x = float(p[x]) if x >= 0 else 0.0
            assert abs(int(accepted.sum()) - n * p_x) <= 1.5
            counts = torch.bincount(tokens[~accepted], minlength=vocab).double()
            if x >= 0:
                assert counts[x] == 0
            others = torch.arange(vocab) != x
            assert float((counts - n * p)[others].abs().max()) <= 1.5, f"{params}, proposal {x}"


STATISTICAL = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=4),
    SamplingParams(temperature=1.0, top_p=0.8),
    SamplingParams(temperature=1.3, min_p=0.15),
    SamplingParams(temperature=1.2, top_k=8, top_p=0.9, min_p=0.05),
]


@pytest.mark.parametrize("params", STATISTICAL, ids=["plain", "top-k", "top-p", "min-p", "all"])
def test_verify_tokens_are_distributed_as_p(params: SamplingParams) -> None:
    """20,000 rows drawn with a seeded generator, vocabulary of 12: for a likely, an unlikely and an impossible
    proposal (or none), the tokens fit p (chi-square), acceptance happens p(x) of the time (within 4 sigma), and
    the rejected rows' tokens fit p without x, renormalised."""
    vocab, n = 12, 20_000
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(3)) * 1.5
    p = reference_probs(logits, params)
    ranked = torch.argsort(p, descending=True).tolist()
    impossible = [t for t in ranked if p[t] == 0]
    # likely, unlikely, impossible (where the settings cut tokens), else no proposal
    proposals = [ranked[0], ranked[int((p > 0).sum()) - 1]] + (impossible[-1:] or [-1])
    for seed, x in enumerate(proposals):
        gen = make_generator(100 + seed)
        out = Sampler().verify(
            logits.expand(n, vocab).contiguous(), make_batch([params] * n, [gen] * n), [x] * n
        )
        tokens = torch.tensor(out.token_ids)
        accepted = torch.tensor(out.accepted)
        assert chi_square_p_value(torch.bincount(tokens, minlength=vocab), p) > P_VALUE, (
            f"{params}, proposal {x}"
        )
        p_x = float(p[x]) if x >= 0 else 0.0
        num_accepted = int(accepted.sum())
        assert abs(num_accepted - n * p_x) <= 4 * math.sqrt(n * p_x * (1 - p_x)), f"{params}, proposal {x}"
        assert torch.equal(accepted, tokens == x)
        if x >= 0 and p_x < 1.0:
            residual = p.clone()
            residual[x] = 0.0
            counts = torch.bincount(tokens[~accepted], minlength=vocab)
            assert chi_square_p_value(counts, residual / residual.sum()) > P_VALUE, f"{params}, proposal {x}"


def test_chi_square_rejects_a_biased_sampler() -> None:
    """The statistical test has power at its size: drawing from p, but with a twentieth of the rows forced onto the
    likeliest token (a sampler whose rejected rows redraw from p rather than its residual moves more), fails it."""
    vocab, n = 12, 20_000
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(3)) * 1.5
    p = reference_probs(logits, STATISTICAL[0])
    gen = torch.Generator().manual_seed(4)
    tokens = torch.multinomial(p.float(), n, replacement=True, generator=gen)
    biased = tokens.clone()
    biased[: n // 20] = int(p.argmax())  # 5% of rows forced onto the proposal
    assert chi_square_p_value(torch.bincount(tokens, minlength=vocab), p) > P_VALUE
    assert chi_square_p_value(torch.bincount(biased, minlength=vocab), p) < P_VALUE


def test_greedy_rows_accept_exactly_the_argmax() -> None:
    """Greedy rows: accepted iff the proposal is the row's argmax, and the token is the argmax either way (also for
    rows without a proposal); sampled rows in the same batch do not change that."""
    gen = torch.Generator().manual_seed(5)
    n, vocab = 64, 1000
    logits = torch.randn(n, vocab, generator=gen)
    argmax = logits.argmax(dim=-1).tolist()
    greedy, sampled = SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=1)
    params = [sampled if i % 5 == 4 else greedy for i in range(n)]
    proposals = [argmax[i] if i % 3 == 0 else (argmax[i] + 1) % vocab if i % 3 == 1 else -1 for i in range(n)]
    out = Sampler().verify(
        logits, make_batch(params, [make_generator(1) if p is sampled else None for p in params]), proposals
    )
    for i in range(n):
        if params[i] is greedy:
            assert out.token_ids[i] == argmax[i]
            assert out.accepted[i] == (proposals[i] == argmax[i])
    plain = Sampler()(logits, make_batch([greedy] * n))
    assert [t for t, p in zip(out.token_ids, params) if p is greedy] == [
        t for t, p in zip(plain.token_ids, params) if p is greedy
    ]


def _run_verify(
    seqs: list[Sequence], rows: list[int], logits: torch.Tensor, proposed: dict[int, tuple[int, ...]]
):
    """ModelRunner._verify on given logits, without a model: the runner's layout of rows and histories."""
    runner = SimpleNamespace(sampler=Sampler(), seeded_generators={}, generator=None)
    return ModelRunner._verify(runner, seqs, rows, StepLogits(logits), proposed)


@pytest.mark.parametrize(
    ("penalty", "num_kept", "token"),
    [
        (
            {"repetition_penalty": 2.0},
            1,
            5,
        ),  # 3 at 2.0 -> 1.0 once it is in the history: 5 (1.5) wins at row 1
        ({"frequency_penalty": 0.3}, 2, 5),  # 2.0, 1.7, 1.4: 5 wins at row 2
        ({"presence_penalty": 0.3}, 3, 3),  # 2.0, 1.7, 1.7, 1.7: 3 keeps winning, bonus row included
        ({}, 3, 3),
    ],
)
def test_greedy_penalties_see_the_proposals_before_each_row(penalty, num_kept: int, token: int) -> None:
    """A sequence proposing (3, 3, 3) where 3 leads 5 by a margin a penalty can close: row j's history holds the j
    proposals before it, so the penalty grows along the rows and the verdict changes where the argmax does. A plain
    sequence and a second verifying one share the step."""
    vocab = 8
    params = SamplingParams(temperature=0.0, **penalty)
    a = make_seq(1, [0, 1, 2], 2, params)  # prompt [0, 1], output [2]
    plain = make_seq(2, [0, 1], 2, params)
    b = make_seq(3, [6, 7], 2, params)
    logits = torch.zeros(7, vocab)
    logits[0:4, 3], logits[0:4, 5] = 2.0, 1.5  # a's rows: its own and one per proposal
    logits[4, 6] = 1.0  # plain's
    logits[5, 4], logits[6, 1] = 1.0, 1.0  # b's: it proposes 4, then its bonus row
    out = _run_verify([a, plain, b], [0, 4, 5], logits, {1: (3, 3, 3), 3: (4,)})
    assert out.accepted == {1: [3] * num_kept, 3: [4]}
    assert out.token_ids == [token, 6, 1]


def test_sampled_penalties_see_the_proposals_before_each_row(monkeypatch) -> None:
    """A sampled sequence proposing (3, 3, 3) under a frequency penalty: with the same uniform at every row, row j
    takes the token __call__ draws with j 3s in its history, and keeps the proposals up to the first row whose token
    is not 3. On a grid of uniforms the verdicts differ from those of rows without the proposals in their history."""
    params = SamplingParams(temperature=0.9, frequency_penalty=0.5)
    seq = make_seq(1, [0, 1], 2, params)
    logits = torch.tensor([[0.5, 0.0, 0.2, 2.0, -1.0, 0.3]] * 4)
    num_differing = 0
    for u in grid(200).tolist():
        expected = []
        for j in range(4):
            controlled_uniforms(monkeypatch, torch.tensor([u]))
            expected.append(
                Sampler()(logits[j : j + 1], make_batch([params], outputs=[[3] * j])).token_ids[0]
            )
        num_kept = next(j for j, t in enumerate(expected) if t != 3 or j == 3)
        controlled_uniforms(monkeypatch, torch.full((4,), u))
        out = _run_verify([seq], [0], logits, {1: (3, 3, 3)})
        assert out.accepted == {1: [3] * num_kept} and out.token_ids == [expected[num_kept]], f"u = {u}"
        num_differing += expected != [expected[0]] * 4
    assert num_differing > 20


def test_a_seeded_sequence_draws_only_for_its_kept_tokens() -> None:
    """After verifying, a seeded sequence's generator has spent one uniform per token it keeps (the accepted ones
    and the one after), whatever it was proposed: its next draw is the one it would have made without proposals.
    An unseeded sequence's generator (shared) is left as drawn."""
    vocab = 6
    seeded = SamplingParams(temperature=1.0, top_k=2, seed=9)
    logits = torch.zeros(8, vocab)
    logits[:, 3] = 4.0  # 3: ~96% at every row
    logits[2, 3], logits[2, 4] = 0.0, 4.0  # ... but for the third row, where 4 is
    seq = make_seq(1, [0, 1, 2], 2, seeded)
    runner = SimpleNamespace(
        sampler=Sampler(), seeded_generators={}, generator=torch.Generator().manual_seed(0)
    )
    out = ModelRunner._verify(runner, [seq], [0], StepLogits(logits[:5]), {1: (3, 3, 3, 3)})
    assert out.accepted == {1: [3, 3]} and out.token_ids == [4]
    reference = make_generator(9)
    torch.rand(3, generator=reference)  # three tokens kept: two accepted, then 4
    assert torch.equal(runner.seeded_generators[1].get_state(), reference.get_state())
    unseeded = make_seq(2, [0, 1, 2], 2, SamplingParams(temperature=1.0, top_k=2))
    state = runner.generator.get_state()
    ModelRunner._verify(runner, [unseeded], [0], StepLogits(logits[:5]), {2: (3, 3, 3, 3)})
    reference = torch.Generator().set_state(state)
    torch.rand(5, generator=reference)
    assert torch.equal(runner.generator.get_state(), reference.get_state())


def test_verify_logprobs_are_those_call_reports() -> None:
    """Each row's Logprob is the one __call__ reports for the same token: log_softmax of the penalised logits before
    temperature, its top alternatives alike; greedy rows and top-k-1 rows (whose tokens __call__ also knows) equal
    __call__'s Logprob outright."""
    gen = torch.Generator().manual_seed(6)
    n, vocab = 24, 300
    logits = torch.randn(n, vocab, generator=gen) * 2
    histories = [torch.randint(0, vocab, (i % 4,), generator=gen).tolist() for i in range(n)]
    kinds = [
        SamplingParams(temperature=0.0, logprobs=3),
        SamplingParams(temperature=0.0, logprobs=2, repetition_penalty=1.5, frequency_penalty=0.4),
        SamplingParams(temperature=1.4, top_k=1, logprobs=0, presence_penalty=0.5),
        SamplingParams(temperature=0.8, top_p=0.9, logprobs=5, frequency_penalty=0.2),
        SamplingParams(temperature=1.0, logprobs=1),
        SamplingParams(temperature=1.0),  # asks for none
    ]
    params = [kinds[i % len(kinds)] for i in range(n)]
    batch = SamplingBatch(params, [None] * n, [[] for _ in range(n)], histories)
    called = Sampler()(logits, batch)
    proposals = [called.token_ids[i] if i % 2 else (called.token_ids[i] + 7) % vocab for i in range(n)]
    out = Sampler().verify(logits, batch, proposals)
    for i, p in enumerate(params):
        if p.logprobs is None:
            assert out.logprobs[i] is None
            continue
        penalised = logits[i].clone()
        for t in set(histories[i]):
            v = penalised[t]
            if p.repetition_penalty != 1.0:
                v = v / p.repetition_penalty if v > 0 else v * p.repetition_penalty
            penalised[t] = v - p.frequency_penalty * histories[i].count(t) - p.presence_penalty
        lsm = torch.log_softmax(penalised, dim=-1)
        got = out.logprobs[i]
        assert got.token_id == out.token_ids[i]
        assert got.logprob == pytest.approx(float(lsm[got.token_id]), abs=1e-5)
        assert got.top == called.logprobs[i].top
        if p.temperature == 0.0 or p.top_k == 1:
            assert out.token_ids[i] == called.token_ids[i] and got == called.logprobs[i]


def two_sample_p_value(a: list[int], b: list[int], min_count: int = 10) -> float:
    """Chi-square test that samples `a` and `b` come from one distribution; values seen fewer than `min_count`
    times in both together are pooled into one category."""
    pooled = Counter(a) + Counter(b)
    rare = {v for v, c in pooled.items() if c < min_count}
    count_a = Counter(-1 if v in rare else v for v in a)
    count_b = Counter(-1 if v in rare else v for v in b)
    share_a = len(a) / (len(a) + len(b))
    stat = 0.0
    categories = set(count_a) | set(count_b)
    for v in categories:
        total = count_a[v] + count_b[v]
        stat += (count_a[v] - total * share_a) ** 2 / (total * share_a)
        stat += (count_b[v] - total * (1 - share_a)) ** 2 / (total * (1 - share_a))
    dof = len(categories) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2)))


def test_engine_samples_alike_with_and_without_speculation(tmp_path, monkeypatch) -> None:
    """The tiny random model after a prompt of one token repeated (which it tends to repeat, p ~ 0.3-0.8 at these
    settings), 300 requests each alone in its steps, with n-gram speculation and without. The planner is made to
    propose wherever it can: a token after a 302 is verified against a proposed 302 (about 200 of the 300 2nd
    tokens, half of them accepted). Seeded requests give the same tokens either way; unseeded ones (the engine's
    shared generator) give tokens distributed alike, 1st (never verified) to 4th (two-sample chi-square: it catches
    gross errors such as always accepting, not small biases)."""
    path = write_tiny_chat_gguf(tmp_path / "tiny.gguf", seed=0)
    prompt = [10, 11, 12, 13, 14] + [302] * 8
    seeded = [
        SamplingParams(temperature=1.5, top_k=4, max_tokens=4, seed=s, ignore_eos=True) for s in range(300)
    ]
    unseeded = [SamplingParams(temperature=1.5, top_k=4, max_tokens=4, ignore_eos=True)] * 300
    tokens = {}
    for method in ("off", "ngram"):
        llm = LLM(
            model=str(path),
            speculative_method=method,
            max_num_seqs=1,
            kv_cache_bytes=32 * 2**20,
            kv_disk_bytes=0,
        )
        if llm.engine.spec is not None:
            # a planner that proposes wherever the n-grams offer tokens: certain acceptance, free rows
            monkeypatch.setattr(llm.engine.spec, "_chance", lambda seq_id, match_len: 1.0)
            monkeypatch.setattr(llm.engine.spec.step_times, "estimate", lambda rows: 1.0)
        for name, params in (("seeded", seeded), ("unseeded", unseeded)):
            outputs = llm.generate([prompt] * len(params), params)
            tokens[method, name] = [r.outputs[0].token_ids for r in outputs]
            if method == "ngram":
                counters = llm.engine.spec.counters
                assert (
                    counters.num_draft_tokens > 150
                    and 0 < counters.num_accepted_tokens < counters.num_draft_tokens
                )
                counters.num_draft_tokens = counters.num_accepted_tokens = 0
    assert tokens["off", "seeded"] == tokens["ngram", "seeded"]
    for pos in range(4):
        off, on = ([t[pos] for t in tokens[m, "unseeded"]] for m in ("off", "ngram"))
        assert two_sample_p_value(off, on) > P_VALUE, f"token {pos}: {Counter(off)} vs {Counter(on)}"
