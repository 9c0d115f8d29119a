"""Every closed form of profile/expected.py against a Monte Carlo of the engine's own verification written
here, straightforwardly, on generated cases (hypothesis, derandomized): random target distributions, sibling
counts, chain lengths, tree shapes and SGLang thresholds (1, below 1, and a child whose p equals t_single
exactly).

The engines, as their sources decide one cycle (each simulated for N cycles at once, every cycle its own
coins):
- SGLang `TreeSpeculativeSamplingTargetOnly` (sgl-project/sglang:sgl-kernel/csrc/speculative/
  speculative_sampling.cuh): one coin per depth (the accepted node's), `prob_acc` summed over the siblings
  tried, a child accepted iff coin <= prob_acc / threshold_acc or its p >= threshold_single.
- EAGLE `evaluate_posterior` (SafeAILab/EAGLE:eagle/model/utils.py): a fresh coin per sibling, accepted iff
  coin <= p(x), else p(x) = 0 and p renormalised over the whole vocab.
- vLLM `rejection_random_sample_kernel` without draft probs (vllm-project/vllm:vllm/v1/sample/
  rejection_sampler.py): one coin per position, accepted iff p(d) / 1 >= coin, the chain stops at a reject.
- Sampled drafts: d ~ q, accepted iff q(d) > 0 and p(d) / q(d) >= coin (vLLM's kernel with draft probs) or
  coin * q(d) < p(d) (SGLang's `speculative_sampling_classic_kernel`).

The interval test: each frequency's Wilson score interval at z = 5 (two-sided alpha 5.7e-7 per comparison,
a few thousand comparisons in all) must hold the closed form. With N = 50,000 cycles its half-width is at
most 0.0112, so a closed form off by 0.02 fails (`test_the_interval_test_has_the_power_to_see_0_02` shows it)
and the product-of-p chain form under thresholds below 1 fails (`test_planted_product_of_p_chain_fails`).
"""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle_eval.settings import DecodingSettings
from eagle_eval.profile.expected import (
    chain_accept,
    chain_at_least,
    depth_at_least,
    overlap,
    sibling_accept,
    tree_reach,
)

N = 50_000
Z = 5.0
EXAMPLES = 25


# -- the engines, one cycle each for N cycles at once ------------------------------------------------------

class Tree:
    """A verify tree: node 0 the root, `parents[v]` before v, `tokens[v]`, `p[v]` [V] the target's distribution
    at v (after its path), children in sibling order = ascending index."""

    def __init__(self, parents: list[int], tokens: list[int], p: torch.Tensor):
        self.parents, self.tokens, self.p = parents, tokens, p
        self.kids = [[c for c in range(len(parents)) if parents[c] == v] for v in range(len(parents))]
        self.depths = [0] * len(parents)
        for v in range(1, len(parents)):
            self.depths[v] = self.depths[parents[v]] + 1

    def kid_table(self) -> torch.Tensor:
        width = max(1, max(len(k) for k in self.kids))
        return torch.tensor([k + [-1] * (width - len(k)) for k in self.kids])            # [nodes, width]


def sglang_kernel(tree: Tree, t_single: float, t_acc: float, gen) -> torch.Tensor:
    """-> reached [N, nodes] bool: the nodes on each cycle's accepted path."""
    kids, tokens, p = tree.kid_table(), torch.tensor(tree.tokens), tree.p
    rows = torch.arange(N)
    node = torch.zeros(N, dtype=torch.long)
    done = torch.zeros(N, dtype=torch.bool)
    reached = torch.zeros(N, len(tree.parents), dtype=torch.bool)
    reached[:, 0] = True
    for _ in range(max(tree.depths)):
        coin = torch.rand(N, generator=gen, dtype=torch.float64)
        prob_acc = torch.zeros(N, dtype=torch.float64)
        accepted = torch.full((N,), -1)
        for k in range(kids.shape[1]):
            child = kids[node, k]
            tried = ~done & (accepted < 0) & (child >= 0)
            target_prob_single = torch.where(tried, p[node, tokens[child.clamp(min=0)]], 0.0)
            prob_acc = prob_acc + target_prob_single
            accept = tried & ((coin <= prob_acc / t_acc) | (target_prob_single >= t_single))
            accepted = torch.where(accept, child, accepted)
        done |= accepted < 0
        node = torch.where(accepted >= 0, accepted, node)
        reached[rows[accepted >= 0], node[accepted >= 0]] = True
    return reached


