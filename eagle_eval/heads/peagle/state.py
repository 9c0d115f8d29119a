"""`ParallelDraftState`: a P-EAGLE head's side of a decode, under the loop's drafting contract.

Contract: the same calls as loop/draft.py `DraftState`, so loop/reference.py `speculative_decode` runs it unchanged
(`Speculator(..., draft_state=ParallelDraftState)`):
- `real_len`, `extend(aux, next_ids)`: as `DraftState` (the head's `step` over the new real pairs, appended to its
  KV cache; the output of the last one kept): the draft's context is the real pairs only;
- `propose_chain(num_steps) -> drafts [num_steps]` target ids: draft 1 from the last real pair's output (slot 0),
  then ONE head step over num_steps - 1 mask rows (slots.py: mask token, fc(mask_hidden), positions t + 1 ..
  t + num_steps - 1, causal among themselves, full over the real pairs), each row's logits given to the decode
  policy's `propose` in slot order; the mask rows' K/V are dropped before returning (the cache is rolled back);
- `propose_tree` is refused: vLLM 0.32 has no token tree, and parallel drafting returns one chain of K.

The batched loop asks the class for its batched form (`rows`: batched.py `ParallelRows`), the graphed loop for why
it is not captured (`capture_blocker`), the teacher-forced profile for `run_lengths` (all_starts.py).
"""

from __future__ import annotations

import torch

from eagle_eval.heads.eagle3.layer import DraftCache
from eagle_eval.heads.peagle.slots import TREES_REFUSED, mask_rows


class ParallelDraftState:
    """Invariant between cycles: `len(cache) == real_len` real pairs, `last_out` the output of the last one."""

    capture_blocker = ("a P-EAGLE cycle (parallel drafting) is not captured as a CUDA graph (capture not measured on "
                       "a GPU yet): the loop runs eager")

    @staticmethod
    def rows(head, embed, batch: int, capacity: int, device):
        from eagle_eval.heads.peagle.batched import ParallelRows

        return ParallelRows(head, embed, batch, capacity, device)

    @staticmethod
    def run_lengths(head, embed, aux: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor,
                    num_steps: int) -> torch.Tensor:
        from eagle_eval.heads.peagle.all_starts import run_lengths

        return run_lengths(head, embed, aux, tokens, anchors, num_steps)

    def __init__(self, head, embed, position_offset: int = 0, policy=None):
        if policy is None:
            raise ValueError("a parallel draft state drafts through the decode policy: pass the started policy")
        if position_offset:
            raise ValueError(f"position_offset={position_offset}: SGLang's old EAGLE-3 draft positions; vLLM runs "
                             "P-EAGLE's slots at t, t + 1, ...")
        self.head, self.embed, self.policy = head, embed, policy
        self.cache = DraftCache()
        self.last_out: torch.Tensor | None = None        # [1, 1, H]: out of the last real pair (slot 0)

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
        """num_steps drafts (target ids [num_steps]) from slot 0 and one forward over num_steps - 1 mask rows."""
        if self.last_out is None:
            raise ValueError("propose_chain before extend: the P-EAGLE head has no real pair yet")
        head, real_len = self.head, self.real_len
        drafts = [head.to_target_ids(self.policy.propose(head.logits(self.last_out)[:, -1]))]     # [1]
        if num_steps > 1:
            count = num_steps - 1
            embeds, hidden = mask_rows(head, self.embed, 1, count)
            positions = torch.arange(real_len, real_len + count, device=hidden.device)[None]      # t + 1 .. t + K - 1
            logits = head.logits(head.step(embeds, hidden, positions, self.cache))                # [1, K-1, V_d]
            self.cache.rollback(real_len)
            drafts += [head.to_target_ids(self.policy.propose(logits[:, j])) for j in range(count)]
        return torch.cat(drafts)

    def propose_tree(self, num_steps: int, topk: int):
        from eagle_eval.settings import ConfigError

        raise ConfigError(TREES_REFUSED.format(topk=topk))
