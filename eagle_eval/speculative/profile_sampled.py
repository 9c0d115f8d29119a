"""The profile at temperature > 0: the exact expectation of every cycle start, and the acceptance along
continuations sampled from the target, from one teacher-forced pass per batch.

Contract: for each prompt + continuation (sampled here from `sampling.target_probs` with the prompt's own
generator, or given), ONE target forward over the sequence gives the aux features, the target's rows on
the continuation and its KV cache. Start t >= 1 (docs/sampling.md) is the context prompt + the first t
continuation tokens, the t-th being the root; its drafts are what the head proposes there (the loop's
drafts: past a wrong draft the chain continues from its own drafts, `run_lengths.SparseChains` running a
step only where its draft can count; trees from `draft.unroll_trees`, which is exact). For a one-hot rule,
P(A >= i) of start t is a product of p(draft) along the drafts (speculative/expected.py); each p is read
from the pass's own row where the drafts so far follow the continuation, else from `branches.BranchCache`
(the left drafts run as extra query tokens over the cache).
Every num_steps <= max_steps and every tree shape comes from the same drafts and rows.

The acceptance along the continuation itself (what a server reports, EAGLE3.md section 8: under the
one-hot rules an emitted token equals a draft exactly when that draft was accepted) is the greedy
profile's prefix match on it: `Profiled.run_lengths` / `tree_runs`, walked by `profile.simulate_cycles`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_eval.models.capture import FeatureCapture
from eagle_eval.speculative.branches import BranchCache, Branches, probs_at
from eagle_eval.speculative.chain import Speculator
from eagle_eval.speculative.expected import chain_at_least
from eagle_eval.speculative.profile import Profiled
from eagle_eval.speculative.run_lengths import SparseChains, rank_in_row
from eagle_eval.speculative.sampling import prompt_generator, target_probs


@dataclass
class Expected:
    """One sequence's exact expectations, per start k = t - 1 (root = the t-th continuation token)."""
    chain: torch.Tensor | None = None       # [max_new, max_steps] float64: P(A >= i) of the chain, i = 1..max_steps
    trees: dict | None = None               # {(S, D): [max_new, S] float64}: P(accepted depth >= d)
    variance: torch.Tensor | None = None    # [max_new, max_steps]: the estimate's variance (sampled drafts only)
    cut: torch.Tensor | None = None         # [max_new]: P(A >= i) where the chain was cut (< floor; 0 = not cut)
    branch_nodes: int = 0                   # target tokens run off the continuation for this sequence


