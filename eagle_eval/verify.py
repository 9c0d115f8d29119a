"""Verification: one target forward over [root, drafts], greedy acceptance, cache rollback.

Contract: `verify_chain` leaves the target cache holding exactly the verified prefix (root and the
accepted drafts) and returns the target features of those tokens, which the draft is re-run on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_eval.acceptance import greedy_accept
from eagle_eval.capture import FeatureCapture
from eagle_eval.target import Target


@dataclass
class Verified:
    accepted: int                 # n, accepted drafts (0..S)
    bonus: int                    # target argmax after the last accepted node
    aux: torch.Tensor             # [1, n+1, k*H_t] target features of root, d_1..d_n


@torch.no_grad()
def verify_chain(target: Target, cache, capture: FeatureCapture, root: int,
                 drafts: torch.Tensor) -> Verified:
    """drafts [S] target ids. Appends root + drafts to `cache`, keeps root + accepted ones."""
    start = Target.cache_len(cache)
    ids = torch.cat([torch.tensor([root], device=drafts.device), drafts])[None]     # [1, S+1]
    logits = target.forward(ids, cache)                                             # [1, S+1, V]
    aux = capture.pop()
    argmax = logits[0].argmax(-1).tolist()
    n = greedy_accept(drafts.tolist(), argmax)
    Target.rollback(cache, start + n + 1)
    return Verified(accepted=n, bonus=argmax[n], aux=aux[:, : n + 1])
