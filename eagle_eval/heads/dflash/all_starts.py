"""A block drafter at every start of one sequence at once: the teacher-forced form the profile runs
(profile/teacher_forced.py asks the drafting state class for `run_lengths`).

Contract: for a sequence x_0..x_{n-1} whose target states (the tapped layers) are `aux` [1, n, k*H_t], the cycle
whose anchor is x_s at position s drafts from the context rows 0..s-1 and the block [x_s, m x L] at positions
s..s+L (state.py `BlockDraftState.propose_chain` with L = num_steps): nothing else. So the draft of every start is
ONE block forward over one context (dflash/model.py `block` with P starts: each block sees the context rows before
its own start), chunked so that P x n key rows stay within `max_keys`.
- `block_drafts(head, embed, aux, tokens, anchors, num_steps)` -> drafts [P, L] (target ids): the greedy drafts of
  each start, DFlash2's selector walking each block from its anchor with its own choices (the loop's walk).
- `run_lengths(...)` -> r [P]: the leading drafts equal to the sequence's tokens x_{s+1}..x_{s+L} (a draft past
  the sequence counts as wrong): the greedy loop's accepted drafts at a cycle whose anchor is s, for this L.
The drafts depend on L (the block is non-causal: a block of L + 1 rows is not a prefix of a longer one), so a
profile runs one forward per L, not one for the longest L truncated.
"""

from __future__ import annotations

import torch

from eagle_eval.heads.dflash.bind import DFlashHead

MAX_KEYS = 1 << 20          # starts x context rows per block forward (the expanded keys of one chunk)


@torch.no_grad()
def block_drafts(head: DFlashHead, embed, aux: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor,
                 num_steps: int, max_keys: int = MAX_KEYS) -> torch.Tensor:
    """aux [1, n, k*H_t], tokens [n] (x_0..x_{n-1}), anchors [P] (positions s < n) -> greedy drafts [P, num_steps]."""
    drafter, device = head.drafter, head.device
    n = aux.shape[1]
    context = head.context_kv(aux.to(device), torch.arange(n, device=device))
    anchors, tokens = anchors.to(device), tokens.to(device)
    selector = drafter.candidate_selector
    out = []
    for chunk in anchors.split(max(1, max_keys // (n + num_steps + 1))):
        ids = torch.full((len(chunk), num_steps + 1), head.config.mask_token_id, dtype=torch.long, device=device)
        ids[:, 0] = tokens[chunk]
        y = drafter.block(embed(ids), chunk, context)[:, 1:]                                       # [P, L, H]
        logits = head.logits(y)                                                                    # [P, L, V_d]
        if selector is None:
            out.append(head.to_target_ids(logits.argmax(-1)))
            continue
        drafts, previous = [], tokens[chunk]
        for j in range(num_steps):
            previous = head.to_target_ids(selector.scores_rows(logits[:, j], y[:, j], previous).argmax(-1))
            drafts.append(previous)
        out.append(torch.stack(drafts, dim=1))
    return torch.cat(out) if out else torch.zeros(0, num_steps, dtype=torch.long, device=device)


def run_lengths(head: DFlashHead, embed, aux: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor,
                num_steps: int, max_keys: int = MAX_KEYS) -> torch.Tensor:
    """r [P]: the leading drafts of each start equal to x_{s+1}.. (module contract)."""
    drafts = block_drafts(head, embed, aux, tokens, anchors, num_steps, max_keys)                  # [P, L]
    at = anchors.to(drafts.device)[:, None] + 1 + torch.arange(num_steps, device=drafts.device)    # [P, L]
    tokens = tokens.to(drafts.device)
    truth = torch.where(at < len(tokens), tokens[at.clamp(max=len(tokens) - 1)], torch.full_like(at, -1))
    return (drafts == truth).long().cumprod(dim=1).sum(dim=1)
