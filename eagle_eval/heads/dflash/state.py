"""`BlockDraftState`: a block drafter's side of a decode, under the loop's drafting contract.

Contract: the same calls as loop/draft.py `DraftState`, so loop/reference.py `speculative_decode`
runs a DFlash drafter unchanged (`Speculator(..., draft_state=BlockDraftState)`):
- `real_len`: verified positions whose context K/V are held (== the target cache length between cycles);
- `extend(aux [1, n, k*H_t], next_ids [1, n])`: the target's tapped states of the n newly verified positions
  real_len..real_len+n-1 become context rows (bind.py `DFlashHead.context_kv`: dflash/model.py `context_kv` at their
  absolute positions, the keys normed in the head's convention, dflash/conventions.py); the anchor of the next
  block is next_ids[0, -1], the newest verified token (the loop's root);
- `propose_chain(num_steps) -> drafts [num_steps]` target ids: ONE draft forward over the block
  [anchor, mask x num_steps] at positions real_len..real_len+num_steps (a block of num_steps + 1 rows: the
  trained block when num_steps = block_size - 1, vLLM's num_speculative_tokens; any other length is a
  different, non-causal computation, not a prefix of the trained one), then each draft is the decode policy's
  `propose(logits [1, V_d])` of its row, in slot order, so every rule, T > 0 ones included, draws as for any
  chain. DFlash2's rows go through the candidate selector: slot j's logits become its candidates' scores given
  the token the policy chose for slot j - 1 (the anchor for slot 1).
- Nothing but the context persists: the block's K/V are never stored (z-lab crops its draft cache back to s
  after each draft, `_crop_to`; vLLM overwrites the block's slots), and `propose_chain` checks the context length
  is unchanged.
- `propose_tree` is refused: block drafters verify chains (vLLM and SGLang run DFlash with topk 1).

The batched loop (loop/batched.py) asks the drafting state's class for its batched form: `rows(head, embed, batch,
capacity, device)` gives dflash/batched.py `BlockRows` (the same computation for B rows over per-row context
caches), and `capture_blocker` says why that cycle is not replayed as a CUDA graph (loop/graphed.py). The
teacher-forced profile asks it for `run_lengths` (dflash/all_starts.py: every start of a sequence in one block
forward, once per num_steps, since the drafts depend on the block's length). `one_forward` tells the speedup model
(profile/costs.py, stats/advice.py) that a cycle's drafts cost one forward of num_steps + 1 rows, not num_steps.
"""

from __future__ import annotations

import torch

from eagle_eval.heads.dflash.bind import DFlashHead
from eagle_eval.heads.dflash.config import TREES_REFUSED
from eagle_eval.heads.dflash.model import ContextKV


class BlockDraftState:
    """Invariant between cycles: `real_len` context rows (positions 0..real_len-1) and the anchor at real_len."""

    # the batched loop's form (module contract); its cycle has fixed shapes but has not been captured and replayed
    # on a GPU here, so it runs eager
    capture_blocker = ("a block drafter's cycle (DFlash) is not captured as a CUDA graph (capture not measured on a "
                       "GPU yet): the loop runs eager")
    one_forward = True            # a cycle's num_steps drafts come from ONE block forward (the speedup model's cost)

    @staticmethod
    def rows(head: DFlashHead, embed, batch: int, capacity: int, device):
        from eagle_eval.heads.dflash.batched import BlockRows

        return BlockRows(head, embed, batch, capacity, device)

    @staticmethod
    def run_lengths(head: DFlashHead, embed, aux: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor,
                    num_steps: int) -> torch.Tensor:
        """The teacher-forced profile's form: the greedy run length of every start (dflash/all_starts.py)."""
        from eagle_eval.heads.dflash.all_starts import run_lengths

        return run_lengths(head, embed, aux, tokens, anchors, num_steps)

    def __init__(self, head: DFlashHead, embed, position_offset: int = 0, policy=None):
        """head: dflash/bind.py DFlashHead; embed: token ids [B, T] -> [B, T, H] (the head's own `embed`: raw rows
        x input_embedding_scale); policy: the decode's started policy (loop/policy.py), required here."""
        if policy is None:
            raise ValueError("a block draft state drafts through the decode policy: pass the started policy")
        if position_offset:
            raise ValueError(f"position_offset={position_offset}: SGLang's old EAGLE-3 draft positions; a block "
                             "drafter runs at the verified positions s..s+B-1 in every engine")
        self.head, self.embed, self.policy = head, embed, policy
        self.context: ContextKV | None = None            # per draft layer k, v [1, kv_heads, real_len, head_dim]
        self.anchor: int | None = None

    @property
    def real_len(self) -> int:
        return 0 if self.context is None else self.context[0][0].shape[2]

    @torch.no_grad()
    def extend(self, aux: torch.Tensor, next_ids: torch.Tensor) -> None:
        """aux [1, n, k*H_t]: target states of positions real_len..real_len+n-1; next_ids [1, n]: the token after each
        (next_ids[0, -1] is the newest verified token, the next block's anchor)."""
        n = aux.shape[1]
        if tuple(next_ids.shape) != (1, n):
            raise ValueError(f"extend: aux covers {n} positions, next_ids has shape {list(next_ids.shape)}")
        start, device = self.real_len, self.head.device
        new = self.head.context_kv(aux.to(device), torch.arange(start, start + n, device=device))
        self.context = new if self.context is None else [
            (torch.cat([k, nk], dim=2), torch.cat([v, nv], dim=2)) for (k, v), (nk, nv) in zip(self.context, new)]
        self.anchor = int(next_ids[0, -1])

    @torch.no_grad()
    def propose_chain(self, num_steps: int) -> torch.Tensor:
        """num_steps drafts (target ids [num_steps]) from one block forward (module docstring)."""
        if self.context is None:
            raise ValueError("propose_chain before extend: the block drafter has no context yet")
        if num_steps < 1:
            raise ValueError(f"num_steps={num_steps}: a block drafts at least one token")
        head, start = self.head, self.real_len
        ids = torch.tensor([[self.anchor] + [head.config.mask_token_id] * num_steps], device=head.device)
        starts = torch.tensor([start], device=head.device)
        y = head.drafter.block(self.embed(ids), starts, self.context)[0, 1:]             # [S, H]
        logits = head.logits(y)                                                          # [S, V_d] float32
        selector = head.drafter.candidate_selector
        drafts, previous = [], self.anchor
        for j in range(num_steps):
            row = logits[j] if selector is None else selector.scores(logits[j], y[j], previous)
            token = head.to_target_ids(self.policy.propose(row[None]))                   # [1]
            drafts.append(token)
            previous = int(token)
        if self.real_len != start:
            raise RuntimeError(f"the draft context changed during a proposal ({start} -> {self.real_len})")
        return torch.cat(drafts)

    def propose_tree(self, num_steps: int, topk: int):
        from eagle_eval.settings import ConfigError

        raise ConfigError(TREES_REFUSED.format(topk=topk))
