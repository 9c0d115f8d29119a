"""Drafting: what the head proposes, step by step (the loop) or from every start at once (the profile).

Contract: functions here take an `Eagle3Head`, fused or raw target features and token embeddings;
they never call the target. Pairing and positions follow EAGLE3.md section 3: pair t is
(target feature of x_t, token x_{t+1}) at RoPE position t; the k-th draft step after the last real
pair p runs at position p + k (+1 with `position_offset=1`, SGLang before PR #25015).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from eagle_eval.heads import DraftCache, Eagle3Head
from eagle_eval.tree import Pool, stable_top

EmbedFn = Callable[[torch.Tensor], torch.Tensor]   # token ids [B, T] -> embeddings [B, T, H]


class DraftState:
    """The draft's side of a decode: its KV cache over real pairs and the output of the last one.

    Invariant between cycles: `len(cache) == real_len`, the number of real pairs, which equals the
    target cache length (every verified token except the newest one, the root).
    """

    def __init__(self, head: Eagle3Head, embed: EmbedFn, position_offset: int = 0):
        self.head, self.embed, self.position_offset = head, embed, position_offset
        self.cache = DraftCache()
        self.last_out: torch.Tensor | None = None    # [1, 1, H]: out of the last real pair

    @property
    def real_len(self) -> int:
        return len(self.cache)

    @torch.no_grad()
    def extend(self, aux: torch.Tensor, next_ids: torch.Tensor) -> None:
        """Append real pairs: aux [1, n, k*H_t] target features of x_t, next_ids [1, n] = x_{t+1}."""
        start = self.real_len
        positions = torch.arange(start, start + aux.shape[1], device=aux.device)[None]
        out = self.head.step(self.embed(next_ids), self.head.fuse(aux), positions, self.cache)
        self.last_out = out[:, -1:]

    @torch.no_grad()
    def propose_chain(self, num_steps: int) -> torch.Tensor:
        """Greedy chain of `num_steps` drafts (target vocab ids, [num_steps]) from the last real pair.

        Runs num_steps - 1 head steps; their KV entries are speculative and dropped before returning
        (after each verify the draft is re-run on target features over the accepted tokens).
        """
        head, out = self.head, self.last_out
        real_len = self.real_len
        p = real_len - 1
        drafts = []
        for k in range(1, num_steps + 1):
            token = head.to_target_ids(head.logits(out)[:, -1].argmax(-1))     # [1]
            drafts.append(token)
            if k == num_steps:
                break
            positions = torch.tensor([[p + k + self.position_offset]], device=out.device)
            out = head.step(self.embed(token[:, None]), out, positions, self.cache)
        self.cache.rollback(real_len)
        return torch.cat(drafts)


    @torch.no_grad()
    def propose_tree(self, num_steps: int, topk: int) -> Pool:
        """The candidate pool of EAGLE3.md section 4: level 1 = top-K of the first distribution;
        each of the num_steps - 1 expansions runs the K frontier nodes (one forward, K queries at
        position p + level, each attending to the real pairs and to its own ancestors), scores their
        K children by parent score * child prob, and keeps the best K as the next frontier."""
        head, attn = self.head, self.head.midlayer.self_attn
        p, k = self.real_len - 1, topk
        probs = torch.softmax(head.logits(self.last_out)[0, -1], dim=-1)              # [V_d]
        top = stable_top(probs, k)
        pool = Pool(tokens=head.to_target_ids(top).tolist(), scores=probs[top].tolist(),
                    parents=[-1] * k, ranks=list(range(k)))
        frontier, scores = list(range(k)), probs[top]                                  # pool ids, [K]
        hidden = self.last_out.expand(1, k, -1)                                        # [1, K, H]
        ancestors = {i: [] for i in frontier}           # pool id -> speculative KV slots on its path
        spec_k = spec_v = None                                                         # [1, kv, n, d]
        for level in range(1, num_steps):
            tokens = torch.tensor([[pool.tokens[i] for i in frontier]], device=hidden.device)
            u, residual = head.attention_input(self.embed(tokens), hidden)
            positions = torch.full((1, k), p + level + self.position_offset, device=hidden.device)
            q, kk, vv = attn.project(u, *head.rope(positions))
            base = 0 if spec_k is None else spec_k.shape[2]
            spec_k = kk if spec_k is None else torch.cat([spec_k, kk], dim=2)
            spec_v = vv if spec_v is None else torch.cat([spec_v, vv], dim=2)
            paths = [ancestors[f] + [base + j] for j, f in enumerate(frontier)]
            mask = torch.zeros(k, self.real_len + base + k, dtype=torch.bool, device=hidden.device)
            mask[:, : self.real_len] = True
            for j, path in enumerate(paths):
                mask[j, [self.real_len + s for s in path]] = True
            keys = torch.cat([self.cache.keys, spec_k], dim=2)
            values = torch.cat([self.cache.values, spec_v], dim=2)
            out = head.finish(residual, attn.attend(q, keys, values, mask))            # [1, K, H]
            child_probs = torch.softmax(head.logits(out)[0], dim=-1)                   # [K, V_d]
            child_ids = torch.stack([stable_top(row, k) for row in child_probs])      # [K, K]
            child_scores = (scores[:, None] * child_probs.gather(1, child_ids)).flatten()   # [K*K]
            first = len(pool.tokens)
            pool.tokens += head.to_target_ids(child_ids.flatten()).tolist()
            pool.scores += child_scores.tolist()
            pool.parents += [f for f in frontier for _ in range(k)]
            pool.ranks += list(range(k)) * k
            best = stable_top(child_scores, k)
            for b, j in zip(best.tolist(), (best // k).tolist()):
                ancestors[first + b] = paths[j]
            frontier, scores = [first + b for b in best.tolist()], child_scores[best]
            hidden = out[:, best // k]
        return pool


def unroll_chains(head: Eagle3Head, aux: torch.Tensor, token_embeds: torch.Tensor,
                  num_steps: int, position_offset: int = 0) -> list[torch.Tensor]:
    """Run the draft chain from EVERY start pair at once (the training-time-test attention pattern).

    aux [B, T, k*H_t]: target features of x_0..x_{T-1}; token_embeds [B, T, H]: embeddings of
    x_1..x_T (the next token at each position). Returns `num_steps` logits tensors [B, T, V_d]
    (float32, draft vocab): step j's logits at position q are the (j+1)-th draft of the chain that
    starts at real pair p = q - j, teacher-forced on the true tokens, and predict x_{q+2}. Entries
    with q < j have no valid start and are garbage.

    Step j's query at position q attends to the real pairs 0..q-j and to the speculative entries of
    steps 1..j of its own chain (at positions q-j+1..q), exactly as the j-th step of the loop does.
    """
    attn = head.midlayer.self_attn
    b, t, _ = token_embeds.shape
    device = token_embeds.device
    positions = torch.arange(t, device=device)[None].expand(b, t)
    q_idx = torch.arange(t, device=device)
    scale = 1.0 / math.sqrt(attn.head_dim)

    hidden = head.fuse(aux)                      # [B, T, H]
    keys, values = [], []                        # step i: [B, heads, T, d] (GQA expanded)
    logits = []
    for j in range(num_steps):
        if j > 0:                                # step j's hidden input is step j-1's out at q-1
            hidden = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)
        u, residual = head.attention_input(token_embeds, hidden)
        rope_pos = positions if j == 0 else positions + position_offset
        q, k, v = attn.project(u, *head.rope(rope_pos))
        keys.append(attn.expand_kv(k))
        values.append(attn.expand_kv(v))
        # scores over the real pairs (step 0's keys), s <= q - j
        real = torch.matmul(q, keys[0].transpose(-1, -2)) * scale            # [B, h, T, T]
        allowed = q_idx[None, :] <= (q_idx[:, None] - j)
        if j == 0:
            real = real.masked_fill(~allowed, float("-inf"))
            probs = torch.softmax(real.float(), dim=-1).to(q.dtype)
            ctx = torch.matmul(probs, values[0])
        else:
            # speculative entries: step i's key at position q - (j - i), i = 1..j
            spec_k = torch.stack([_shift(keys[i], j - i) for i in range(1, j + 1)], dim=-2)
            spec_v = torch.stack([_shift(values[i], j - i) for i in range(1, j + 1)], dim=-2)
            spec = (q.unsqueeze(-2) * spec_k).sum(-1) * scale                # [B, h, T, j]
            valid = q_idx >= j                                                # rows with a start
            real = real.masked_fill(~allowed & valid[:, None], float("-inf"))
            probs = torch.softmax(torch.cat([real, spec], dim=-1).float(), dim=-1).to(q.dtype)
            ctx = torch.matmul(probs[..., :t], values[0]) + \
                (probs[..., t:].unsqueeze(-1) * spec_v).sum(-2)
        ctx = attn.o_proj(ctx.transpose(1, 2).reshape(b, t, -1))
        out = head.finish(residual, ctx)
        logits.append(head.logits(out))
    return logits


def _shift(x: torch.Tensor, n: int) -> torch.Tensor:
    """x [B, h, T, d] -> y with y[..., q, :] = x[..., q - n, :] (zeros where q < n)."""
    if n == 0:
        return x
    return torch.cat([torch.zeros_like(x[..., :n, :]), x[..., :-n, :]], dim=-2)
