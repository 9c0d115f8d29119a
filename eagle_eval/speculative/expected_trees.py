"""Trees at temperature > 0: P(accepted depth >= d) of every start's verify tree, every (S, D) from one pass.

Contract: `tree_expectations` takes the teacher-forced pass of speculative/profile_sampled.py (its cache,
logits, aux features) and, per row, the all-starts tree expansion of `draft.unroll_trees` (exact per
start). A tree node's children are judged by p at that node (speculative/expected.py `sibling_accept`,
the rule's closed form, siblings in the tree's order): the pass's own row while the node's path follows
the continuation, else a branch node over the cache (`branches.branch_probs`, all rows' nodes in one
call, no floor). It also returns the realized accepted depth along the continuation (`tree_run_lengths`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_eval.speculative.branches import Branches, branch_probs, probs_at
from eagle_eval.speculative.chain import Speculator
from eagle_eval.speculative.draft import unroll_trees
from eagle_eval.speculative.expected import depth_at_least, first_duplicates, sibling_accept, tree_reach
from eagle_eval.speculative.profile import tree_run_lengths
from eagle_eval.speculative.tree import pool_size


@dataclass
class _TreeRow:
    """One row's pool and the p(child) it still needs (`tree_expectations`)."""
    pools: object
    on: torch.Tensor                     # [P, N] the node's path follows the continuation
    selected: dict                       # (S, D) -> [P, N] bool
    a: torch.Tensor                      # [P, N] float64: p(child) at its parent
    back: list                           # (start, block, branch node index) to fill from the branch


def tree_expectations(spec: Speculator, cache, width: int, logits: torch.Tensor, aux: torch.Tensor,
                      ids: torch.Tensor, starts: list[int], lengths: list[int], max_steps: int, max_new: int,
                      topk: int, shapes: list, decoding, chunk_tokens: int) -> list[tuple[dict, dict]]:
    """Per row of a batch with trees: ({(S, D): (run lengths, off-top-1 flags)} along the continuation,
    {(S, D): P(accepted depth >= d) [max_new, S] float64}), every shape from one all-starts expansion.

    The pool's K children of a node are one aligned block of K (level 1: the root's), in rank order, which
    is the verify tree's sibling order. A node's children are judged by p at that node: the row's own at
    position p + 1 + depth while its path follows the continuation, else a branch node (all rows' branch
    nodes in one `branch_probs`)."""
    rows, nodes = [], []
    for row, (t, length) in enumerate(zip(starts, lengths)):
        state, row_nodes = _tree_row(spec, logits[row], aux[row: row + 1, : length - 1], ids[row, :length], t,
                                     max_steps, max_new, topk, shapes, decoding)
        rows.append(state)
        nodes.append(row_nodes)
    if any(nodes):
        got = branch_probs(spec.target, cache, width, Branches.from_rows(nodes, topk, ids.device), decoding,
                           chunk_tokens).double()
        for row, state in enumerate(rows):
            for i, b, j in state.back:
                state.a[i, b * topk: (b + 1) * topk] = got[row, j].to(state.a.device)
    out = []
    for row, state in enumerate(rows):
        nxt = ids[row, torch.arange(starts[row], starts[row] + max_new, device=ids.device)[:, None]
                  + torch.arange(max_steps + 1, device=ids.device)]                          # [P, S+1]
        runs = {}
        for s, d in shapes:
            r, off = tree_run_lengths(state.pools, nxt, s, topk, d)
            runs[(s, d)] = (r.tolist(), off.tolist())
        out.append((runs, _tree_at_least(state, topk, decoding)))
    return out


