"""The draft-head interface the loop and the profile drive: what a head kind must provide (no torch modules here).

Contract: `DraftHead` is the per-token math of docs/eagle3.md section 2 split where drafting needs to reach in:
fuse the target features, build the attention input (embedding first), project/attend through the head's
`attention` (`DraftAttention`), finish the layer, and map logits to target ids. `Eagle3Head`
(heads/eagle3/layer.py, GQA), `MLAHead` (heads/mla/layer.py, DeepSeek multi-head latent attention) and `MTPDraft`
(heads/mtp/model.py, a target's own MTP layer) implement it; a new head kind is a new class that does, and
drafting, the loop and the profile need no change. Every caller hands `attention_input` the rows' RoPE positions
(an MTP layer zeroes the embedding of a row at position 0) and `attend` / `o_proj` the rows' attention input `u`
(a gated attention, Qwen3-Next's, reads its output gate from it); the EAGLE-3 heads ignore both. A head of several
decoder layers (an EAGLE-3 head with num_hidden_layers > 1) also has `depth` and `above`: every caller that attends
through `attention` and `finish` passes the first layer's output to `above` (the function below) with its own
attention for each further layer (that layer's cache, the same mask); a kind without them has one layer.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class DraftAttention(Protocol):
    scale: float                       # the softmax scale (qk head dim^-0.5, times mscale^2 for MLA yarn)

    def project(self, u, cos, sin):
        """u [B, T, 2H] -> q [B, heads, T, d], k [B, kv, T, d_k], v [B, kv, T, d_v], RoPE applied."""

    def attend(self, q, k, v, mask, u=None):
        """q, keys, values and a bool mask [T, S] or [B, 1, T, S] (True = attend) -> o_proj(output, u) [B, T, H]."""

    def expand_kv(self, x):
        """[B, kv, T, d] -> [B, heads, T, d] (GQA; the identity where every head has its own)."""

    def o_proj(self, x, u=None):
        """[..., heads * d_v] -> [..., H]; u [..., H_u]: the same rows' attention input (`attention_input`'s u)."""


@runtime_checkable
class DraftHead(Protocol):
    config: object                     # heads/eagle3/config.py HeadConfig, heads/mtp/model.py MTPConfig
    embed_tokens: object               # nn.Embedding of its own, or None
    lm_head: object                    # nn.Linear [V_d, H]: its weight's device and dtype are the head's
    d2t: object                        # [V_d] int64: target id = draft id + d2t[draft id]
    t2d: object                        # [V] bool

    @property
    def attention(self) -> DraftAttention:
        """The draft layer's attention."""

    def fuse(self, aux):
        """aux [B, T, k*H_t] -> g [B, T, H]."""

    def rope(self, positions):
        """positions [B, T] -> (cos, sin) [B, T, rotary dims]."""

    def attention_input(self, embeds, hidden, positions=None):
        """(u [B, T, 2H] embedding first (an MTP layer: [B, T, H]), residual [B, T, H]); positions [B, T]: the rows'
        RoPE positions."""

    def finish(self, residual, attn_out):
        """The layer's output [B, T, H]: the next step's hidden input."""

    def step(self, embeds, hidden, positions, cache):
        """Append T pairs to the draft cache -> out [B, T, H]."""

    def lm(self, out):
        """out -> draft-vocab logits [B, T, V_d] in the head's dtype."""

    def logits(self, out):
        """out -> draft-vocab logits [B, T, V_d] float32."""

    def to_target_ids(self, draft_ids):
        """draft vocab ids -> target vocab ids."""


def above(head, out, cos, sin, attend):
    """The layers above the first of a multi-layer head (heads/eagle3/layer.py `Eagle3Head.above`) over the rows whose
    first-layer output is `out`; `out` itself for a head of one layer (every other kind)."""
    return out if getattr(head, "depth", 1) == 1 else head.above(out, cos, sin, attend)