def eagle_posterior(tree: Tree, gen) -> torch.Tensor:
    """-> reached [N, nodes] bool, EAGLE's per-sibling coins with the vocab vector renormalised after a reject."""
    kids, tokens = tree.kid_table(), torch.tensor(tree.tokens)
    rows = torch.arange(N)
    node = torch.zeros(N, dtype=torch.long)
    done = torch.zeros(N, dtype=torch.bool)
    reached = torch.zeros(N, len(tree.parents), dtype=torch.bool)
    reached[:, 0] = True
    for _ in range(max(tree.depths)):
        gtp = tree.p[node].clone()                                                        # [N, V]
        accepted = torch.full((N,), -1)
        for k in range(kids.shape[1]):
            child = kids[node, k]
            tried = ~done & (accepted < 0) & (child >= 0)
            xi = tokens[child.clamp(min=0)]
            r = torch.rand(N, generator=gen, dtype=torch.float64)
            accept = tried & (r <= gtp[rows, xi])
            accepted = torch.where(accept, child, accepted)
            reject = tried & ~accept
            gtp[rows[reject], xi[reject]] = 0.0
            total = gtp.sum(-1, keepdim=True)
            gtp = torch.where(reject[:, None] & (total > 0), gtp / total.clamp(min=1e-300), gtp)
        done |= accepted < 0
        node = torch.where(accepted >= 0, accepted, node)
        reached[rows[accepted >= 0], node[accepted >= 0]] = True
    return reached


def vllm_chain(a: list[float], gen) -> torch.Tensor:
    """a: p_i(d_i) along a chain -> accepted drafts [N]: position by position, accepted iff p(d) / 1 >= u."""
    count = torch.zeros(N, dtype=torch.long)
    going = torch.ones(N, dtype=torch.bool)
    for target_prob in a:
        u = torch.rand(N, generator=gen, dtype=torch.float64)
        going &= target_prob / 1.0 >= u
        count += going.long()
    return count


def sampled_draft_accepts(p: torch.Tensor, q: torch.Tensor, engine: str, gen) -> torch.Tensor:
    """d ~ q, one coin -> accepted [N] bool under vLLM's (p / q >= u) or SGLang's classic (u q < p) test."""
    d = torch.multinomial(q, N, replacement=True, generator=gen)
    u = torch.rand(N, generator=gen, dtype=torch.float64)
    if engine == "vllm":
        return (q[d] > 0) & (p[d] / q[d] >= u)
    return u * q[d] < p[d]


# -- the interval test ---------------------------------------------------------------------------------------

def wilson(successes: int, n: int, z: float = Z) -> tuple[float, float]:
    phat = successes / n
    denom = 1 + z * z / n
    center = (phat + z * z / (2 * n)) / denom
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / denom
    return center - half, center + half


def misses(counts: torch.Tensor, closed: torch.Tensor, n: int = N) -> list[tuple[int, float, float]]:
    """(index, frequency, closed form) of every closed form outside its frequency's Wilson interval."""
    out = []
    for i, (c, want) in enumerate(zip(counts.tolist(), closed.tolist())):
        lo, hi = wilson(int(c), n)
        if not lo - 1e-12 <= want <= hi + 1e-12:
            out.append((i, c / n, want))
    return out


# -- generated cases ------------------------------------------------------------------------------------------

threshold = st.one_of(st.just(1.0), st.floats(0.05, 1.0), st.sampled_from([0.3, 0.5, 0.6, 0.8]))


@st.composite
def distributions(draw, rows: int, vocab: int) -> torch.Tensor:
    """[rows, vocab] float64 target distributions: flat to peaked, some tokens filtered to 0."""
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 31 - 1)))
    sharp = draw(st.sampled_from([1.0, 3.0, 8.0]))
    raw = torch.rand(rows, vocab, generator=gen, dtype=torch.float64) ** sharp
    raw = raw * (torch.rand(rows, vocab, generator=gen, dtype=torch.float64) > draw(st.sampled_from([0.0, 0.3])))
    raw[:, 0] += 1e-3                                               # every row some mass
    return raw / raw.sum(-1, keepdim=True)


def with_tie(p: torch.Tensor, token: int, t_single: float) -> torch.Tensor:
    """p [V] with p(token) = t_single exactly, the rest rescaled to 1 - t_single."""
    out = p.clone()
    rest = out.sum() - out[token]
    out *= (1 - t_single) / rest if rest > 0 else 0.0
    out[token] = t_single
    return out


