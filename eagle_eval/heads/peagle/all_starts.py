"""A P-EAGLE head at every start of one sequence at once: the teacher-forced form the profile runs
(profile/teacher_forced.py asks the drafting state class for `run_lengths`).

Contract: for a sequence x_0..x_{n-1} whose tapped target states are `aux` [1, n, k*H_t], the cycle whose root is
x_s (position s) drafts from the real pairs 0..s-1 (pair t = features of x_t with x_{t+1}) and num_steps - 1 mask
rows at positions s..s+num_steps-2 (state.py `ParallelDraftState.propose_chain`): nothing else. So every start is
one forward: the real pairs' layer once over the whole sequence (the head's `step`, causal), then the mask rows of
all P starts together, each seeing the real pairs before its start and its own earlier mask rows (chunked so that
P x n key rows stay within `max_keys`).
- `parallel_drafts(head, embed, aux, tokens, anchors, num_steps)` -> greedy drafts [P, num_steps] (target ids);
- `run_lengths(...)` -> r [P]: the leading drafts equal to x_{s+1}..x_{s+num_steps} (a draft past the sequence
  counts as wrong): the greedy loop's accepted drafts at a cycle whose root is s.
A slot's draft does not depend on num_steps (causal): the drafts for S are the first S of a longer chain's.
"""

from __future__ import annotations

import torch

from eagle_eval.heads.eagle3.layer import DraftCache
from eagle_eval.heads.protocol import above
from eagle_eval.heads.peagle.slots import mask_rows

MAX_KEYS = 1 << 20


@torch.no_grad()
def parallel_drafts(head, embed, aux: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor, num_steps: int,
                    max_keys: int = MAX_KEYS) -> torch.Tensor:
    """aux [1, n, k*H_t], tokens [n], anchors [P] (roots at 1 <= s < n) -> greedy drafts [P, num_steps]."""
    device, n = head.lm_head.weight.device, aux.shape[1]
    tokens, anchors = tokens.to(device), anchors.to(device)
    cache, attn = DraftCache(), head.attention
    outs = head.step(embed(tokens[None, 1:n]), head.fuse(aux[:, : n - 1].to(device)),
                     torch.arange(n - 1, device=device)[None], cache)                               # [1, n-1, H]
    count = num_steps - 1
    out = []
    for chunk in anchors.split(max(1, max_keys // (n + num_steps))):
        p = len(chunk)
        first = head.logits(outs[0, chunk - 1][:, None])[:, 0].argmax(-1)                           # [P]
        if not count:
            out.append(head.to_target_ids(first)[:, None])
            continue
        embeds, hidden = mask_rows(head, embed, p, count)
        positions = chunk[:, None] + torch.arange(count, device=device)                             # [P, K-1]
        u, residual = head.attention_input(embeds, hidden, positions)
        cos, sin = head.rope(positions)
        q, k, v = attn.project(u, cos, sin)
        real = torch.arange(n - 1, device=device)[None, None, :] < chunk[:, None, None]             # pairs t < s
        own = torch.ones(count, count, dtype=torch.bool, device=device).tril()[None]                # rows j <= i
        visible = torch.cat([real.expand(p, count, n - 1), own.expand(p, -1, -1)], dim=2)           # [P, K-1, keys]

        def attend(layer, attn, q, k, v, u, p=p):
            past = cache.layer(layer)                                # the real pairs' keys of this layer
            keys = torch.cat([past.keys.expand(p, -1, -1, -1), k], dim=2)                           # [P, kv, n-1+K-1, d]
            values = torch.cat([past.values.expand(p, -1, -1, -1), v], dim=2)
            return attn.attend(q, keys, values, visible[:, None], u)

        out_k = above(head, head.finish(residual, attend(0, attn, q, k, v, u)), cos, sin, attend)    # [P, K-1, H]
        rest = head.logits(out_k).argmax(-1)
        out.append(head.to_target_ids(torch.cat([first[:, None], rest], dim=1)))
    return torch.cat(out) if out else torch.zeros(0, num_steps, dtype=torch.long, device=device)


def run_lengths(head, embed, aux: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor, num_steps: int,
                max_keys: int = MAX_KEYS) -> torch.Tensor:
    """r [P]: the leading drafts of each start equal to x_{s+1}.. (module contract)."""
    drafts = parallel_drafts(head, embed, aux, tokens, anchors, num_steps, max_keys)                 # [P, S]
    at = anchors.to(drafts.device)[:, None] + 1 + torch.arange(num_steps, device=drafts.device)
    tokens = tokens.to(drafts.device)
    truth = torch.where(at < len(tokens), tokens[at.clamp(max=len(tokens) - 1)], torch.full_like(at, -1))
    return (drafts == truth).long().cumprod(dim=1).sum(dim=1)
