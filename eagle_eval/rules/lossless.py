"""`--check-lossless` at temperature > 0: is the loop's output distributed as plain sampling from the target?

Contract: `cell_counts(target, decoding, prompt_ids, output_ids)` runs ONE teacher-forced target forward over
the prompt and the loop's output, builds p_t = `sampling.target_probs` (the rule's processed distribution,
the one the loop claims to sample) at every emitted position t, and counts each emitted token in its rank
cell (stats/distribution.py, which holds the statistic and the verdict). A token with p_t = 0 is recorded;
it decides alone unless it lies at a filter's edge (inside the support of slightly loosened filters), where
another forward's rounding could have kept it. Nothing here samples: the test
compares what the loop emitted with what the target says it should have emitted.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from eagle_eval.models.target import Target
from eagle_eval.stats.distribution import RANK_CELLS, CellCounts


def relaxed(decoding):
    """`decoding` with its filters loosened by a numeric margin (top-k + 1, top-p + 0.01, min_p x 0.9), each a
    superset of the support in every engine's order: a token the loop kept at a filter's edge can fall just
    outside it in this forward's rounding (bf16 above all), and is then listed, not decisive."""
    return replace(decoding, top_k=decoding.top_k + 1 if decoding.top_k > 0 else 0,
                   top_p=min(1.0, decoding.top_p + 0.01), min_p=decoding.min_p * 0.9)


def counts_of(probs: torch.Tensor, tokens: list[int], loose: torch.Tensor | None = None) -> CellCounts:
    """probs [n, V] (p_t at each position), tokens [n] (x_t) -> the rank-cell counts; loose [n, V]: p under
    `relaxed` filters (a token outside probs' support but inside loose's is marked at_filter_edge).

    >>> p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.2, 0.7, 0.0]])
    >>> c = counts_of(p, [1, 3])
    >>> c.observed[:3], [round(e, 3) for e in c.expected[:3]], c.outside_support
    ([0, 1, 0], [1.2, 0.5, 0.3], [{'position': 1, 'token': 3, 'at_filter_edge': False}])
    """
    n = len(tokens)
    out = CellCounts()
    if n == 0:
        return out
    probs = probs.detach().double().cpu()
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)                   # [n, V]
    vocab = probs.shape[-1]
    pi = torch.stack([sorted_p[:, lo - 1: vocab if hi is None else hi].sum(-1) for lo, hi in RANK_CELLS], -1)  # [n, K]
    x = torch.tensor(tokens)
    rank = (order == x[:, None]).int().argmax(-1) + 1                                    # [n], 1-based
    cell = torch.zeros(n, dtype=torch.long)
    for c, (lo, _) in enumerate(RANK_CELLS):
        cell[rank >= lo] = c
    out.observed = torch.bincount(cell, minlength=len(RANK_CELLS)).tolist()
    out.expected = pi.sum(0).tolist()
    out.covariance = (torch.diag(pi.sum(0)) - pi.T @ pi).tolist()
    out.tokens = n
    zero = (probs.gather(1, x[:, None])[:, 0] <= 0).nonzero()[:, 0].tolist()
    out.outside_support = [{"position": t, "token": tokens[t],
                            "at_filter_edge": loose is not None and bool(loose[t, tokens[t]] > 0)} for t in zero]
    return out


@torch.no_grad()
def cell_counts(target: Target, decoding, prompt_ids: list[int], output_ids: list[int]) -> CellCounts:
    """The rank-cell counts of one decode's output against p_t from one teacher-forced forward; `not_plain`
    says why, when the rule is not plain sampling by construction (the check then fails whatever it counts)."""
    from eagle_eval.rules.base import not_plain_sampling

    if not output_ids:
        return CellCounts(not_plain=not_plain_sampling(decoding))
    ids = torch.tensor([prompt_ids + output_ids[:-1]], device=target.input_device)
    logits = target.forward(ids, None)[0, len(prompt_ids) - 1:]                           # [n, V]
    from eagle_eval.rules.filters import target_probs

    out = counts_of(target_probs(logits, decoding), output_ids, target_probs(logits, relaxed(decoding)))
    out.not_plain = not_plain_sampling(decoding)
    return out
