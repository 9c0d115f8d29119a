"""A DFlash drafter bound to a target: the tables it reads through, and its shapes checked against the target.

Contract: `bind(loaded, target)` returns a `DFlashHead` and the notes a reader must see, or raises a
`CheckpointError` naming the config file, the key and both sizes when the drafter cannot serve this target:
hidden sizes (the context features are the target's states; in the z-lab layout the block rows are the target's
embedding rows and the logits its lm_head's), vocabulary (config vocab_size against the target's lm_head rows;
the mask id is a row of the embedding table), and the tapped layers (z-lab id l taps HF `hidden_states[l + 1]`:
an id >= N does not exist, vLLM's first request then kills the engine; id N - 1 is engine-dependent: z-lab reads
HF's last entry, which is AFTER the final norm, vLLM and SGLang the pre-norm output, and speculators' converter
drops it).

`DFlashHead` is what the loop holds as `Speculator.head` (loop/reference.py reads `config.draft_vocab_size`,
`lm_head.weight.device`, `to_target_ids`): `embed(ids)` = raw embedding rows x input_embedding_scale (z-lab
PyPI `_raw_input_embeddings`: `F.embedding` on the table, so a target whose embedding module scales its output
is not scaled twice; vLLM `embed_input_ids` likewise takes the rows), `logits(y)` = lm_head(y) x
output_multiplier, tanh-softcapped (z-lab PyPI `DFlashDraftModel.compute_logits`), `to_target_ids` through d2t
(speculators' reduced draft vocab; the identity in the z-lab layout).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.nn import functional as F

from eagle_eval.heads.eagle3.config import CheckpointError
from eagle_eval.heads.dflash.config import ZLAB, DFlashConfig
from eagle_eval.heads.dflash.conventions import CONVENTIONS, PUBLISHED, DFlashConvention
from eagle_eval.heads.dflash.model import DFlashDrafter


class DFlashHead:
    """A drafter with the embedding table [V, H] and lm_head (`.weight` [V_d, H]) it reads through; d2t [V_d] and
    t2d [V] (the target ids it can draft) as an EAGLE-3 head's; and the convention its context keys are computed in
    (dflash/conventions.py: the published math unless a run asks for an engine's)."""

    def __init__(self, drafter: DFlashDrafter, embed_weight: torch.Tensor, lm_head: torch.nn.Module,
                 convention: DFlashConvention = CONVENTIONS[PUBLISHED]):
        self.drafter, self.config, self.convention = drafter, drafter.config, convention
        self.embed_weight, self.lm_head = embed_weight, lm_head
        device = lm_head.weight.device
        own = drafter.lm_head is not None
        self.d2t = drafter.d2t if own else torch.zeros(self.config.draft_vocab_size, dtype=torch.long, device=device)
        self.t2d = drafter.t2d if own else torch.ones(self.config.vocab_size, dtype=torch.bool, device=device)

    def with_convention(self, convention: DFlashConvention) -> "DFlashHead":
        """The same drafter and tables under another convention (nothing copied)."""
        return DFlashHead(self.drafter, self.embed_weight, self.lm_head, convention)

    def context_kv(self, aux: torch.Tensor, positions: torch.Tensor):
        """The context K/V of every draft layer for aux [1, n, k*H_t] at `positions` [n], in this head's convention."""
        return self.drafter.context_kv(aux, positions, self.convention.k_norm_layer)

    def context_keys_values(self, c: torch.Tensor, cos, sin):
        """The same from context features c already computed (the batched loop's rows), in this head's convention."""
        return self.drafter.context_keys_values(c, cos, sin, self.convention.k_norm_layer)

    @property
    def device(self):
        return self.lm_head.weight.device

    @property
    def embed_tokens(self):
        """The checkpoint's own embedding table (speculators layout), else None: the target's is read."""
        return self.drafter.embed_tokens

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] -> the raw rows x input_embedding_scale [B, T, H] on the drafter's device and dtype."""
        rows = F.embedding(ids.to(self.embed_weight.device), self.embed_weight)
        return rows.to(self.device, self.drafter.fc.weight.dtype) * self.config.input_embedding_scale

    def logits(self, y: torch.Tensor) -> torch.Tensor:
        """y [..., H] (the drafter's final norm) -> draft-vocab logits [..., V_d] float32."""
        logits = self.lm_head(y.to(self.lm_head.weight.dtype)).float() * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap is not None else logits

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """draft vocab ids -> target vocab ids (target id = draft id + d2t[draft id])."""
        return draft_ids + self.d2t[draft_ids]


