"""Sampler: greedy, penalties, top-k/top-p/min-p support, seeds, logprobs, temperature."""

from __future__ import annotations

import math

import pytest
import torch

from loraplex.engine.request import SamplingParams
from loraplex.engine.sampler import (
    Sampler,
    SamplingMetadata,
    apply_penalties,
    apply_top_k,
    apply_top_p,
    create_generator,
)

VOCAB = 32


def build(
    params: list[SamplingParams],
    prompts: list[list[int]] | None = None,
    outputs: list[list[int]] | None = None,
    generators: list[torch.Generator | None] | None = None,
    stop_token_ids: list[list[int]] | None = None,
) -> SamplingMetadata:
    n = len(params)
    return SamplingMetadata.build(
        params,
        prompts if prompts is not None else [[] for _ in range(n)],
        outputs if outputs is not None else [[] for _ in range(n)],
        generators if generators is not None else [None] * n,
        "cpu",
        stop_token_ids=stop_token_ids,
    )


def distinct_logits(num_seqs: int, vocab: int = VOCAB, seed: int = 0) -> torch.Tensor:
    # Random logits without ties, so supports are unambiguous.
    g = torch.Generator().manual_seed(seed)
    return torch.stack(
        [torch.randperm(vocab, generator=g).float() * 0.37 - 5.0 for _ in range(num_seqs)]
    )


def sample_many(logits: torch.Tensor, params: list[SamplingParams], times: int) -> torch.Tensor:
    sampler = Sampler(seed=1234)
    md = build(params)
    rows = [sampler(logits, md).sampled_token_ids for _ in range(times)]
    return torch.tensor(rows)  # [times, num_seqs]


# ---- greedy -------------------------------------------------------------------------------


def test_greedy_equals_argmax() -> None:
    logits = torch.randn(7, 1000, generator=torch.Generator().manual_seed(3))
    out = Sampler()(logits, build([SamplingParams(temperature=0.0)] * 7))
    assert out.sampled_token_ids == logits.argmax(dim=1).tolist()
    assert out.logprobs is None


