"""The distribution check's statistics (stats/distribution.py) and its counting (rules/lossless.py)."""

import math

import pytest
import torch

from eagle_eval.stats.distribution import (ALPHA, CellCounts, chi2_isf, chi2_sf, detectable_w, judge,
                                             merged_groups, ncx2_sf)
from eagle_eval.rules.lossless import counts_of


def test_chi_square_tails_match_the_tables():
    # textbook critical values (e.g. NIST/SEMATECH e-Handbook table 1.3.6.7.4)
    for x, df, alpha in ((3.841, 1, 0.05), (6.635, 1, 0.01), (10.828, 1, 0.001), (16.266, 3, 0.001),
                         (22.458, 6, 0.001), (12.592, 6, 0.05)):
        assert abs(chi2_sf(x, df) / alpha - 1) < 0.01, (x, df)
        assert abs(chi2_isf(alpha, df) - x) < 2e-3
    # df = 2: P(X > x) = exp(-x / 2) exactly
    assert abs(chi2_sf(7.3, 2) - math.exp(-3.65)) < 1e-13
    # noncentral: df 1, lam: P(|Z + sqrt(lam)| > c) by the normal distribution
    c, lam = 1.959963984540054, 4.0
    normal_sf = lambda z: 0.5 * math.erfc(z / math.sqrt(2))
    assert abs(ncx2_sf(c * c, 1, lam) - (normal_sf(c - 2) + normal_sf(c + 2))) < 1e-9


def test_identical_distributions_give_pearsons_statistic():
    """With one p for every token, S = (O - E)' C^-1 (O - E) is Pearson's sum (O - E)^2 / E, written out here."""
    pi = [0.5, 0.2, 0.15, 0.1, 0.05, 0.0, 0.0]
    counts = CellCounts()
    observed = [60, 30, 10, 15, 5]
    for cell, n in enumerate(observed):
        for _ in range(n):
            counts.add(cell, pi)
    n = sum(observed)
    # cells 5 and 6 expect nothing: merged into the 5th (expects 6); 5 cells, df 4
    pearson = sum((o - n * p) ** 2 / (n * p) for o, p in zip(observed, pi[:5]))
    got = judge(counts)
    assert got["df"] == 4 and abs(got["statistic"] - pearson) < 1e-9
    assert abs(got["p_value"] - chi2_sf(pearson, 4)) < 1e-12


def test_merging_keeps_each_cell_at_five_expected():
    assert merged_groups([10.0, 4.0, 4.0, 1.0, 0.5, 0.0, 0.0]) == [[0], [1, 2, 3, 4, 5, 6]]
    assert merged_groups([6.0, 5.0, 0.0]) == [[0], [1, 2]]


def _sample_counts(g, n_tokens: int, vocab: int = 30, tilt: float = 0.0) -> CellCounts:
    """n tokens, each from its own random p_t (heterogeneous positions); tilt > 0 moves mass onto the top token
    of what is sampled (a biased sampler)."""
    logits = torch.randn(n_tokens, vocab, generator=g, dtype=torch.float64) * 2.0
    p = logits.softmax(-1)
    emit = p.clone()
    top = p.argmax(-1)
    emit[torch.arange(n_tokens), top] += tilt
    emit = emit / emit.sum(-1, keepdim=True)
    tokens = torch.multinomial(emit, 1, generator=g)[:, 0].tolist()
    return counts_of(p, tokens)


def test_false_alarm_rate_with_a_different_p_at_every_position():
    """Tokens really sampled from p_t (torch.multinomial, not our sampler): S < the alpha quantile at the stated
    rate. At alpha 0.05 over 400 runs of 300 tokens the rejections are Binomial(400, 0.05): 20 +- 4.4."""
    g = torch.Generator().manual_seed(7)
    p_values = [judge(_sample_counts(g, 300))["p_value"] for _ in range(400)]
    rejected = sum(p < 0.05 for p in p_values)
    assert 8 <= rejected <= 34, rejected
    # and the p-values are uniform: about half below 0.5
    assert 170 <= sum(p < 0.5 for p in p_values) <= 230


def test_a_biased_sampler_is_caught_and_the_power_is_as_stated():
    g = torch.Generator().manual_seed(3)
    assert judge(_sample_counts(g, 2000, tilt=0.15))["verdict"] == "differs"
    # what detectable_w promises: with w = 0.3 and n tokens giving noncentrality n w^2, power 0.8 at ALPHA
    n = 400
    w = detectable_w(n, 6)
    crit = chi2_isf(ALPHA, 6)
    assert abs(ncx2_sf(crit, 6, n * w * w) - 0.8) < 1e-6