@st.composite
def trees(draw, max_depth: int, max_kids: int, vocab: int = 7) -> tuple[Tree, float]:
    """A random tree (distinct sibling tokens, as every engine's tree has) with p at every node, and t_single;
    a child's p equals t_single exactly when `tie` is drawn."""
    parents, tokens, frontier = [-1], [-1], [0]
    for _ in range(draw(st.integers(1, max_depth))):
        nxt = []
        for v in frontier:
            m = draw(st.integers(0 if v else 1, max_kids))
            for tok in draw(st.permutations(range(vocab)))[:m]:
                parents.append(v)
                tokens.append(tok)
                nxt.append(len(parents) - 1)
        frontier = nxt or frontier[:0]
        if not frontier:
            break
    p = draw(distributions(len(parents), vocab))
    t_single = draw(threshold)
    if draw(st.booleans()):
        child = draw(st.integers(1, len(parents) - 1))
        p[parents[child]] = with_tie(p[parents[child]], tokens[child], t_single)
    return Tree(parents, tokens, p), t_single


def decoding(rule: str, t_single: float = 1.0, t_acc: float = 1.0) -> DecodingSettings:
    return DecodingSettings(temperature=1.0, accept_rule=rule, accept_threshold_single=t_single,
                            accept_threshold_acc=t_acc)


def closed_reach(tree: Tree, dec: DecodingSettings) -> torch.Tensor:
    """P(reach v) [nodes] (the root 1) from `sibling_accept` at every node and `tree_reach`."""
    accept = torch.zeros(len(tree.parents), dtype=torch.float64)
    for v, kids in enumerate(tree.kids):
        if kids:
            a = tree.p[v, [tree.tokens[c] for c in kids]]
            accept[kids] = sibling_accept(a, torch.ones(len(kids), dtype=torch.bool), dec)
    reach = tree_reach(torch.tensor(tree.parents[1:]) - 1, accept[1:])                # index shifted: no root
    return torch.cat([torch.ones(1, dtype=torch.float64), reach])


def chain_tree(p: torch.Tensor, drafts: list[int]) -> Tree:
    """A chain d_1..d_K as a tree: node i (depth i) holds d_i, p[i] is the target after d_1..d_i."""
    k = len(drafts)
    return Tree(list(range(-1, k)), [-1] + drafts, p)


# -- the tests --------------------------------------------------------------------------------------------------

@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(case=trees(max_depth=3, max_kids=4), t_acc=threshold, seed=st.integers(0, 2 ** 31 - 1))
def test_sglang_tree_sibling_reach_and_depth_equal_the_kernel(case, t_acc, seed):
    """Per-sibling acceptance (the root's children), every node's reach and every P(depth >= d)."""
    tree, t_single = case
    reached = sglang_kernel(tree, t_single, t_acc, torch.Generator().manual_seed(seed))
    reach = closed_reach(tree, decoding("sglang", t_single, t_acc))
    assert not misses(reached.sum(0), reach), (tree.parents, tree.tokens, t_single, t_acc)
    depth = reached.sum(-1) - 1
    s = max(tree.depths)
    at_least = depth_at_least(reach[1:], torch.tensor(tree.depths[1:]), s)
    assert not misses(torch.stack([(depth >= d).sum() for d in range(1, s + 1)]), at_least)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(case=trees(max_depth=3, max_kids=4), seed=st.integers(0, 2 ** 31 - 1))
def test_eagle_tree_sibling_reach_and_depth_equal_evaluate_posterior(case, seed):
    tree, _ = case
    reached = eagle_posterior(tree, torch.Generator().manual_seed(seed))
    reach = closed_reach(tree, decoding("eagle"))
    assert not misses(reached.sum(0), reach), (tree.parents, tree.tokens)
    depth = reached.sum(-1) - 1
    s = max(tree.depths)
    at_least = depth_at_least(reach[1:], torch.tensor(tree.depths[1:]), s)
    assert not misses(torch.stack([(depth >= d).sum() for d in range(1, s + 1)]), at_least)


@st.composite
def chains(draw, vocab: int = 6):
    """(p [K+1, V], drafts d_1..d_K, t_single, t_acc); a draft's p equals t_single exactly when `tie` is drawn,
    and drafts are often the argmax (a trained head's), else any token."""
    k = draw(st.integers(1, 6))
    p = draw(distributions(k + 1, vocab))
    drafts = [int(p[i].argmax()) if draw(st.booleans()) else draw(st.integers(0, vocab - 1)) for i in range(k)]
    t_single, t_acc = draw(threshold), draw(threshold)
    if draw(st.booleans()):
        i = draw(st.integers(0, k - 1))
        p[i] = with_tie(p[i], drafts[i], t_single)
    return p, drafts, t_single, t_acc