class SampleNext:
    """`choose` for `profile.greedy_continuations`: each row's next token drawn from target_probs by
    inverse CDF with one uniform of the row's own generator (reproducible whatever the batch)."""

    def __init__(self, decoding, generators: list[torch.Generator]):
        self.decoding, self.generators = decoding, generators

    def __call__(self, logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
        u = torch.cat([torch.rand(1, generator=self.generators[r], dtype=torch.float64) for r in rows])
        return sample_inverse_cdf(target_probs(logits, self.decoding), u).cpu()


def sample_inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """probs [B, V], u [B] in [0, 1) -> ids [B]: the first index whose cumulative probability exceeds u * total
    (never a zero-probability token).

    >>> sample_inverse_cdf(torch.tensor([[0.0, 0.5, 0.0, 0.5]]), torch.tensor([0.0])).tolist()
    [1]
    """
    cdf = probs.double().cumsum(-1)
    pick = torch.searchsorted(cdf, (u.to(cdf.device) * cdf[:, -1])[:, None], right=True)[:, 0]
    return pick.clamp(max=probs.shape[-1] - 1)


def sampled_continuations(spec: Speculator, prompts: list, samples: list[int], num_tokens: int, pad_id: int,
                          batch_tokens: int, decoding, prefixes: list[list[int]] | None = None) -> list[list[int]]:
    """Continuations of num_tokens tokens sampled from the target (not stopped at EOS), row i with
    `prompt_generator(seed, prompts[i].id, samples[i])`; prefixes: tokens already given (kept, then
    extended by sampling)."""
    from eagle_eval.speculative.profile import greedy_continuations

    gens = [prompt_generator(decoding.seed, p.id, s) for p, s in zip(prompts, samples)]
    heads = prefixes or [[] for _ in prompts]
    more = greedy_continuations(spec, [p.input_ids + h for p, h in zip(prompts, heads)], num_tokens, pad_id,
                                batch_tokens, choose=SampleNext(decoding, gens))
    return [h + m for h, m in zip(heads, more)]


@dataclass
class _Pass:
    """The teacher-forced pass over a right-padded batch: what the expectations read."""
    ids: torch.Tensor                 # [B, W] on the draft's device
    logits: torch.Tensor              # [B, W, V] (the target's dtype)
    aux: torch.Tensor                 # [B, W, k*H_t]
    cache: object                     # the target's KV cache over the W positions
    width: int
    starts: list                      # T per row: the root of start 1 is at position T
    lengths: list                     # real tokens per row


@torch.no_grad()
def teacher_forced(spec: Speculator, items: list, pad_id: int) -> _Pass:
    """One target forward over each prompt + continuation (right-padded), keeping its KV cache."""
    target, device = spec.target, spec.draft_device
    seqs = [p.input_ids + c for p, c in items]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = torch.tensor(s)
        mask[row, : len(s)] = 1
    cache = target.new_cache()
    with FeatureCapture(target.layers, spec.aux_hf, device) as cap:
        logits = target.forward(ids, cache, attention_mask=mask, upcast=False)      # [B, W, V]
        aux = cap.pop()                                                            # [B, W, k*H_t]
    return _Pass(ids.to(device), logits, aux, cache, width, [len(p.input_ids) for p, _ in items],
                 [len(s) for s in seqs])


@torch.no_grad()
def profile_batch_sampled(spec: Speculator, items: list, max_steps: int, max_new_tokens: int, pad_id: int,
                          decoding, topk: int = 1, tree_shapes: list | None = None,
                          chunk_tokens: int = 4096, floor: float = 0.0) -> list[Profiled]:
    """`profile.profile_batch` at temperature > 0 (a one-hot rule): the same pass, plus `Profiled.expected`.
    items: (prompt, continuation of max_new_tokens + max_steps tokens); floor: `chain_expectations`'."""
    tf = teacher_forced(spec, items, pad_id)
    results = [Profiled(prompt=p, continuation=c, run_lengths=[]) for p, c in items]
    if topk == 1:
        chain, cut, nodes, runs = chain_expectations(spec, tf, max_steps, max_new_tokens, decoding, chunk_tokens,
                                                     floor)
        for row, res in enumerate(results):
            res.run_lengths = runs[row].tolist()
            res.expected = Expected(chain=chain[row], cut=cut[row], branch_nodes=int(nodes[row]))
        return results
    from eagle_eval.speculative.expected_trees import tree_expectations

    trees = tree_expectations(spec, tf.cache, tf.width, tf.logits, tf.aux, tf.ids, tf.starts, tf.lengths, max_steps,
                              max_new_tokens, topk, tree_shapes, decoding, chunk_tokens)
    for res, (runs, at_least) in zip(results, trees):
        res.tree_runs, res.expected = runs, Expected(trees=at_least)
    return results


@torch.no_grad()
def profile_batch_rollouts(spec: Speculator, items: list, keys: list, max_steps: int, max_new_tokens: int,
                           pad_id: int, decoding, rollouts: int, chunk_tokens: int = 4096) -> list[Profiled]:
    """The sampled-draft rules (chains): P(A >= i) estimated by rollouts (speculative/rollouts.py), exact at
    i = 1. keys: (prompt id, sample) per item. No run lengths: the accepted count is not a function of the text."""
    from eagle_eval.speculative.rollouts import rollout_expectations

    tf = teacher_forced(spec, items, pad_id)
    est, var = rollout_expectations(spec, tf.cache, tf.width, tf.logits, tf.aux, tf.ids, tf.starts, keys, max_steps,
                                    max_new_tokens, decoding, rollouts, chunk_tokens)
    return [Profiled(prompt=p, continuation=c, run_lengths=[], expected=Expected(chain=est[i], variance=var[i]))
            for i, (p, c) in enumerate(items)]


def chain_expectations(spec: Speculator, tf: _Pass, k_max: int, max_new: int, decoding, chunk_tokens: int,
                       floor: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(P(A >= i) [B, max_new, K] float64 of the chain from each start, the P(A >= i) at which each start's
    chain was cut [B, max_new] (0 = not cut), branch nodes run per row [B], run lengths [B, max_new]: the
    leading drafts the continuation holds), the drafts being the loop's.

    Start k of row b: start pair p = T_b - 1 + k, root at p + 1; its draft d_i (step i - 1 of
    `run_lengths.SparseChains`, at column p + i - 1) sits at position p + 1 + i. Two phases, each running a
    draft step only where its draft can count:
    1. on the continuation: the steps of the chains whose drafts so far equal the continuation (teacher-
       forced, the greedy profile's survivors). This gives the run length m and d_1..d_{m+1}, whose p_i(d_i)
       are the pass's own rows at position p + i (read for every start at once).
    2. off it: past the first wrong draft the chain continues from its own drafts (the loop's chain), one
       step per level, and each left draft d_j runs as a branch node over the pass's cache (context: the
       sequence to p + 1 + m, then the chain's earlier branch nodes), read at d_{j+1}; a chain goes on only
       while its P(A >= j + 1) is > 0 and >= floor (below it, the deeper P(A >= j) are left 0: each too low by
       less than the floor). Chains of a row that reach the same context with the same token share one node
       (the target's p depends on the tokens alone)."""
    head, target = spec.head, spec.target
    b, width = tf.ids.shape
    device = tf.ids.device
    embeds = spec.embed(tf.ids[:, 1:])                                              # x_1..x_{W-1}
    drafter = SparseChains(head, tf.aux[:, :-1], embeds, spec.position_offset)
    k_idx = torch.arange(max_new, device=device)
    i_idx = torch.arange(1, k_max + 1, device=device)
    pairs = torch.tensor(tf.starts, device=device)[:, None] - 1 + k_idx[None]        # [B, P] start pair p
    lengths = torch.tensor(tf.lengths, device=device)
    at = pairs[..., None] + 1 + i_idx                                               # [B, P, K] position of d_i
    truth = torch.where(at < lengths[:, None, None], tf.ids.gather(1, at.clamp(max=width - 1).flatten(1))
                        .view(at.shape), torch.full_like(at, -1))                  # the continuation there
    drafts = torch.full((b, max_new, k_max), -1, dtype=torch.long, device=device)   # d_i of start k (-1: not run)
    drafts[..., 0] = drafter.first.gather(1, pairs.clamp(max=width - 2))

    # 1. on the continuation
    on = (drafts[..., 0] == truth[..., 0]) & (truth[..., 0] >= 0)
    for j in range(1, k_max):
        bb, kk = on.nonzero(as_tuple=True)                                           # (host sync)
        if bb.numel() == 0:
            break
        col = pairs[bb, kk] + j
        got = drafter.step(j, bb, col, embeds[bb, col])
        drafts[bb, kk, j] = got
        on = torch.zeros_like(on)
        on[bb, kk] = (got == truth[bb, kk, j]) & (truth[bb, kk, j] >= 0)
    match = (drafts == truth) & (truth >= 0)
    run = match.long().cumprod(-1).sum(-1)                                          # [B, P]: m
    span = max_new + k_max - 1                                                     # positions T .. T + span - 1
    asked = torch.full((b, span, k_max), -1, dtype=torch.long, device=device)     # position T + k + i - 1 asks d_i
    for i in range(k_max):
        asked[:, i: i + max_new, i] = drafts[..., i]
    from_pass = torch.zeros(b, max_new, k_max, dtype=torch.float64, device=device)
    for row, t in enumerate(tf.starts):
        got = probs_at(tf.logits[row, t: t + span], asked[row], decoding).double().to(device)   # [span, K]
        from_pass[row] = got[k_idx[:, None] + i_idx[None] - 1, i_idx[None].expand(max_new, -1) - 1]
    off = i_idx[None, None] > run[..., None] + 1                                    # p_i off the continuation
    accept = torch.where(off, torch.zeros_like(from_pass), from_pass)
    prefix = chain_at_least(torch.where(off, torch.ones_like(from_pass), from_pass)).gather(
        -1, run[..., None].clamp(max=k_max - 1))[..., 0]                            # P(A >= m + 1)
    alive = (run <= k_max - 2) & (prefix > 0) & (prefix >= floor)
    cut = torch.where((run <= k_max - 2) & (prefix > 0) & ~alive, prefix, torch.zeros_like(prefix))

    # 2. off it
    last = torch.full((b, max_new), -1, dtype=torch.long, device=device)           # column of the chain's node
    nodes = torch.zeros(b, dtype=torch.long, device=device)
    extended, known = BranchCache(target, tf.cache, tf.width), _Known()
    try:
        for j in range(1, k_max):
            bb, kk = (alive & (run + 1 <= j)).nonzero(as_tuple=True)                 # node d_j, asking d_{j+1}
            if bb.numel() == 0:
                if not bool(alive.any()):
                    break
                continue
            p, m = pairs[bb, kk], run[bb, kk]
            node = drafts[bb, kk, j - 1]
            drafts[bb, kk, j] = ask = drafter.step(j, bb, p + j, spec.embed(node[None])[0])
            val, col = known.lookup(bb, p + 1 + m, last[bb, kk], node, ask)
            todo = (col < 0).nonzero(as_tuple=True)[0]
            if todo.numel():
                t_bb, t_ctx, t_par, t_node, t_ask = (x[todo] for x in (bb, p + 1 + m, last[bb, kk], node, ask))
                branches, slot, ask_slot = _shared_nodes(b, t_bb, t_node, p[todo] + 1 + j, t_ctx, t_par, t_ask)
                got, where = extended.probs(branches, decoding, chunk_tokens, local_parents=False)
                nodes += (branches.context_end >= 0).sum(1)
                val[todo] = got[t_bb, slot, ask_slot].double()                        # p_{j+1}(d_{j+1})
                col[todo] = where[t_bb, slot]
                known.add(t_bb, t_ctx, t_par, t_node, t_ask, val[todo], col[todo])
            accept[bb, kk, j] = val
            prefix[bb, kk] = prefix[bb, kk] * val
            last[bb, kk] = col
            more = torch.zeros_like(alive)
            more[bb, kk] = (j + 1 <= k_max - 1) & (prefix[bb, kk] > 0)
            cut[bb, kk] = torch.where(more[bb, kk] & (prefix[bb, kk] < floor), prefix[bb, kk], cut[bb, kk])
            alive[bb, kk] = more[bb, kk] & (prefix[bb, kk] >= floor)
    finally:
        extended.close()
    return chain_at_least(accept), cut, nodes, run


class _Known:
    """The branch nodes run so far for a pass: (row, context_end, parent column, token) -> (its column, {asked
    token: p}). A chain that reaches a known node asking a known token reads it there (a later start that left
    the continuation at the same place with the same drafts); a known node asked a new token runs again."""

    def __init__(self):
        self.nodes: dict[tuple, tuple[int, dict]] = {}

    def lookup(self, *keys) -> tuple[torch.Tensor, torch.Tensor]:
        """keys: row, context_end, parent, token, ask [N] -> (p [N] float64, column [N]; -1 = not known)."""
        device = keys[0].device
        val, col = [0.0] * keys[0].shape[0], [-1] * keys[0].shape[0]
        for n, (*key, ask) in enumerate(zip(*(k.tolist() for k in keys))):
            hit = self.nodes.get(tuple(key))
            if hit is not None and ask in hit[1]:
                val[n], col[n] = hit[1][ask], hit[0]
        return (torch.tensor(val, dtype=torch.float64, device=device),
                torch.tensor(col, dtype=torch.long, device=device))

    def add(self, *keys_ask_val_col) -> None:
        for *key, ask, val, col in zip(*(k.tolist() for k in keys_ask_val_col)):
            self.nodes.setdefault(tuple(key), (col, {}))[1][ask] = val


def _group_ids(*columns: torch.Tensor) -> torch.Tensor:
    """Equal rows of the columns [N] each -> one id, ids 0..G-1 in lexicographic order of the rows (1-D uniques
    of mixed-radix codes, each below N^2: no overflow, and faster than torch.unique over rows).

    >>> _group_ids(torch.tensor([1, 0, 1, 0]), torch.tensor([5, 9, 5, 2])).tolist()
    [2, 1, 2, 0]
    """
    ids = torch.zeros_like(columns[0])
    for col in columns:
        values, rank = torch.unique(col, return_inverse=True)
        ids = torch.unique(ids * values.shape[0] + rank, return_inverse=True)[1]
    return ids


def _shared_nodes(rows: int, bb, token, position, context_end, parent, ask) -> tuple[Branches, torch.Tensor,
                                                                                     torch.Tensor]:
    """One branch level for N chains (row bb, node token at position over context_end / under parent, asking
    `ask`) -> (Branches with each distinct (row, context_end, parent, token) once and each of its distinct
    asked tokens once, each chain's node slot [N], each chain's asked slot [N])."""
    inv = _group_ids(bb, context_end, parent, token)                                 # rows ascending
    count = int(inv.max()) + 1
    nodes = torch.zeros(count, 5, dtype=torch.long, device=bb.device)
    nodes[inv] = torch.stack([bb, context_end, parent, token, position], dim=1)
    slot = rank_in_row(nodes[:, 0], rows)
    ask_inv = _group_ids(inv, ask)
    pairs = torch.zeros(int(ask_inv.max()) + 1, 2, dtype=torch.long, device=bb.device)
    pairs[ask_inv] = torch.stack([inv, ask], dim=1)
    ask_slot = rank_in_row(pairs[:, 0], count)
    q, m = int(slot.max()) + 1, int(ask_slot.max()) + 1
    r = nodes[:, 0]

    def grid(values, fill):
        out = torch.full((rows, q), fill, dtype=torch.long, device=bb.device)
        out[r, slot] = values
        return out
    asked = torch.full((rows, q, m), -1, dtype=torch.long, device=bb.device)
    asked[r[pairs[:, 0]], slot[pairs[:, 0]], ask_slot] = pairs[:, 1]
    branches = Branches(tokens=grid(nodes[:, 3], 0), positions=grid(nodes[:, 4], 0),
                        context_end=grid(nodes[:, 1], -1), parents=grid(nodes[:, 2], -1), asked=asked)
    return branches, slot[inv], ask_slot[ask_inv]
