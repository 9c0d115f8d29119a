"""The profile at temperature > 0: the exact expectation of every cycle start, and the acceptance along
continuations sampled from the target, from one teacher-forced pass per batch.

Contract: for each prompt + continuation (sampled here from `sampling.target_probs` with the prompt's own
generator, or given), ONE target forward over the sequence gives the aux features, the target's rows on
the continuation and its KV cache. Start t >= 1 (docs/sampling.md) is the context prompt + the first t
continuation tokens, the t-th being the root; its drafts are what the head proposes there (the loop's
drafts: the chain continues from its own drafts, `draft.free_running`; trees from `draft.unroll_trees`,
which is exact). For a one-hot rule, P(A >= i) of start t is a product of p(draft) along the drafts
(speculative/expected.py); each p is read from the pass's own row where the drafts so far follow the
continuation, else from `branches.branch_probs` (the left drafts run as extra query tokens over the cache).
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
from eagle_eval.speculative.draft import free_running, unroll_chains
from eagle_eval.speculative.expected import chain_at_least
from eagle_eval.speculative.profile import Profiled, run_lengths_from_predictions
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
        steps = unroll_chains(spec.head, tf.aux[:, :-1], spec.embed(tf.ids[:, 1:]), max_steps, spec.position_offset,
                              argmax_only=True, feed=free_running(spec.head, spec.embed))
        preds = torch.stack(steps, dim=1)                                            # [B, K, W-1]
        chain, cut, nodes = chain_expectations(spec.target, tf.cache, tf.width, tf.logits, preds, tf.ids, tf.starts,
                                               tf.lengths, max_steps, max_new_tokens, decoding, chunk_tokens, floor)
        for row, res in enumerate(results):
            t, n = tf.starts[row], tf.lengths[row]
            r = run_lengths_from_predictions(preds[row, :, : n - 1], tf.ids[row, :n])
            res.run_lengths = r[t - 1: t - 1 + max_new_tokens].tolist()
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


def chain_expectations(target, cache, width: int, logits: torch.Tensor, preds: torch.Tensor, ids: torch.Tensor,
                       starts: list[int], lengths: list[int], k_max: int, max_new: int, decoding,
                       chunk_tokens: int, floor: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(P(A >= i) [B, max_new, K] float64 of the chain from each start, the P(A >= i) at which each start's
    chain was cut [B, max_new] (0 = not cut), branch nodes run per row [B]), the drafts being the loop's
    (preds [B, K, W-1]).

    Start k of row b: start pair p = T_b - 1 + k, root at p + 1, draft i = preds[b, i-1, p+i-1] at position
    p + 1 + i. p_i(d_i) is the row's own at position p + i while d_1..d_{i-1} follow the continuation (the
    first m drafts do, m = the run length); past it the chain runs as branch nodes over the cache, one level
    (one more draft per chain) per forward, each chain only while its P(A >= i) so far is > 0 and >= floor
    (below it, the deeper P(A >= j) are left 0: each too low by less than the floor)."""
    b = preds.shape[0]
    device = preds.device
    k_idx = torch.arange(max_new, device=device)
    i_idx = torch.arange(1, k_max + 1, device=device)
    drafts = torch.full((b, max_new, k_max), -1, dtype=torch.long, device=device)   # d_i of start k
    truth = torch.full_like(drafts, -1)                                             # the continuation there
    on = torch.zeros(b, max_new, k_max, dtype=torch.float64, device=device)
    span = max_new + k_max - 1                                                     # positions T .. T + span - 1
    for row, t in enumerate(starts):
        drafts[row] = _gather_steps(preds[row], t - 1 + k_idx[:, None] + i_idx[None] - 1)   # column p + i - 1
        # the row's own p at positions T .. T + span - 1, read at the drafts ending there: position c holds
        # p_i of start k = c - T - i + 1 for every i, whose draft d_i is preds[i-1, c-1]
        asked = preds[row, :, t - 1: t - 1 + span].T                                 # [span, K]
        got = probs_at(logits[row, t: t + span], asked, decoding).double().to(device)   # [span, K]
        on[row] = got[k_idx[:, None] + i_idx[None] - 1, i_idx[None].expand(max_new, -1) - 1]
        truth[row] = _padded(ids[row, : lengths[row]], t + k_idx[:, None] + i_idx[None])       # x at p + 1 + i
    run = (drafts == truth).long().cumprod(-1).sum(-1)                                # [B, max_new]: m
    off = i_idx[None, None] > run[..., None] + 1                                    # p_i off the continuation
    accept = torch.where(off, torch.zeros_like(on), on)
    prefix = chain_at_least(torch.where(off, torch.ones_like(on), on)).gather(
        -1, run[..., None].clamp(max=k_max - 1))[..., 0]                            # P(A >= m + 1)
    level_of = run.clone()                                                       # drafts known on the chain
    alive = (run <= k_max - 2) & (prefix > 0) & (prefix >= floor)
    cut = torch.where((run <= k_max - 2) & (prefix > 0) & ~alive, prefix, torch.zeros_like(prefix))
    pairs = torch.tensor(starts, device=device)[:, None] - 1 + k_idx[None]            # [B, P] start pair p
    last = torch.full((b, max_new), -1, dtype=torch.long, device=device)           # column of the chain's node
    nodes = torch.zeros(b, dtype=torch.long, device=device)
    extended = BranchCache(target, cache, width)
    try:
        while bool(alive.any()):
            counts = alive.sum(1)
            q = int(counts.max())
            sel = torch.sort((~alive).long(), dim=1, stable=True).indices[:, :q]       # [B, q] alive starts first
            valid = torch.arange(q, device=device)[None] < counts[:, None]
            nodes += counts
            m, i = run.gather(1, sel), level_of.gather(1, sel) + 1                      # next draft d_i, 1-based
            p = pairs.gather(1, sel)
            tok = drafts.gather(1, sel[..., None].expand(-1, -1, k_max))              # [B, q, K]
            i = torch.where(valid, i, torch.ones_like(i))                              # padding: any index
            node = tok.gather(2, (i - 1)[..., None])[..., 0]
            ask = tok.gather(2, i[..., None])                                          # d_{i+1}
            branches = Branches(tokens=torch.where(valid, node, 0), positions=torch.where(valid, p + 1 + i, 0),
                                context_end=torch.where(valid, p + 1 + m, -1),
                                parents=torch.where(valid, last.gather(1, sel), -1),
                                asked=torch.where(valid[..., None], ask, -1))
            got, where = extended.probs(branches, decoding, chunk_tokens, local_parents=False)
            got = got[..., 0].double()                                                 # [B, q]
            rows, cols = valid.nonzero(as_tuple=True)
            ks, ii = sel[rows, cols], i[rows, cols]
            accept[rows, ks, ii] = got[rows, cols]                                     # p_{i+1}(d_{i+1})
            prefix[rows, ks] = prefix[rows, ks] * got[rows, cols]
            last[rows, ks] = where[rows, cols]
            level_of[rows, ks] = ii
            more = torch.zeros_like(alive)
            more[rows, ks] = (ii + 1 <= k_max - 1) & (prefix[rows, ks] > 0)
            cut[rows, ks] = torch.where(more[rows, ks] & (prefix[rows, ks] < floor), prefix[rows, ks], cut[rows, ks])
            alive = more & (prefix >= floor)
    finally:
        extended.close()
    return chain_at_least(accept), cut, nodes


def _gather_steps(preds: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """preds [K, P] (step j's draft at column q), cols [N, K] -> [N, K]: preds[i, cols[:, i]], -1 past the end."""
    k, p = preds.shape
    ok = cols < p
    got = preds.gather(1, cols.clamp(max=p - 1).T).T
    return torch.where(ok, got, torch.full_like(got, -1))


def _padded(row: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    ok = idx < row.shape[0]
    return torch.where(ok, row[idx.clamp(max=row.shape[0] - 1)], torch.full_like(idx, -1))
