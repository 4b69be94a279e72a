"""Sampler: greedy exactness, seeded reproducibility, allowed sets of top-k/top-p/min-p, penalties, logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from engine.core.sequence import SamplingParams, Sequence
from engine.worker.sampler import Sampler, SamplingBatch, _draw, make_generator


def make_batch(
    params: list[SamplingParams],
    generators: list[torch.Generator | None] | None = None,
    prompts: list[list[int]] | None = None,
    outputs: list[list[int]] | None = None,
) -> SamplingBatch:
    n = len(params)
    return SamplingBatch(
        params=params,
        generators=generators if generators is not None else [None] * n,
        prompt_token_ids=prompts if prompts is not None else [[] for _ in range(n)],
        output_token_ids=outputs if outputs is not None else [[] for _ in range(n)],
    )


def make_seq(
    seq_id: int, token_ids: list[int], num_prompt: int, params: SamplingParams, sample_index: int = 0
):
    return Sequence(seq_id, f"r{seq_id}", token_ids, num_prompt, params, 0.0, sample_index=sample_index)


def test_greedy_equals_argmax_including_ties_and_nan() -> None:
    gen = torch.Generator().manual_seed(0)
    random_logits = torch.randn(64, 49152, generator=gen)
    tied = torch.randint(0, 3, (64, 1000), generator=gen).float()  # many equal maxima per row
    bf16 = torch.randn(64, 4096, generator=gen).bfloat16().float()
    nan = torch.tensor([[1.0, float("nan"), 3.0, float("nan")], [2.0, 2.0, 1.0, 0.0]])  # the first NaN wins
    for logits in (random_logits, tied, bf16, nan):
        out = Sampler()(logits, make_batch([SamplingParams(temperature=0.0)] * logits.shape[0]))
        assert out.token_ids == torch.argmax(logits, dim=-1).tolist()
        assert out.logprobs == [None] * logits.shape[0]


def test_a_given_argmax_serves_greedy_rows_only_while_the_logits_stay_as_they_were() -> None:
    """The fused step hands its argmax over: greedy rows take it (a stand-in pick proves they do), sampled rows in
    the same batch still draw, and a penalty (which changes the logits first) makes the sampler search again."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    greedy = SamplingParams(temperature=0.0)
    stand_in = [7, 8, 9]  # not the argmax: what the rows get shows which pick they took
    assert Sampler()(logits, make_batch([greedy] * 3), stand_in).token_ids == stand_in
    sampled = SamplingParams(temperature=1.0, seed=3)
    gens = [None, make_generator(3), None]
    mixed = Sampler()(logits, make_batch([greedy, sampled, greedy], gens), stand_in).token_ids
    alone = Sampler()(logits, make_batch([greedy, sampled, greedy], [None, make_generator(3), None]))
    assert (mixed[0], mixed[2]) == (7, 9) and mixed[1] == alone.token_ids[1]
    penalised = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    batch = make_batch([penalised] * 3, prompts=[[int(logits[i].argmax())] for i in range(3)])
    assert Sampler()(logits, batch, stand_in).token_ids == Sampler()(logits, batch).token_ids != stand_in


def test_top_k_one_equals_greedy() -> None:
    logits = torch.randn(32, 5000, generator=torch.Generator().manual_seed(1))
    batch = make_batch([SamplingParams(temperature=1.5, top_k=1)] * 32, [make_generator(3)] * 32)
    assert Sampler()(logits, batch).token_ids == torch.argmax(logits, dim=-1).tolist()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.9, seed=123),
        SamplingParams(temperature=0.9, top_p=0.8, seed=123),
        SamplingParams(temperature=1.2, top_p=0.999, seed=123),  # nucleus wider than the candidate lists
        SamplingParams(temperature=0.7, top_k=20, min_p=0.05, seed=123),
    ],
)
def test_seeded_rows_reproducible_regardless_of_batch(params: SamplingParams) -> None:
    vocab, steps = 6000, 12
    logits = torch.randn(steps, vocab, generator=torch.Generator().manual_seed(5)) * 2.0
    noise = torch.Generator().manual_seed(6)
    others = [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.5, top_p=0.5, seed=9),
        SamplingParams(temperature=1.0, top_k=7),
    ]

    def run(position: int, num_others: int) -> list[int]:
        own = make_generator(123)
        shared = torch.Generator().manual_seed(position)
        other_gens = [make_generator(9) if p.seed is not None else shared for p in others]
        tokens = []
        for step in range(steps):
            rows = [torch.randn(vocab, generator=noise) for _ in range(num_others)]
            rows.insert(position, logits[step])
            row_params = [others[i % len(others)] for i in range(num_others)]
            row_gens = [other_gens[i % len(others)] for i in range(num_others)]
            row_params.insert(position, params)
            row_gens.insert(position, own)
            out = Sampler()(torch.stack(rows), make_batch(row_params, row_gens))
            tokens.append(out.token_ids[position])
        return tokens

    alone = run(0, 0)
    assert run(3, 7) == alone
    assert run(9, 9) == alone
    assert len(set(alone)) > 1  # the rows really sample


