"""The reference speculative loop (chain: topk = 1, or a tree), one prompt at a time.

Contract: `speculative_decode` returns exactly the tokens plain greedy decoding returns (up to
floating-point near-ties, which `greedy.first_divergence` reports), plus the accepted drafts of each
verify forward. Each cycle (docs/eagle3.md section 4): the draft proposes S tokens from its last real pair;
the target verifies [root, d_1..d_S] in one forward; the longest matching prefix is accepted plus one
bonus token; the target cache is rolled back to the verified prefix; the draft is re-run on the
target features of (root + accepted) paired with (accepted + bonus). Nothing is recomputed over the
whole prefix. Which tokens are proposed and kept is the decode policy's (loop/policy.py;
greedy by default; at temperature > 0 a rule of rules/base.py, whose output is distributed as plain
sampling from the target, every draw from the `generator` given).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from eagle_eval.models.target import Target
from eagle_eval.loop.draft import DraftState, EmbedFn
from eagle_eval.loop.policy import GREEDY, DecodePolicy
from eagle_eval.loop.tree import select_tree
from eagle_eval.loop.verify import verify_chain, verify_tree

if TYPE_CHECKING:                     # annotations only: the protocol costs the loop no import
    from eagle_eval.heads.protocol import DraftHead


@dataclass
class Decoded:
    output_ids: list[int] = field(default_factory=list)
    accepted_per_cycle: list[int] = field(default_factory=list)
    emitted_per_cycle: list[int] = field(default_factory=list)
    off_top1_per_cycle: list[bool] = field(default_factory=list)   # trees: accepted path left the top-1 chain
    tree_shape_per_cycle: list[list[int]] = field(default_factory=list)   # trees: nodes at depth 1, 2, ...


@dataclass(frozen=True)
class Speculator:
    """Everything the loop needs besides the prompt."""
    target: Target
    head: DraftHead
    embed: EmbedFn                 # token ids -> draft-side embeddings (target's or draft's table)
    aux_hf: tuple[int, ...]        # resolved aux layers (HF indices)
    position_offset: int = 0       # 1 reproduces SGLang's draft positions before PR #25015
    policy: DecodePolicy = GREEDY  # how tokens are proposed and accepted
    # the draft's side of one decode, built as draft_state(head, embed, position_offset, started policy): an
    # EAGLE-3 head's DraftState, or a block drafter's (heads/dflash/state.py BlockDraftState); both offer
    # real_len, extend(aux, next_ids), propose_chain(num_steps) and propose_tree(num_steps, topk). A class may also
    # offer its batched form (`rows`, loop/batched.py), why that cycle is not captured (`capture_blocker`) and that a
    # chain's drafts come from one forward (`one_forward`: the speedup model's draft cost, profile/costs.py)
    draft_state: Callable[..., DraftState] = DraftState

    @property
    def draft_device(self):
        return self.head.lm_head.weight.device


def emit(out: Decoded, tokens: list[int], max_new_tokens: int, eos_ids: set[int]) -> bool:
    """Append tokens, cut at max_new_tokens or after EOS; return True when decoding is finished."""
    added = 0
    for tok in tokens:
        if len(out.output_ids) >= max_new_tokens:
            break
        out.output_ids.append(tok)
        added += 1
        if tok in eos_ids:
            out.emitted_per_cycle.append(added)
            return True
    out.emitted_per_cycle.append(added)
    return len(out.output_ids) >= max_new_tokens


@torch.no_grad()
def speculative_decode(spec: Speculator, prompt_ids: list[int], num_steps: int, max_new_tokens: int,
                       eos_ids: set[int], topk: int = 1, num_draft_tokens: int | None = None,
                       tree: bool | None = None, generator: torch.Generator | None = None) -> Decoded:
    """Chain when topk == 1 (num_draft_tokens is then num_steps + 1), else the tree of tree.py;
    `tree=True` runs the tree machinery for topk == 1 too (it must equal the chain). `generator`: the
    prompt's random stream (sampling.prompt_generator), which a sampling policy draws every coin from."""
    use_tree = topk > 1 if tree is None else tree
    if use_tree and num_draft_tokens is None:
        num_draft_tokens = num_steps + 1
    target, device = spec.target, spec.draft_device
    out = Decoded()
    if max_new_tokens <= 0:
        return out
    cache = target.new_cache()
    policy = spec.policy.start(generator, spec.head.to_target_ids(torch.arange(spec.head.config.draft_vocab_size,
                                                                                device=device)))
    draft = spec.draft_state(spec.head, spec.embed, spec.position_offset, policy)
    prompt = torch.tensor([prompt_ids], device=device)                 # [1, T]
    with target.capture(spec.aux_hf, device) as capture:
        logits = target.forward(prompt, cache)                         # prefill
        aux = capture.pop()                                            # [1, T, k*H_t]
        first = policy.first_token(logits[0, -1])
        out.output_ids.append(first)
        if first in eos_ids or max_new_tokens == 1:
            return out
        # real pairs 0..T-1: (feature of x_t, token x_{t+1}), the last one pairing with the first new token
        draft.extend(aux, torch.cat([prompt[:, 1:], torch.tensor([[first]], device=device)], dim=1))
        root = first
        while True:
            if not use_tree:
                drafts = draft.propose_chain(num_steps)                # [S]
                v = verify_chain(target, cache, capture, root, drafts, policy)
                new_tokens = drafts[: v.accepted].tolist() + [v.bonus]
            else:
                tree = select_tree(draft.propose_tree(num_steps, topk), root, num_draft_tokens)
                v = verify_tree(target, cache, capture, tree, policy)
                new_tokens = [tree.tokens[i] for i in v.path[1:]] + [v.bonus]
                out.off_top1_per_cycle.append(not tree.on_top1_chain(v.path))
                out.tree_shape_per_cycle.append([tree.depths.count(d) for d in range(1, max(tree.depths) + 1)])
            out.accepted_per_cycle.append(v.accepted)
            if emit(out, new_tokens, max_new_tokens, eos_ids):
                return out
            draft.extend(v.aux, torch.tensor([new_tokens], device=device))
            assert draft.real_len == Target.cache_len(cache), "draft and target caches out of step"
            root = v.bonus
