"""The EAGLE repository's accept rule (SafeAILab/EAGLE `eagle/model/utils.py` `evaluate_posterior`): deterministic
chain or top-k tree; a fresh coin per distinct child against p renormalised after each rejection.

The filter order of p (`prepare_logits_processor`: HF warpers): z / T, top-p on the full distribution (ascending
cumsum <= 1 - p removed, one kept), top-k (ties kept), softmax.
"""

from __future__ import annotations

import torch

from eagle_eval.rules import base
from eagle_eval.rules.base import OneHotRule, Rule
from eagle_eval.rules.filters import keep_top_k, keep_top_p_cumsum, renorm


def probs(scaled: torch.Tensor, decoding) -> torch.Tensor:
    """EAGLE's p from z / T (module docstring)."""
    p = scaled.softmax(-1)
    return renorm(p, keep_top_p_cumsum(p, decoding.top_p) & keep_top_k(scaled, decoding.top_k))


def sibling_accept(a: torch.Tensor, valid: torch.Tensor, decoding=None) -> torch.Tensor:
    """a, valid [..., m] -> P(accept c_k | at the parent) [..., m], EAGLE's rule: a coin per sibling against
    the renormalised p, prod_{i<k} (1 - a_i / (1 - C_{i-1})) * a_k / (1 - C_{k-1}) (the product is kept, so that
    its telescoping to a_k is tested, not assumed)."""
    a = a.double() * valid
    left = 1 - (a.cumsum(-1) - a)                                                # 1 - C_{k-1}
    ratio = torch.where(left > 0, a / left.clamp(min=1e-300), torch.zeros_like(a)).clamp(max=1.0)
    reject_before = torch.cat([torch.ones_like(ratio[..., :1]), (1 - ratio).cumprod(-1)[..., :-1]], dim=-1)
    return reject_before * ratio * valid


class EagleRule(OneHotRule):
    """EAGLE's rule: a fresh coin per distinct child against p renormalised after each rejection."""

    def node(self, p, children):
        residual, tried = p.double(), []
        for k, c in enumerate(children):
            if c in tried:
                continue
            if base.coin(self.rng) < float(residual[c]):
                return k, None
            tried.append(c)
            residual = base.without(residual, [c])
            residual = residual / residual.sum()
        return None, residual


EAGLE = Rule(
    name="eagle", engine="EAGLE official", policy=EagleRule, probs=probs,
    filter_order="temperature -> top-p (on the full distribution) -> top-k",
    drafts="the deterministic chain or top-k tree",
    at_a_node="a fresh coin per distinct child: accept iff u < p'(c), else p'(c) = 0 and p' renormalised",
    residual="p'", source="SafeAILab/EAGLE `eagle/model/utils.py` `evaluate_posterior`",
    node=sibling_accept)