def test_greedy_ties_break_to_first_max() -> None:
    logits = torch.zeros(2, VOCAB)
    logits[0, [5, 9, 20]] = 3.0
    logits[1, [31, 0]] = 1.0
    out = Sampler()(logits, build([SamplingParams(temperature=0.0)] * 2))
    assert out.sampled_token_ids == [5, 0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_greedy_on_half_precision_logits_equals_greedy_on_their_float32_upcast(
    dtype: torch.dtype,
) -> None:
    # The model's LM head hands the sampler logits in its own dtype; all-greedy steps take the
    # argmax there, without a float32 copy. Rounded logits tie often: the first maximum wins.
    logits = (torch.randn(9, 5000, generator=torch.Generator().manual_seed(4)) * 3).to(dtype)
    logits[0, [7, 4000]] = logits[0].max()  # an exact tie at the top
    greedy = build([SamplingParams(temperature=0.0)] * 9)
    out = Sampler()(logits, greedy)
    assert out.sampled_token_ids == Sampler()(logits.float(), greedy).sampled_token_ids
    assert out.sampled_token_ids[0] == 7
    # Rows that ask for logprobs (or penalties) go through float32: the same tokens.
    with_logprobs = build([SamplingParams(temperature=0.0, logprobs=2)] * 9)
    out_lp = Sampler()(logits, with_logprobs)
    assert out_lp.sampled_token_ids == out.sampled_token_ids
    expected = torch.log_softmax(logits.float(), dim=-1)
    assert out_lp.logprobs is not None and out_lp.logprobs[0] is not None
    sampled, _ = out_lp.logprobs[0]
    assert math.isclose(sampled.logprob, expected[0, 7].item(), rel_tol=1e-5)


def test_greedy_rows_in_mixed_batch_are_argmax() -> None:
    logits = distinct_logits(6)
    params = [SamplingParams(temperature=0.0 if i % 2 == 0 else 1.0) for i in range(6)]
    md = build(params)
    assert not md.all_greedy and not md.all_random
    out = Sampler(seed=0)(logits, md).sampled_token_ids
    assert [out[i] for i in (0, 2, 4)] == logits[[0, 2, 4]].argmax(dim=1).tolist()


def test_build_flags_skip_unused_stages() -> None:
    md = build([SamplingParams(temperature=0.0)] * 3)
    assert md.all_greedy and md.no_penalties and md.no_top_k and md.no_top_p and md.no_min_p
    assert md.max_num_logprobs is None and md.random_rows is None
    md = build(
        [
            SamplingParams(top_k=4),
            SamplingParams(top_p=0.9, logprobs=3),
            SamplingParams(min_p=0.2, presence_penalty=0.5),
        ]
    )
    assert md.all_random and not md.no_top_k and not md.no_top_p and not md.no_min_p
    assert not md.no_penalties and md.max_top_k == 4 and md.max_num_logprobs == 3


# ---- penalties -------------------------------------------------------------------------------


def penalize(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """apply_penalties with the metadata's penalty fields (all set when a row has a penalty)."""
    assert md.prompt_token_ids is not None and md.output_token_ids is not None
    assert md.presence_penalties is not None and md.frequency_penalties is not None
    assert md.repetition_penalties is not None
    return apply_penalties(
        logits,
        md.prompt_token_ids,
        md.output_token_ids,
        md.presence_penalties,
        md.frequency_penalties,
        md.repetition_penalties,
    )


def reference_penalties(
    logits: torch.Tensor,
    prompt: list[int],
    output: list[int],
    presence: float,
    frequency: float,
    repetition: float,
) -> torch.Tensor:
    out = logits.clone()
    for t in set(prompt) | set(output):
        out[t] = out[t] / repetition if out[t] > 0 else out[t] * repetition
    for t in set(output):
        out[t] -= frequency * output.count(t) + presence
    return out


def test_penalties_match_hand_reference() -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1)) * 3
    prompts = [[1, 2, 3, 3], [4], []]
    outputs = [[3, 7, 7, 7], [], [9, 9, 1]]
    settings = [(0.5, 0.25, 1.3), (1.0, 2.0, 0.7), (-0.5, -1.0, 1.0)]
    params = [
        SamplingParams(presence_penalty=p, frequency_penalty=f, repetition_penalty=r)
        for p, f, r in settings
    ]
    md = build(params, prompts, outputs)
    got = penalize(logits, md)
    for row in range(3):
        want = reference_penalties(logits[row], prompts[row], outputs[row], *settings[row])
        torch.testing.assert_close(got[row], want)


def test_repetition_penalty_matches_hf() -> None:
    from transformers import RepetitionPenaltyLogitsProcessor

    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(2)) * 4
    prompts, outputs = [[0, 5, 6], [10, 11]], [[6, 8], [12, 12, 31]]
    for penalty in (0.5, 1.2, 2.0):
        md = build([SamplingParams(repetition_penalty=penalty)] * 2, prompts, outputs)
        got = penalize(logits, md)
        hf = RepetitionPenaltyLogitsProcessor(penalty=penalty)
        for row in range(2):
            input_ids = torch.tensor([prompts[row] + outputs[row]])
            want = hf(input_ids, logits[row : row + 1].clone())[0]
            torch.testing.assert_close(got[row], want)


def test_neutral_rows_untouched_by_penalties() -> None:
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(4))
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, repetition_penalty=2.0),
    ]
    md = build(params, [[1, 2], [1, 2]], [[3], [3]])
    got = penalize(logits, md)
    assert torch.equal(got[0], logits[0])
    assert not torch.equal(got[1], logits[1])


