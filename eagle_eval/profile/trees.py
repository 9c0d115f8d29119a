"""Trees at temperature > 0: P(accepted depth >= d) of every start's verify tree, every (S, D) from one pass.

Contract: `tree_expectations` takes the teacher-forced pass of profile/sampled.py and, per row,
the all-starts tree expansion of `unroll.unroll_trees` (exact per start). A tree node's children are judged
by p at that node (profile/expected.py `sibling_accept`, the rule's closed form, siblings in the tree's
order): the pass's own row while the node's path follows the continuation, else a branch node over the
cache (`branches.BranchCache`). Branch nodes run level by level (level j: j nodes off the continuation
on the path), only where the node can still be reached with probability > 0 and >= the floor under some
tree shape; nodes of a row with the same context and tokens (several starts, several levels of the pool)
run once. It also returns the realized accepted depth along the continuation (`tree_run_lengths`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_eval.profile.branches import BranchCache, probs_at, shared_nodes
from eagle_eval.loop.reference import Speculator
from eagle_eval.profile.unroll import unroll_trees
from eagle_eval.profile.expected import depth_at_least, first_duplicates, sibling_accept, tree_reach
from eagle_eval.profile.teacher_forced import tree_run_lengths
from eagle_eval.loop.tree import pool_size


@dataclass
class TreeExpected:
    """One row's trees (`tree_expectations`)."""
    runs: dict              # (S, D) -> (run lengths, off-top-1 flags) along the continuation, per start
    at_least: dict          # (S, D) -> [max_new, S] float64 P(accepted depth >= d)
    cut: torch.Tensor       # [max_new] float64: summed reach of the nodes left unexpanded below the floor (0 = none)
    branch_nodes: int       # target tokens run off the continuation for this row


