"""Verification: one target forward over [root, drafts] (or the tree's nodes), the policy's acceptance,
cache rollback.

Contract: `verify_chain` leaves the target cache holding exactly the verified prefix (root and the
accepted drafts) and returns the target features of those tokens, which the draft is re-run on; the
acceptance rule is the decode policy's (loop/policy.py; greedy by default).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_eval.models.capture import FeatureCapture
from eagle_eval.models.target import Target
from eagle_eval.loop.policy import GREEDY, DecodePolicy
from eagle_eval.loop.tree import Tree


@dataclass
class Verified:
    accepted: int                 # n, accepted drafts (0..S)
    bonus: int                    # the token the target adds after the last accepted node (greedy: its argmax)
    aux: torch.Tensor             # [1, n+1, k*H_t] target features of root, d_1..d_n
    path: list[int] | None = None  # tree indices of root + accepted nodes (trees only)


@torch.no_grad()
def verify_chain(target: Target, cache, capture: FeatureCapture, root: int,
                 drafts: torch.Tensor, policy: DecodePolicy = GREEDY) -> Verified:
    """drafts [S] target ids. Appends root + drafts to `cache`, keeps root + accepted ones."""
    start = Target.cache_len(cache)
    ids = torch.cat([torch.tensor([root], device=drafts.device), drafts])[None]     # [1, S+1]
    logits = target.forward(ids, cache)                                             # [1, S+1, V]
    aux = capture.pop()
    n, bonus = policy.accept_chain(drafts.tolist(), logits[0])
    Target.rollback(cache, start + n + 1)
    return Verified(accepted=n, bonus=bonus, aux=aux[:, : n + 1])


@torch.no_grad()
def verify_tree(target: Target, cache, capture: FeatureCapture, tree: Tree,
                policy: DecodePolicy = GREEDY) -> Verified:
    """One forward over the D tree nodes (positions = length + depth, ancestor mask over the cache);
    walk the accepted path (the policy's); keep only root + accepted nodes in the cache."""
    start = Target.cache_len(cache)
    ids = torch.tensor([tree.tokens])
    positions = torch.tensor([tree.depths]) + start
    logits = target.forward(ids, cache, position_ids=positions,
                            attention_mask=target.tree_mask(tree.mask(), start))     # [1, D, V]
    aux = capture.pop()
    path, bonus = policy.accept_tree(tree, logits[0])
    Target.keep(cache, start, path)
    return Verified(accepted=len(path) - 1, bonus=bonus, aux=aux[:, path], path=path)
