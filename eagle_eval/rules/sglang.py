"""SGLang's accept rules: `sglang` (EAGLE/EAGLE3 verification, `TreeSpeculativeSamplingTargetOnly`: deterministic
chain or top-k tree drafted from the draft's softmax without temperature, one coin per depth, the thresholds
`--speculative-accept-threshold-single` / `-acc`) and `sglang-rs` (`--speculative-use-rejection-sampling`: drafts sampled
from q, a chain, the full vocab).

Sources: `sgl-kernel/csrc/speculative/speculative_sampling.cuh` `TreeSpeculativeSamplingTargetOnly` (a child c_k is
accepted iff u <= C_k / t_acc or p(c_k) >= t_single, C_k the cumulative p of the children tried), and
`speculative_sampling_classic_kernel` (refuses topk > 1, thresholds != 1, a reduced draft vocab); the filter order of
p in `speculative/eagle_utils.py` eagle_sample (FlashInfer top_k/top_p_renorm_probs): softmax(z / T), top-k
renormalised (ties kept), top-p renormalised (keep p >= the first ascending prob whose CDF reaches 1 - p); min_p is
NOT applied at verify.
"""

from __future__ import annotations

import torch

from eagle_eval.rules import base
from eagle_eval.rules.base import OneHotRule, Rule, SampledDraftRule, overlap
from eagle_eval.rules.filters import keep_top_k, keep_top_p_pivot, renorm

ORDER = "temperature -> top-k -> top-p (on the top-k distribution); min_p not applied at verify"


def probs(scaled: torch.Tensor, decoding) -> torch.Tensor:
    """SGLang's p from z / T (module docstring)."""
    p = scaled.softmax(-1)
    p = renorm(p, keep_top_k(p, decoding.top_k))
    return renorm(p, keep_top_p_pivot(p, decoding.top_p))


def sibling_accept(a: torch.Tensor, valid: torch.Tensor, t_single: float = 1.0,
                   t_acc: float = 1.0) -> torch.Tensor:
    """a, valid [..., m] (siblings in order) -> P(accept c_k | at the parent) [..., m], SGLang's rule: with
    F(x) = min(1, x / t_acc), k* the first child with a_k >= t_single (> 0): F(C_k) - F(C_{k-1}) for k < k*,
    1 - F(C_{k*-1}) at k*, 0 after. Thresholds 1 give a_k; with ONE child (a chain) min(1, a / t_acc), or 1 when
    a >= t_single.

    >>> sibling_accept(torch.tensor([0.3, 0.5, 0.1]), torch.tensor([True, True, True])).tolist()
    [0.30000001192092896, 0.5, 0.10000000149011612]
    >>> [round(x, 6) for x in sibling_accept(torch.tensor([0.3, 0.5, 0.1]), torch.tensor([True] * 3), 0.4, 0.5).tolist()]
    [0.6, 0.4, 0.0]
    >>> [round(x, 6) for x in sibling_accept(torch.tensor([0.3]), torch.tensor([True]), 1.0, 0.5).tolist()]
    [0.6]
    """
    a = a.double() * valid
    c = a.cumsum(-1)
    f = lambda x: (x / t_acc).clamp(max=1.0)                                    # noqa: E731
    single = valid & (a > 0) & (a >= t_single)
    after_single = (single.long().cumsum(-1) - single.long()) > 0               # some earlier child is single
    prob = torch.where(single, 1 - f(c - a), f(c) - f(c - a))
    return torch.where(after_single | ~valid, torch.zeros_like(prob), prob)


class SglangRule(OneHotRule):
    """SGLang's tree rule: one coin per depth against the children's cumulative p, thresholds t_single/t_acc."""

    def node(self, p, children):
        u, acc = base.coin(self.rng), 0.0
        t_single, t_acc = self.decoding.accept_threshold_single, self.decoding.accept_threshold_acc
        for k, c in enumerate(children):
            a = float(p[c])
            acc += a
            if a > 0 and (u < acc / t_acc or a >= t_single):
                return k, None
        return None, base.without(p, children)


SGLANG = Rule(
    name="sglang", engine="SGLang", policy=SglangRule, probs=probs, filter_order=ORDER,
    drafts="the deterministic chain or top-k tree (`loop/tree.py`, draft softmax at T = 1)",
    at_a_node="one coin u per depth; acc += p(c_k); accept c_k iff p(c_k) > 0 and (u < acc / t_acc or "
              "p(c_k) >= t_single)",
    residual="p with every rejected child zeroed (relu(p - q), q = their mass)",
    source="SGLang `sgl-kernel/csrc/speculative/speculative_sampling.cuh` `TreeSpeculativeSamplingTargetOnly`",
    node=lambda a, valid, decoding: sibling_accept(a, valid, decoding.accept_threshold_single,
                                                   decoding.accept_threshold_acc),
    thresholds=True,
    lossless=lambda decoding: (decoding.accept_threshold_single, decoding.accept_threshold_acc) == (1.0, 1.0))

SGLANG_RS = Rule(
    name="sglang-rs", engine="SGLang", policy=SampledDraftRule, probs=probs,
    filter_order=ORDER + "; drafts sampled from softmax(draft logits / T), unfiltered",
    drafts="d_i ~ q_i, a chain, full vocab", at_a_node="accept d iff u q(d) < p(d)", residual="relu(p - q)",
    source="SGLang `--speculative-use-rejection-sampling`", first=overlap,
    chain_only="SGLang's rejection sampling (--speculative-use-rejection-sampling) needs --speculative-eagle-topk 1",
    full_vocab="(SGLang's rejection sampling) needs the draft vocab equal to the target's (SGLang refuses a "
               "reduced-vocab EAGLE-3 head there); use --accept-rule sglang")
