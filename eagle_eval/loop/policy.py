"""The decode policy: how the loop chooses tokens. The proposal rule (what the draft proposes from its
logits) and the acceptance rule (what the target keeps of a verified chain or tree, and the token it adds)
in one small object, so that a rule is one class and the loop stays one loop.

Contract: `DecodePolicy` is what loop/reference.py and verify.py call; `GREEDY` is temperature 0 in every
engine (docs/eagle3.md section 4): drafts are the draft's argmax, a draft is accepted while it equals the
target's argmax at its parent, and the added (bonus) token is the target's argmax after the last accepted
node. Tree drafting stays the deterministic top-k expansion of tree.py for every rule (SGLang and EAGLE
build the tree from the draft's softmax without temperature). The sampling rules (vLLM, SGLang, EAGLE at
temperature > 0, rules/base.py) implement the same protocol: `start` binds one decode's random stream
(`sampling.prompt_generator`) and the draft-to-target vocab map, and returns the policy that decode calls;
greedy draws nothing and is its own decode's policy.

The batched loop (loop/batched.py) takes the same decision for B rows at once through `rows(batch)`, a
`RowPolicies`: greedy's is device work only (argmax, prefix match: a CUDA graph can hold it); a sampling rule's
seats each row's started policy (its prompt's own stream) and calls it on that row's logits, so a row's draws
are the reference loop's draws, in the same order, whatever the batch and the other rows.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from eagle_eval.loop.tree import Tree, accept_path


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

    def rows(self, batch: int) -> "RowPolicies":
        """This rule's decision for `batch` rows at once (the batched loop's)."""


@runtime_checkable
class RowPolicies(Protocol):
    """The decode policy of B rows at once. `seat` gives row b the started policy of the prompt it now holds
    (`DecodePolicy.start`); the other calls decide for every row, and an inactive row (no prompt) gets a
    placeholder nothing reads. Logits come in the model's dtype; every decision is the seated policy's own
    (upcast to float32 as the reference loop's target.forward does)."""
    capture_blocker: str | None        # why a CUDA graph cannot hold this decision (None: device work only)

    def seat(self, row: int, policy: DecodePolicy) -> None:
        """Row `row` now decodes a prompt with `policy` (started)."""

    def first_tokens(self, rows: list[int], logits: torch.Tensor) -> list[int]:
        """The token after each prefill: logits [G, V] at the last prompt position of rows `rows`."""

    def propose(self, draft_logits: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """Draft-vocab ids [B] from the draft's logits [B, V_d] (one chain step of every row)."""

    def accept_chains(self, drafts: torch.Tensor, target_logits: torch.Tensor,
                      active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(accepted drafts [B], the token added after them [B]) on drafts' device, from drafts [B, S] (target
        ids) and the target's logits [B, S+1, V]; inactive rows give 0 and a placeholder."""

    def accept_tree(self, row: int, tree: Tree, target_logits: torch.Tensor) -> tuple[list[int], int]:
        """`DecodePolicy.accept_tree` of row `row`: target_logits [D, V]."""


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

    def rows(self, batch: int) -> "GreedyRows":
        return GreedyRows()


def accept_chains(drafts: torch.Tensor, argmax: torch.Tensor) -> torch.Tensor:
    """`greedy_accept` of every row, on the device: drafts [B, S], target argmax [B, S+1] -> accepted [B].

    >>> accept_chains(torch.tensor([[5, 7, 9], [1, 2, 3]]), torch.tensor([[5, 7, 1, 4], [0, 2, 3, 3]])).tolist()
    [2, 0]
    """
    return (drafts == argmax[:, :-1]).long().cumprod(dim=1).sum(dim=1)


class GreedyRows:
    """Greedy for B rows: device work only, no host read (a CUDA graph can hold a chain cycle)."""
    capture_blocker = None

    def seat(self, row: int, policy: DecodePolicy) -> None:
        pass

    def first_tokens(self, rows: list[int], logits: torch.Tensor) -> list[int]:
        return logits.argmax(-1).tolist()

    def propose(self, draft_logits: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        return draft_logits.argmax(-1)

    def accept_chains(self, drafts, target_logits, active):
        argmax = target_logits.argmax(-1).to(drafts.device)                           # [B, S+1]
        accepted = accept_chains(drafts, argmax)
        return accepted, argmax.gather(1, accepted[:, None])[:, 0]

    def accept_tree(self, row: int, tree: Tree, target_logits: torch.Tensor) -> tuple[list[int], int]:
        return GREEDY.accept_tree(tree, target_logits)


class SeatedRows:
    """A rule that draws (every sampling rule) for B rows: each row's decision is its seated policy's, on that row's
    logits alone, so the row draws from its prompt's stream exactly what the reference loop draws, in the same
    order. The draws are on the host (per row), so a CUDA graph cannot hold the cycle."""
    capture_blocker = ("sampling draws each row's coins and tokens from its prompt's own generator on the host: "
                       "the cycle runs eager")

    def __init__(self, batch: int):
        self.seated: list[DecodePolicy | None] = [None] * batch

    def seat(self, row: int, policy: DecodePolicy) -> None:
        self.seated[row] = policy

    def first_tokens(self, rows: list[int], logits: torch.Tensor) -> list[int]:
        return [self.seated[b].first_token(logits[i].float()) for i, b in enumerate(rows)]

    def propose(self, draft_logits: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        ids = draft_logits.argmax(-1)                                                  # [B] placeholders
        for b in active.nonzero()[:, 0].tolist():
            ids[b] = self.seated[b].propose(draft_logits[b:b + 1])[0]
        return ids

    def accept_chains(self, drafts, target_logits, active):
        accepted, token = [0] * drafts.shape[0], [0] * drafts.shape[0]
        rows = drafts.tolist()
        for b in active.nonzero()[:, 0].tolist():
            accepted[b], token[b] = self.seated[b].accept_chain(rows[b], target_logits[b].float())
        device = drafts.device
        return torch.tensor(accepted, device=device), torch.tensor(token, device=device)

    def accept_tree(self, row: int, tree: Tree, target_logits: torch.Tensor) -> tuple[list[int], int]:
        return self.seated[row].accept_tree(tree, target_logits.float())


GREEDY = Greedy()
