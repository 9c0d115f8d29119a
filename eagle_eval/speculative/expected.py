"""Exact expected acceptance at temperature > 0 for a fixed context: the closed forms of each engine's rule.

Contract: pure tensor math over target probabilities already read at the drafts (no model here). Notation
of EAGLE3.md section 8: p is the target's processed distribution at a node (speculative/sampling.py
`target_probs`), a child c of that node has a = p(c); A is the number of accepted drafts of one cycle.
Each rule's closed form is ONE record, `CLOSED_FORMS[rule]` (`ClosedForm`): the one-hot rules' `node`,
P(accept c_k | at the parent) of the children of one node in sibling order, from which chains and trees
alike are built; the sampled-draft rules' P(A >= 1).

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
  speculative/weighted.py or rollouts.py (docs/sampling.md derives the estimators and their variance).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


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


def sglang_sibling_accept(a: torch.Tensor, valid: torch.Tensor, t_single: float = 1.0,
                          t_acc: float = 1.0) -> torch.Tensor:
    """a, valid [..., m] (siblings in order) -> P(accept c_k | at the parent) [..., m], SGLang's rule.

    >>> sglang_sibling_accept(torch.tensor([0.3, 0.5, 0.1]), torch.tensor([True, True, True])).tolist()
    [0.30000001192092896, 0.5, 0.10000000149011612]
    >>> [round(x, 6) for x in sglang_sibling_accept(torch.tensor([0.3, 0.5, 0.1]),
    ...                                               torch.tensor([True] * 3), 0.4, 0.5).tolist()]
    [0.6, 0.4, 0.0]
    >>> [round(x, 6) for x in sglang_sibling_accept(torch.tensor([0.3]), torch.tensor([True]), 1.0, 0.5).tolist()]
    [0.6]
    """
    a = a.double() * valid
    c = a.cumsum(-1)
    f = lambda x: (x / t_acc).clamp(max=1.0)                                    # noqa: E731
    single = valid & (a > 0) & (a >= t_single)
    after_single = (single.long().cumsum(-1) - single.long()) > 0               # some earlier child is single
    prob = torch.where(single, 1 - f(c - a), f(c) - f(c - a))
    return torch.where(after_single | ~valid, torch.zeros_like(prob), prob)


def eagle_sibling_accept(a: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """a, valid [..., m] -> P(accept c_k | at the parent) [..., m], EAGLE's rule: a coin per sibling against
    the renormalised p (the product of the rejections before it times the renormalised p(c_k))."""
    a = a.double() * valid
    left = 1 - (a.cumsum(-1) - a)                                                # 1 - C_{k-1}
    ratio = torch.where(left > 0, a / left.clamp(min=1e-300), torch.zeros_like(a)).clamp(max=1.0)
    reject_before = torch.cat([torch.ones_like(ratio[..., :1]), (1 - ratio).cumprod(-1)[..., :-1]], dim=-1)
    return reject_before * ratio * valid


def vllm_sibling_accept(a: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """a, valid [..., m] (m = 1: vLLM verifies chains) -> P(accept d | at the parent) = p(d)."""
    if valid.shape[-1] > 1 and bool((valid.sum(-1) > 1).any()):
        raise ValueError("accept rule vllm verifies chains only (one child per node)")
    return a.double() * valid


@dataclass(frozen=True)
class ClosedForm:
    """One accept rule's closed form. `node` (the one-hot rules): (a, valid [..., m], decoding) -> P(accept
    c_k | at the parent) [..., m] float64, the children in sibling order; chains and trees are built from it.
    `first` (the sampled-draft rules): (p, q [..., V]) -> P(A >= 1), exact; deeper positions are estimated.
    `lossless(decoding)`: the rule's output is plain sampling from p at these settings."""
    node: Callable | None = None
    first: Callable | None = None
    trees: bool = False                 # the rule verifies trees (topk > 1)
    lossless: Callable = lambda decoding: True                                  # noqa: E731


def overlap(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """sum_x min(p(x), q(x)) over the last dim: P(accept) of a draft sampled from q, kept with min(1, p/q).

    >>> round(float(overlap(torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.2, 0.4, 0.4]))), 6)
    0.6
    """
    return torch.minimum(p, q).sum(-1)


CLOSED_FORMS = {
    "vllm": ClosedForm(node=lambda a, valid, decoding: vllm_sibling_accept(a, valid)),
    "vllm-probabilistic": ClosedForm(first=overlap),
    "sglang": ClosedForm(node=lambda a, valid, decoding: sglang_sibling_accept(
        a, valid, decoding.accept_threshold_single, decoding.accept_threshold_acc), trees=True,
        lossless=lambda decoding: (decoding.accept_threshold_single, decoding.accept_threshold_acc) == (1.0, 1.0)),
    "sglang-rs": ClosedForm(first=overlap),
    "eagle": ClosedForm(node=lambda a, valid, decoding: eagle_sibling_accept(a, valid), trees=True),
}
ONE_HOT_RULES = tuple(r for r, f in CLOSED_FORMS.items() if f.node is not None)
PROBABILISTIC_RULES = tuple(r for r, f in CLOSED_FORMS.items() if f.first is not None)
TREE_RULES = tuple(r for r, f in CLOSED_FORMS.items() if f.trees)


def sibling_accept(a: torch.Tensor, valid: torch.Tensor, decoding) -> torch.Tensor:
    """P(accept c_k | at the parent) [..., m] under `decoding.accept_rule` (a one-hot rule); float64."""
    form = CLOSED_FORMS.get(decoding.accept_rule)
    if form is None or form.node is None:
        raise ValueError(f"accept rule {decoding.accept_rule!r} has no one-hot closed form (drafts are sampled)")
    return form.node(a, valid, decoding)


def realized_along_samples(decoding) -> bool:
    """Whether the drafts' prefix match along a text sampled from p is distributed as the rule's own realized
    acceptance: a one-hot rule (an emitted token equals a draft exactly when that draft was accepted, since a
    rejected child leaves the residual) whose output is plain sampling from p; not sampled drafts (the count
    is not a function of the text), not SGLang's thresholds below 1 (its text is not a sample of p)."""
    form = CLOSED_FORMS[decoding.accept_rule]
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

