"""The profile at temperature > 0: the exact expectation of every cycle start, and the acceptance along
continuations sampled from the target, from one teacher-forced pass per batch.

Contract: for each prompt + continuation (sampled here from `sampling.target_probs` with the prompt's own
generator, or given), ONE target forward over the sequence gives the aux features, the target's rows on
the continuation and its KV cache. Start t >= 1 (docs/sampling.md) is the context prompt + the first t
continuation tokens, the t-th being the root; its drafts are what the head proposes there (the loop's
drafts: past a wrong draft the chain continues from its own drafts, `run_lengths.SparseChains` running a
step only where its draft can count; trees from `unroll.unroll_trees`, which is exact). For a one-hot rule,
P(A >= i) of start t is the product along the drafts of the rule's P(accept d_i | d_<i accepted), a function
of p_i(d_i) (profile/expected.py `chain_accept`: p_i(d_i) itself except under SGLang's thresholds below 1;
trees: expected_trees.py); each p is read from the pass's own row where the drafts so far follow the
continuation, else from `branches.BranchCache` (the left drafts run as extra query tokens over the cache).
Every num_steps <= max_steps and every tree shape comes from the same drafts and rows.

The acceptance along the continuation itself (what a server reports, EAGLE3.md section 8: under the
one-hot rules an emitted token equals a draft exactly when that draft was accepted) is the greedy
profile's prefix match on it: `Profiled.run_lengths` / `tree_runs`, walked by `profile.simulate_cycles`.
It is the rule's own only where the rule's text is a sample of p (lossless: not SGLang's thresholds below 1,
for which commands/profile_sampling.py reports the per-context figure alone).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_eval.profile.branches import BranchCache, KnownNodes, probs_at, shared_nodes
from eagle_eval.loop.reference import Speculator
from eagle_eval.profile.expected import chain_accept, chain_at_least
from eagle_eval.profile.teacher_forced import Profiled
from eagle_eval.profile.run_lengths import SparseChains
from eagle_eval.rules.filters import prompt_generator, target_probs


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
    from eagle_eval.profile.teacher_forced import greedy_continuations

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
    with target.capture(spec.aux_hf, device) as cap:
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
    from eagle_eval.profile.trees import tree_expectations

    trees = tree_expectations(spec, tf, max_steps, max_new_tokens, topk, tree_shapes, decoding, chunk_tokens, floor)
    for res, tree in zip(results, trees):
        res.tree_runs = tree.runs
        res.expected = Expected(trees=tree.at_least, cut=tree.cut, branch_nodes=tree.branch_nodes)
    return results


@torch.no_grad()
def profile_batch_rollouts(spec: Speculator, items: list, keys: list, max_steps: int, max_new_tokens: int,
                           pad_id: int, decoding, rollouts: int, chunk_tokens: int = 4096) -> list[Profiled]:
    """The sampled-draft rules (chains): P(A >= i) estimated by rollouts (profile/rollouts.py), exact at
    i = 1. keys: (prompt id, sample) per item. No run lengths: the accepted count is not a function of the text."""
    from eagle_eval.profile.rollouts import rollout_expectations

    tf = teacher_forced(spec, items, pad_id)
    est, var = rollout_expectations(spec, tf.cache, tf.width, tf.logits, tf.aux, tf.ids, tf.starts, keys, max_steps,
                                    max_new_tokens, decoding, rollouts, chunk_tokens)
    return [Profiled(prompt=p, continuation=c, run_lengths=[], expected=Expected(chain=est[i], variance=var[i]))
            for i, (p, c) in enumerate(items)]


@torch.no_grad()
def profile_batch_weighted(spec: Speculator, items: list, max_steps: int, max_new_tokens: int, pad_id: int,
                           decoding) -> list[Profiled]:
    """The sampled-draft rules (chains) on continuations sampled from the target at these settings: P(A >= i)
    exact at i = 1, importance-weighted along the continuation deeper (profile/weighted.py), from the pass
    alone. No run lengths: the accepted count is not a function of the text."""
    from eagle_eval.profile.weighted import weighted_expectations

    tf = teacher_forced(spec, items, pad_id)
    est = weighted_expectations(spec, tf, max_steps, max_new_tokens, decoding)
    return [Profiled(prompt=p, continuation=c, run_lengths=[], expected=Expected(chain=est[i]))
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
       are the pass's own rows at position p + i (read for every start at once), turned into the rule's
       acceptance (`expected.chain_accept`).
    2. off it: past the first wrong draft the chain continues from its own drafts (the loop's chain), one
       step per level, and each left draft d_j runs as a branch node over the pass's cache (context: the
       sequence to p + 1 + m, then the chain's earlier branch nodes), read at d_{j+1}; a chain goes on only
       while its P(A >= j + 1) is > 0 and >= floor (below it, the deeper P(A >= j) are left 0: each too low by
       less than the floor). Chains of a row that reach the same context with the same token share one node
       (the target's p depends on the tokens alone)."""
    embeds = spec.embed(tf.ids[:, 1:])                                              # x_1..x_{W-1}
    drafter = SparseChains(spec.head, tf.aux[:, :-1], embeds, spec.position_offset)
    chains = _Chains.at_starts(tf, drafter, k_max, max_new)
    _draft_on_continuation(chains, drafter, embeds)
    _read_pass(chains, tf, decoding, floor)
    nodes = _follow_off_continuation(chains, spec, tf, drafter, decoding, chunk_tokens, floor)
    return chain_at_least(chains.accept), chains.cut, nodes, chains.run


