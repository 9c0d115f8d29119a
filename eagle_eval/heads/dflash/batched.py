"""`BlockRows`: a block drafter's side of the batched loop (loop/batched.py), B rows at once.

Contract: the rows' context K/V live in a fixed-capacity cache with one length per row (`lengths` [B]: row b's valid
slots are 0..lengths[b]-1, slot = absolute position, as the target's rows in loop/rows.py), per draft layer
keys/values [B, kv_heads, capacity, head_dim]. The batched loop owns `lengths` (it parks rows, advances them by the
accepted tokens + 1, and reads them as the draft cache's) and calls:
- `write(aux [B', T, k*H_t], base [B'], rows, next_ids)`: the context K/V of T positions per row at slots
  base[b]..base[b]+T-1 (dflash/model.py `context_kv` in the head's convention, every row at its own positions;
  next_ids is not read); slots past what is later accepted are garbage past the row's length, overwritten by the
  next write, never attended;
- `propose(root [B], num_steps, policy, active) -> drafts [B, num_steps]` target ids: ONE block forward for every
  row over [root, mask x num_steps] at positions lengths[b].., each row attending its own context slots
  < lengths[b] and its whole block (dflash/model.py `block` with per-row contexts: the masks it builds hide exactly
  the slots past each row's start), then slot by slot the decode policy's batched `propose` (loop/policy.py
  RowPolicies), DFlash2 through the candidate selector given each row's previous choice;
- `propose_tree` is refused, as BlockDraftState's.
Per row this is `BlockDraftState`'s computation (state.py): the same context rows, block, positions and the
policy's draws in the same order, so the batched loop's records equal the reference loop's (tests/
test_batched_generated.py).
"""

from __future__ import annotations

import torch

from eagle_eval.heads.dflash.bind import DFlashHead
from eagle_eval.heads.dflash.config import TREES_REFUSED


class BlockRows:
    """B rows of context K/V for a block drafter (module contract)."""

    def __init__(self, head: DFlashHead, embed, batch: int, capacity: int, device):
        self.head, self.embed = head, embed
        self.batch, self.capacity, self.device = batch, capacity, torch.device(device)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=self.device)
        self.context: list[tuple[torch.Tensor, torch.Tensor]] | None = None   # per layer [B, kv, capacity, d]

    @torch.no_grad()
    def write(self, aux: torch.Tensor, base: torch.Tensor, rows: slice | torch.Tensor, next_ids=None) -> None:
        """Context K/V of aux [B', T, k*H_t] (rows `rows`: a slice or an index tensor) at slots base[b] + t; the
        tokens after them (`next_ids`, what an EAGLE-style drafter pairs with them) are not read: the context rows
        are the target's states alone."""
        drafter, t = self.head.drafter, aux.shape[1]
        slots = base.to(self.device)[:, None] + torch.arange(t, device=self.device)                # [B', T]
        c = drafter.context(aux.to(self.device))                                                     # [B', T, H]
        cos, sin = drafter.rope(slots)                                                               # [B', 1, T, d]
        new = self.head.context_keys_values(c, cos, sin)                                           # [B', kv, T, d]
        if self.context is None:
            self.context = [tuple(torch.zeros(self.batch, x.shape[1], self.capacity, x.shape[3], dtype=x.dtype,
                                              device=self.device) for x in kv) for kv in new]
        index = slots[:, None, :, None]
        for (keys, values), (k, v) in zip(self.context, new):
            for buf, x in ((keys, k), (values, v)):
                part = buf[rows]
                part.scatter_(2, index.expand(-1, x.shape[1], -1, x.shape[3]), x)
                if not isinstance(rows, slice):                # an index tensor selects a copy: put it back
                    buf.index_copy_(0, rows.to(self.device), part)

    @torch.no_grad()
    def propose(self, root: torch.Tensor, num_steps: int, policy, active: torch.Tensor) -> torch.Tensor:
        """Every row's num_steps drafts (target ids [B, num_steps]) from one block forward (module contract)."""
        head = self.head
        if self.context is None:
            raise ValueError("propose before write: the block drafter's rows have no context yet")
        mask = torch.full((self.batch, num_steps), head.config.mask_token_id, dtype=torch.long, device=self.device)
        ids = torch.cat([root.to(self.device)[:, None], mask], dim=1)                                # [B, S+1]
        y = head.drafter.block(self.embed(ids), self.lengths, self.context)[:, 1:]                   # [B, S, H]
        logits = head.logits(y)                                                                      # [B, S, V_d]
        selector = head.drafter.candidate_selector
        drafts, previous = [], root.to(self.device)
        for j in range(num_steps):
            row = logits[:, j] if selector is None else selector.scores_rows(logits[:, j], y[:, j], previous)
            token = head.to_target_ids(policy.propose(row, active))                                 # [B]
            drafts.append(token)
            previous = token
        return torch.stack(drafts, dim=1)

    def propose_tree(self, num_steps: int, topk: int):
        from eagle_eval.settings import ConfigError

        raise ConfigError(TREES_REFUSED.format(topk=topk))
