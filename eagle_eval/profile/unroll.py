"""The draft from EVERY start pair at once: the training-time-test attention pattern the profile reproduces the
loop with (chains: `unroll_chains`; trees: `unroll_trees`, the candidate pools of `loop.draft.DraftState.propose_tree`
for every start).

Contract: functions here take a `DraftHead` (heads/protocol.py), fused or raw target features and token embeddings;
they never call the target. Pairing and positions are the loop's (loop/draft.py): pair t is (target feature of
x_t, token x_{t+1}) at RoPE position t; the k-th draft step after start pair p runs at position p + k (+1 with
`position_offset=1`, SGLang before PR #25015).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from eagle_eval.heads.eagle3.config import DEEP_TREES_REFUSED
from eagle_eval.heads.protocol import above
from eagle_eval.loop.draft import EmbedFn
from eagle_eval.loop.tree import stable_top

if TYPE_CHECKING:                     # annotations only: the protocol costs the profile no import
    from eagle_eval.heads.protocol import DraftHead


def unroll_chains(head: DraftHead, aux: torch.Tensor, token_embeds: torch.Tensor,
                  num_steps: int, position_offset: int = 0, argmax_only: bool = False,
                  feed: Callable[[int, torch.Tensor], torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Run the draft chain from EVERY start pair at once (the training-time-test attention pattern).

    aux [B, T, k*H_t]: target features of x_0..x_{T-1}; token_embeds [B, T, H]: embeddings of
    x_1..x_T (the next token at each position). Returns `num_steps` logits tensors [B, T, V_d]
    (float32, draft vocab): step j's logits at position q are the (j+1)-th draft of the chain that
    starts at real pair p = q - j, teacher-forced on the true tokens, and predict x_{q+2}. Entries
    with q < j have no valid start and are garbage. With `argmax_only`, each step gives the drafted
    target ids [B, T] instead (no [B, T, V_d] float32 tensor is kept).

    Step j's query at position q attends to the real pairs 0..q-j and to the speculative entries of
    steps 1..j of its own chain (at positions q-j+1..q), exactly as the j-th step of the loop does.

    `feed(j, logits)`: the token embeddings [B, T, H] of step j >= 1 from step j-1's logits [B, T, V_d] (head dtype)
    (feeding each chain its own previous draft gives the loop's chain past a wrong draft; the profile at
    T > 0 runs that through `run_lengths.SparseChains`, tests/test_batched.py checks the two agree);
    None = teacher-forced on the true tokens (what counts for a greedy run length is the same).
    """
    attn = head.attention
    b, t, _ = token_embeds.shape
    device = token_embeds.device
    positions = torch.arange(t, device=device)[None].expand(b, t)
    q_idx = torch.arange(t, device=device)

    hidden = head.fuse(aux)                      # [B, T, H]
    out = hidden                                 # step j > 0 reads the previous step's out
    keys, values = {}, {}                        # layer -> step i: [B, heads, T, d] (GQA expanded)
    logits = []
    for j in range(num_steps):
        if j > 0:                                # step j's hidden input is step j-1's out at q-1
            hidden = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)
        rope_pos = positions if j == 0 else positions + position_offset
        u, residual = head.attention_input(token_embeds, hidden, rope_pos)
        cos, sin = head.rope(rope_pos)
        q, k, v = attn.project(u, cos, sin)

        def attend(layer, attn, q, k, v, u, j=j):
            """Layer `layer`'s attention of step j (every layer of a multi-layer head: the same pattern)."""
            scale = attn.scale                   # qk_head_dim^-0.5, times mscale^2 for MLA yarn
            keys_l, values_l = keys.setdefault(layer, []), values.setdefault(layer, [])
            keys_l.append(attn.expand_kv(k))
            values_l.append(attn.expand_kv(v))
            # scores over the real pairs (step 0's keys), s <= q - j
            real = torch.matmul(q, keys_l[0].transpose(-1, -2)) * scale          # [B, h, T, T]
            allowed = q_idx[None, :] <= (q_idx[:, None] - j)
            if j == 0:
                real = real.masked_fill(~allowed, float("-inf"))
                probs = torch.softmax(real.float(), dim=-1).to(q.dtype)
                ctx = torch.matmul(probs, values_l[0])
            else:
                # speculative entries: step i's key at position q - (j - i), i = 1..j
                spec_k = torch.stack([_shift(keys_l[i], j - i) for i in range(1, j + 1)], dim=-2)
                spec_v = torch.stack([_shift(values_l[i], j - i) for i in range(1, j + 1)], dim=-2)
                spec = (q.unsqueeze(-2) * spec_k).sum(-1) * scale                # [B, h, T, j]
                valid = q_idx >= j                                                # rows with a start
                real = real.masked_fill(~allowed & valid[:, None], float("-inf"))
                probs = torch.softmax(torch.cat([real, spec], dim=-1).float(), dim=-1).to(q.dtype)
                ctx = torch.matmul(probs[..., :t], values_l[0]) + \
                    (probs[..., t:].unsqueeze(-1) * spec_v).sum(-2)
            return attn.o_proj(ctx.transpose(1, 2).reshape(b, t, -1), u)

        out = above(head, head.finish(residual, attend(0, attn, q, k, v, u)), cos, sin, attend)
        step = head.lm(out)
        logits.append(head.to_target_ids(step.argmax(-1)) if argmax_only else step.float())
        if feed is not None and j + 1 < num_steps:
            token_embeds = feed(j + 1, step)
    return logits