def test_penalised_greedy_avoids_repeated_token() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 3], logits[0, 4] = 2.0, 1.9
    params = [SamplingParams(temperature=0.0, frequency_penalty=0.5)]
    assert Sampler()(logits, build(params, [[0]], [[3]])).sampled_token_ids == [4]
    assert Sampler()(logits, build(params, [[3]], [[0]])).sampled_token_ids == [3]


def test_min_tokens_bans_stop_tokens() -> None:
    logits = torch.zeros(2, VOCAB)
    logits[:, 2] = 10.0  # EOS is the argmax
    params = [SamplingParams(temperature=0.0, min_tokens=2)] * 2
    md = build(params, outputs=[[5], [5, 6]], stop_token_ids=[[2], [2]])
    assert Sampler()(logits, md).sampled_token_ids == [0, 2]


# ---- top-k / top-p / min-p support ---------------------------------------------------------


def test_top_k_support() -> None:
    logits = distinct_logits(3)
    params = [SamplingParams(temperature=1.5, top_k=k) for k in (1, 3, 7)]
    draws = sample_many(logits, params, 400)
    for row, k in enumerate((1, 3, 7)):
        support = set(torch.topk(logits[row], k).indices.tolist())
        seen = set(draws[:, row].tolist())
        assert seen <= support
        assert len(seen) == k  # every kept token shows up at this temperature


def test_top_k_off_rows_and_ties() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [1.0, 3.0, 3.0, 2.0]])
    out = apply_top_k(logits, torch.tensor([1, -1]), max_top_k=1)
    ninf = float("-inf")
    assert out[0].tolist() == [ninf, 3.0, 3.0, ninf]  # ties with the k-th are kept
    assert out[1].tolist() == logits[1].tolist()


def test_top_p_support() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]])
    logits = probs.log()
    filtered = apply_top_p(logits, torch.tensor([0.75, 0.5]))
    kept = [torch.isfinite(filtered[r]).nonzero().squeeze(1).tolist() for r in range(2)]
    assert kept == [[0, 1], [2, 3]]  # smallest prefix whose mass reaches top_p
    draws = sample_many(logits, [SamplingParams(top_p=0.75), SamplingParams(top_p=0.5)], 400)
    assert set(draws[:, 0].tolist()) == {0, 1}
    assert set(draws[:, 1].tolist()) == {2, 3}


def test_top_p_one_keeps_everything() -> None:
    logits = torch.randn(2, 5000, generator=torch.Generator().manual_seed(5)) * 8
    out = apply_top_p(logits, torch.tensor([1.0, 1.0]))
    assert torch.equal(out, logits)


def test_min_p_support() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.12, 0.08]])
    logits = probs.log().repeat(2, 1)
    params = [SamplingParams(min_p=0.5), SamplingParams(min_p=0.2)]
    draws = sample_many(logits, params, 400)
    assert set(draws[:, 0].tolist()) == {0, 1}  # threshold 0.25
    assert set(draws[:, 1].tolist()) == {0, 1, 2}  # threshold 0.10


def test_filters_combine() -> None:
    logits = distinct_logits(1, seed=9)
    params = [SamplingParams(temperature=0.8, top_k=6, top_p=0.9, min_p=0.05)]
    draws = sample_many(logits, params, 300)
    assert set(draws[:, 0].tolist()) <= set(torch.topk(logits[0], 6).indices.tolist())


# ---- seeds ---------------------------------------------------------------------------------


def seeded_tokens(
    order: list[int], all_params: list[SamplingParams], steps: int
) -> dict[int, list[int]]:
    """Run `steps` steps on the rows in `order`; each row's logits fixed per (row, step)."""
    gens = {
        i: create_generator(s, "cpu") for i, p in enumerate(all_params) if (s := p.seed) is not None
    }
    sampler = Sampler()  # unseeded rows use the global RNG: batch-order dependent
    got: dict[int, list[int]] = {i: [] for i in order}
    for step in range(steps):
        logits = torch.stack([distinct_logits(1, seed=100 * i + step)[0] for i in order])
        params = [all_params[i] for i in order]
        md = build(params, generators=[gens.get(i) for i in order])
        for i, tok in zip(order, sampler(logits, md).sampled_token_ids, strict=True):
            got[i].append(tok)
    return got


