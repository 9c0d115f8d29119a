"""The profile's drafting: the draft chain from every start pair, computing only the draft steps whose
result can still count.

Contract: `SparseChains` runs step 0 of every chain (one dense pass over every pair) and then, step by step,
step j only at the chains asked for, with the per-token math of `unroll.unroll_chains` (its all-starts
attention pattern: step j at position q attends to the real pairs 0..q-j and to its own chain's speculative
entries of steps 1..j). The token a step reads is the caller's: the true token (teacher-forced, what counts
for a greedy run length) or the chain's own previous draft (free-running, the loop's chain past a wrong
draft). A chain's step j needs its step j - 1, so the chains asked for at step j must have run step j - 1.

`chain_run_lengths` returns r [B, T], r[b, p] = the number of leading steps j of the greedy draft chain
started at real pair p whose draft equals the true token x_{p+2+j} (at most num_steps), exactly what
`profile.run_lengths_from_predictions` makes of `unroll.unroll_chains(argmax_only=True)`. A draft after a
wrong one never counts (r stops there), so step j is computed only for the chains whose steps 0..j-1 were
all right ("survivors"). With E = 1 + sum_j u_j steps per start on average (u_j = the rate of chains right up
to step j, tau - 1 = sum_j u_j), the head's cost falls from num_steps full passes to about E; untrained or
mismatched heads (u_1 ~ 0) cost one pass. The attention of a step j >= 1 runs over the real pairs of each
row for the chains asked for, packed per row ([B, n, T], n the most chains asked for in one row).
"""

from __future__ import annotations

import torch

from eagle_eval.heads.protocol import above


