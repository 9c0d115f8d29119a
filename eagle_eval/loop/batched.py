"""The speculative loop over many prompts at once: B rows verified in one target forward.

Contract: `batched_decode` returns, for every prompt, the `Decoded` that `chain.speculative_decode`
returns for it alone (tokens, accepted drafts per cycle, emitted tokens per cycle, tree fields), up
to floating-point near-ties: every row computes the same per-token math as the reference loop, only
batched with other rows. Each row has its own cache length (loop/rows.py: one length per
row, rollback = setting it; no holes, no copies for a chain), its own positions and its own accepted
length; a row whose prompt is finished is refilled with the next prompt before the next cycle (the
rows freed in one cycle, and all rows at the start, are prefilled together: `admit`, `prefill_groups`).
A row with no prompt is parked at length 0: it computes garbage that nothing reads, written in its first
slots, and never advances. Room is checked on the host before every forward (`Rows.check_room`): a row's
length plus the block it writes never passes the capacity (`capacity_for`), so no write can leave a row.

Every decision (the token after the prefill, each draft, what the target keeps and the token it adds) is the
decode policy's batched form (loop/policy.py `RowPolicies`): greedy's is device work only, a sampling
rule's calls each row's own started policy (its prompt's random stream) on that row's logits, so a row draws
what the reference loop draws for its prompt alone, in the same order, at any batch size and row order.

One chain cycle (`chain_cycle`) has fixed shapes, so loop/graphed.py can capture it as one CUDA graph
where the policy is device work only (greedy): S draft steps per row, one verify forward of [B, S+1], the
policy's acceptance, the draft re-run over a fixed S+1 pairs per row of which the first n+1 are real (the
rest land past the row's length and are overwritten). Trees (`tree_cycle`) draft each row's tree on the host
exactly as the reference does (`DraftState.propose_tree` over the row's cache), then verify all rows'
D nodes in one forward with per-row ancestor masks, accept with the row's policy, and move each
row's accepted path into place (`RowCache.keep`).

A kind whose drafting state class offers its own batched form (`draft_state.rows`: a block drafter's
heads/dflash/batched.py BlockRows, one draft forward per cycle over per-row context caches; a P-EAGLE head's
heads/peagle/batched.py ParallelRows) drafts through it instead of the head's steps: `Rows.drafts` holds it (it is
also the draft cache whose lengths the loop keeps); the prefill and the verify write the verified positions'
target states and the token after each (`drafts.write`), a cycle's drafts are `drafts.propose`; the verify, the
acceptance and the rollback are the same. Such a kind verifies chains only.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from eagle_eval.models.capture import FeatureCapture
from eagle_eval.loop.rows import RowCache, RowDraftCache, block_slots, block_visible
from eagle_eval.loop.reference import Decoded, Speculator, emit
from eagle_eval.loop.draft import DraftState
from eagle_eval.loop.policy import RowPolicies, accept_chains  # noqa: F401  (accept_chains: re-exported)
from eagle_eval.loop.tree import Tree, select_tree


class BatchError(ValueError):
    """A target the batched loop cannot run (sliding-window KV layers)."""


@dataclass
class BatchedRun:
    decoded: list[Decoded]                 # in prompt order
    cuda_graphs: bool                      # True when the chain cycle ran as a replayed CUDA graph
    fallback: str | None = None            # why graphs were asked for and not used (one line)
    cycles: int = 0                        # batched cycles run (each one target forward of B rows)
    prefill_s: float = 0.0                 # wall time spent admitting prompts (prefills)
    capture_s: float = 0.0                 # wall time spent capturing the graph (warm-ups included)


@dataclass
class Rows:
    """The device state of the B rows between cycles (static buffers: a captured graph reads them)."""
    target_cache: RowCache
    draft_cache: RowDraftCache
    root: torch.Tensor                     # [B] the last verified token of each row (target ids)
    last_out: torch.Tensor                 # [B, 1, H] the head's out at each row's last real pair
    active: torch.Tensor                   # [B] bool: the row holds a prompt that is not finished
    policy: RowPolicies                    # every decision of every row (loop/policy.py)
    host_len: list[int] = field(default_factory=list)   # lengths as the host knows them (both caches)
    drafts: object | None = None           # a kind's own batched drafting (module contract), else None

    def state(self) -> list[torch.Tensor]:
        """The tensors a cycle changes besides cache slots past the lengths."""
        return [self.target_cache.lengths, self.draft_cache.lengths, self.root, self.last_out]

    def park(self, rows: list[int]) -> None:
        """Rows that hold no prompt: inactive, both lengths 0 (a parked row's garbage stays in its first slots)."""
        if not rows:
            return
        self.active[rows] = False
        self.target_cache.lengths[rows] = 0
        self.draft_cache.lengths[rows] = 0
        for b in rows:
            self.host_len[b] = 0

    def check_room(self, width: int) -> None:
        """Before a forward that writes `width` slots per row at its length: every row has them (host only)."""
        capacity = self.target_cache.capacity
        worst = max(range(len(self.host_len)), key=lambda b: self.host_len[b])
        if self.host_len[worst] + width > capacity:
            raise AssertionError(f"batched loop: row {worst} at length {self.host_len[worst]} would write {width} "
                                 f"slots past its capacity {capacity}")


def draft_block(spec: Speculator, cache: RowDraftCache, embeds: torch.Tensor, hidden: torch.Tensor,
                base: torch.Tensor, rows: slice = slice(None), position_offset: int = 0) -> torch.Tensor:
    """The head's `step` over a block of T pairs per row, written at slots base[b] + t, causal within
    the block, full over the row's first base[b] slots: embeds/hidden [B', T, H] -> out [B', T, H]."""
    head = spec.head
    attn = head.attention
    t = embeds.shape[1]
    positions = block_slots(base, t) + position_offset
    u, residual = head.attention_input(embeds, hidden, positions)
    cos, sin = head.rope(positions)
    q, k, v = attn.project(u, cos, sin)
    keys, values = cache.write(k, v, base, rows)
    visible = block_visible(base, t, cache.capacity, None)
    out = head.finish(residual, attn.attend(q, keys, values, visible, u))
    if getattr(head, "depth", 1) == 1:
        return out
    return head.above(out, cos, sin, lambda i, a, q, k, v, u: a.attend(q, *cache.layer(i).write(k, v, base, rows),
                                                                         visible, u))


def propose_chains(spec: Speculator, rows: Rows, num_steps: int) -> torch.Tensor:
    """Each row's chain of S drafts from its last real pair, each the policy's proposal -> [B, S] target ids;
    the S-1 speculative KV entries go past the row's length (DraftState.propose_chain, every row at once)."""
    head, out, base = spec.head, rows.last_out, rows.draft_cache.lengths
    drafts = []
    for k in range(1, num_steps + 1):
        token = head.to_target_ids(rows.policy.propose(head.logits(out)[:, -1], rows.active))   # [B]
        drafts.append(token)
        if k == num_steps:
            break
        out = draft_block(spec, rows.draft_cache, spec.embed(token[:, None]), out, base + (k - 1),
                          position_offset=spec.position_offset)
    return torch.stack(drafts, dim=1)


def chain_cycle(spec: Speculator, rows: Rows, capture: FeatureCapture, num_steps: int):
    """One chain cycle of every row, device work only -> (accepted [B], new tokens [B, S+1]: row b's
    first accepted[b] + 1 are its accepted drafts and the bonus). Advances the active rows' state."""
    target, head, device = spec.target, spec.head, spec.draft_device
    drafts = (propose_chains(spec, rows, num_steps) if rows.drafts is None                          # [B, S]
              else rows.drafts.propose(rows.root, num_steps, rows.policy, rows.active))
    ids = torch.cat([rows.root[:, None], drafts], dim=1)                            # [B, S+1]
    positions, mask = rows.target_cache.begin(num_steps + 1, target.model.dtype)
    logits = target.forward(ids, rows.target_cache, position_ids=positions, attention_mask=mask, upcast=False)
    aux = capture.pop()                                                             # [B, S+1, k*H_t]
    accepted, bonus = rows.policy.accept_chains(drafts, logits, rows.active)        # [B], [B]
    accepted, bonus = accepted * rows.active, bonus[:, None]                        # [B], [B, 1]
    new = torch.cat([drafts, bonus], dim=1).scatter(1, accepted[:, None], bonus)    # [B, S+1]
    advance = (accepted + 1) * rows.active
    rows.target_cache.lengths += advance.to(rows.target_cache.lengths.device)
    if rows.drafts is not None:            # the verified positions' context; what is not accepted lies past the length
        rows.drafts.write(aux, rows.draft_cache.lengths, slice(None), new)
        rows.draft_cache.lengths += advance
    else:
        out = draft_block(spec, rows.draft_cache, spec.embed(new), head.fuse(aux), rows.draft_cache.lengths)
        rows.draft_cache.lengths += advance
        picked = out.gather(1, accepted[:, None, None].expand(-1, 1, out.shape[-1]))   # [B, 1, H]
        rows.last_out.copy_(torch.where(rows.active[:, None, None], picked, rows.last_out))
    rows.root.copy_(torch.where(rows.active, bonus[:, 0], rows.root))
    return accepted, new


class _RowDraft:
    """One row of the draft cache seen as the `DraftState` that `propose_tree` reads (real pairs only)."""

    def __init__(self, spec: Speculator, rows: Rows, b: int):
        n = rows.host_len[b]
        self.head, self.embed, self.position_offset = spec.head, spec.embed, spec.position_offset
        self.cache = type("RowView", (), {"keys": rows.draft_cache.keys[b:b + 1, :, :n],
                                          "values": rows.draft_cache.values[b:b + 1, :, :n]})()
        self.real_len, self.last_out = n, rows.last_out[b:b + 1]


def tree_cycle(spec: Speculator, rows: Rows, capture: FeatureCapture, num_steps: int, topk: int,
               num_draft_tokens: int) -> list[tuple[Tree, list[int], int]]:
    """One tree cycle of every row -> per row (tree, accepted path, bonus); inactive rows verify a
    dummy chain and do not advance. Advances the active rows' state."""
    target, head, device = spec.target, spec.head, spec.draft_device
    batch, width, d = rows.root.shape[0], num_steps + 1, num_draft_tokens
    active = rows.active.tolist()
    roots = rows.root.tolist()
    trees = [select_tree(DraftState.propose_tree(_RowDraft(spec, rows, b), num_steps, topk), roots[b], d)
             if active[b] else Tree([roots[b]] * d, [-1] + list(range(d - 1)), list(range(d)), [0] * d)
             for b in range(batch)]
    ids = torch.tensor([t.tokens for t in trees], device=device)                    # [B, D]
    intra = torch.stack([t.mask() for t in trees])                                  # [B, D, D]
    base = rows.target_cache.lengths.clone()
    positions, mask = rows.target_cache.begin(d, target.model.dtype, intra=intra,
                                              depths=torch.tensor([t.depths for t in trees]))
    logits = target.forward(ids, rows.target_cache, position_ids=positions, attention_mask=mask, upcast=False)
    aux = capture.pop()                                                             # [B, D, k*H_t]
    out_rows, paths, new = [], [], []
    for b, tree in enumerate(trees):
        path, bonus = rows.policy.accept_tree(b, tree, logits[b]) if active[b] else ([0], roots[b])
        out_rows.append((tree, path, bonus))
        paths.append(path + [path[-1]] * (width - len(path)))
        new.append([tree.tokens[i] for i in path[1:]] + [bonus] * (width - len(path) + 1))
    path_t = torch.tensor(paths, device=base.device)                                # [B, S+1]
    kept = torch.tensor([len(p) if a else 0 for (_, p, _), a in zip(out_rows, active)])
    rows.target_cache.keep(path_t, base)
    rows.target_cache.lengths.copy_(base + kept.to(base.device))
    feats = aux.gather(1, path_t.to(aux.device)[..., None].expand(-1, -1, aux.shape[-1]))
    out = draft_block(spec, rows.draft_cache, spec.embed(torch.tensor(new, device=device)), head.fuse(feats),
                      rows.draft_cache.lengths)
    rows.draft_cache.lengths += kept.to(device)
    last = (kept - 1).clamp(min=0).to(device)
    picked = out.gather(1, last[:, None, None].expand(-1, 1, out.shape[-1]))
    rows.last_out.copy_(torch.where(rows.active[:, None, None], picked, rows.last_out))
    rows.root.copy_(torch.where(rows.active, torch.tensor([r[2] for r in out_rows], device=device), rows.root))
    return out_rows


def new_rows(spec: Speculator, batch: int, capacity: int) -> Rows:
    """Empty rows: no prompt, lengths 0, the decode policy's batched form."""
    target, device = spec.target, spec.draft_device
    from eagle_eval.models.target import RECURRENT_REFUSAL, has_recurrent_layers

    if has_recurrent_layers(target.text_config):
        raise BatchError(f"the batched loop cannot run this target: {RECURRENT_REFUSAL}")
    if target.info.sliding_window is not None:
        raise BatchError(f"the batched loop needs full-attention KV layers; this target has sliding-window layers "
                         f"(window {target.info.sliding_window}): run it with --batch-size 1")
    hidden = spec.head.config.hidden_size
    own = getattr(spec.draft_state, "rows", None)          # a kind's own batched drafting (module contract)
    drafts = own(spec.head, spec.embed, batch, capacity, device) if own is not None else None
    return Rows(target_cache=RowCache(batch, capacity, target.input_device),
                draft_cache=drafts if drafts is not None else RowDraftCache(batch, capacity, device), drafts=drafts,
                root=torch.zeros(batch, dtype=torch.long, device=device),
                last_out=torch.zeros(batch, 1, hidden, dtype=spec.head.lm_head.weight.dtype, device=device),
                active=torch.zeros(batch, dtype=torch.bool, device=device), policy=spec.policy.rows(batch),
                host_len=[0] * batch)


PREFILL_TOKENS = 4096      # padded tokens per prefill forward (one prompt alone may be longer)


def admit(spec: Speculator, rows: Rows, capture: FeatureCapture, group: list[int], prompts: list[list[int]],
          max_new_tokens: int, eos_ids: set[int]) -> list[tuple[Decoded, bool]]:
    """Prefill rows `group` with `prompts`, one forward for all of them -> per row (its Decoded so far,
    whether it needs cycles). The rows' policies are seated (`RowPolicies.seat`) and the rows parked. The
    prompts are right-padded to the longest (causal: no real token sees a pad); a row's padding lands past its
    length, where the next forward overwrites it."""
    target, head, device = spec.target, spec.head, spec.draft_device
    outs = [Decoded() for _ in prompts]
    rows.park(group)
    if max_new_tokens <= 0:
        return [(out, False) for out in outs]
    sel = (slice(group[0], group[0] + len(group)) if group == list(range(group[0], group[0] + len(group)))
           else torch.tensor(group, device=rows.target_cache.device))
    lens = [len(p) for p in prompts]
    width = max(lens)
    last = torch.tensor(lens, device=device) - 1                                    # [G] each row's last token
    ids = torch.tensor([p + [p[-1]] * (width - len(p)) for p in prompts], device=device)   # [G, T]
    if width > rows.target_cache.capacity:
        raise AssertionError(f"batched loop: a prompt of {width} tokens in rows of {rows.target_cache.capacity} slots")
    positions, mask = rows.target_cache.begin(width, target.model.dtype, rows=sel)
    logits = target.forward(ids, rows.target_cache, position_ids=positions, attention_mask=mask, upcast=False)
    aux = capture.pop()                                                             # [G, T, k*H_t]
    tokens = rows.policy.first_tokens(group, logits[torch.arange(len(group), device=logits.device),
                                                    last.to(logits.device)])       # [G] from logits [G, V]
    first = torch.tensor(tokens, device=device)
    alive = [True] * len(group)
    for i, (out, token) in enumerate(zip(outs, tokens)):
        out.output_ids.append(token)
        alive[i] = not (token in eos_ids or max_new_tokens == 1)
    if not any(alive):
        return list(zip(outs, alive))
    nxt = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1).scatter(1, last[:, None], first[:, None])
    zero = torch.zeros(len(group), dtype=torch.long, device=device)
    if rows.drafts is not None:                             # the prompt's context (its padding past the length)
        rows.drafts.write(aux, zero, sel, nxt)
    else:
        out = draft_block(spec, rows.draft_cache, spec.embed(nxt), head.fuse(aux), zero, rows=sel)
        picked = out.gather(1, last[:, None, None].expand(-1, 1, out.shape[-1]))   # [G, 1, H]
    for i, b in enumerate(group):
        if alive[i]:
            rows.target_cache.lengths[b] = lens[i]
            rows.draft_cache.lengths[b] = lens[i]
            rows.host_len[b] = lens[i]
            if rows.drafts is None:
                rows.last_out[b] = picked[i]
            rows.root[b] = first[i]
            rows.active[b] = True
    return list(zip(outs, alive))