def _shift(x: torch.Tensor, n: int) -> torch.Tensor:
    """x [B, h, T, d] -> y with y[..., q, :] = x[..., q - n, :] (zeros where q < n)."""
    if n == 0:
        return x
    return torch.cat([torch.zeros_like(x[..., :n, :]), x[..., :-n, :]], dim=-2)


@dataclass
class TreePools:
    """The candidate pools of `propose_tree`, for every start pair at once: tensors [P, N], pool order
    as in `tree.Pool` (level 1, then K^2 per later level)."""
    tokens: torch.Tensor      # target ids
    scores: torch.Tensor      # products of draft probabilities (float32)
    parents: torch.Tensor     # pool index of the parent, -1 = root
    ranks: torch.Tensor       # child rank among its parent's K children
    depths: torch.Tensor      # level, 1..num_steps


@torch.no_grad()
def unroll_trees(head: DraftHead, aux: torch.Tensor, token_embeds: torch.Tensor, embed: EmbedFn,
                 starts: torch.Tensor, num_steps: int, topk: int, position_offset: int = 0) -> TreePools:
    """`propose_tree` from every start pair in `starts` [P] at once (batch of one sequence).

    aux [1, T, k*H_t], token_embeds [1, T, H] as in `unroll_chains`. Each frontier node of start p at
    level l runs at position p + l and attends to the real pairs 0..p, to the speculative entries of its
    own ancestors and to itself, exactly as in the loop.
    """
    attn = head.attention
    if getattr(head, "depth", 1) > 1:
        raise ValueError(DEEP_TREES_REFUSED.format(topk=topk, depth=head.depth))
    t, device, k = token_embeds.shape[1], token_embeds.device, topk
    scale = attn.scale                           # qk_head_dim^-0.5, times mscale^2 for MLA yarn
    real_pos = torch.arange(t, device=device)[None]
    u, residual = head.attention_input(token_embeds, head.fuse(aux), real_pos)
    q, kk, vv = attn.project(u, *head.rope(real_pos))
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    out0 = head.finish(residual, attn.attend(q, kk, vv, causal, u))[0]              # [T, H]
    keys0, values0 = attn.expand_kv(kk)[0], attn.expand_kv(vv)[0]                   # [h, T, d]
    p = starts.numel()
    real = torch.arange(t, device=device)[None] <= starts[:, None]                   # [P, T]

    def top(probs):                                                                 # stable top-k, last dim
        idx = stable_top(probs, k)
        return probs.gather(-1, idx), idx

    top_p, top_i = top(torch.softmax(head.logits(out0[starts]), dim=-1))            # [P, K]
    tokens, scores = [head.to_target_ids(top_i)], [top_p]
    parents = [torch.full((p, k), -1, device=device)]
    ranks = [torch.arange(k, device=device).expand(p, k)]
    depths = [torch.ones(p, k, dtype=torch.long, device=device)]
    frontier, f_scores = torch.arange(k, device=device).expand(p, k), top_p
    hidden = out0[starts][:, None].expand(p, k, -1)                                 # [P, K, H]
    anc_k = anc_v = None                                                            # [P, K, h, L, d]
    for level in range(1, num_steps):
        f_tokens = torch.cat(tokens, dim=1).gather(1, frontier)                     # [P, K]
        pos = (starts + level + position_offset)[:, None].expand(p, k)
        u, residual = head.attention_input(embed(f_tokens), hidden, pos)
        q, kk, vv = attn.project(u, *head.rope(pos))                                # q [P, h, K, d]
        kk, vv = attn.expand_kv(kk), attn.expand_kv(vv)                             # [P, h, K, d]
        s_real = torch.einsum("phkd,htd->phkt", q, keys0) * scale
        s_real = s_real.masked_fill(~real[:, None, None, :], float("-inf"))
        s_self = (q * kk).sum(-1, keepdim=True) * scale                             # [P, h, K, 1]
        parts = [s_real] + ([torch.einsum("phkd,pkhld->phkl", q, anc_k) * scale] if anc_k is not None else [])
        w = torch.softmax(torch.cat(parts + [s_self], dim=-1).float(), dim=-1).to(q.dtype)
        ctx = torch.einsum("phkt,htd->phkd", w[..., :t], values0) + w[..., -1:] * vv
        if anc_v is not None:
            ctx = ctx + torch.einsum("phkl,pkhld->phkd", w[..., t:-1], anc_v)
        ctx = attn.o_proj(ctx.transpose(1, 2).reshape(p, k, -1), u)
        out = head.finish(residual, ctx)                                            # [P, K, H]
        c_p, c_i = top(torch.softmax(head.logits(out), dim=-1))                     # [P, K, K]
        cand = (f_scores[..., None] * c_p).reshape(p, k * k)
        first = sum(x.shape[1] for x in tokens)
        tokens.append(head.to_target_ids(c_i).reshape(p, k * k))
        scores.append(cand)
        parents.append(frontier.repeat_interleave(k, dim=1))
        ranks.append(torch.arange(k, device=device).repeat(k).expand(p, k * k))
        depths.append(torch.full((p, k * k), level + 1, dtype=torch.long, device=device))
        best = torch.sort(cand, dim=-1, descending=True, stable=True).indices[:, :k]    # [P, K]
        slot = best // k                                                            # parent's frontier slot
        own_k = kk.permute(0, 2, 1, 3)[:, :, :, None]                               # [P, K, h, 1, d]
        own_v = vv.permute(0, 2, 1, 3)[:, :, :, None]
        new_k = own_k if anc_k is None else torch.cat([anc_k, own_k], dim=3)
        new_v = own_v if anc_v is None else torch.cat([anc_v, own_v], dim=3)
        pick = slot[:, :, None, None, None]                  # keys and values may differ in width (MLA)
        anc_k = new_k.gather(1, pick.expand(-1, -1, *new_k.shape[2:]))
        anc_v = new_v.gather(1, pick.expand(-1, -1, *new_v.shape[2:]))
        hidden = out.gather(1, slot[..., None].expand(-1, -1, out.shape[-1]))
        frontier, f_scores = first + best, cand.gather(1, best)
    cat = lambda xs: torch.cat(xs, dim=1)
    return TreePools(cat(tokens), cat(scores), cat(parents), cat(ranks), cat(depths))
