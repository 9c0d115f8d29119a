"""Drafting in the loop: what the head proposes from the last real pair, step by step (chains) or as the top-k
tree, over the draft's own KV cache (the profile's all-starts form is profile/unroll.py).

Contract: functions here take a `DraftHead` (heads/protocol.py: the Llama-style and MLA heads),
fused or raw target features and token embeddings;
they never call the target. Pairing and positions follow docs/eagle3.md section 3: pair t is
(target feature of x_t, token x_{t+1}) at RoPE position t; the k-th draft step after the last real
pair p runs at position p + k (+1 with `position_offset=1`, SGLang before PR #25015).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from eagle_eval.heads.eagle3.config import DEEP_TREES_REFUSED
from eagle_eval.heads.eagle3.layer import DraftCache
from eagle_eval.loop.tree import Pool, stable_top

if TYPE_CHECKING:                     # annotations only: the protocol costs the loop no import
    from eagle_eval.heads.protocol import DraftHead

EmbedFn = Callable[[torch.Tensor], torch.Tensor]   # token ids [B, T] -> embeddings [B, T, H]


class DraftState:
    """The draft's side of a decode: its KV cache over real pairs and the output of the last one.

    Invariant between cycles: `len(cache) == real_len`, the number of real pairs, which equals the
    target cache length (every verified token except the newest one, the root).
    """

    def __init__(self, head: DraftHead, embed: EmbedFn, position_offset: int = 0, policy=None):
        from eagle_eval.loop.policy import GREEDY

        self.head, self.embed, self.position_offset = head, embed, position_offset
        self.policy = policy or GREEDY
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
        """A chain of `num_steps` drafts (target vocab ids, [num_steps]) from the last real pair, each step's
        token the policy's proposal (greedy: the draft's argmax).

        Runs num_steps - 1 head steps; their KV entries are speculative and dropped before returning
        (after each verify the draft is re-run on target features over the accepted tokens).
        """
        head, out = self.head, self.last_out
        real_len = self.real_len
        p = real_len - 1
        drafts = []
        for k in range(1, num_steps + 1):
            token = head.to_target_ids(self.policy.propose(head.logits(out)[:, -1]))     # [1]
            drafts.append(token)
            if k == num_steps:
                break
            positions = torch.tensor([[p + k + self.position_offset]], device=out.device)
            out = head.step(self.embed(token[:, None]), out, positions, self.cache)
        self.cache.rollback(real_len)
        return torch.cat(drafts)


    @torch.no_grad()
    def propose_tree(self, num_steps: int, topk: int) -> Pool:
        """The candidate pool of docs/eagle3.md section 4: level 1 = top-K of the first distribution;
        each of the num_steps - 1 expansions runs the K frontier nodes (one forward, K queries at
        position p + level, each attending to the real pairs and to its own ancestors), scores their
        K children by parent score * child prob, and keeps the best K as the next frontier."""
        head, attn = self.head, self.head.attention
        if getattr(head, "depth", 1) > 1:
            raise ValueError(DEEP_TREES_REFUSED.format(topk=topk, depth=head.depth))
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
            positions = torch.full((1, k), p + level + self.position_offset, device=hidden.device)
            u, residual = head.attention_input(self.embed(tokens), hidden, positions)
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
            out = head.finish(residual, attn.attend(q, keys, values, mask, u))         # [1, K, H]
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
