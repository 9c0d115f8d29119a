"""Exact expected acceptance at temperature > 0 for a fixed context: the closed forms of each engine's rule.

Contract: pure tensor math over target probabilities already read at the drafts (no model here). Notation
of EAGLE3.md section 8: p is the target's processed distribution at a node (rules/filters.py
`target_probs`), a child c of that node has a = p(c); A is the number of accepted drafts of one cycle.
Each rule's closed form lives in its record (rules/base.py `Rule`, one file per engine): the one-hot rules'
`node`, P(accept c_k | at the parent) of the children of one node in sibling order, from which chains and trees
alike are built here; the sampled-draft rules' `first`, P(A >= 1).

- one node (`sibling_accept`, children c_1..c_m, C_k = a_1 + .. + a_k):
  - vllm (chains only; `rejection_random_sample_kernel` with no draft probs: accept iff p(d) >= u): a.
  - sglang (`TreeSpeculativeSamplingTargetOnly`, one coin u per depth, c_k accepted iff u <= C_k / t_acc or
    a_k >= t_single): with F(x) = min(1, x / t_acc), k* the first child with a_k >= t_single (> 0):
    F(C_k) - F(C_{k-1}) for k < k*, 1 - F(C_{k*-1}) at k*, 0 after. Thresholds 1 give a_k. Sibling order
    matters only when a threshold is below 1; with ONE child (a chain) it is min(1, a / t_acc), or 1 when
    a >= t_single: not a itself below 1.
  - eagle (`evaluate_posterior`: a fresh coin per distinct sibling, accept with the renormalised
    p(c_k) / (1 - C_{k-1}), else zero it): prod_{i<k} (1 - a_i / (1 - C_{i-1})) * a_k / (1 - C_{k-1}), which
    telescopes to a_k (`eagle_sibling_accept` keeps the product, so the telescoping is tested, not assumed).
  Children are de-duplicated first: a later sibling with the token of an earlier one is never accepted
  (the emitted token at a depth is one token; every engine's tree holds distinct siblings anyway).
- chain (every one-hot rule, topk = 1): a chain is a tree of one child per node, so P(accept d_i | d_<i
  accepted) is the rule's node form with one child (`chain_accept`) and P(A >= k) is the product of those
  (`chain_at_least`).
- tree: P(reach v) = product over the path of P(accept child | at parent) (`tree_reach`); the events
  "accepted path reaches v" for the nodes v of one depth are disjoint, so P(A >= d) = sum of P(reach v)
  over depth d (`depth_at_least`).
- sampled drafts (vllm-probabilistic, sglang-rs): d_i ~ q_i and accepted with min(1, p_i / q_i), so
  P(A >= 1) = sum_x min(p_1(x), q_1(x)) exactly (`overlap`); deeper positions are estimated by
  profile/weighted.py or rollouts.py (docs/sampling.md derives the estimators and their variance).
"""

from __future__ import annotations

import torch

from eagle_eval.rules.base import overlap, rule  # noqa: F401  (overlap: the sampled drafts' P(A >= 1), re-exported)


def chain_at_least(accept: torch.Tensor) -> torch.Tensor:
    """accept [..., K]: P(accept d_i | d_1..d_{i-1} accepted) along a chain (`chain_accept`) -> P(A >= k)
    [..., K], k = 1..K.

    >>> chain_at_least(torch.tensor([0.5, 0.8, 0.25])).tolist()
    [0.5, 0.4000000059604645, 0.10000000149011612]
    """
    return accept.cumprod(dim=-1)


def first_duplicates(tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """tokens, valid [..., m]: True where a valid sibling repeats the token of an earlier valid one.

    >>> first_duplicates(torch.tensor([4, 7, 4, 9]), torch.tensor([True, True, True, True])).tolist()
    [False, False, True, False]
    """
    same = tokens[..., :, None] == tokens[..., None, :]                         # [..., m, m]: i vs j
    earlier = torch.ones(tokens.shape[-1], tokens.shape[-1], dtype=torch.bool, device=tokens.device).tril(-1)
    return valid & (same & earlier & valid[..., None, :]).any(-1)


def sibling_accept(a: torch.Tensor, valid: torch.Tensor, decoding) -> torch.Tensor:
    """P(accept c_k | at the parent) [..., m] under `decoding.accept_rule` (a one-hot rule: its record's `node`);
    float64."""
    form = rule(decoding.accept_rule)
    if form.node is None:
        raise ValueError(f"accept rule {decoding.accept_rule!r} has no one-hot closed form (drafts are sampled)")
    return form.node(a, valid, decoding)


def realized_along_samples(decoding) -> bool:
    """Whether the drafts' prefix match along a text sampled from p is distributed as the rule's own realized
    acceptance: a one-hot rule (an emitted token equals a draft exactly when that draft was accepted, since a
    rejected child leaves the residual) whose output is plain sampling from p; not sampled drafts (the count
    is not a function of the text), not SGLang's thresholds below 1 (its text is not a sample of p)."""
    form = rule(decoding.accept_rule)
    return form.node is not None and form.lossless(decoding)


def chain_accept(a: torch.Tensor, decoding) -> torch.Tensor:
    """a [..., K]: p_i(d_i) along a chain -> P(accept d_i | d_1..d_{i-1} accepted) [..., K] float64: the rule's
    node form with one child at each node (under SGLang's thresholds below 1 not p_i(d_i) itself).

    >>> from eagle_eval.settings import DecodingSettings
    >>> dec = DecodingSettings(temperature=1.0, accept_rule="sglang", accept_threshold_single=0.7,
    ...                        accept_threshold_acc=0.5)
    >>> chain_accept(torch.tensor([0.2, 0.4, 0.7, 0.0], dtype=torch.float64), dec).tolist()
    [0.4, 0.8, 1.0, 0.0]
    """
    one_child = torch.ones(a.shape + (1,), dtype=torch.bool, device=a.device)
    return sibling_accept(a[..., None], one_child, decoding)[..., 0]


def tree_reach(parents: torch.Tensor, accept: torch.Tensor) -> torch.Tensor:
    """parents [..., N] (index of the parent node, -1 = the root; parents before children), accept [..., N]
    (P(accept v | at its parent)) -> P(the accepted path reaches v) [..., N].

    >>> tree_reach(torch.tensor([-1, -1, 0, 2]), torch.tensor([0.5, 0.25, 0.5, 0.5])).tolist()
    [0.5, 0.25, 0.25, 0.125]
    """
    reach = accept.clone()
    cur = parents.clone()
    while bool((cur >= 0).any()):                     # multiply in one ancestor level per pass
        has = cur >= 0
        reach = torch.where(has, reach * accept.gather(-1, cur.clamp(min=0)), reach)
        cur = torch.where(has, parents.gather(-1, cur.clamp(min=0)), cur)
    return reach


def depth_at_least(reach: torch.Tensor, depths: torch.Tensor, num_steps: int) -> torch.Tensor:
    """reach, depths [..., N] (depth 1..num_steps; 0 = not in the tree) -> P(A >= d) [..., num_steps]."""
    levels = torch.arange(1, num_steps + 1, device=depths.device)
    return ((depths[..., None, :] == levels[:, None]) * reach[..., None, :]).sum(-1)

