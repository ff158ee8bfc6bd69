"""Sampling: filters on crafted logits, penalties, seeded reproducibility and independence of batch mates."""

from __future__ import annotations

import math

import pytest

import torch

from tests.worker.helpers import Driver, Req, make_engine
from worker_svc.sampler import SampleRow, SamplingParams, apply_penalties, filter_probs, mix, ordered, sample

PROBS = torch.tensor([0.4, 0.3, 0.2, 0.1])
LOGITS = PROBS.log()[None, :]


def probs_after(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0):
    return filter_probs(LOGITS, torch.tensor([temperature]), torch.tensor([top_k]), torch.tensor([top_p]),
                        torch.tensor([min_p]))[0]


def test_top_k_keeps_k_best_and_renormalizes():
    p = probs_after(top_k=2)
    assert torch.allclose(p, torch.tensor([0.4 / 0.7, 0.3 / 0.7, 0.0, 0.0]))


def test_top_p_keeps_smallest_prefix_reaching_p():
    assert torch.allclose(probs_after(top_p=0.5), torch.tensor([0.4 / 0.7, 0.3 / 0.7, 0, 0]))
    assert torch.allclose(probs_after(top_p=0.75), torch.tensor([0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0]))
    assert torch.allclose(probs_after(top_p=0.05), torch.tensor([1.0, 0, 0, 0]))


def test_min_p_drops_tokens_below_fraction_of_max():
    # threshold 0.45 * 0.4 = 0.18: 0.2 stays, 0.1 goes; 0.6 * 0.4 = 0.24: 0.2 goes too
    assert torch.allclose(probs_after(min_p=0.45), torch.tensor([0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0]))
    assert torch.allclose(probs_after(min_p=0.6), torch.tensor([0.4 / 0.7, 0.3 / 0.7, 0, 0]))
    assert torch.allclose(probs_after(min_p=0.9), torch.tensor([1.0, 0, 0, 0]))


def test_temperature_sharpens_before_filters():
    p = probs_after(temperature=0.5)
    want = PROBS ** 2 / (PROBS ** 2).sum()
    assert torch.allclose(p, want, atol=1e-6)


def test_filtered_tokens_are_never_drawn():
    logits = PROBS.log().repeat(200, 1)
    rows = [SampleRow(SamplingParams(temperature=1.0, top_k=2, seed=i), (), 0, 5) for i in range(200)]
    ids = {r.token_id for r in sample(logits, rows)}
    assert ids == {0, 1}


def test_draws_follow_the_distribution():
    n = 4000
    logits = PROBS.log().repeat(n, 1)
    rows = [SampleRow(SamplingParams(temperature=1.0, seed=i), (), 0, 0) for i in range(n)]
    counts = torch.bincount(torch.tensor([r.token_id for r in sample(logits, rows)]), minlength=4).float() / n
    assert torch.allclose(counts, PROBS, atol=0.03)


def test_greedy_is_argmax_and_logprobs_are_raw():
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0]])
    (r,) = sample(logits, [SampleRow(SamplingParams(), (), 0, 0, top_n=2)])
    lp = torch.log_softmax(logits[0], -1)
    assert r.token_id == 1 and math.isclose(r.logprob, float(lp[1]), abs_tol=1e-6)
    assert [t for t, _ in r.top] == [1, 2] and math.isclose(r.top[1][1], float(lp[2]), abs_tol=1e-6)
    # with temperature the reported logprob is still the raw one
    (s,) = sample(logits, [SampleRow(SamplingParams(temperature=0.3, seed=1), (), 0, 0)])
    assert math.isclose(s.logprob, float(lp[s.token_id]), abs_tol=1e-6)


def test_repetition_penalty_hf_semantics_over_prompt_and_output():
    logits = torch.tensor([2.0, -2.0, 1.0, 0.5])
    row = SampleRow(SamplingParams(repetition_penalty=2.0), history=(0, 1, 1), prompt_len=2, position=3)
    assert torch.allclose(apply_penalties(logits, row), torch.tensor([1.0, -4.0, 1.0, 0.5]))