def test_top_k_top_p_min_p_stay_in_allowed_set() -> None:
    vocab, num_rows = 1000, 3000
    probs = torch.full((vocab,), 0.05 / (vocab - 4))
    probs[:4] = torch.tensor([0.4, 0.3, 0.15, 0.1])  # tail mass 0.05
    logits = probs.log().expand(num_rows, vocab).contiguous()
    cases = {
        SamplingParams(top_k=3): {0, 1, 2},
        SamplingParams(top_p=0.8): {0, 1, 2},  # 0.4 + 0.3 < 0.8 <= 0.85
        SamplingParams(top_p=0.6): {0, 1},
        SamplingParams(min_p=0.3): {0, 1, 2},  # 0.15 >= 0.3 * 0.4, 0.1 < 0.12
        SamplingParams(top_k=4, top_p=0.85): {
            0,
            1,
            2,
        },  # over the top 4: (0.4 + 0.3) / 0.95 < 0.85 < 0.85 / 0.95
        SamplingParams(top_p=0.95, min_p=0.3): {0, 1, 2},
    }
    for params, allowed in cases.items():
        gen = torch.Generator().manual_seed(11)
        out = Sampler()(logits, make_batch([params] * num_rows, [gen] * num_rows))
        assert set(out.token_ids) == allowed, params


def test_top_p_beyond_candidate_lists_uses_the_whole_vocabulary() -> None:
    vocab, num_rows = 12000, 200
    logits = torch.linspace(0.0, -1.0, vocab).expand(num_rows, vocab).contiguous()
    probs = torch.softmax(logits[0].double(), dim=0)
    nucleus = int((probs.cumsum(0) < 0.7).sum()) + 1  # first prefix reaching 0.7 of the mass
    assert 4096 < nucleus < vocab
    gen = torch.Generator().manual_seed(12)
    out = Sampler()(logits, make_batch([SamplingParams(top_p=0.7)] * num_rows, [gen] * num_rows))
    assert max(out.token_ids) < nucleus
    assert max(out.token_ids) > 4096  # the widest candidate list did not silently cap the nucleus


def test_repetition_presence_frequency_penalties_match_hand_computation() -> None:
    logits = torch.tensor([[2.0, 1.9, -0.5, -0.4, 0.0, 1.0]])
    original = logits.clone()
    params = SamplingParams(
        temperature=0.0, repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.25, logprobs=6
    )
    prompt, output = [0, 5], [0, 3, 3]
    out = Sampler()(logits, make_batch([params], prompts=[prompt], outputs=[output]))
    # HF: divide positive logits of prompt+output tokens, multiply negative ones; OpenAI: output only.
    expected = [
        2.0 / 1.5 - 0.25 * 1 - 0.5,  # token 0: prompt and output once
        1.9,
        -0.5,
        -0.4 * 1.5 - 0.25 * 2 - 0.5,  # token 3: output twice
        0.0,
        1.0 / 1.5,  # token 5: prompt only, so no presence/frequency
    ]
    assert out.token_ids == [1]  # token 0 won before the penalties
    log_z = math.log(sum(math.exp(v) for v in expected))
    got = dict(out.logprobs[0].top)
    for token_id, value in enumerate(expected):
        assert got[token_id] == pytest.approx(value - log_z, abs=1e-6)
    no_penalty = Sampler()(
        logits, make_batch([SamplingParams(temperature=0.0)], prompts=[prompt], outputs=[output])
    )
    assert no_penalty.token_ids == [0]
    assert torch.equal(logits, original)  # the caller's logits are untouched


def test_penalties_apply_per_row() -> None:
    logits = torch.tensor([[1.0, 0.9, 0.0]] * 3)
    params = [
        SamplingParams(temperature=0.0, repetition_penalty=2.0),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, presence_penalty=0.2),
    ]
    out = Sampler()(logits, make_batch(params, prompts=[[0], [0], [0]], outputs=[[], [0], [0]]))
    assert out.token_ids == [1, 0, 1]  # row 2: presence only sees the output token 0


