"""The decode policies at temperature > 0 (rules/base.py) on hand-made distributions: each rule's node
decision against its closed form worked out by hand, and a toy loop whose output must be distributed exactly
as plain sampling from the target (a chi-square test over every 3-token sequence); planted mistakes fail it."""

import math

import pytest
import torch

from eagle_eval.stats.distribution import chi2_sf
from eagle_eval.settings import ConfigError, DecodingSettings
from eagle_eval.registry import RULES
from eagle_eval.rules import base as rules
from eagle_eval.loop.policy import GREEDY
from eagle_eval.loop.tree import Tree

# a bigram target P[prev] and a bigram draft Q[prev] over 4 tokens; the draft's argmax differs from the
# target's in rows 0 and 2, so drafts are rejected often and every residual matters
P = torch.tensor([[0.40, 0.30, 0.20, 0.10],
                  [0.10, 0.50, 0.25, 0.15],
                  [0.30, 0.10, 0.35, 0.25],
                  [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
Q = torch.tensor([[0.20, 0.60, 0.10, 0.10],
                  [0.10, 0.70, 0.10, 0.10],
                  [0.50, 0.20, 0.20, 0.10],
                  [0.10, 0.10, 0.20, 0.60]], dtype=torch.float64)
LOG_P, LOG_Q = P.log().float(), Q.log().float()
LENGTH = 3


def _decoding(rule, **kw):
    return DecodingSettings(temperature=1.0, accept_rule=rule, **kw)


def _policy(rule, seed=0, **kw):
    return RULES.get(rule).policy(_decoding(rule, **kw)).start(torch.Generator().manual_seed(seed), torch.arange(4))


def _tree(root: int) -> Tree:
    """topk 2, two levels, children by the draft's rank (descending Q, ties to the lower id)."""
    top = lambda t: torch.sort(Q[t], descending=True, stable=True).indices[:2].tolist()
    a, b = top(root)
    tokens = [root, a, b] + top(a) + top(b)
    return Tree(tokens=tokens, parents=[-1, 0, 0, 1, 1, 2, 2], depths=[0, 1, 1, 2, 2, 2, 2],
                ranks=[0, 0, 1, 0, 1, 0, 1])


def toy_loop(policy, num_steps: int = 2, tree: bool = False) -> tuple[int, ...]:
    """The speculative loop on the bigram pair until LENGTH tokens after token 0: drafts from Q (the policy's
    proposals, or the tree), verify rows log P[node token]."""
    out = [policy.first_token(LOG_P[0])]
    while len(out) < LENGTH:
        root = out[-1]
        if tree:
            t = _tree(root)
            path, token = policy.accept_tree(t, LOG_P[t.tokens])
            out += [t.tokens[i] for i in path[1:]] + [token]
            continue
        drafts, prev = [], root
        for _ in range(num_steps):
            prev = int(policy.propose(LOG_Q[prev][None])[0])
            drafts.append(prev)
        n, token = policy.accept_chain(drafts, LOG_P[[root] + drafts])
        out += drafts[:n] + [token]
    return tuple(out[:LENGTH])


def plain_probability(seq) -> float:
    prob, prev = 1.0, 0
    for x in seq:
        prob *= float(P[prev, x])
        prev = x
    return prob


def sequence_p_value(policy, runs: int, **loop) -> float:
    """Pearson's chi-square of the toy loop's 3-token sequences against plain sampling (64 cells; the rarest,
    0.1^3, expects 6 at 6000 runs)."""
    counts: dict = {}
    for _ in range(runs):
        seq = toy_loop(policy, **loop)
        counts[seq] = counts.get(seq, 0) + 1
    cells = [(a, b, c) for a in range(4) for b in range(4) for c in range(4)]
    assert set(counts) <= set(cells)
    stat = sum((counts.get(s, 0) - runs * plain_probability(s)) ** 2 / (runs * plain_probability(s)) for s in cells)
    return chi2_sf(stat, len(cells) - 1)


CONFIGS = [("vllm", {}), ("vllm-probabilistic", {}), ("sglang-rs", {}), ("sglang", {}), ("sglang", {"tree": True}),
           ("eagle", {}), ("eagle", {"tree": True})]


@pytest.mark.parametrize("rule,loop", CONFIGS, ids=[f"{r}{'-tree' if l else ''}" for r, l in CONFIGS])
def test_every_rule_samples_the_target_exactly(rule, loop):
    assert sequence_p_value(_policy(rule, seed=1), 6000, **loop) > 1e-3


PLANTED = [("vllm", {}, "without"), ("vllm-probabilistic", {}, "relu_residual"), ("eagle", {"tree": True}, "without"),
           ("sglang", {"tree": True}, "without")]


@pytest.mark.parametrize("rule,loop,name", PLANTED)
def test_a_planted_wrong_residual_fails(monkeypatch, rule, loop, name):
    """residual = p instead of relu(p - q) (for one-hot drafts: p without the rejected drafts)."""
    monkeypatch.setattr(rules, name, lambda p, other: p.clone())
    assert sequence_p_value(_policy(rule, seed=1), 3000, **loop) < 1e-6


def test_a_coin_against_the_wrong_probability_fails(monkeypatch):
    """vllm accepting with sqrt(p(d)) instead of p(d): more drafts kept than the target allows."""
    monkeypatch.setattr(rules, "coin", lambda rng: float(torch.rand((), generator=rng, dtype=torch.float64)) ** 2)
    assert sequence_p_value(_policy("vllm", seed=1), 3000) < 1e-6


def test_sglang_thresholds_below_one_bias_the_output_as_in_sglang():
    assert sequence_p_value(_policy("sglang", seed=1, accept_threshold_single=0.3), 3000, tree=True) < 1e-6
    assert sequence_p_value(_policy("sglang", seed=1, accept_threshold_acc=0.5), 3000, tree=True) < 1e-6


def _node_frequencies(policy, p, children, runs=20000):
    """How often the node accepts each child (index) or none (-1)."""
    freq: dict = {}
    for _ in range(runs):
        picked, _ = policy.node(p, children)
        key = -1 if picked is None else picked
        freq[key] = freq.get(key, 0) + 1
    return {k: v / runs for k, v in freq.items()}


def _close(freq: dict, expected: dict, runs=20000):
    """Each frequency within 5 standard errors of its closed form; outcomes of probability 0 never happen."""
    for k, e in expected.items():
        got = freq.get(k, 0.0)
        if e == 0:
            assert got == 0, (k, got)
        else:
            assert abs(got - e) < 5 * math.sqrt(e * (1 - e) / runs) + 1e-12, (k, got, e)
    assert set(freq) <= {k for k, e in expected.items() if e > 0}


def test_sglang_node_closed_form_with_and_without_thresholds():
    """Children a = (0.3, 0.5, 0.1) in sibling order; F(x) = min(1, x / t_acc); k* = the first child with
    a >= t_single: P(c_k) = F(C_k) - F(C_{k-1}) before k*, 1 - F(C_{k*-1}) at k*, 0 after."""
    p = torch.tensor([0.1, 0.3, 0.5, 0.1])
    children = [1, 2, 0]
    _close(_node_frequencies(_policy("sglang"), p, children), {0: 0.3, 1: 0.5, 2: 0.1, -1: 0.1})
    # t_acc 0.9: F(0.3) = 1/3, F(0.8) = 8/9, F(0.9) = 1
    _close(_node_frequencies(_policy("sglang", accept_threshold_acc=0.9), p, children),
           {0: 1 / 3, 1: 8 / 9 - 1 / 3, 2: 1 / 9, -1: 0.0})
    # t_single 0.45: the second child (0.5) is accepted whenever the first is not; the third never
    _close(_node_frequencies(_policy("sglang", accept_threshold_single=0.45), p, children),
           {0: 0.3, 1: 0.7, 2: 0.0, -1: 0.0})
    # both: t_acc 0.6 makes F(0.3) = 0.5; k* = 2
    _close(_node_frequencies(_policy("sglang", accept_threshold_single=0.45, accept_threshold_acc=0.6), p, children),
           {0: 0.5, 1: 0.5, 2: 0.0, -1: 0.0})
    _, residual = _policy("sglang").node(torch.tensor([0.1, 0.3, 0.5, 0.1]), [1, 2])      # none accepted
    assert residual.tolist() == pytest.approx([0.1, 0.0, 0.0, 0.1])


def test_eagle_node_a_coin_per_sibling_telescopes_to_p():
    """P(c_k) = prod_{i<k} (1 - a_i / (1 - C_{i-1})) a_k / (1 - C_{k-1}) = a_k; the residual p without the
    rejected siblings, renormalised."""
    p = torch.tensor([0.1, 0.3, 0.2, 0.4])
    _close(_node_frequencies(_policy("eagle"), p, [3, 1]), {0: 0.4, 1: 0.3, -1: 0.3})
    # a duplicate sibling is tried once (EAGLE de-duplicates the children)
    _close(_node_frequencies(_policy("eagle"), p, [3, 3, 1]), {0: 0.4, 2: 0.3, -1: 0.3})
    policy = _policy("eagle")
    while True:
        picked, residual = policy.node(p, [3, 1])
        if picked is None:
            break
    assert residual.tolist() == pytest.approx([1 / 3, 0.0, 2 / 3, 0.0])


def test_chain_acceptance_is_the_product_of_p_along_the_drafts():
    """P(A >= k) = prod_{i<=k} p_i(d_i) for the one-hot rules: drafts (1, 1) after token 0."""
    drafts, logits = [1, 1], LOG_P[[0, 1, 1]]
    expected = {1: 0.3, 2: 0.3 * 0.5}
    runs = 6000
    for rule in ("vllm", "sglang", "eagle"):
        policy = _policy(rule)
        accepted = [policy.accept_chain(drafts, logits)[0] for _ in range(runs)]
        for k, e in expected.items():
            got = sum(n >= k for n in accepted) / runs
            assert abs(got - e) < 5 * math.sqrt(e * (1 - e) / runs), (rule, k, got, e)


def test_sampled_drafts_accept_the_first_with_the_overlap():
    """vllm-probabilistic / sglang-rs: P(d_1 accepted) = sum_x min(p(x), q(x)) after token 0."""
    overlap = float(torch.minimum(P[0], Q[0]).sum())                   # 0.2 + 0.3 + 0.1 + 0.1 = 0.7
    runs = 5000
    for rule in ("vllm-probabilistic", "sglang-rs"):
        policy = _policy(rule)
        hits = 0
        for _ in range(runs):
            d = int(policy.propose(LOG_Q[0][None])[0])
            hits += policy.accept_chain([d], LOG_P[[0, d]])[0]
        assert abs(hits / runs - overlap) < 5 * math.sqrt(overlap * (1 - overlap) / runs)


@pytest.mark.parametrize("rule", RULES.names())
def test_temperature_zero_is_greedy_under_every_rule(rule):
    """The rule itself at T = 0 (p and q one-hot): argmax drafts, prefix acceptance, argmax bonus."""
    logits = torch.full((3, 6), -1.0)
    for row, best in enumerate([5, 2, 4]):
        logits[row, best] = 1.0
    policy = RULES.get(rule).policy(DecodingSettings(temperature=0.0, accept_rule=rule)).start(
        torch.Generator().manual_seed(0), torch.arange(6))
    for target_rows, expected in (([0, 1, 2], (2, 4)), ([0, 2, 1], (1, 4)), ([1, 0, 0], (0, 2))):
        for _ in range(10):
            drafts = [int(policy.propose(logits[i][None])[0]) for i in range(2)]
            assert drafts == [5, 2]
            assert policy.accept_chain(drafts, logits[target_rows]) == expected
            assert GREEDY.accept_chain(drafts, logits[target_rows]) == expected
    assert policy.first_token(logits[2]) == 4


def test_the_same_generator_reproduces_every_draw():
    def runs(seed):
        policy = _policy("eagle", seed=seed)
        return [toy_loop(policy, tree=True) for _ in range(50)]
    assert runs(5) == runs(5) and runs(5) != runs(6)


def test_sampling_draws_only_from_positive_weights():
    g = torch.Generator().manual_seed(0)
    w = torch.tensor([0.0, 1e-30, 0.0, 1.0, 0.0])
    draws = {rules.sample(w, g) for _ in range(2000)}
    assert draws <= {1, 3} and 3 in draws
    with pytest.raises(ValueError):
        rules.sample(torch.zeros(3), g)


def test_what_each_engine_refuses():
    d = lambda rule, **kw: DecodingSettings(temperature=0.7, accept_rule=rule, **kw)
    for rule in ("vllm", "vllm-probabilistic", "sglang-rs"):
        with pytest.raises(ConfigError, match=f"--accept-rule {rule} with --topk 4"):
            rules.policy_for(d(rule), topk=4)
    for rule in ("sglang", "eagle"):
        assert rules.policy_for(d(rule), topk=4).name == rule
    with pytest.raises(ConfigError, match="heads/h: draft vocab 40 < target vocab 96.*sglang-rs"):
        rules.policy_for(d("sglang-rs"), 1, "heads/h", draft_vocab_size=40, vocab_size=96)
    assert isinstance(rules.policy_for(d("sglang-rs"), 1, "heads/h", 96, 96), rules.SampledDraftRule)
    with pytest.raises(ConfigError, match="--accept-rule sglang"):
        rules.policy_for(d("eagle", accept_threshold_single=0.5))
    assert rules.policy_for(DecodingSettings(temperature=0.0, accept_rule="vllm-probabilistic"), topk=4) is GREEDY
    with pytest.raises(ValueError, match="verifies sampled chains"):
        _policy("vllm-probabilistic").accept_tree(_tree(0), LOG_P[_tree(0).tokens])