@dataclass
class _Chains:
    """The chain of every start of a batch, [B, P(, K)] (start k of row b: start pair p = T_b - 1 + k)."""
    pairs: torch.Tensor                 # [B, P] start pair p
    truth: torch.Tensor                 # [B, P, K] the continuation at d_i's position p + 1 + i (-1: past it)
    drafts: torch.Tensor                # [B, P, K] d_i (-1: not drafted)
    run: torch.Tensor | None = None     # [B, P] m: leading drafts the continuation holds
    accept: torch.Tensor | None = None  # [B, P, K] float64 P(accept d_i | d_<i accepted) (0 where not followed)
    prefix: torch.Tensor | None = None  # [B, P] P(A >= i) along the chain so far
    cut: torch.Tensor | None = None     # [B, P] P(A >= i) where the chain was cut below the floor (0 = not)
    alive: torch.Tensor | None = None   # [B, P] followed further off the continuation

    @classmethod
    def at_starts(cls, tf: _Pass, drafter: SparseChains, k_max: int, max_new: int) -> "_Chains":
        b, width = tf.ids.shape
        device = tf.ids.device
        k_idx = torch.arange(max_new, device=device)
        pairs = torch.tensor(tf.starts, device=device)[:, None] - 1 + k_idx[None]
        at = pairs[..., None] + 1 + torch.arange(1, k_max + 1, device=device)      # [B, P, K]
        inside = at < torch.tensor(tf.lengths, device=device)[:, None, None]
        truth = torch.where(inside, tf.ids.gather(1, at.clamp(max=width - 1).flatten(1)).view(at.shape),
                            torch.full_like(at, -1))
        drafts = torch.full((b, max_new, k_max), -1, dtype=torch.long, device=device)
        drafts[..., 0] = drafter.first.gather(1, pairs.clamp(max=width - 2))
        return cls(pairs, truth, drafts)


def _draft_on_continuation(chains: _Chains, drafter: SparseChains, embeds: torch.Tensor) -> None:
    """Draft step j for the chains whose d_1..d_j equal the continuation (teacher-forced: the step reads the
    true token); sets `drafts` up to each chain's first wrong draft d_{m+1} and `run` (m)."""
    drafts, truth = chains.drafts, chains.truth
    on = (drafts[..., 0] == truth[..., 0]) & (truth[..., 0] >= 0)
    for j in range(1, drafts.shape[-1]):
        bb, kk = on.nonzero(as_tuple=True)                                           # (host sync)
        if bb.numel() == 0:
            break
        col = chains.pairs[bb, kk] + j
        got = drafter.step(j, bb, col, embeds[bb, col])
        drafts[bb, kk, j] = got
        on = torch.zeros_like(on)
        on[bb, kk] = (got == truth[bb, kk, j]) & (truth[bb, kk, j] >= 0)
    chains.run = ((drafts == truth) & (truth >= 0)).long().cumprod(-1).sum(-1)