def _tree_row(spec: Speculator, logits: torch.Tensor, aux: torch.Tensor, ids: torch.Tensor, t: int,
              max_steps: int, max_new: int, k: int, shapes: list, decoding) -> tuple[_TreeRow, list]:
    """The pools of one row, p(child) read on the continuation, and the branch nodes it needs."""
    device = ids.device
    starts = torch.arange(t - 1, t - 1 + max_new, device=device)
    pools = unroll_trees(spec.head, aux, spec.embed(ids[None, 1:]), spec.embed, starts, max_steps, k,
                         spec.position_offset)
    nxt = ids[starts[:, None] + 1 + torch.arange(max_steps + 1, device=device)]              # [P, S+1]
    n = pool_size(max_steps, k)
    tokens, depths, parents = pools.tokens[:, :n], pools.depths[:, :n], pools.parents[:, :n]
    on = torch.zeros_like(tokens, dtype=torch.bool)
    truth = nxt.gather(1, depths)
    for level in range(1, max_steps + 1):                                  # parents before children
        cols = (depths[0] == level).nonzero().flatten()
        par = parents[:, cols]
        on[:, cols] = (tokens[:, cols] == truth[:, cols]) & ((par < 0) | on.gather(1, par.clamp(min=0)))
    selected = {}
    for s, d in shapes:                                                   # best D-1 of the S-level pool
        m = pool_size(s, k)
        best = torch.sort(pools.scores[:, :m].double(), dim=-1, descending=True, stable=True).indices[:, : d - 1]
        selected[(s, d)] = torch.zeros_like(on).scatter_(1, best, True)
    used = torch.stack(list(selected.values())).any(0)
    blocks = n // k
    block_parent = parents[:, ::k]                                         # [P, N/K]: whose children block b is
    state = _TreeRow(pools, on, selected, torch.zeros(tokens.shape, dtype=torch.float64, device=device), [])
    seq_rows, seq_ask, seq_back, nodes, node_of = [], [], [], [], {}
    p_list = starts.tolist()
    for i, b in used.view(-1, blocks, k).any(-1).nonzero().tolist():
        u = int(block_parent[i, b])
        ask = tokens[i, b * k: (b + 1) * k].tolist()
        if u < 0 or bool(on[i, u]):                                        # p at u: the row's own
            seq_rows.append(p_list[i] + 1 + (0 if u < 0 else int(depths[i, u])))
            seq_ask.append(ask)
            seq_back.append((i, b))
            continue
        path = [u]                                                         # u and its ancestors off the continuation
        while int(parents[i, path[-1]]) >= 0 and not bool(on[i, int(parents[i, path[-1]])]):
            path.append(int(parents[i, path[-1]]))
        anchor = int(parents[i, path[-1]])
        end = p_list[i] + 1 + (0 if anchor < 0 else int(depths[i, anchor]))
        for v in reversed(path):
            if (i, v) not in node_of:
                node_of[(i, v)] = len(nodes)
                nodes.append([int(tokens[i, v]), p_list[i] + 1 + int(depths[i, v]), end,
                              node_of.get((i, int(parents[i, v])), -1), []])
        nodes[node_of[(i, u)]][4] = ask
        state.back.append((i, b, node_of[(i, u)]))
    if seq_rows:
        got = probs_at(logits, torch.tensor(seq_ask, device=device), decoding,
                       rows=torch.tensor(seq_rows, device=device)).double().to(device)
        for (i, b), g in zip(seq_back, got):
            state.a[i, b * k: (b + 1) * k] = g
    return state, [tuple(x) for x in nodes]


def _tree_at_least(state: _TreeRow, k: int, decoding) -> dict:
    """{(S, D): P(accepted depth >= d) [P, S]} from p(child) at each parent, under the accept rule."""
    tokens, depths, parents = (x[:, : state.a.shape[1]] for x in (state.pools.tokens, state.pools.depths,
                                                                   state.pools.parents))
    p, n = state.a.shape
    out = {}
    for (s, d), sel in state.selected.items():
        valid = sel.view(p, n // k, k)
        valid = valid & ~first_duplicates(tokens.view(p, n // k, k), valid)
        acc = sibling_accept(state.a.view(p, n // k, k), valid, decoding).reshape(p, n)
        reach = tree_reach(parents, acc) * valid.reshape(p, n)
        out[(s, d)] = depth_at_least(reach, depths, s)
    return out
