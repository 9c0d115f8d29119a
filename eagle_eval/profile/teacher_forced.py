"""Teacher-forced profile: exact acceptance for every num_steps from one target forward per prompt.

Contract: given the target's greedy continuation of a prompt (generated here in batches, or read
from a responses file and checked against the target's own argmax), ONE target forward over
prompt + continuation yields the aux features; `run_lengths.chain_run_lengths` then runs the draft chain
from every start pair at once (the pattern of `unroll.unroll_chains`, only the steps that can still count),
giving the run length r_p of consecutive correct drafts from each start.
Because the draft state at a cycle start depends only on the verified prefix (docs/eagle3.md section 4),
walking the cycles over r_p reproduces the reference loop exactly, for every S <= max_steps.

The continuation is extended by max_steps tokens past max_new_tokens and past EOS: the loop's last
verify forward checks drafts beyond the cut, and their acceptance counts.

A kind whose drafts depend on num_steps (a block drafter: its block of num_steps + 1 rows is non-causal) offers its
own all-starts form on its drafting state class (`draft_state.run_lengths`, heads/dflash/all_starts.py): the run
lengths are then computed once per num_steps S <= max_steps (`Profiled.runs_by_steps`), each walked for S.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from eagle_eval.records import Prompt
from eagle_eval.loop.reference import Decoded, Speculator, emit
from eagle_eval.profile.unroll import TreePools, unroll_trees
from eagle_eval.profile.run_lengths import chain_run_lengths
from eagle_eval.loop.tree import pool_size


@dataclass
class Profiled:
    """One prompt's profile: the continuation it was run on and r_p from each cycle-start root."""
    prompt: Prompt
    continuation: list[int]          # x_T .. x_{T+max_new+max_steps-1} (greedy, not cut at EOS)
    run_lengths: list[int]           # r[k]: correct drafts in a row from the root x_{T+k}, k < max_new
    divergence: dict | None = None   # where given responses departed from the target's argmax
    tree_runs: dict | None = None    # trees: {(S, D): (run lengths, off-top-1 flags)} for the given K
    expected: object = None          # temperature > 0: profile_sampled.Expected (P(A >= i) of every start)
    runs_by_steps: dict | None = None  # {S: run lengths}: a kind whose drafts depend on S (block drafters)

    def runs(self, num_steps: int) -> list[int]:
        """The run lengths a chain of num_steps drafts walks (`run_lengths` unless they depend on num_steps)."""
        return self.run_lengths if self.runs_by_steps is None else self.runs_by_steps[num_steps]


def simulate_cycles(run_lengths: list[int], continuation: list[int], num_steps: int, max_new_tokens: int,
                    eos_ids: set[int], off_top1: list[bool] | None = None) -> Decoded:
    """Walk the loop's cycles over run lengths: accept min(r, S), emit them plus the bonus.

    >>> d = simulate_cycles([2, 0, 5, 1, 0, 0, 0], [10, 11, 12, 13, 14, 15, 16, 17], 3, 6, set())
    >>> d.output_ids, d.accepted_per_cycle, d.emitted_per_cycle
    ([10, 11, 12, 13, 14, 15], [2, 1], [3, 2])
    """
    out = Decoded()
    if max_new_tokens <= 0:
        return out
    out.output_ids.append(continuation[0])
    if continuation[0] in eos_ids or max_new_tokens == 1:
        return out
    k = 0                                           # index of the root in the continuation
    while True:
        n = min(run_lengths[k], num_steps)
        out.accepted_per_cycle.append(n)
        if off_top1 is not None:
            out.off_top1_per_cycle.append(off_top1[k])
        if emit(out, continuation[k + 1: k + n + 2], max_new_tokens, eos_ids):
            return out
        k += n + 1