def test_frequency_and_presence_count_generated_tokens_only():
    logits = torch.zeros(4)
    # prompt (3, 3) is not penalized; generated: 1 twice, 2 once
    row = SampleRow(SamplingParams(frequency_penalty=0.5, presence_penalty=0.25), history=(3, 3, 1, 2, 1),
                    prompt_len=2, position=5)
    assert torch.allclose(apply_penalties(logits, row), torch.tensor([0.0, -1.25, -0.75, 0.0]))


def test_penalty_changes_greedy_choice():
    logits = torch.tensor([[3.0, 2.9, 0.0]])
    (r,) = sample(logits, [SampleRow(SamplingParams(presence_penalty=0.5), (0,), 0, 1)])
    assert r.token_id == 1


def test_seed_mix_depends_on_both_inputs():
    assert mix(1, 5) != mix(1, 6) and mix(1, 5) != mix(2, 5) and mix(1, 5) == mix(1, 5)
    assert 0 <= mix(2**64 - 1, 10**9) < 2**63


def test_invalid_params_have_reasons():
    assert "temperature" in SamplingParams(temperature=-1).validate()
    assert "top_p" in SamplingParams(top_p=1.5).validate()
    assert "min_p" in SamplingParams(min_p=2).validate()
    assert "repetition_penalty" in SamplingParams(repetition_penalty=-1).validate()
    assert SamplingParams(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05).validate() is None


SEEDED = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)


def _generate(engine, reqs, chunk=1 << 30):
    Driver(engine, chunk=chunk, stop_at_eos=False).run(reqs)
    return [r.out for r in reqs]


def test_seeded_sampling_reproducible_and_independent_of_batch_mates(model_dir, prompts):
    alone = _generate(make_engine(model_dir), [Req("s", prompts[0], 16, SEEDED)])[0]
    again = _generate(make_engine(model_dir, seed=99), [Req("s", prompts[0], 16, SEEDED)])[0]
    assert alone == again
    mates = [Req(f"m{i}", p, 20, SamplingParams(temperature=1.2)) for i, p in enumerate(prompts[1:4])]
    with_mates = _generate(make_engine(model_dir, seed=5), mates[:1] + [Req("s", prompts[0], 16, SEEDED)] + mates[1:])
    assert with_mates[1] == alone
    chunked = _generate(make_engine(model_dir), [Req("s", prompts[0], 16, SEEDED)], chunk=3)[0]
    assert chunked == alone
    other_seed = _generate(make_engine(model_dir), [Req("s", prompts[0], 16, SamplingParams(temperature=1.0, top_p=0.95,
                                                                                              seed=4321))])[0]
    assert other_seed != alone
    greedy = _generate(make_engine(model_dir), [Req("g", prompts[0], 16)])[0]
    assert greedy != alone  # it really sampled


def test_seeded_sampling_survives_retract(model_dir, prompts):
    ref = _generate(make_engine(model_dir), [Req("s", prompts[1], 12, SEEDED)])[0]
    eng = make_engine(model_dir)
    drv = Driver(eng, stop_at_eos=False)
    r = Req("s", prompts[1], 12, SEEDED)
    while len(r.out) < 4:
        drv.step([r])
    drv.retract(r, keep=len(prompts[1]))
    r.prompt = prompts[1] + r.out
    drv.run([r])
    assert r.out == ref


def test_unseeded_rows_drawn_together_follow_the_distribution():
    n = 4000
    logits = PROBS.log().repeat(n, 1)
    rows = [SampleRow(SamplingParams(temperature=1.0), (), 0, 0) for _ in range(n)]
    got = sample(logits, rows, torch.Generator().manual_seed(5))
    counts = torch.bincount(torch.tensor([r.token_id for r in got]), minlength=4).float() / n
    assert torch.allclose(counts, PROBS, atol=0.03)


def test_a_seeded_row_draws_the_same_among_unseeded_batch_mates():
    logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(9))
    seeded = [SamplingParams(temperature=0.9, seed=7), SamplingParams(temperature=0.9, top_p=0.8, seed=8)]
    alone = [sample(logits[i:i + 1], [SampleRow(p, (), 0, 4)])[0].token_id for i, p in zip((0, 2), seeded)]
    mixed = sample(logits, [SampleRow(seeded[0], (), 0, 4), SampleRow(SamplingParams(temperature=0.9), (), 0, 4),
                            SampleRow(seeded[1], (), 0, 4)], torch.Generator().manual_seed(1))
    assert [mixed[0].token_id, mixed[2].token_id] == alone