def _read_pass(chains: _Chains, tf: _Pass, decoding, floor: float) -> None:
    """p_i(d_i) of d_1..d_{m+1} from the pass's own rows (position p + i), every start at once, and the rule's
    acceptance of each; then P(A >= m + 1) (`prefix`) and which chains go on off the continuation (`alive`,
    `cut`)."""
    b, max_new, k_max = chains.drafts.shape
    device = chains.drafts.device
    k_idx, i_idx = torch.arange(max_new, device=device), torch.arange(1, k_max + 1, device=device)
    span = max_new + k_max - 1                                                     # positions T .. T + span - 1
    asked = torch.full((b, span, k_max), -1, dtype=torch.long, device=device)     # position T + k + i - 1 asks d_i
    for i in range(k_max):
        asked[:, i: i + max_new, i] = chains.drafts[..., i]
    from_pass = torch.zeros(b, max_new, k_max, dtype=torch.float64, device=device)
    for row, t in enumerate(tf.starts):
        got = probs_at(tf.logits[row, t: t + span], asked[row], decoding).double().to(device)   # [span, K]
        from_pass[row] = got[k_idx[:, None] + i_idx[None] - 1, i_idx[None].expand(max_new, -1) - 1]
    run = chains.run
    off = i_idx[None, None] > run[..., None] + 1                                    # p_i off the continuation
    accept = chain_accept(from_pass, decoding)
    chains.accept = torch.where(off, torch.zeros_like(accept), accept)
    chains.prefix = chain_at_least(torch.where(off, torch.ones_like(accept), accept)).gather(
        -1, run[..., None].clamp(max=k_max - 1))[..., 0]                            # P(A >= m + 1)
    more = (run <= k_max - 2) & (chains.prefix > 0)
    chains.alive = more & (chains.prefix >= floor)
    chains.cut = torch.where(more & ~chains.alive, chains.prefix, torch.zeros_like(chains.prefix))


def _follow_off_continuation(chains: _Chains, spec: Speculator, tf: _Pass, drafter: SparseChains, decoding,
                             chunk_tokens: int, floor: float) -> torch.Tensor:
    """Level j = 1..K-1: each alive chain off the continuation by d_j drafts d_{j+1} from its own d_j, and
    d_j runs as a branch node (shared between starts where it can be, `branches.KnownNodes` and
    `shared_nodes`) read at d_{j+1}. Returns the branch nodes run per row [B]."""
    b, _, k_max = chains.drafts.shape
    pairs, run, drafts = chains.pairs, chains.run, chains.drafts
    prefix, alive, cut = chains.prefix, chains.alive, chains.cut
    last = torch.full_like(run, -1)                                                  # column of the chain's node
    nodes = torch.zeros(b, dtype=torch.long, device=run.device)
    extended, known = BranchCache(spec.target, tf.cache, tf.width), KnownNodes()
    try:
        for j in range(1, k_max):
            if not bool(alive.any()):
                break
            bb, kk = (alive & (run + 1 <= j)).nonzero(as_tuple=True)                 # node d_j, asking d_{j+1}
            if bb.numel() == 0:
                continue
            p, ctx, parent, node = pairs[bb, kk], pairs[bb, kk] + 1 + run[bb, kk], last[bb, kk], drafts[bb, kk, j - 1]
            drafts[bb, kk, j] = ask = drafter.step(j, bb, p + j, spec.embed(node[None])[0])
            val, col = known.lookup(bb, ctx, parent, node, ask)
            todo = (col < 0).nonzero(as_tuple=True)[0]
            if todo.numel():
                keys = [x[todo] for x in (bb, ctx, parent, node, ask)]
                t_bb, t_ctx, t_parent, t_node, t_ask = keys
                branches, slot, ask_slot = shared_nodes(b, t_bb, t_node, p[todo] + 1 + j, t_ctx, t_parent, t_ask)
                got, where = extended.probs(branches, decoding, chunk_tokens, local_parents=False)
                nodes += (branches.context_end >= 0).sum(1)
                val[todo] = got[t_bb, slot, ask_slot].double()                        # p_{j+1}(d_{j+1})
                col[todo] = where[t_bb, slot]
                known.add(*keys, val[todo], col[todo])
            accept = chain_accept(val, decoding)
            chains.accept[bb, kk, j] = accept
            prefix[bb, kk] = prefix[bb, kk] * accept
            last[bb, kk] = col
            more = (j + 1 <= k_max - 1) & (prefix[bb, kk] > 0)
            cut[bb, kk] = torch.where(more & (prefix[bb, kk] < floor), prefix[bb, kk], cut[bb, kk])
            alive[bb, kk] = more & (prefix[bb, kk] >= floor)
    finally:
        extended.close()
    return nodes