def test_seeded_rows_independent_of_batch_composition() -> None:
    params = [
        SamplingParams(temperature=1.0, seed=7),
        SamplingParams(temperature=1.3, seed=99),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=5, seed=7),
    ]
    alone = {i: seeded_tokens([i], params, 12)[i] for i in (0, 1, 4)}
    for order in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [3, 0, 4], [1, 2, 0]):
        got = seeded_tokens(order, params, 12)
        for i in (0, 1, 4):
            if i in got:
                assert got[i] == alone[i], (order, i)
    # Different seeds really do differ.
    assert alone[0] != seeded_tokens([0], [SamplingParams(seed=8)], 12)[0]


def test_sampler_seed_makes_unseeded_rows_reproducible() -> None:
    logits = distinct_logits(4)
    md = build([SamplingParams()] * 4)
    s1, s2 = Sampler(seed=3), Sampler(seed=3)
    a = [s1(logits, md).sampled_token_ids for _ in range(5)]
    b = [s2(logits, md).sampled_token_ids for _ in range(5)]
    assert a == b


# ---- logprobs ------------------------------------------------------------------------------


def test_logprobs_sorted_and_match_log_softmax() -> None:
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(6)) * 2
    params = [
        SamplingParams(temperature=0.0, logprobs=5),
        SamplingParams(logprobs=None),
        SamplingParams(temperature=0.5, logprobs=0),
        SamplingParams(temperature=2.0, logprobs=20),
    ]
    out = Sampler(seed=0)(logits, build(params))
    assert out.logprobs is not None and out.logprobs[1] is None
    ref = logits.log_softmax(dim=1)  # raw logprobs: pre-temperature
    for row, n in ((0, 5), (2, 0), (3, 20)):
        entry = out.logprobs[row]
        assert entry is not None
        sampled, top = entry
        assert sampled.token_id == out.sampled_token_ids[row]
        assert math.isclose(sampled.logprob, ref[row, sampled.token_id].item(), rel_tol=1e-5)
        assert len(top) == n
        values = [lp.logprob for lp in top]
        assert values == sorted(values, reverse=True)
        want = torch.topk(ref[row], n)
        assert [lp.token_id for lp in top] == want.indices.tolist()
        torch.testing.assert_close(torch.tensor(values), want.values)
    assert (
        out.logprobs[0] is not None and out.logprobs[0][1][0].token_id == out.sampled_token_ids[0]
    )


def test_logprobs_are_post_penalty() -> None:
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(8))
    params = [SamplingParams(temperature=0.0, logprobs=3, presence_penalty=2.0)]
    md = build(params, [[0]], [[1, 2]])
    out = Sampler()(logits, md)
    penalised = reference_penalties(logits[0], [0], [1, 2], 2.0, 0.0, 1.0).log_softmax(dim=0)
    assert out.logprobs is not None and out.logprobs[0] is not None
    sampled, _ = out.logprobs[0]
    assert math.isclose(sampled.logprob, penalised[sampled.token_id].item(), rel_tol=1e-5)


# ---- temperature statistics ----------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_frequencies(temperature: float) -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    times = 4000
    draws = sample_many(
        logits.repeat(times, 1), [SamplingParams(temperature=temperature)] * times, 1
    )[0]
    expected = (logits[0] / temperature).softmax(dim=0) * times
    observed = torch.bincount(draws, minlength=6).float()
    chi2 = (((observed - expected) ** 2) / expected).sum().item()
    # 5 degrees of freedom: P(chi2 > 20.5) ≈ 0.001; the seed is fixed, so this is deterministic.
    assert chi2 < 20.5, (observed, expected)
