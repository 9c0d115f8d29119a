"""The decode policy: how the loop chooses tokens. The proposal rule (what the draft proposes from its
logits) and the acceptance rule (what the target keeps of a verified chain or tree, and the token it adds)
in one small object, so that a rule is one class and the loop stays one loop.

Contract: `DecodePolicy` is what speculative/chain.py and verify.py call; `GREEDY` is temperature 0 in every
engine (docs/eagle3.md section 4): drafts are the draft's argmax, a draft is accepted while it equals the
target's argmax at its parent, and the added (bonus) token is the target's argmax after the last accepted
node. Tree drafting stays the deterministic top-k expansion of tree.py for every rule (SGLang and EAGLE
build the tree from the draft's softmax without temperature). The sampling rules (vLLM, SGLang, EAGLE at
temperature > 0, speculative/rules.py) implement the same protocol: `start` binds one decode's random stream
(`sampling.prompt_generator`) and the draft-to-target vocab map, and returns the policy that decode calls;
greedy draws nothing and is its own decode's policy.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from eagle_eval.speculative.tree import Tree, accept_path


@runtime_checkable
class DecodePolicy(Protocol):
    name: str

    def start(self, generator: torch.Generator | None, draft_vocab: torch.Tensor) -> "DecodePolicy":
        """The policy of one decode: every draw from `generator` (the prompt's stream); draft_vocab [V_d] = the
        target id of each draft id (the head's d2t map), for rules whose drafts carry a distribution q."""

    def first_token(self, logits: torch.Tensor) -> int:
        """The token after the prefill: logits [V] float32 of the target at the prompt's last position."""

    def propose(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocab ids [B] proposed from the draft's logits [B, V_d] (one chain step)."""

    def accept_chain(self, drafts: list[int], target_logits: torch.Tensor) -> tuple[int, int]:
        """(accepted drafts n, the token added after them) from the target's logits [S+1, V] after the root
        and each draft d_1..d_S."""

    def accept_tree(self, tree: Tree, target_logits: torch.Tensor) -> tuple[list[int], int]:
        """(tree indices of the accepted path, root first; the token added after its last node) from the
        target's logits [D, V] at each tree node."""


def greedy_accept(drafts: list[int], target_argmax: list[int]) -> int:
    """Accepted drafts of one chain cycle: d_i is accepted while d_i == target argmax at node i-1.

    drafts [S], target_argmax [S+1] (argmax after root, d_1, ..., d_S).
    >>> greedy_accept([5, 7, 9], [5, 7, 1, 4])
    2
    """
    n = 0
    for d, g in zip(drafts, target_argmax):
        if d != g:
            break
        n += 1
    return n


class Greedy:
    """Temperature 0: argmax proposals, prefix acceptance, argmax bonus (every engine's greedy rule)."""
    name = "greedy"

    def start(self, generator: torch.Generator | None = None, draft_vocab: torch.Tensor | None = None) -> "Greedy":
        return self

    def first_token(self, logits: torch.Tensor) -> int:
        return int(logits.argmax())

    def propose(self, draft_logits: torch.Tensor) -> torch.Tensor:
        return draft_logits.argmax(-1)

    def accept_chain(self, drafts: list[int], target_logits: torch.Tensor) -> tuple[int, int]:
        argmax = target_logits.argmax(-1).tolist()
        n = greedy_accept(drafts, argmax)
        return n, argmax[n]

    def accept_tree(self, tree: Tree, target_logits: torch.Tensor) -> tuple[list[int], int]:
        argmax = target_logits.argmax(-1).tolist()
        path = accept_path(tree, argmax)
        return path, argmax[path[-1]]


GREEDY = Greedy()
