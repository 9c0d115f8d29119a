"""Draft trees (topk > 1): candidate pool -> verify tree, and greedy acceptance along it.

Contract (docs/eagle3.md section 4, SGLang `organize_draft_results` / EAGLE `topK_genrate`): the pool holds
level 1 (the top-K of the first draft distribution, score = prob) and, for each later level, the K^2
children of the K frontier nodes (score = parent score * child prob). The best D-1 pool nodes by score
plus the root form the verify tree, ordered by pool index.

Ties are broken deterministically by the lower pool index (a stable sort), for the frontier and for
the final selection alike. Because a child's score never exceeds its parent's and its pool index is
always larger, a selected node's parent is always selected too. Scores multiply probabilities as
SGLang does; EAGLE adds log-probabilities, which orders the nodes the same way up to rounding.

>>> pool = Pool(tokens=[10, 11, 20, 21, 22, 23], scores=[0.6, 0.3, 0.42, 0.12, 0.2, 0.05],
...             parents=[-1, -1, 0, 0, 1, 1], ranks=[0, 1, 0, 1, 0, 1])
>>> t = select_tree(pool, root_token=5, num_draft_tokens=4)
>>> t.tokens, t.parents, t.depths
([5, 10, 11, 20], [-1, 0, 0, 1], [0, 1, 1, 2])
>>> accept_path(t, target_argmax=[10, 20, 99, 7])
[0, 1, 3]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Pool:
    """Candidate nodes in pool order: level 1 first, then each level's K^2 children."""
    tokens: list[int]          # target vocab ids
    scores: list[float]        # products of draft probabilities along the path
    parents: list[int]         # pool index of the parent, -1 = the root
    ranks: list[int]           # rank of the node among its parent's K children (0 = top-1)


@dataclass
class Tree:
    tokens: list[int]          # [D], index 0 = root (the last verified token)
    parents: list[int]         # [D], -1 for the root
    depths: list[int]          # [D], root 0; RoPE position = sequence length + depth
    ranks: list[int]           # [D], child rank in the draft expansion (root 0)

    def __len__(self) -> int:
        return len(self.tokens)

    def mask(self) -> torch.Tensor:
        """[D, D] bool: node i may attend to node j iff j is i or an ancestor of i."""
        d = len(self)
        m = torch.zeros(d, d, dtype=torch.bool)
        for i in range(d):
            j = i
            while j != -1:
                m[i, j] = True
                j = self.parents[j]
        return m

    def on_top1_chain(self, path: list[int]) -> bool:
        """True when every node of the path is its parent's top-1 child (what a chain would draft)."""
        return all(self.ranks[i] == 0 for i in path[1:])


def stable_top(scores: torch.Tensor, n: int) -> torch.Tensor:
    """Indices of the n largest scores along the last dim, largest first, ties to the lower index: the first n
    of a stable descending sort. `topk` finds them; a row whose n-th largest value is tied with a value outside
    the n falls back to the full stable sort (topk's choice among ties is unspecified).

    >>> stable_top(torch.tensor([0.1, 0.3, 0.3, 0.2, 0.3]), 2).tolist()
    [1, 2]
    """
    n = min(n, scores.shape[-1])
    if n == 0:
        return torch.zeros(*scores.shape[:-1], 0, dtype=torch.long, device=scores.device)
    idx = scores.topk(n, dim=-1).indices.sort(dim=-1).values                      # the set, index order
    vals = scores.gather(-1, idx)
    order = idx.gather(-1, torch.sort(vals, dim=-1, descending=True, stable=True).indices)
    tied = (scores >= vals.min(dim=-1, keepdim=True).values).sum(-1) > n          # the n-th value ties outside
    if bool(tied.any()):
        full = torch.sort(scores[tied], dim=-1, descending=True, stable=True).indices[..., :n]
        order[tied] = full
    return order


def select_tree(pool: Pool, root_token: int, num_draft_tokens: int) -> Tree:
    """The verify tree: root + the best D-1 pool nodes (ties -> lower pool index), in pool order."""
    if num_draft_tokens - 1 > len(pool.tokens):
        raise ValueError(f"num_draft_tokens - 1 = {num_draft_tokens - 1} exceeds the pool of {len(pool.tokens)}")
    chosen = sorted(stable_top(torch.tensor(pool.scores, dtype=torch.float64), num_draft_tokens - 1).tolist())
    where = {p: i + 1 for i, p in enumerate(chosen)}           # pool index -> tree index
    tokens, parents, depths, ranks = [root_token], [-1], [0], [0]
    for p in chosen:
        parent = pool.parents[p]
        if parent != -1 and parent not in where:
            raise AssertionError(f"pool node {p} selected without its parent {parent}")
        t_parent = where.get(parent, 0)
        tokens.append(pool.tokens[p])
        parents.append(t_parent)
        depths.append(depths[t_parent] + 1)
        ranks.append(pool.ranks[p])
    return Tree(tokens, parents, depths, ranks)


def accept_path(tree: Tree, target_argmax: list[int]) -> list[int]:
    """Greedy acceptance: from the root, follow the child whose token is the target's argmax at its
    parent. Returns the tree indices of the path, root included (accepted drafts = len - 1)."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents):
        children.setdefault(p, []).append(i)
    path, node = [0], 0
    while True:
        nxt = next((c for c in children.get(node, []) if tree.tokens[c] == target_argmax[node]), None)
        if nxt is None:
            return path
        path.append(nxt)
        node = nxt


def pool_size(num_steps: int, topk: int) -> int:
    """K + (S-1) K^2 candidates; SGLang requires num_draft_tokens <= pool_size + 1."""
    return topk + (num_steps - 1) * topk * topk