def test_temperature_alone_draws_as_the_filtered_path_with_filters_that_keep_everything():
    """The draw of rows with no top-k / top-p / min-p skips the sort; the same seeds through the filtering path
    (top_k = vocab keeps every token) draw the same tokens."""
    logits = torch.randn(64, 512, generator=torch.Generator().manual_seed(3))
    plain = [SampleRow(SamplingParams(temperature=0.7, seed=s), (), 0, 9) for s in range(64)]
    kept = [SampleRow(SamplingParams(temperature=0.7, top_k=512, seed=s), (), 0, 9) for s in range(64)]
    assert [r.token_id for r in sample(logits, plain)] == [r.token_id for r in sample(logits, kept)]


def test_top_p_one_keeps_every_token_even_where_the_float_mass_reaches_one():
    logits = torch.randn(8, 2000, generator=torch.Generator().manual_seed(6)) * 6  # a long, tiny tail
    ones = torch.ones(8)
    p = filter_probs(logits, ones, torch.zeros(8, dtype=torch.long), ones, torch.zeros(8))
    assert bool((p > 0).all())


def test_a_seeded_temperature_only_row_draws_the_same_next_to_a_filtering_mate():
    """Alone, a row with temperature alone skips the sort; next to a row that filters it goes through
    ``filter_probs``: the values it draws from, and so its seeded tokens, are the same (logits rounded through
    bfloat16, as the model's are: ties)."""
    g = torch.Generator().manual_seed(8)
    logits = (torch.randn(2, 4096, generator=g) * 3).bfloat16().float()
    plain, filtering = SamplingParams(temperature=0.8, seed=11), SamplingParams(temperature=0.8, top_k=5, seed=12)
    for pos in range(40):
        alone = sample(logits[:1], [SampleRow(plain, (), 0, pos)])[0].token_id
        mixed = sample(logits, [SampleRow(plain, (), 0, pos), SampleRow(filtering, (), 0, pos)])[0].token_id
        assert alone == mixed, pos


def test_topk_and_the_full_sort_give_one_order_and_one_distribution_with_ties():
    """Rows that all set top_k order only the k_max most likely tokens; with logits rounded through bfloat16 (the
    model's: ties are common) the distribution is exactly the full sort's, top-p and min-p applied inside."""
    g = torch.Generator().manual_seed(4)
    logits = (torch.randn(6, 4096, generator=g) * 3).bfloat16().float()
    temp = torch.tensor([0.7, 1.0, 1.3, 0.5, 1.0, 0.9])
    top_k = torch.tensor([5, 40, 1, 17, 40, 3])
    top_p = torch.tensor([1.0, 0.9, 1.0, 0.6, 0.95, 1.0])
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.1, 0.02, 0.0])
    full = filter_probs(logits, temp, top_k, top_p, min_p)
    fast = filter_probs(logits, temp, top_k, top_p, min_p, k_max=40)
    assert torch.equal(fast, full)
    assert ((fast > 0).sum(-1) <= top_k).all()
    vals, ids = ordered(torch.tensor([[0.2, 0.3, 0.2, 0.3]]))
    assert ids.tolist() == [[1, 3, 0, 2]] and torch.equal(vals, torch.tensor([[0.3, 0.3, 0.2, 0.2]]))


@pytest.mark.parametrize("mate_top_k", [0, 50, 200])
def test_a_seeded_top_k_row_draws_the_same_whatever_its_batch_mates(mate_top_k):
    g = torch.Generator().manual_seed(8)
    logits = (torch.randn(2, 4096, generator=g) * 3).bfloat16().float()
    row = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=3)
    mate = SamplingParams(temperature=1.0, top_k=mate_top_k, seed=4)
    for pos in range(60):
        alone = sample(logits[:1], [SampleRow(row, (), 0, pos)])[0].token_id
        mixed = sample(logits, [SampleRow(row, (), 0, pos), SampleRow(mate, (), 0, pos)])[0].token_id
        assert alone == mixed, pos