@dataclass
class _Trees:
    """Every start's pool of a batch, flattened to G = B * max_new rows of N pool nodes (start k of batch row b
    is row b * max_new + k; its start pair is pair = T_b - 1 + k, the root at position pair + 1)."""
    tokens: torch.Tensor     # [G, N]
    depths: torch.Tensor     # [G, N] 1..S
    parents: torch.Tensor    # [G, N] pool index, -1 = the root
    pair: torch.Tensor       # [G]
    on: torch.Tensor         # [G, N] the node's path follows the continuation
    selected: dict           # (S, D) -> [G, N] bool: the node is in that verify tree
    a: torch.Tensor          # [G, N] float64: p(node) at its parent (0 until read)
    valid: torch.Tensor | None = None    # [shapes, G, N/K, K]: in the shape's tree, not an earlier sibling's token
    reach: torch.Tensor | None = None    # [shapes, G, N] float64: P(the accepted path reaches the node)

    @property
    def k(self) -> int:
        return int((self.depths[0] == 1).sum())

    def children_selected(self, sel: torch.Tensor, child_block: torch.Tensor) -> torch.Tensor:
        """[G, N]: some child of the node is in the tree `sel` [G, N] (child_block: `_child_blocks`)."""
        g, n = sel.shape
        block_any = sel.view(g, n // self.k, self.k).any(-1)                            # [G, N/K]
        return (child_block >= 0) & block_any.gather(1, child_block.clamp(min=0))

    def judge_all(self, decoding) -> None:
        """`reach` of every node in every shape from the p read so far (a node whose block is unread: 0)."""
        g, n = self.tokens.shape
        k = self.k
        valid = torch.stack(list(self.selected.values())).view(-1, g, n // k, k)
        self.valid = valid & ~first_duplicates(self.tokens.view(g, n // k, k), valid)
        acc = sibling_accept(self.a.view(g, n // k, k).expand(self.valid.shape), self.valid, decoding)
        self.reach = tree_reach(self.parents.expand(acc.shape[0], g, n), acc.reshape(-1, g, n)) \
            * self.valid.reshape(-1, g, n)

    def judge(self, decoding, gi: torch.Tensor, ui: torch.Tensor, blocks: torch.Tensor) -> None:
        """`reach` of the children block `blocks` [R] of node ui [R] of start gi [R], just read."""
        k = self.k
        s_count, g, n = self.reach.shape
        valid = self.valid[:, gi, blocks]                                                # [shapes, R, K]
        acc = sibling_accept(self.a.view(g, n // k, k)[gi, blocks].expand(valid.shape), valid, decoding)
        self.reach.view(s_count, g, n // k, k)[:, gi, blocks] = self.reach[:, gi, ui][..., None] * acc * valid


def tree_expectations(spec: Speculator, tf, max_steps: int, max_new: int, topk: int, shapes: list, decoding,
                      chunk_tokens: int, floor: float = 0.0) -> list[TreeExpected]:
    """Per row of a batch with trees (tf: profile_sampled's `_Pass`): every shape's expectations and run lengths
    from one all-starts expansion per row.

    The pool's K children of a node are one aligned block of K (level 1: the root's), in rank order, which
    is the verify tree's sibling order. A node's children are judged by p at that node: the row's own at
    position pair + 1 + depth while its path follows the continuation (read for every start at once), else a
    branch node (`_follow_off_continuation`). floor: a node off the continuation whose largest reach over the
    shapes is below it is not run; its descendants' reach is left 0, each P(depth >= d) too low by at most
    the reach summed over such nodes (`TreeExpected.cut`)."""
    pools = [_pools(spec, tf, row, max_steps, max_new, topk) for row in range(len(tf.starts))]
    trees = _trees_of(pools, tf, max_steps, max_new, topk, shapes)
    _read_pass(trees, tf, decoding)
    trees.judge_all(decoding)
    cut, nodes = _follow_off_continuation(trees, spec, tf, decoding, chunk_tokens, floor)
    at_least = _tree_at_least(trees)
    out = []
    for row, pool in enumerate(pools):
        t = tf.starts[row]
        nxt = tf.ids[row, torch.arange(t, t + max_new, device=tf.ids.device)[:, None]
                     + torch.arange(max_steps + 1, device=tf.ids.device)]                      # [P, S+1]
        runs = {}
        for s, d in shapes:
            r, off = tree_run_lengths(pool, nxt, s, topk, d)
            runs[(s, d)] = (r.tolist(), off.tolist())
        rows = slice(row * max_new, (row + 1) * max_new)
        out.append(TreeExpected(runs, {sd: x[rows] for sd, x in at_least.items()}, cut[rows], int(nodes[row])))
    return out


def _pools(spec: Speculator, tf, row: int, max_steps: int, max_new: int, k: int):
    """`unroll_trees` of one row: every start's pool."""
    t, length = tf.starts[row], tf.lengths[row]
    pairs = torch.arange(t - 1, t - 1 + max_new, device=tf.ids.device)
    return unroll_trees(spec.head, tf.aux[row: row + 1, : length - 1], spec.embed(tf.ids[None, row, 1:length]),
                        spec.embed, pairs, max_steps, k, spec.position_offset)


def _trees_of(pools: list, tf, max_steps: int, max_new: int, k: int, shapes: list) -> _Trees:
    """The pools of every row flattened to `_Trees`, with `on` and each shape's `selected`."""
    n = pool_size(max_steps, k)
    cat = lambda name: torch.cat([getattr(p, name)[:, :n] for p in pools])            # noqa: E731
    tokens, depths, parents, scores = cat("tokens"), cat("depths"), cat("parents"), cat("scores")
    device = tokens.device
    pair = (torch.tensor(tf.starts, device=device)[:, None] - 1 + torch.arange(max_new, device=device)).flatten()
    row = torch.arange(len(pools), device=device).repeat_interleave(max_new)
    at = (pair + 1)[:, None] + torch.arange(max_steps + 1, device=device)                # root .. depth S
    nxt = tf.ids[row[:, None], at.clamp(max=tf.ids.shape[1] - 1)]
    truth = nxt.gather(1, depths)
    on = torch.zeros_like(tokens, dtype=torch.bool)
    for level in range(1, max_steps + 1):                                             # parents before children
        cols = (depths[0] == level).nonzero().flatten()
        par = parents[:, cols]
        on[:, cols] = (tokens[:, cols] == truth[:, cols]) & ((par < 0) | on.gather(1, par.clamp(min=0)))
    selected = {}
    for s, d in shapes:                                                               # best D-1 of the S-level pool
        m = pool_size(s, k)
        best = torch.sort(scores[:, :m].double(), dim=-1, descending=True, stable=True).indices[:, : d - 1]
        selected[(s, d)] = torch.zeros_like(on).scatter_(1, best, True)
    return _Trees(tokens, depths, parents, pair, on, selected,
                  torch.zeros(tokens.shape, dtype=torch.float64, device=device))


def _read_pass(trees: _Trees, tf, decoding) -> None:
    """p(child) at every root and every node on the continuation whose children some shape keeps: the pass's
    own row at position pair + 1 + depth, every start of the batch at once."""
    g, n = trees.tokens.shape
    k = trees.k
    used = torch.stack(list(trees.selected.values())).any(0)
    parent = trees.parents[:, ::k]                                                     # [G, N/K]
    at_seq = (parent < 0) | trees.on.gather(1, parent.clamp(min=0))
    gi, bi = (used.view(g, n // k, k).any(-1) & at_seq).nonzero(as_tuple=True)
    if gi.numel() == 0:
        return
    u = parent[gi, bi]
    depth = torch.where(u < 0, torch.zeros_like(u), trees.depths[gi, u.clamp(min=0)])
    batch_row = gi // (g // len(tf.starts))
    width = tf.logits.shape[1]
    rows = batch_row * width + trees.pair[gi] + 1 + depth
    ask = trees.tokens.view(g, n // k, k)[gi, bi]
    got = probs_at(tf.logits.reshape(-1, tf.logits.shape[-1]), ask, decoding, rows=rows).double()
    trees.a.view(g, n // k, k)[gi, bi] = got.to(trees.a.device)


def _follow_off_continuation(trees: _Trees, spec: Speculator, tf, decoding, chunk_tokens: int,
                             floor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Level j = 1..S-1: the nodes j steps off the continuation (their parent on it, or run at level j - 1)
    whose children some shape keeps run as branch nodes, asked at their children, where their reach is > 0
    and >= floor in some shape. Returns (the cut reach per start [G], branch nodes run per batch row [B])."""
    g, n = trees.tokens.shape
    k, b = trees.k, len(tf.starts)
    per_row = g // b
    tokens, depths, parents, on = trees.tokens, trees.depths, trees.parents, trees.on
    off_depth = torch.zeros_like(depths)                                              # nodes off on the path
    for level in range(1, int(depths.max()) + 1):
        cols = (depths[0] == level).nonzero().flatten()
        par = parents[:, cols]
        above = torch.where(par < 0, torch.zeros_like(par), off_depth.gather(1, par.clamp(min=0)))
        off_depth[:, cols] = torch.where(on[:, cols], torch.zeros_like(par), above + 1)
    context_end = trees.pair[:, None] + 1 + depths - off_depth                         # the last node on it
    child_block = _child_blocks(parents, k)
    has_kids = torch.stack([trees.children_selected(sel, child_block) for sel in trees.selected.values()])
    column = torch.full_like(tokens, -1)                                               # the node's cache column
    cut = torch.zeros(g, dtype=torch.float64, device=tokens.device)
    nodes = torch.zeros(b, dtype=torch.long, device=tokens.device)
    blocks = torch.arange(n, device=tokens.device).view(n // k, k)
    extended = None
    try:
        for j in range(1, int(depths.max())):
            gi, ui = ((off_depth == j) & has_kids.any(0)).nonzero(as_tuple=True)
            if gi.numel() == 0:
                break
            need = (trees.reach[:, gi, ui] * has_kids[:, gi, ui]).amax(0)                # largest over shapes
            low = (need > 0) & (need < floor)
            cut.index_add_(0, gi[low], need[low])
            run = (need > 0) & (need >= floor)
            gi, ui = gi[run], ui[run]
            if gi.numel() == 0:
                continue
            kids = blocks[child_block[gi, ui]]                                           # [R, K] pool indices
            par = parents[gi, ui]
            parent_col = torch.where(par < 0, torch.full_like(par, -1), column[gi, par.clamp(min=0)])
            rep = lambda x: x[:, None].expand(-1, k).flatten()                           # noqa: E731
            bb = rep(gi // per_row)
            branches, slot, ask_slot = shared_nodes(
                b, bb, rep(tokens[gi, ui]), rep(trees.pair[gi] + 1 + depths[gi, ui]), rep(context_end[gi, ui]),
                rep(parent_col), tokens[gi[:, None], kids].flatten())
            if extended is None:
                extended = BranchCache(spec.target, tf.cache, tf.width)
            got, where = extended.probs(branches, decoding, chunk_tokens, local_parents=False)
            nodes += (branches.context_end >= 0).sum(1).to(nodes.device)
            trees.a[gi[:, None], kids] = got[bb, slot, ask_slot].double().view(-1, k).to(trees.a.device)
            column[gi, ui] = where[bb, slot].view(-1, k)[:, 0]
            trees.judge(decoding, gi, ui, child_block[gi, ui])
    finally:
        if extended is not None:
            extended.close()
    return cut, nodes


def _child_blocks(parents: torch.Tensor, k: int) -> torch.Tensor:
    """[G, N]: the block index of each node's children (-1: none in the pool)."""
    g, n = parents.shape
    owner = parents[:, ::k]                                                            # [G, N/K]
    out = torch.full_like(parents, -1)
    blocks = torch.arange(n // k, device=parents.device).expand(g, -1)
    has = owner >= 0
    out[torch.arange(g, device=parents.device)[:, None].expand(-1, n // k)[has], owner[has]] = blocks[has]
    return out


def _tree_at_least(trees: _Trees) -> dict:
    """{(S, D): P(accepted depth >= d) [G, S]} from each node's reach."""
    return {(s, d): depth_at_least(r, trees.depths, s) for ((s, d), r) in zip(trees.selected, trees.reach)}
