"""What a head kind hands the oracle for one run (`HeadKind.wire`): the head the loop drives, how its tokens are
embedded, which target tensors it reads, its vocab map, its load-time findings, and what the report echoes of it.

Contract: `Wired` is the one record between a head kind and oracle.py; `VocabMap` and `HeadInfo` are the parts of
the report's `config` a kind fills. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class VocabMap:
    draft_vocab_size: int
    vocab_size: int
    d2t: str                          # "checkpoint" | "none (full vocab)"
    d2t_identity: bool


@dataclass(frozen=True)
class HeadInfo:
    path: str
    dialect: str
    weights: str
    kind: str                         # the head kind's registry name (heads/kind.py)
    mla: dict | None
    norm_before_residual: bool | None
    rope_theta: float | None
    rope_scaling: dict | None
    variant: dict
    keys: dict | None
    extra: dict = field(default_factory=dict)     # a kind's own keys (an MTP layer's conventions, a block's size)

    def as_dict(self) -> dict:
        d = {"path": self.path, "dialect": self.dialect, "weights": self.weights, "kind": self.kind}
        if self.mla is not None:
            d["mla"] = self.mla
        d.update(norm_before_residual=self.norm_before_residual, rope_theta=self.rope_theta,
                 rope_scaling=self.rope_scaling, variant=self.variant, keys=self.keys)
        d.update(self.extra)
        return d


@dataclass(frozen=True)
class Wired:
    """A head wired to a target for one run (module contract)."""
    head: object                      # what the loop drives: a DraftHead (heads/protocol.py) or a kind's own
    embed: Callable                   # token ids [B, T] -> draft-side embeddings [B, T, H] on the draft device
    embedding: str                    # which table embeds the draft's tokens, in words
    aux: object                       # models/capture.py AuxLayers: the target tensors it reads
    engines: dict                     # engine -> capture.EngineTaps: what each engine would tap
    vocab_map: VocabMap
    info: HeadInfo
    sanity: tuple = ()                # load-time findings
    notes: tuple = ()                 # warnings (also given to warnings.warn)
    train_acc: dict | None = None     # the head's training-time per-step accuracy, if known
    draft_state: Callable | None = None   # the loop's drafting state (None: loop/draft.py DraftState)
