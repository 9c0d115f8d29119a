"""vLLM's accept rules (vLLM 0.32, V1 and V2 runners): `vllm` (the default, draft_sample_method "greedy": argmax
drafts, one-hot q) and `vllm-probabilistic` (draft_sample_method "probabilistic": drafts sampled from q). Both verify
chains only.

Sources: `v1/sample/rejection_sampler.py` (`rejection_random_sample_kernel`; with `draft_probs=None` q is one-hot,
`sample_recovered_tokens`), V2 `v1/worker/gpu/spec_decode/rejection_sampler_utils.py`; the filter order of p in
`v1/sample/sampler.py` and `ops/topk_topp_sampler.py` `apply_top_k_top_p`: z / T, min_p on softmax(z / T), top-k (ties
at the k-th kept), top-p on the top-k-renormalised distribution (ascending cumsum <= 1 - p removed, the largest
always kept).
"""

from __future__ import annotations

import torch

from eagle_eval.rules import base
from eagle_eval.rules.base import OneHotRule, Rule, SampledDraftRule, overlap
from eagle_eval.rules.filters import keep_top_k, keep_top_p_cumsum, renorm

CHAINS = "vLLM 0.32 verifies EAGLE drafts as a chain (no token tree)"
ORDER = "temperature -> min_p -> top-k -> top-p (on the top-k distribution)"


def probs(scaled: torch.Tensor, decoding) -> torch.Tensor:
    """vLLM's p from z / T (module docstring)."""
    p = scaled.softmax(-1)
    keep = p >= decoding.min_p * p.max(dim=-1, keepdim=True).values if decoding.min_p > 0 else \
        torch.ones_like(p, dtype=torch.bool)
    keep &= keep_top_k(scaled.masked_fill(~keep, float("-inf")), decoding.top_k)
    p = renorm(p, keep)
    return renorm(p, keep_top_p_cumsum(p, decoding.top_p))


def sibling_accept(a: torch.Tensor, valid: torch.Tensor, decoding=None) -> torch.Tensor:
    """a, valid [..., m] (m = 1: vLLM verifies chains) -> P(accept d | at the parent) = p(d)."""
    if valid.shape[-1] > 1 and bool((valid.sum(-1) > 1).any()):
        raise ValueError("accept rule vllm verifies chains only (one child per node)")
    return a.double() * valid


class VllmRule(OneHotRule):
    """vLLM, draft_sample_method "greedy": the chain's one child d is accepted with p(d)."""

    def node(self, p, children):
        (d,) = children
        if base.coin(self.rng) < float(p[d]):
            return 0, None
        return None, base.without(p, [d])


VLLM = Rule(
    name="vllm", engine="vLLM 0.32", policy=VllmRule, probs=probs, filter_order=ORDER,
    drafts="the draft's argmax, a chain", at_a_node="accept d iff u < p(d)", residual="p with d removed",
    source="vLLM 0.32 `v1/sample/rejection_sampler.py` (`rejection_random_sample_kernel` with `draft_probs=None`, "
           "`sample_recovered_tokens`); V2 `v1/worker/gpu/spec_decode/rejection_sampler_utils.py`",
    node=sibling_accept, chain_only=CHAINS)

VLLM_PROBABILISTIC = Rule(
    name="vllm-probabilistic", engine="vLLM 0.32", policy=SampledDraftRule, probs=probs,
    filter_order=ORDER + "; drafts sampled from softmax(draft logits / T), unfiltered",
    drafts="d_i ~ q_i, a chain", at_a_node="accept d iff u q(d) < p(d)", residual="relu(p - q)",
    source="the same, `draft_sample_method=\"probabilistic\"`", first=overlap, chain_only=CHAINS)