def test_counts_by_rank_with_ties_and_zeros_by_hand():
    p = torch.tensor([[0.1, 0.4, 0.4, 0.1, 0.0],           # ties: ranks by id, 1 -> 1, 2 -> 2, 0 -> 3, 3 -> 4
                      [0.0, 0.0, 1.0, 0.0, 0.0]])
    c = counts_of(p, [0, 2])
    assert c.observed == [1, 0, 1, 0, 0, 0, 0]
    assert [round(e, 6) for e in c.expected] == [1.4, 0.4, 0.1, 0.1, 0.0, 0.0, 0.0]
    # covariance of the first position: diag(pi) - pi pi' with pi = (0.4, 0.4, 0.1, 0.1, 0, ...)
    assert abs(c.covariance[0][1] - (-0.16)) < 1e-6 and abs(c.covariance[0][0] - (0.4 - 0.16)) < 1e-6
    assert c.outside_support == []
    assert counts_of(p, [4, 1]).outside_support == [{"position": 0, "token": 4, "at_filter_edge": False},
                                                    {"position": 1, "token": 1, "at_filter_edge": False}]


def test_a_token_at_a_filters_edge_is_listed_not_decisive():
    """The check's forward rounds differently from the loop's (bf16 above all): a token just outside top-p
    there may have been inside for the loop. Only tokens outside the loosened filters decide."""
    from eagle_eval.settings import DecodingSettings
    from eagle_eval.rules.lossless import relaxed
    from eagle_eval.rules.filters import target_probs

    z = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    d = DecodingSettings(temperature=1.0, top_p=0.795)         # drops ascending cumsum <= 0.205: tokens 3, 2
    loose = target_probs(z, relaxed(d))                         # 0.805: drops <= 0.195, token 3 only
    assert relaxed(d).top_p == pytest.approx(0.805) and loose[0, 2] > 0 and loose[0, 3] == 0
    edge = counts_of(target_probs(z, d), [2], loose)
    far = counts_of(target_probs(z, d), [3], loose)
    assert edge.outside_support == [{"position": 0, "token": 2, "at_filter_edge": True}]
    assert judge(edge)["outside_support"] == 0 and judge(edge)["at_filter_edge"] == 1
    assert judge(edge)["verdict"] == "undecided" and judge(far)["verdict"] == "differs"
    k = DecodingSettings(temperature=1.0, top_k=2, min_p=0.5)
    assert (relaxed(k).top_k, relaxed(k).min_p) == (3, 0.45) and relaxed(DecodingSettings()).top_k == 0


def test_verdicts_never_say_lossless():
    g = torch.Generator().manual_seed(11)
    assert judge(_sample_counts(g, 60))["verdict"] == "undecided"          # too few tokens for the stated power
    assert judge(CellCounts())["verdict"] == "undecided"
    big = judge(_sample_counts(g, 3000))
    assert big["verdict"] == "consistent" and big["detectable_w"] < 0.1
    outside = CellCounts(outside_support=[{"position": 3, "token": 9}])
    assert judge(outside)["verdict"] == "differs"
    # counts merge exactly: the pooled verdict is the same whatever the split
    a, b = _sample_counts(g, 500), _sample_counts(g, 700)
    assert judge(a.merge(b))["statistic"] == judge(CellCounts.from_dict(a.merge(b).as_dict()))["statistic"]


# -- power: the departure the settings imply (m / 2 in total variation, m the sampled mass) ---------------

NEAR_ONE_HOT = [0.97, 0.01, 0.008, 0.006, 0.004, 0.002]     # p at every position: sampled mass m = 0.03


def _near_one_hot(tokens: list[int]) -> CellCounts:
    return counts_of(torch.tensor([NEAR_ONE_HOT] * len(tokens), dtype=torch.float64), tokens)