def chain_counts(p, drafts, rule, t_single, t_acc, gen) -> torch.Tensor:
    """Cycles [K] with A >= k, k = 1..K, by the rule's engine."""
    k = len(drafts)
    if rule == "vllm":
        accepted = vllm_chain([float(p[i, d]) for i, d in enumerate(drafts)], gen)
    else:
        tree = chain_tree(p, drafts)
        reached = sglang_kernel(tree, t_single, t_acc, gen) if rule == "sglang" else eagle_posterior(tree, gen)
        accepted = reached.sum(-1) - 1
    return torch.stack([(accepted >= i).sum() for i in range(1, k + 1)])


def closed_chain(p, drafts, dec) -> torch.Tensor:
    """What the profile computes for a chain: `chain_at_least(chain_accept(p_i(d_i)))`."""
    a = torch.stack([p[i, d] for i, d in enumerate(drafts)])
    return chain_at_least(chain_accept(a, dec))


@settings(max_examples=2 * EXAMPLES, deadline=None, derandomize=True)
@given(case=chains(), rule=st.sampled_from(["sglang", "eagle", "vllm"]), seed=st.integers(0, 2 ** 31 - 1))
def test_chain_at_least_equals_each_engine(case, rule, seed):
    """P(A >= k) of a chain under every one-hot rule (SGLang with its thresholds, the others at 1)."""
    p, drafts, t_single, t_acc = case
    if rule != "sglang":
        t_single = t_acc = 1.0
    counts = chain_counts(p, drafts, rule, t_single, t_acc, torch.Generator().manual_seed(seed))
    closed = closed_chain(p, drafts, decoding(rule, t_single, t_acc))
    assert not misses(counts, closed), ([float(p[i, d]) for i, d in enumerate(drafts)], t_single, t_acc)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(pq=distributions(2, 8), engine=st.sampled_from(["vllm", "sglang"]), seed=st.integers(0, 2 ** 31 - 1))
def test_sampled_draft_first_acceptance_is_the_overlap(pq, engine, seed):
    """P(A >= 1) of the sampled-draft rules (vllm-probabilistic, sglang-rs): sum min(p, q); q may be 0 on some
    tokens (a reduced draft vocab) and p on others (filtered)."""
    p, q = pq[0], pq[1]
    accepted = sampled_draft_accepts(p, q, engine, torch.Generator().manual_seed(seed))
    assert not misses(accepted.sum()[None], overlap(p, q)[None])


# -- the test sees what it must: a planted error fails ----------------------------------------------------------

def test_planted_product_of_p_chain_fails():
    """The chain form the profile had before (P(A >= k) = prod p_i(d_i) for every one-hot rule) against SGLang's
    kernel at the thresholds of the issue (single 0.6, acc 0.5): it misses on every generated chain where it
    differs from the kernel by more than 0.02, and the form used now holds there."""
    dec = decoding("sglang", 0.6, 0.5)
    differing = 0
    for seed in range(12):
        gen = torch.Generator().manual_seed(seed)
        p = torch.rand(5, 6, generator=gen, dtype=torch.float64) ** 2
        p = p / p.sum(-1, keepdim=True)
        drafts = [int(x) for x in p[:4].argmax(-1)]
        counts = chain_counts(p, drafts, "sglang", 0.6, 0.5, gen)
        old = chain_at_least(torch.stack([p[i, d] for i, d in enumerate(drafts)]))
        new = closed_chain(p, drafts, dec)
        assert not misses(counts, new), seed
        if float((old - new).abs().max()) > 0.02:
            differing += 1
            assert misses(counts, old), seed
    assert differing >= 10


def test_the_interval_test_has_the_power_to_see_0_02():
    """A closed form moved by 0.02 either way, where the frequency's variance is largest (P near 0.5), fails."""
    p = torch.tensor([[0.35, 0.4, 0.25], [0.5, 0.3, 0.2]], dtype=torch.float64)
    drafts = [0, 0]
    dec = decoding("sglang", 1.0, 0.7)                                   # P(A >= 1) = 0.5, P(A >= 2) = 0.5 * 5 / 7
    counts = chain_counts(p, drafts, "sglang", 1.0, 0.7, torch.Generator().manual_seed(0))
    closed = closed_chain(p, drafts, dec)
    assert closed[0] == 0.5 and not misses(counts, closed)
    for shift in (0.02, -0.02):
        assert len(misses(counts, closed + shift)) == 2, shift
    assert wilson(N // 2, N)[1] - 0.5 < 0.0112
