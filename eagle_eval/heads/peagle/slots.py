"""The K - 1 mask rows of a P-EAGLE cycle, laid out as vLLM 0.32 lays them out.

Read in vLLM's `v1/spec_decode/utils.py` `copy_and_expand_eagle_inputs_kernel` (shift_input_ids: the EAGLE path)
and `v1/spec_decode/llm_base_proposer.py`:

- slot 0 is the ordinary EAGLE-3 row of the last real pair (the target's fused features of x_t with the newest
  verified token x_{t+1}, at position t): its output gives draft 1, as in an EAGLE-3 chain;
- slot i = 1..K-1 has the mask token m as its token (embedded by the draft's own embedding, as every token:
  `embed_input_ids`) and fc(mask_hidden) as its feature row: `mask_hidden` [1, k*H_t] goes through the head's
  own fusion (norm_before_fc / fc_norm included: `combine_hidden_states`, copied once into
  `parallel_drafting_hidden_state_tensor` in `load_model`), so the layer sees fc(mask_hidden) where a real row has
  fc(features). Its position is t + i (start_pos + j: consecutive after slot 0); its output gives draft i + 1;
- attention is the head's ordinary causal attention: slot i sees every real pair and slots 0..i (speculators
  `create_peagle_mask_mod`: the depth-0 context of earlier anchors plus its own rollout up to its depth);
- the K drafts are read from the K slots in one forward (`SpecDecodeBaseProposer.propose` returns early when
  parallel_drafting), K = num_speculative_tokens; nothing of the mask rows persists: next cycle the newly verified
  pairs are written at those positions (vLLM rewrites the slots; seq_lens leave the rest unseen).
So a draft at slot i does not depend on K (causal): the K-slot drafts are a prefix of the (K+1)-slot drafts.
"""

from __future__ import annotations

import torch

TREES_REFUSED = ("--topk {topk}: a P-EAGLE head drafts one chain of K per forward (vLLM 0.32 serves parallel "
                 "drafting as a chain: SpecDecodeBaseProposer.propose returns [batch, K], and it has no token tree); "
                 "use --topk 1")


def mask_rows(head, embed, rows: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(embeddings, fused feature rows), each [rows, count, H], of `count` mask slots for `rows` rows."""
    ids = torch.full((rows, count), head.config.mask_token_id, dtype=torch.long, device=head.mask_hidden.device)
    fused = head.fuse(head.mask_hidden[None])                                 # [1, 1, H]
    return embed(ids), fused.expand(rows, count, -1)