def test_temperature_sweep_matches_softmax() -> None:
    logits = torch.tensor([1.0, 0.5, -1.0])
    num_draws = 20000
    tolerance = 0.015  # > 4 standard deviations of a frequency estimated from 20000 draws
    for temperature in (0.5, 1.0, 2.0):
        gen = torch.Generator().manual_seed(2024)
        batch = make_batch([SamplingParams(temperature=temperature)] * num_draws, [gen] * num_draws)
        out = Sampler()(logits.expand(num_draws, 3).contiguous(), batch)
        freq = torch.bincount(torch.tensor(out.token_ids), minlength=3).double() / num_draws
        expected = torch.softmax(logits.double() / temperature, dim=0)
        assert torch.allclose(freq, expected, atol=tolerance), (temperature, freq, expected)


def test_logprobs_sum_to_one_sorted_and_before_temperature() -> None:
    logits = torch.tensor([[0.3, 2.0, -1.0, 1.5, 0.0]] * 2)
    hot = SamplingParams(temperature=2.0, logprobs=5)
    cold = SamplingParams(temperature=0.5, logprobs=2)
    gen = make_generator(1)
    out = Sampler()(logits, make_batch([hot, cold], [gen, gen]))
    full = out.logprobs[0]
    assert full is not None and len(full.top) == 5
    assert sum(math.exp(lp) for _, lp in full.top) == pytest.approx(1.0, abs=1e-6)
    assert [t for t, _ in full.top] == [1, 3, 0, 4, 2]
    assert [lp for _, lp in full.top] == sorted((lp for _, lp in full.top), reverse=True)
    assert full.token_id == out.token_ids[0] and full.logprob == dict(full.top)[full.token_id]
    two = out.logprobs[1]
    assert two is not None and two.top == full.top[:2]  # same raw distribution whatever the temperature
    zero = Sampler()(logits[:1], make_batch([SamplingParams(temperature=0.0, logprobs=0)])).logprobs[0]
    expected = torch.log_softmax(logits[0], dim=0)[1].item()
    assert (
        zero is not None and zero.token_id == 1 and zero.top == [] and zero.logprob == pytest.approx(expected)
    )


def test_draw_never_lands_on_zero_probability() -> None:
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]] * 3)
    u = torch.tensor([0.0, 0.5 - 1e-7, 1.0 - 2**-24])
    assert _draw(probs, u).tolist() == [3, 3, 1]


def test_from_sequences_generators_and_histories() -> None:
    seeded = SamplingParams(temperature=1.0, seed=40)
    seqs = [
        make_seq(1, [5, 6, 7, 8], 2, seeded, sample_index=0),
        make_seq(2, [5, 6, 7, 9], 2, seeded, sample_index=1),
        make_seq(3, [1, 2, 3], 2, SamplingParams(repetition_penalty=1.2)),
        make_seq(4, [1, 2, 3], 2, SamplingParams(frequency_penalty=0.5)),
    ]
    gens: dict[int, torch.Generator] = {}
    default = torch.Generator()
    batch = SamplingBatch.from_sequences(seqs, gens, default)
    assert sorted(gens) == [1, 2]
    assert batch.generators[:2] == [gens[1], gens[2]] and batch.generators[2:] == [default, default]
    assert gens[1].initial_seed() == 40 and gens[2].initial_seed() == 41
    assert batch.prompt_token_ids == [[], [], [1, 2], []]
    assert batch.output_token_ids == [[], [], [3], [3]]
    again = SamplingBatch.from_sequences(seqs, gens, default)
    assert again.generators[0] is gens[1]  # kept for the sequence's whole life
    no_default = SamplingBatch.from_sequences(seqs, gens)
    assert no_default.generators == [gens[1], gens[2], None, None]


def test_logits_batch_mismatch_raises() -> None:
    with pytest.raises(RuntimeError, match="do not match"):
        Sampler()(torch.zeros(2, 4), make_batch([SamplingParams()]))


def test_vanishing_temperature_is_greedy_and_tiny_penalties_are_refused():
    import pytest

    from engine.core.sequence import SamplingParams

    assert SamplingParams(temperature=1e-300).temperature == 0.0
    assert SamplingParams(temperature=1e-3).temperature == 1e-3
    with pytest.raises(ValueError, match=r"repetition_penalty must be in \[0.01, 10\], got 1e-300"):
        SamplingParams(repetition_penalty=1e-300)
