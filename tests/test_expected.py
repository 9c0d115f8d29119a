"""The closed forms of profile/expected.py against hand-worked values and against straightforward
implementations of each engine's rule written here (the kernel's loop, the coins drawn or integrated)."""

import math
import random

import pytest
import torch

from eagle_eval.results.expectation import cycle_roots, cycle_starts, ratio_interval
from eagle_eval.settings import DecodingSettings
from eagle_eval.rules.base import overlap
from eagle_eval.rules.eagle import sibling_accept as eagle_sibling_accept
from eagle_eval.rules.sglang import sibling_accept as sglang_sibling_accept
from eagle_eval.profile.expected import (
    chain_at_least,
    depth_at_least,
    first_duplicates,
    sibling_accept,
    tree_reach,
)


def sglang_kernel_accepts(a, u, t_single, t_acc):
    """SGLang's TreeSpeculativeSamplingTargetOnly at one node, literally: the children in sibling order, the
    running sum of their target probabilities against one coin u; returns the accepted child or None."""
    acc = 0.0
    for k, ak in enumerate(a):
        acc += ak
        if ak > 0 and (u < acc / t_acc or ak >= t_single):
            return k
    return None


def sglang_by_integration(a, t_single, t_acc, grid=200_000):
    """P(accept child k) integrating the coin over [0, 1) on a midpoint grid (each cell 1 / grid)."""
    counts = [0] * len(a)
    for j in range(grid):
        k = sglang_kernel_accepts(a, (j + 0.5) / grid, t_single, t_acc)
        if k is not None:
            counts[k] += 1
    return [c / grid for c in counts]


def test_chain_by_hand():
    got = chain_at_least(torch.tensor([[0.5, 0.5, 1.0, 0.2]], dtype=torch.float64))
    assert got.tolist() == [[0.5, 0.25, 0.25, 0.05]]


def test_sglang_default_thresholds_accept_each_child_with_its_probability():
    a = torch.tensor([0.3, 0.5, 0.1], dtype=torch.float64)
    got = sglang_sibling_accept(a, torch.ones(3, dtype=torch.bool))
    assert torch.allclose(got, a, atol=1e-15)


def test_sglang_thresholds_worked_by_hand():
    """t_single 0.4, t_acc 0.5, a = (0.3, 0.5, 0.1): F(x) = min(1, 2x). Child 1: F(0.3) - F(0) = 0.6; child 2 has
    a >= t_single: accepted whenever reached, 1 - F(0.3) = 0.4; child 3 is never reached."""
    def accept(a, t_single, t_acc):
        got = sglang_sibling_accept(torch.tensor(a, dtype=torch.float64), torch.ones(3, dtype=torch.bool), t_single, t_acc)
        return [round(x, 12) for x in got.tolist()]

    assert accept([0.3, 0.5, 0.1], 0.4, 0.5) == [0.6, 0.4, 0.0]
    # t_acc alone: F(x) = min(1, x / 0.6): F(0.3) = 0.5, F(0.8) - F(0.3) = 1 - 0.5 (capped), 0
    assert accept([0.3, 0.5, 0.1], 1.0, 0.6) == [0.5, 0.5, 0.0]
    # sibling order matters below 1: the same children reversed, F(0.1) = 1/6, F(0.6) - F(0.1) = 5/6, 0
    assert accept([0.1, 0.5, 0.3], 1.0, 0.6) == [round(1 / 6, 12), round(5 / 6, 12), 0.0]


@pytest.mark.parametrize("t_single, t_acc", [(1.0, 1.0), (0.4, 1.0), (1.0, 0.55), (0.25, 0.7), (0.05, 0.3)])
def test_sglang_closed_form_equals_the_kernel_loop_integrated_over_the_coin(t_single, t_acc):
    rng = random.Random(7)
    for _ in range(6):
        m = rng.randint(1, 5)
        raw = [rng.random() ** 2 for _ in range(m + 1)]
        a = [x / sum(raw) for x in raw[:m]]                 # children's target mass, the rest elsewhere
        if rng.random() < 0.3:
            a[rng.randrange(m)] = 0.0                         # a child the target filtered out
        want = sglang_by_integration(a, t_single, t_acc, grid=20_000)
        got = sglang_sibling_accept(torch.tensor(a, dtype=torch.float64), torch.ones(m, dtype=torch.bool),
                                    t_single, t_acc).tolist()
        assert max(abs(x - y) for x, y in zip(got, want)) < 1e-4, (a, got, want)


