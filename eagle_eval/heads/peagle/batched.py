"""`ParallelRows`: a P-EAGLE head's side of the batched loop (loop/batched.py), B rows at once.

Contract (the batched loop's drafting form, as heads/dflash/batched.py `BlockRows`): the rows' real pairs live in a
fixed-capacity cache with one length per row (`lengths` [B]: row b's valid slots are 0..lengths[b]-1, slot =
position, as the target's rows in loop/rows.py), keys/values [B, kv_heads, capacity, head_dim], and beside them
the head's output at every slot (`outs` [B, capacity, H]), so a row's slot 0 is `outs[b, lengths[b] - 1]`. The
batched loop owns `lengths` and calls:
- `write(aux [B', T, k*H_t], base [B'], rows, next_ids [B', T])`: T real pairs per row (the target's features of
  the positions base[b].. with the token after each) at slots base[b]..base[b]+T-1, causal among themselves, full
  over the row's first base[b] slots (the head's `step`, every row at its own positions); pairs past what is later
  accepted lie past the row's length, overwritten by the next write, never attended;
- `propose(root [B], num_steps, policy, active) -> drafts [B, num_steps]` target ids: draft 1 from each row's
  slot 0, then ONE forward of num_steps - 1 mask rows per row at slots lengths[b].. (written past the length,
  overwritten by the verify's write), each seeing its row's real pairs and the mask rows before it; slot by slot
  the decode policy's batched `propose` (loop/policy.py RowPolicies);
- `propose_tree` is refused, as ParallelDraftState's.
Per row this is `ParallelDraftState`'s computation (state.py): the same pairs, positions, mask rows and draws.
"""

from __future__ import annotations

import torch

from eagle_eval.heads.protocol import above
from eagle_eval.heads.peagle.slots import TREES_REFUSED, mask_rows


class ParallelRows:
    """B rows of real pairs for a P-EAGLE head (module contract)."""

    def __init__(self, head, embed, batch: int, capacity: int, device):
        cfg, self.device = head.config, torch.device(device)
        self.head, self.embed, self.batch, self.capacity = head, embed, batch, capacity
        dtype = head.lm_head.weight.dtype
        self.lengths = torch.zeros(batch, dtype=torch.long, device=self.device)
        shape = (batch, cfg.num_key_value_heads, capacity, cfg.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=self.device)
        self.values = torch.zeros(shape, dtype=dtype, device=self.device)
        # the layers above the first of a multi-layer head: their own keys/values at the same slots
        self.upper = [(torch.zeros(shape, dtype=dtype, device=self.device),
                       torch.zeros(shape, dtype=dtype, device=self.device)) for _ in range(cfg.num_hidden_layers - 1)]
        self.outs = torch.zeros(batch, capacity, cfg.hidden_size, dtype=dtype, device=self.device)

    def _forward(self, embeds, hidden, base: torch.Tensor, rows) -> torch.Tensor:
        """The head's layer over T rows per row b of `rows` at slots base[b].., their K/V written there first;
        causal within, full over slots < base[b] -> out [B', T, H]."""
        head, attn = self.head, self.head.attention
        t = embeds.shape[1]
        slots = base[:, None] + torch.arange(t, device=self.device)                                # [B', T]
        u, residual = head.attention_input(embeds, hidden, slots)
        cos, sin = head.rope(slots)
        q, k, v = attn.project(u, cos, sin)
        visible = torch.arange(self.capacity, device=self.device)[None, None, :] <= slots[:, :, None]  # [B', T, L]

        def attend(layer, attn, q, k, v, u):
            all_k, all_v = (self.keys, self.values) if layer == 0 else self.upper[layer - 1]
            keys, values = all_k[rows], all_v[rows]                                                 # copies
            index = slots[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
            keys.scatter_(2, index, k)
            values.scatter_(2, index, v)
            all_k[rows], all_v[rows] = keys, values
            return attn.attend(q, keys, values, visible[:, None], u)

        return above(head, head.finish(residual, attend(0, attn, q, k, v, u)), cos, sin, attend)

    @torch.no_grad()
    def write(self, aux: torch.Tensor, base: torch.Tensor, rows, next_ids: torch.Tensor) -> None:
        """Real pairs (aux [B', T, k*H_t], next_ids [B', T]) of rows `rows` (a slice or an index tensor) at slots
        base[b] + t."""
        base = base.to(self.device)
        out = self._forward(self.embed(next_ids.to(self.device)), self.head.fuse(aux.to(self.device)), base, rows)
        slots = base[:, None] + torch.arange(out.shape[1], device=self.device)
        outs = self.outs[rows]
        outs.scatter_(1, slots[..., None].expand(-1, -1, out.shape[2]), out)
        self.outs[rows] = outs

    @torch.no_grad()
    def propose(self, root: torch.Tensor, num_steps: int, policy, active: torch.Tensor) -> torch.Tensor:
        """Every row's num_steps drafts (target ids [B, num_steps]) from one forward (module contract)."""
        head, every = self.head, torch.arange(self.batch, device=self.device)
        last = self.outs[every, (self.lengths - 1).clamp(min=0)][:, None]                          # [B, 1, H]
        drafts = [head.to_target_ids(policy.propose(head.logits(last)[:, -1], active))]            # [B]
        if num_steps > 1:
            embeds, hidden = mask_rows(head, self.embed, self.batch, num_steps - 1)
            logits = head.logits(self._forward(embeds, hidden, self.lengths, slice(None)))         # [B, K-1, V_d]
            drafts += [head.to_target_ids(policy.propose(logits[:, j], active)) for j in range(num_steps - 1)]
        return torch.stack(drafts, dim=1)

    def propose_tree(self, num_steps: int, topk: int):
        from eagle_eval.settings import ConfigError

        raise ConfigError(TREES_REFUSED.format(topk=topk))