def _fail(config_file, message: str):
    raise CheckpointError(f"{config_file}: {message}")


def check_target_layers(cfg: DFlashConfig, num_layers: int, config_file) -> list[str]:
    """The tapped layers against a target of `num_layers` decoder layers (module docstring); the notes to show."""
    ids = list(cfg.target_layer_ids)
    beyond = [i for i in ids if i >= num_layers]
    if beyond:
        _fail(config_file, f"target_layer_ids {ids} name layer(s) {beyond}, but the target has {num_layers} decoder "
                           f"layers (ids 0..{num_layers - 1}; vLLM kills the engine at the first request)")
    if num_layers - 1 in ids:
        _fail(config_file, f"target_layer_ids {ids} include the last layer {num_layers - 1}: z-lab taps HF "
                           "hidden_states[N] (after the final norm), vLLM and SGLang the last layer's pre-norm output, "
                           "and speculators' converter drops it: the engines disagree on this tensor")
    if cfg.num_target_layers is not None and cfg.num_target_layers != num_layers:
        return [f"{config_file}: num_target_layers = {cfg.num_target_layers} but the target has {num_layers} layers: "
                "the draft was configured for another target depth"]
    return []


def bind(loaded, target) -> tuple[DFlashHead, list[str]]:
    """(the head, notes) of `loaded` (io.LoadedDFlash) on `target` (models/target.py Target); the drafter is moved
    to the target's lm_head device and dtype."""
    cfg, drafter, config_file = loaded.config, loaded.drafter, Path(loaded.config_file)
    embed, lm_head = target.input_embeddings.weight, target.output_embeddings
    vocab, hidden = lm_head.weight.shape[0], target.info.hidden_size
    if cfg.target_hidden_size != hidden:
        key = "hidden_size" if cfg.layout == ZLAB else "target_hidden_size"
        _fail(config_file, f"key {key!r} = {cfg.target_hidden_size}: fc.weight takes {cfg.num_aux} x "
                           f"{cfg.target_hidden_size} features, the target's hidden states are {hidden} wide")
    if cfg.vocab_size != vocab:
        _fail(config_file, f"key 'vocab_size' = {cfg.vocab_size}, the target's lm_head has {vocab} rows "
                           f"({list(lm_head.weight.shape)})")
    if cfg.layout == ZLAB and (tuple(embed.shape) != (vocab, cfg.hidden_size)
                               or lm_head.weight.shape[1] != cfg.hidden_size):
        _fail(config_file, f"key 'hidden_size' = {cfg.hidden_size}: the z-lab layout reads the target's embedding "
                           f"{list(embed.shape)} and lm_head {list(lm_head.weight.shape)}, which must be "
                           f"[{vocab}, {cfg.hidden_size}]")
    notes = check_target_layers(cfg, target.num_layers, config_file)
    drafter.to(device=lm_head.weight.device, dtype=lm_head.weight.dtype)
    if cfg.layout == ZLAB:
        return DFlashHead(drafter, embed, lm_head), notes
    if drafter.embed_tokens is None and embed.shape[1] != cfg.hidden_size:
        _fail(config_file, f"key 'transformer_layer_config.hidden_size' = {cfg.hidden_size}: the checkpoint has no "
                           f"embed_tokens.weight, so the target's embedding {list(embed.shape)} feeds the block")
    own_embed = drafter.embed_tokens.weight if drafter.embed_tokens is not None else embed
    return DFlashHead(drafter, own_embed, drafter.lm_head), notes