def eagle_monte_carlo(a, draws, seed=0):
    """EAGLE's evaluate_posterior at one node, literally: a vocab vector p (children first, the rest in one
    extra entry), a fresh coin per sibling, r <= p(x) accepts, else p(x) = 0 and p renormalised."""
    rng = random.Random(seed)
    counts = [0] * len(a)
    for _ in range(draws):
        p = list(a) + [1 - sum(a)]
        for k in range(len(a)):
            if rng.random() <= p[k]:
                counts[k] += 1
                break
            p[k] = 0.0
            total = sum(p)
            if total == 0:
                break
            p = [x / total for x in p]
    return [c / draws for c in counts]


def test_eagle_per_sibling_coins_telescope_to_the_childs_probability():
    a = [0.35, 0.25, 0.2, 0.05]
    got = eagle_sibling_accept(torch.tensor(a, dtype=torch.float64), torch.ones(4, dtype=torch.bool)).tolist()
    assert max(abs(x - y) for x, y in zip(got, a)) < 1e-12              # prod (1 - a_i / (1 - C_i-1)) = 1 - C_k-1
    draws = 100_000
    mc = eagle_monte_carlo(a, draws)
    for x, p in zip(mc, a):
        assert abs(x - p) < 4.5 * math.sqrt(p * (1 - p) / draws)


def test_duplicate_siblings_are_counted_once():
    tokens = torch.tensor([7, 9, 7])
    valid = torch.ones(3, dtype=torch.bool)
    dup = first_duplicates(tokens, valid)
    assert dup.tolist() == [False, False, True]
    got = sglang_sibling_accept(torch.tensor([0.3, 0.2, 0.3], dtype=torch.float64), valid & ~dup)
    assert [round(x, 12) for x in got.tolist()] == [0.3, 0.2, 0.0]


def test_tree_reach_and_depths_by_hand():
    """root -> a (0.5), b (0.3); a -> c (0.4), d (0.2); c -> e (0.9): reach c = 0.2, e = 0.18; depth 1 =
    0.8, depth 2 = 0.5 * 0.6 = 0.3, depth 3 = 0.18."""
    parents = torch.tensor([-1, -1, 0, 0, 2])
    accept = torch.tensor([0.5, 0.3, 0.4, 0.2, 0.9], dtype=torch.float64)
    depths = torch.tensor([1, 1, 2, 2, 3])
    reach = tree_reach(parents, accept)
    assert [round(x, 12) for x in reach.tolist()] == [0.5, 0.3, 0.2, 0.1, 0.18]
    assert [round(x, 12) for x in depth_at_least(reach, depths, 3).tolist()] == [0.8, 0.3, 0.18]


def test_sibling_accept_dispatches_on_the_rule_and_vllm_refuses_trees():
    a, valid = torch.tensor([0.3, 0.5], dtype=torch.float64), torch.ones(2, dtype=torch.bool)
    sg = sibling_accept(a, valid, DecodingSettings(temperature=1.0, accept_rule="sglang", accept_threshold_acc=0.5))
    assert [round(x, 6) for x in sg.tolist()] == [0.6, 0.4]
    with pytest.raises(ValueError, match="chains only"):
        sibling_accept(a, valid, DecodingSettings(temperature=1.0, accept_rule="vllm"))
    with pytest.raises(ValueError, match="no one-hot closed form"):
        sibling_accept(a, valid, DecodingSettings(temperature=1.0, accept_rule="sglang-rs"))


def test_overlap_is_the_acceptance_of_a_sampled_draft():
    """Draw d ~ q, accept with min(1, p(d) / q(d)): the acceptance rate is sum min(p, q)."""
    p, q = torch.tensor([0.5, 0.3, 0.2, 0.0]), torch.tensor([0.1, 0.6, 0.1, 0.2])
    assert abs(float(overlap(p, q)) - 0.5) < 1e-7                     # 0.1 + 0.3 + 0.1 + 0
    g = torch.Generator().manual_seed(0)
    d = torch.multinomial(q, 200_000, replacement=True, generator=g)
    accept = torch.rand(200_000, generator=g) < (p[d] / q[d]).clamp(max=1)
    assert abs(float(accept.float().mean()) - 0.5) < 4.5 * math.sqrt(0.25 / 200_000)


def test_ratio_interval_and_cycle_bookkeeping_by_hand():
    r = ratio_interval([(3.0, 2), (5.0, 2), (4.0, 2)])
    # R = 12 / 6 = 2; residuals y - R n = -1, 1, 0; var = 3/2 * 2 / 36 = 1/12
    assert r["value"] == 2.0 and abs(r["high"] - 2.0 - 1.959964 * math.sqrt(1 / 12)) < 1e-12
    assert ratio_interval([(3.0, 2)])["low"] is None
    assert cycle_roots([2, 0, 1, 3]) == [0, 3, 4, 6]
    assert cycle_starts([5, 6, 2, 7], 10, {2}) == 2 and cycle_starts([5, 6, 7, 8], 4, set()) == 3