def prefill_groups(lengths: list[int], budget: int | None = None) -> list[int]:
    """Group sizes for prompts of these lengths, in order: each group's rows x longest prompt stays
    within the budget (a prompt longer than it goes alone).

    >>> prefill_groups([100, 3000, 900, 50, 4000, 10])
    [1, 1, 2, 1, 1]
    >>> prefill_groups([10, 50, 900, 1100])
    [3, 1]
    """
    budget = PREFILL_TOKENS if budget is None else budget
    sizes, n, width = [], 0, 0
    for length in lengths:
        if n and (n + 1) * max(width, length) > budget:
            sizes.append(n)
            n, width = 0, 0
        n, width = n + 1, max(width, length)
    return sizes + [n] if n else sizes


def capacity_for(prompts: list[list[int]], max_new_tokens: int, num_steps: int, num_draft_tokens: int) -> int:
    """Slots a row needs: the longest prompt, the new tokens, one verify block past the end."""
    return max(len(p) for p in prompts) + max_new_tokens + max(num_steps + 1, num_draft_tokens) + 1


@torch.no_grad()
def batched_decode(spec: Speculator, prompts: list[list[int]], num_steps: int, max_new_tokens: int,
                   eos_ids: set[int], batch_size: int, topk: int = 1, num_draft_tokens: int | None = None,
                   tree: bool | None = None, cuda_graphs: bool = False,
                   generators: list[torch.Generator | None] | None = None) -> BatchedRun:
    """`speculative_decode` of every prompt, `batch_size` rows at a time (see the module contract).
    cuda_graphs: replay the chain cycle as a CUDA graph where loop/graphed.py can capture it
    (else eager, the reason in `fallback`). generators: prompt i's random stream (`speculative_decode`'s
    `generator`), which its row's policy draws from (a sampling rule needs one per prompt)."""
    from eagle_eval.loop import graphed

    use_tree = topk > 1 if tree is None else tree
    d = num_draft_tokens or num_steps + 1
    results: list[Decoded | None] = [None] * len(prompts)
    run = BatchedRun(results, cuda_graphs=False)
    if not prompts:
        return run
    batch = max(1, min(batch_size, len(prompts)))
    rows = new_rows(spec, batch, capacity_for(prompts, max_new_tokens, num_steps, d))
    if use_tree and rows.drafts is not None:
        rows.drafts.propose_tree(num_steps, topk)                 # a kind that drafts chains only: refused there
    width = d if use_tree else num_steps + 1          # slots a cycle writes per row at its length
    draft_vocab = spec.head.to_target_ids(torch.arange(spec.head.config.draft_vocab_size, device=spec.draft_device))
    held: list[int | None] = [None] * batch           # the prompt each row holds
    queue = iter(range(len(prompts)))
    with spec.target.capture(spec.aux_hf, spec.draft_device) as capture:
        def fill(free: list[int]) -> None:
            """Give each free row the next prompt that needs cycles (prompts that end at their first
            token are done in their prefill), the rows' prefills batched (`prefill_groups`)."""
            start = time.perf_counter()
            for b in free:
                held[b] = None
            rows.park(free)
            while free:
                taken = sorted(itertools.islice(queue, len(free)), key=lambda i: len(prompts[i]))   # less padding
                if not taken:
                    break
                refill, k = [], 0
                for size in prefill_groups([len(prompts[i]) for i in taken]):
                    group, idx = free[k:k + size], taken[k:k + size]
                    k += size
                    for b, i in zip(group, idx):
                        rows.policy.seat(b, spec.policy.start(generators[i] if generators else None, draft_vocab))
                    admitted = admit(spec, rows, capture, group, [prompts[i] for i in idx], max_new_tokens, eos_ids)
                    for b, i, (decoded, alive) in zip(group, idx, admitted):
                        results[i] = decoded
                        if alive:
                            held[b] = i
                        else:
                            refill.append(b)
                free = refill + free[k:]
            run.prefill_s += time.perf_counter() - start

        fill(list(range(batch)))
        cycle = None
        while any(h is not None for h in held):
            rows.check_room(width)
            if use_tree:
                done = tree_cycle(spec, rows, capture, num_steps, topk, d)
                per_row = [(len(path) - 1, [t.tokens[i] for i in path[1:]] + [bonus]) for t, path, bonus in done]
            else:
                if cycle is None:
                    start = time.perf_counter()
                    cycle, run.cuda_graphs, run.fallback = graphed.cycle_runner(
                        lambda: chain_cycle(spec, rows, capture, num_steps), rows.state(), spec, cuda_graphs,
                        rows.policy.capture_blocker)
                    run.capture_s = time.perf_counter() - start
                accepted, new = (x.tolist() for x in cycle())
                per_row = [(n, toks[: n + 1]) for n, toks in zip(accepted, new)]
            run.cycles += 1
            finished = []
            for b, (n, tokens) in enumerate(per_row):
                if held[b] is None:
                    continue
                out = results[held[b]]
                rows.host_len[b] += n + 1
                out.accepted_per_cycle.append(n)
                if use_tree:
                    t, path, _ = done[b]
                    out.off_top1_per_cycle.append(not t.on_top1_chain(path))
                    out.tree_shape_per_cycle.append([t.depths.count(k) for k in range(1, max(t.depths) + 1)])
                if emit(out, tokens, max_new_tokens, eos_ids):
                    finished.append(b)
            if finished:
                fill(finished)
    return run