def _faithful(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.multinomial(torch.tensor(NEAR_ONE_HOT, dtype=torch.float64), n, replacement=True, generator=g).tolist()


def test_a_greedy_loop_at_near_one_hot_p_is_not_called_consistent():
    """250 tokens all at rank 1 where p gives rank 1 0.97: S = 7.5^2 / 242.5 + 7.5^2 / 7.5 = 7.73 on 1 df
    (p = 0.005, not below alpha), and they detect Cohen's w = sqrt(17.07 / 250) = 0.26 <= 0.3, which alone used
    to say "consistent". A loop that never samples departs by m = 0.03; the tokens detect only
    sqrt(17.07 * 0.97 * 0.03 / 250) = 0.0446 in total variation, more than m / 2 = 0.015: undecided."""
    got = judge(_near_one_hot([0] * 250))
    assert got["df"] == 1 and abs(got["statistic"] - (7.5 ** 2 / 242.5 + 7.5)) < 1e-9 and got["p_value"] > ALPHA
    assert got["detectable_w"] <= 0.3                              # the medium deviation alone was satisfied
    assert got["sampled_mass"] == pytest.approx(0.03) and got["departure_to_detect"] == pytest.approx(0.015)
    assert got["detectable_tv"] == pytest.approx(math.sqrt(17.0746468 * 0.97 * 0.03 / 250), rel=1e-6)
    assert got["verdict"] == "undecided"
    assert "the settings imply 0.015" in got["reason"] and "a loop halfway to greedy" in got["reason"]
    need = math.ceil(17.0746468 * 0.97 * 0.03 / 0.015 ** 2)          # 250 (0.0446 / 0.015)^2 = 2,209 tokens
    assert need == 2209 and "about 2,209 tokens would see it" in got["reason"]


def test_enough_tokens_of_a_faithful_sampler_pass_and_of_a_greedy_loop_fail():
    """Past the tokens the departure needs (about 2,209 here), a faithful sampler is consistent and the
    greedy loop differs; a tiny faithful sample is undecided."""
    faithful = judge(_near_one_hot(_faithful(4000, seed=5)))
    assert faithful["verdict"] == "consistent", faithful
    assert faithful["detectable_tv"] <= faithful["departure_to_detect"]
    assert judge(_near_one_hot([0] * 4000))["verdict"] == "differs"
    tiny = judge(_near_one_hot(_faithful(300, seed=6)))
    assert tiny["verdict"] == "undecided" and "total variation" in tiny["reason"]


def test_detectable_tv_is_the_least_detectable_departure_of_that_size():
    """The two-cell Pearson case by hand: pi = (0.6, 0.4), a departure of total variation d moves d from one cell
    to the other, noncentrality n d^2 (1/0.6 + 1/0.4); at d = detectable_tv it is the power's noncentrality."""
    from eagle_eval.stats.distribution import detectable_tv, noncentrality_for_power

    n, tv = 500, detectable_tv(500, [0.6, 0.4], 1)
    assert n * tv ** 2 * (1 / 0.6 + 1 / 0.4) == pytest.approx(noncentrality_for_power(1))
    # more cells: the least detectable split is the one nearest half and half (v = max pi(G) (1 - pi(G)))
    assert detectable_tv(500, [0.5, 0.3, 0.2], 2) == pytest.approx(math.sqrt(noncentrality_for_power(2) * 0.25 / 500))
    assert detectable_tv(500, [0.9, 0.06, 0.04], 2) == pytest.approx(math.sqrt(noncentrality_for_power(2) * 0.09 / 500))


def test_a_rule_that_is_not_plain_sampling_by_construction_differs_whatever_the_counts():
    """SGLang's thresholds below 1: the run's own report says its output is not plain sampling; the check says so
    and fails, even on counts a faithful sampler gives (no count could make it plain sampling)."""
    from eagle_eval.settings import DecodingSettings
    from eagle_eval.rules.base import describe, not_plain_sampling

    biased = DecodingSettings(temperature=1.0, accept_rule="sglang", accept_threshold_single=0.5)
    why = not_plain_sampling(biased)
    assert "thresholds single 0.5, acc 1" in why and "not plain sampling from p by construction" in why
    assert describe(biased)["output"].startswith("biased by thresholds below 1")
    assert not_plain_sampling(DecodingSettings(temperature=1.0, accept_rule="sglang")) is None
    assert not_plain_sampling(DecodingSettings(accept_rule="sglang", accept_threshold_acc=0.5)) is None  # greedy
    counts = _near_one_hot(_faithful(4000, seed=5))
    assert judge(counts)["verdict"] == "consistent"
    counts.not_plain = why
    got = judge(counts)
    assert got["verdict"] == "differs" and got["reason"] == why and got["not_plain"] == why
    # it survives pooling over samples and the round trip through samples.jsonl; older rows read as plain
    pooled = CellCounts.from_dict(CellCounts().merge(counts).as_dict())
    assert judge(pooled)["verdict"] == "differs"
    old_row = {k: v for k, v in counts.as_dict().items() if k != "not_plain"}
    assert CellCounts.from_dict(old_row).not_plain is None