def run_lengths_from_predictions(preds: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """preds [K, P] (step j's draft at pair q, target ids), tokens [P + 1] (x_0..x_P).

    Returns r [P]: for each start pair p, the number of leading steps j with
    preds[j, p + j] == x_{p+2+j}; a draft past the last known token counts as wrong.
    >>> run_lengths_from_predictions(torch.tensor([[2, 3, 9, 5], [9, 3, 4, 9]]), torch.tensor([0, 1, 2, 3, 4])).tolist()
    [2, 2, 0, 0]
    """
    k, p = preds.shape
    target = tokens[2:]                                          # x_{q+2} for q = 0..P-2
    ok = torch.zeros(k, p, dtype=torch.bool, device=preds.device)
    for j in range(min(k, p - 1)):                               # ok[j, p] = step j right at q = p + j
        ok[j, : p - 1 - j] = preds[j, j: p - 1] == target[j:]
    return ok.long().cumprod(dim=0).sum(dim=0)


def tree_run_lengths(pools: TreePools, next_tokens: torch.Tensor, num_steps: int, topk: int,
                     num_draft_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted depth of each start's verify tree, and whether its accepted path left the top-1 chain.

    next_tokens [P, num_steps + 1]: x_{p+1} (the root) .. x_{p+1+num_steps} for each start p. The tree
    keeps the best D-1 of the first K + (S-1) K^2 pool nodes (ties -> lower index, as tree.select_tree);
    a node is accepted when its token is the greedy token at its depth and its parent is accepted.
    """
    n = pool_size(num_steps, topk)
    tokens, depths, parents = pools.tokens[:, :n], pools.depths[:, :n], pools.parents[:, :n]
    truth = next_tokens.gather(1, depths)                                   # greedy token at each depth
    match = torch.zeros_like(tokens, dtype=torch.bool)
    top1 = torch.zeros_like(match)
    for level in range(1, num_steps + 1):                                   # parents before children
        cols = (depths[0] == level).nonzero().flatten()
        par = parents[:, cols].clamp(min=0)
        root_child = parents[:, cols] < 0
        match[:, cols] = (tokens[:, cols] == truth[:, cols]) & (root_child | match.gather(1, par))
        top1[:, cols] = (pools.ranks[:, cols] == 0) & (root_child | top1.gather(1, par))
    order = torch.sort(pools.scores[:, :n].double(), dim=-1, descending=True, stable=True).indices
    selected = torch.zeros_like(match).scatter(1, order[:, : num_draft_tokens - 1], True)
    accepted = selected & match
    r = (depths * accepted).max(dim=1).values
    deepest = (depths * accepted).argmax(dim=1)
    off = (r > 0) & ~top1.gather(1, deepest[:, None])[:, 0]
    return r, off


@torch.no_grad()
def greedy_continuations(spec: Speculator, prompts: list[list[int]], num_tokens: int, pad_id: int,
                         batch_tokens: int, progress: Callable[[int], None] | None = None,
                         choose=None) -> list[list[int]]:
    """Greedy continuations of `num_tokens` tokens, NOT stopped at EOS, in left-padded batches
    (explicit position ids and attention mask, so padding never changes a row's tokens).
    progress(n): called with the tokens each decode step generated (len(prompts) * num_tokens in all),
    for the caller's bar. choose(logits [B, V], prompt indices of the rows) -> next ids [B]: another rule than
    the argmax (profile_sampled.SampleNext)."""
    pick = choose or (lambda logits, rows: logits.argmax(-1).cpu())
    target = spec.target
    out = [None] * len(prompts)
    for batch in batches(prompts, num_tokens, batch_tokens):
        width = max(len(prompts[i]) for i in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(batch):
            ids[row, width - len(prompts[i]):] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = target.new_cache()
        nxt = pick(target.forward(ids, cache, position_ids=pos, attention_mask=mask)[:, -1], batch)
        tokens = [nxt]
        if progress is not None:
            progress(len(batch))
        for _ in range(num_tokens - 1):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            pos = pos[:, -1:] + 1
            logits = target.forward(nxt[:, None], cache, position_ids=pos, attention_mask=mask)
            nxt = pick(logits[:, -1], batch)
            tokens.append(nxt)
            if progress is not None:
                progress(len(batch))
        block = torch.stack(tokens, dim=1)                     # [B, num_tokens]
        for row, i in enumerate(batch):
            out[i] = block[row].tolist()
    return out


def batches(seqs: list[list[int]], extra: int, batch_tokens: int):
    """Indices grouped so that rows * (longest + extra) <= batch_tokens (one row at least)."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    batch, longest = [], 0
    for i in order:
        longest_if = max(longest, len(seqs[i]) + extra)
        if batch and (len(batch) + 1) * longest_if > batch_tokens:
            yield batch
            batch, longest_if = [], len(seqs[i]) + extra
        batch.append(i)
        longest = longest_if
    if batch:
        yield batch


@torch.no_grad()
def profile_batch(spec: Speculator, items: list[tuple[Prompt, list[int]]], max_steps: int,
                  max_new_tokens: int, pad_id: int, topk: int = 1,
                  tree_shapes: list[tuple[int, int]] | None = None) -> list[Profiled]:
    """One teacher-forced target forward over each prompt + continuation (right-padded batch),
    then the all-starts draft unroll. Continuations must hold max_new_tokens + max_steps tokens."""
    target, head, device = spec.target, spec.head, spec.draft_device
    seqs = [p.input_ids + c for p, c in items]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = torch.tensor(s)
        mask[row, : len(s)] = 1
    with target.capture(spec.aux_hf, device) as cap:
        logits = target.forward(ids, None, attention_mask=mask, upcast=False)  # [B, W, V]
        aux = cap.pop()                                                        # [B, W, k*H_t]
    ids = ids.to(device)
    argmax = logits.argmax(-1).to(device)
    lengths = torch.tensor([len(s) for s in seqs], device=device)
    by_steps = getattr(spec.draft_state, "run_lengths", None)          # drafts that depend on S (module contract)
    if by_steps is None:
        runs = chain_run_lengths(head, aux[:, :-1], spec.embed(ids[:, 1:]), ids, lengths, max_steps,
                                 spec.position_offset)                               # [B, W-1]
    results = []
    for row, (prompt, cont) in enumerate(items):
        t, n = len(prompt.input_ids), len(seqs[row])
        per_s = None
        if by_steps is not None:     # the roots x_T.. are the anchors at positions T..T+max_new-1
            anchors = torch.arange(t, t + max_new_tokens, device=device)
            per_s = {s: by_steps(head, spec.embed, aux[row: row + 1, :n], ids[row, :n], anchors, s).tolist()
                     for s in range(1, max_steps + 1)}
        # r_p for the roots x_T.. : start pair p = T - 1 + k
        r = per_s[max_steps] if per_s is not None else runs[row, : n - 1][t - 1: t - 1 + max_new_tokens].tolist()
        res = Profiled(prompt=prompt, continuation=cont, run_lengths=r, runs_by_steps=per_s,
                       divergence=_check_greedy(argmax[row], ids[row], logits[row], t, n))
        if topk > 1:
            res.tree_runs = _tree_runs(spec, aux[row: row + 1, : len(seqs[row]) - 1], ids[row, : len(seqs[row])],
                                       t, max_steps, max_new_tokens, topk, tree_shapes)
        results.append(res)
    return results


def _tree_runs(spec: Speculator, aux, ids, t: int, max_steps: int, max_new: int, topk: int,
               shapes: list[tuple[int, int]]) -> dict:
    """{(S, D): (run lengths, off-top-1 flags)} for each requested shape, all from ONE all-starts
    expansion of max_steps levels (the first S levels of a deeper expansion are the S-level one)."""
    starts = torch.arange(t - 1, t - 1 + max_new, device=ids.device)
    pools = unroll_trees(spec.head, aux, spec.embed(ids[None, 1:]), spec.embed, starts, max_steps, topk,
                         spec.position_offset)
    nxt = ids[starts[:, None] + 1 + torch.arange(max_steps + 1, device=ids.device)]   # [P, S+1]
    runs = {}
    for s, d in shapes:
        r, off = tree_run_lengths(pools, nxt, s, topk, d)
        runs[(s, d)] = (r.tolist(), off.tolist())
    return runs


def _check_greedy(argmax, ids, logits, start: int, end: int) -> dict | None:
    """First position where the continuation is not the target's own argmax (None if it is)."""
    pred, actual = argmax[start - 1: end - 1], ids[start:end]
    bad = (pred != actual).nonzero()
    if not len(bad):
        return None
    i = int(bad[0])
    row = logits[start - 1 + i]
    return {"position": i, "continuation_token": int(actual[i]), "target_argmax": int(pred[i]),
            "margin": float(row[pred[i]] - row[actual[i]])}