class SparseChains:
    """The draft chains of every start pair of a batch, one step at a time at the chains asked for.

    aux [B, T, k*H_t]: target features of x_0..x_{T-1}; token_embeds [B, T, H]: embeddings of x_1..x_T.
    `first` [B, T]: step 0's draft (target ids) at every pair q, the first draft of the chain started at q.
    `step(j, bi, qi, embeds)` runs step j at positions (bi, qi) (the chains started at qi - j), reading the
    embeddings `embeds` [N, H] of their step-j input tokens, and returns their drafts [N] (target ids);
    `step_out` the same step's hidden outputs [N, H] (the draft's logits are `head.lm` of them)."""

    @torch.no_grad()
    def __init__(self, head, aux: torch.Tensor, token_embeds: torch.Tensor, position_offset: int = 0):
        attn = head.attention
        self.head, self.position_offset = head, position_offset
        b, t, _ = token_embeds.shape
        self.shape, self.device = (b, t), token_embeds.device
        self.q_idx = torch.arange(t, device=self.device)
        positions = self.q_idx[None].expand(b, t)
        u, residual = head.attention_input(token_embeds, head.fuse(aux), positions)
        cos, sin = head.rope(positions)
        q, k, v = attn.project(u, cos, sin)
        causal = torch.ones(t, t, dtype=torch.bool, device=self.device).tril()
        self.keys0, self.values0 = {}, {}      # layer -> its real pairs' keys/values [B, h, T, d] (GQA expanded)

        def attend(layer, attn, q, k, v, u):
            self.keys0[layer], self.values0[layer] = attn.expand_kv(k), attn.expand_kv(v)
            return attn.attend(q, k, v, causal, u)

        out = above(head, head.finish(residual, attend(0, attn, q, k, v, u)), cos, sin, attend)   # [B, T, H]
        self.first = head.to_target_ids(head.lm(out).argmax(-1))                   # [B, T]
        self.outs = [out]                      # step j's out, dense [B, T, H] (zeros where not run)
        self.spec_k: dict[int, list[torch.Tensor]] = {}   # layer -> step i >= 1: dense [B, h, T, d], set where it ran
        self.spec_v: dict[int, list[torch.Tensor]] = {}

    @torch.no_grad()
    def step(self, j: int, bi: torch.Tensor, qi: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        if bi.numel() == 0:
            return torch.zeros(0, dtype=torch.long, device=self.device)
        return self.head.to_target_ids(self.head.lm(self.step_out(j, bi, qi, embeds)).argmax(-1))

    @torch.no_grad()
    def step_out(self, j: int, bi: torch.Tensor, qi: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """`step`'s hidden output [N, H] (its draft is the argmax of `head.lm` of it); bi non-empty."""
        head, attn = self.head, self.head.attention
        b, t = self.shape
        positions = (qi + self.position_offset)[None]                                             # [1, N]
        u, residual = head.attention_input(embeds[None], self.outs[j - 1][bi, qi - 1][None], positions)  # [1, N, *]
        cos, sin = head.rope(positions)
        qs, ks, vs = attn.project(u, cos, sin)
        # real pairs s <= q - j, through per-row packed [B, h, n, T] scores (n: the most chains asked for in one
        # row; bi ascending, as nonzero gives it)
        slot = rank_in_row(bi, b)
        n = int(slot.max()) + 1
        first_call = len(self.outs) <= j

        def attend(layer, attn, qs, ks, vs, u):
            """Layer `layer`'s attention of step j at the chains asked for (every layer: the same pattern)."""
            qs = qs[0].transpose(0, 1)                                                     # [N, h, d]
            ks, vs = attn.expand_kv(ks)[0].transpose(0, 1), attn.expand_kv(vs)[0].transpose(0, 1)
            packed_q = torch.zeros(b, qs.shape[1], n, qs.shape[2], dtype=qs.dtype, device=self.device)
            packed_q[bi, :, slot] = qs
            real = torch.matmul(packed_q, self.keys0[layer].transpose(-1, -2))[bi, :, slot] * attn.scale  # [N, h, T]
            real = real.masked_fill(self.q_idx[None, None, :] > (qi - j)[:, None, None], float("-inf"))
            # the chain's own speculative entries: step i's key at q - (j - i), i = 1..j (i = j: this step's)
            spec_k, spec_v = self.spec_k.setdefault(layer, []), self.spec_v.setdefault(layer, [])
            own_k = torch.stack([spec_k[i - 1][bi, :, qi - (j - i)] for i in range(1, j)] + [ks], dim=2)
            own_v = torch.stack([spec_v[i - 1][bi, :, qi - (j - i)] for i in range(1, j)] + [vs], dim=2)
            spec = (qs[:, :, None, :] * own_k).sum(-1) * attn.scale                      # [N, h, j]
            probs = torch.softmax(torch.cat([real, spec], dim=-1).float(), dim=-1).to(qs.dtype)
            packed_p = torch.zeros(b, qs.shape[1], n, t, dtype=qs.dtype, device=self.device)
            packed_p[bi, :, slot] = probs[..., :t]
            ctx = torch.matmul(packed_p, self.values0[layer])[bi, :, slot] + (probs[..., t:, None] * own_v).sum(-2)
            if first_call:                        # a step's first call: its dense stores
                spec_k.append(torch.zeros(b, ks.shape[1], t, ks.shape[2], dtype=ks.dtype, device=self.device))
                spec_v.append(torch.zeros(b, vs.shape[1], t, vs.shape[2], dtype=vs.dtype, device=self.device))
            spec_k[j - 1][bi, :, qi] = ks
            spec_v[j - 1][bi, :, qi] = vs
            return attn.o_proj(ctx.reshape(ctx.shape[0], -1), u[0])[None]                  # [1, N, H]

        out = above(head, head.finish(residual, attend(0, attn, qs, ks, vs, u)), cos, sin, attend)[0]   # [N, H]
        if first_call:
            self.outs.append(torch.zeros_like(self.outs[0]))
        self.outs[j][bi, qi] = out
        return out


@torch.no_grad()
def chain_run_lengths(head, aux: torch.Tensor, token_embeds: torch.Tensor, tokens: torch.Tensor,
                      lengths: torch.Tensor, num_steps: int, position_offset: int = 0) -> torch.Tensor:
    """aux [B, T, k*H_t]: target features of x_0..x_{T-1}; token_embeds [B, T, H]: embeddings of
    x_1..x_T; tokens [B, T+1]: x_0..x_T; lengths [B]: real tokens per row (right padding after).
    Returns r [B, T] (long); entries at p >= lengths[b] - 1 are 0 or garbage."""
    b, t, _ = token_embeds.shape
    device = token_embeds.device
    q_idx = torch.arange(t, device=device)
    # truth[b, q] = x_{q+2}, the token the draft at pair q predicts; -1 (never drafted) past the row's end
    truth = torch.cat([tokens[:, 2:], torch.full((b, 1), -1, dtype=tokens.dtype, device=device)], dim=1)[:, :t]
    truth = truth.masked_fill(q_idx[None] + 2 >= lengths.to(device)[:, None], -1)
    chains = SparseChains(head, aux, token_embeds, position_offset)
    hit = chains.first == truth                                                      # [B, T]: step 0 at q
    runs = hit.long()
    for j in range(1, num_steps):
        alive = torch.zeros_like(hit)
        alive[:, 1:] = hit[:, :-1]               # chain at q - 1 right so far -> its next step runs at q
        bi, qi = alive.nonzero(as_tuple=True)                                        # (host sync)
        if bi.numel() == 0:
            break
        step_hit = chains.step(j, bi, qi, token_embeds[bi, qi]) == truth[bi, qi]
        runs[bi, qi - j] += step_hit.long()
        hit = torch.zeros_like(hit)
        hit[bi, qi] = step_hit
    return runs


def rank_in_row(rows: torch.Tensor, count: int) -> torch.Tensor:
    """rows [N] ascending -> the index of each entry among those of its row.

    >>> rank_in_row(torch.tensor([0, 0, 2, 2, 2]), 3).tolist()
    [0, 1, 0, 1, 2]
    """
    per_row = torch.bincount(rows, minlength=count)
    return torch.arange(rows.shape[0], device=rows.device) - (per_row.cumsum(0) - per_row)[rows]
