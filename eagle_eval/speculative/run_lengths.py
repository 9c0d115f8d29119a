"""The profile's drafting: how many drafts in a row are right from every start pair, computing only
the draft steps whose result can still count.

Contract: `chain_run_lengths` returns r [B, T], r[b, p] = the number of leading steps j of the greedy
draft chain started at real pair p whose draft equals the true token x_{p+2+j} (at most num_steps),
exactly what `profile.run_lengths_from_predictions` makes of `draft.unroll_chains(argmax_only=True)`:
the same per-token math (the all-starts attention pattern of `unroll_chains`: step j at position q
attends to the real pairs 0..q-j and to its own chain's speculative entries of steps 1..j). The
difference is the work: a draft after a wrong one never counts (r stops there), so step j is computed
only for the chains whose steps 0..j-1 were all right ("survivors"). Step 0 runs over every pair; the
projections, MLP and lm_head of step j >= 1 run over the survivors only, and the loop stops when none
is left. With E = 1 + sum_j u_j steps per start on average (u_j = the rate of chains right up to step
j, tau - 1 = sum_j u_j), the head's cost falls from num_steps full passes to about E; untrained or
mismatched heads (u_1 ~ 0) cost one pass. The attention of a step j >= 1 stays dense over [B, T, T]
(scores of non-survivors are computed and dropped): it is a small part of the step.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def chain_run_lengths(head, aux: torch.Tensor, token_embeds: torch.Tensor, tokens: torch.Tensor,
                      lengths: torch.Tensor, num_steps: int, position_offset: int = 0) -> torch.Tensor:
    """aux [B, T, k*H_t]: target features of x_0..x_{T-1}; token_embeds [B, T, H]: embeddings of
    x_1..x_T; tokens [B, T+1]: x_0..x_T; lengths [B]: real tokens per row (right padding after).
    Returns r [B, T] (long); entries at p >= lengths[b] - 1 are 0 or garbage."""
    attn = head.attention
    b, t, _ = token_embeds.shape
    device = token_embeds.device
    scale = attn.scale
    q_idx = torch.arange(t, device=device)
    # truth[b, q] = x_{q+2}, the token the draft at pair q predicts; -1 (never drafted) past the row's end
    truth = torch.cat([tokens[:, 2:], torch.full((b, 1), -1, dtype=tokens.dtype, device=device)], dim=1)[:, :t]
    truth = truth.masked_fill(q_idx[None] + 2 >= lengths.to(device)[:, None], -1)

    u, residual = head.attention_input(token_embeds, head.fuse(aux))
    q, k, v = attn.project(u, *head.rope(q_idx[None].expand(b, t)))
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    out = head.finish(residual, attn.attend(q, k, v, causal))                      # [B, T, H]
    hit = head.to_target_ids(head.lm(out).argmax(-1)) == truth                       # [B, T]: step 0 at q
    runs = hit.long()
    keys0, values0 = attn.expand_kv(k), attn.expand_kv(v)                           # [B, h, T, d]
    spec_k, spec_v = [], []                      # step i >= 1: dense [B, h, T, d], set at its survivors
    for j in range(1, num_steps):
        alive = torch.zeros_like(hit)
        alive[:, 1:] = hit[:, :-1]               # chain at q - 1 right so far -> its next step runs at q
        flat = alive.flatten().nonzero()[:, 0]                                       # [N] (host sync)
        if flat.numel() == 0:
            break
        bi, qi = flat // t, flat % t
        u, residual = head.attention_input(token_embeds[bi, qi][None], out[bi, qi - 1][None])     # [1, N, *]
        qs, ks, vs = attn.project(u, *head.rope((qi + position_offset)[None]))
        qs, ks, vs = qs[0].transpose(0, 1), attn.expand_kv(ks)[0].transpose(0, 1), attn.expand_kv(vs)[0].transpose(0, 1)
        # qs [N, h, d]; real pairs s <= q - j, through dense [B, h, T, T] scores read at the survivors
        dense_q = torch.zeros(b, qs.shape[1], t, qs.shape[2], dtype=qs.dtype, device=device)
        dense_q[bi, :, qi] = qs
        real = torch.matmul(dense_q, keys0.transpose(-1, -2))[bi, :, qi] * scale      # [N, h, T]
        real = real.masked_fill(q_idx[None, None, :] > (qi - j)[:, None, None], float("-inf"))
        # the chain's own speculative entries: step i's key at q - (j - i), i = 1..j (i = j: this step's)
        own_k = torch.stack([spec_k[i - 1][bi, :, qi - (j - i)] for i in range(1, j)] + [ks], dim=2)
        own_v = torch.stack([spec_v[i - 1][bi, :, qi - (j - i)] for i in range(1, j)] + [vs], dim=2)
        spec = (qs[:, :, None, :] * own_k).sum(-1) * scale                           # [N, h, j]
        probs = torch.softmax(torch.cat([real, spec], dim=-1).float(), dim=-1).to(qs.dtype)
        dense_p = torch.zeros(b, qs.shape[1], t, t, dtype=qs.dtype, device=device)
        dense_p[bi, :, qi] = probs[..., :t]
        ctx = torch.matmul(dense_p, values0)[bi, :, qi] + (probs[..., t:, None] * own_v).sum(-2)   # [N, h, dv]
        step_out = head.finish(residual[0], attn.o_proj(ctx.reshape(ctx.shape[0], -1)))          # [N, H]
        step_hit = head.to_target_ids(head.lm(step_out).argmax(-1)) == truth[bi, qi]
        runs[bi, qi - j] += step_hit.long()
        out = torch.zeros_like(out)
        out[bi, qi] = step_out
        hit = torch.zeros_like(hit)
        hit[bi, qi] = step_hit
        for store, x in ((spec_k, ks), (spec_v, vs)):
            dense = torch.zeros(b, x.shape[1], t, x.shape[2], dtype=x.dtype, device=device)
            dense[bi, :, qi] = x
            store.append(dense)
    return runs
