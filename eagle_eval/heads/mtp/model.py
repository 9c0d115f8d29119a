"""The MTP layer as a draft head: the target family's own decoder block, fused with the target's embedding, driven
through heads/protocol.py `DraftHead` under one convention (heads/mtp/conventions.py).

Contract: `MTPStack` holds the n MTP layers as loaded (heads/mtp/load.py): per layer (or shared, for Qwen) the
fusion (embedding norm `a`, hidden norm `b`, projection `P: 2H -> H`), the decoder block built from the TARGET's own
decoder-layer class (its norms, its MoE or MLP, its attention's projections), and the output norm `O`; the norm class
is the block's own (zero-centred `x * (1 + w)` for Qwen3-Next / Qwen3.5). `MTPDraft(stack, convention, lm_head,
rotary)` is the `DraftHead` the loop, the batched loop, trees and the profile drive; per token, with `e` the target's
embedding of the row's token (zeros at position 0 when the convention masks it) and `g` the hidden state fed in:

| step | definition |
|---|---|
| fuse | `x = P(cat[a(e), b(g)])`, or `P(cat[b(g), a(e)])` hidden first (MiMo) |
| attention input | `u = input_layernorm(x)`, residual `x` |
| attention | the family's: GQA with bias / q-k norms / partial rotary (GLM, MiMo), gated full attention with q-k norms and partial rotary (Qwen3-Next / 3.5: `o_proj(attn * sigmoid(gate))`, the gate read from `u`), MLA (DeepSeek) |
| finish | `s = x + attention`, `o = s + mlp(post_attention_layernorm(s))`; hands the next step `O(o)` (chain post) or `o` (chain pre) |
| logits | `lm_head(O(o))`, the TARGET's lm_head (every engine shares it) |

RoPE is the target's own rotary module and the family's own `apply_rotary_pos_emb` (partial rotary, DeepSeek's
interleaved pairs and yarn scaling included), so positions mean what they mean to the target. The draft vocabulary is
the target's (d2t all zeros). Only layer 0 drafts (every engine's schedule but transformers' one pass per layer).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from eagle_eval.heads.mtp.conventions import FIRST, Convention
from eagle_eval.heads.mtp.layouts import LAYOUTS, Layout


@dataclass(frozen=True)
class MTPConfig:
    family: str                       # heads/mtp/layouts.py LAYOUTS key
    num_layers: int                   # n, MTP layers in the checkpoint
    target_layers: int                # N, the target's decoder layers
    hidden_size: int
    vocab_size: int
    block_class: str                  # the target family's decoder-layer class the blocks are
    text_config: object = field(default=None, compare=False, repr=False)   # the block's transformers config
    kind: str = "mtp"
    num_aux: int = 1                  # one target tensor: its last hidden state
    weights: str = "as stored (unquantized)"    # how they are held: the target's way (heads/mtp/quant.py describe)

    @property
    def layout(self) -> Layout:
        return LAYOUTS[self.family]

    @property
    def draft_vocab_size(self) -> int:
        return self.vocab_size

    @property
    def target_hidden_size(self) -> int:
        return self.hidden_size


class Fusion(nn.Module):
    """The embedding norm `a`, the hidden norm `b` and the projection `P` of one MTP layer (or of all, shared)."""

    def __init__(self, norm_class, hidden: int, eps: float):
        super().__init__()
        self.emb_norm = norm_class(hidden, eps=eps)
        self.hidden_norm = norm_class(hidden, eps=eps)
        self.proj = nn.Linear(2 * hidden, hidden, bias=False)


class MTPStack(nn.Module):
    """The n MTP layers of a checkpoint as loaded: `fusions`, `blocks`, `out_norms` (one per layer, or one shared)."""

    def __init__(self, cfg: MTPConfig, block_class):
        super().__init__()
        self.config = cfg
        blocks = [block_class(cfg.text_config, 0) for _ in range(cfg.num_layers)]
        norm_class, eps = type(blocks[0].input_layernorm), cfg.text_config.rms_norm_eps
        sets = 1 if cfg.layout.shared else cfg.num_layers
        self.fusions = nn.ModuleList(Fusion(norm_class, cfg.hidden_size, eps) for _ in range(sets))
        self.blocks = nn.ModuleList(blocks)
        self.out_norms = nn.ModuleList(norm_class(cfg.hidden_size, eps=eps) for _ in range(sets))

    def layer(self, i: int) -> tuple[Fusion, nn.Module, nn.Module]:
        shared = 0 if self.config.layout.shared else i
        return self.fusions[shared], self.blocks[i], self.out_norms[shared]


def _family_function(module: nn.Module, name: str):
    """A function of the modeling file that defines `module`'s class (the family's own RoPE application)."""
    return getattr(sys.modules[type(module).__module__], name)


class GQAAttention:
    """A family attention module with q/k/v projections (GLM-4.5: bias, optional q-k norms, partial rotary; Qwen2 /
    MiMo), driven as heads/protocol.py `DraftAttention`: no cache of its own, scores by SDPA."""

    def __init__(self, module: nn.Module, cfg):
        self.module = module
        self.num_heads, self.num_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = module.head_dim
        self.scale = module.scaling
        self._rotary = _family_function(module, "apply_rotary_pos_emb")

    def _qkv(self, u: torch.Tensor):
        m, shape = self.module, (*u.shape[:-1], -1, self.head_dim)
        q, k, v = m.q_proj(u).view(shape), m.k_proj(u).view(shape), m.v_proj(u).view(shape)
        if getattr(m, "q_norm", None) is not None:
            q, k = m.q_norm(q), m.k_norm(k)
        return q, k, v

    def project(self, u: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """u [B, T, H] -> q [B, heads, T, d], k/v [B, kv, T, d], the family's RoPE applied."""
        q, k, v = (x.transpose(1, 2) for x in self._qkv(u))
        q, k = self._rotary(q, k, cos, sin)
        return q, k, v

    def expand_kv(self, x: torch.Tensor) -> torch.Tensor:
        """[B, kv, T, d] -> [B, heads, T, d] (GQA)."""
        return x.repeat_interleave(self.num_heads // x.shape[1], dim=1)

    def attend(self, q, k, v, mask: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
        """q [B, h, T, d], k/v [B, kv, S, d], mask bool (True = attend) -> o_proj(attention) [B, T, H]."""
        out = F.scaled_dot_product_attention(q, self.expand_kv(k), self.expand_kv(v), attn_mask=mask, scale=self.scale)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1), u)

    def o_proj(self, x: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
        """[..., heads * d] -> [..., H]."""
        return self.module.o_proj(x)


class GatedAttention(GQAAttention):
    """Qwen3-Next / Qwen3.5 full attention: q_proj gives each head its query and an output gate, q-k norms, partial
    rotary; the output is `o_proj(attention * sigmoid(gate))`, the gate read from the rows' attention input `u`."""

    def _split(self, u: torch.Tensor):
        both = self.module.q_proj(u).view(*u.shape[:-1], -1, 2 * self.head_dim)
        return torch.chunk(both, 2, dim=-1)                           # query, gate [..., heads, d]

    def _qkv(self, u: torch.Tensor):
        m, shape = self.module, (*u.shape[:-1], -1, self.head_dim)
        query, _ = self._split(u)
        return m.q_norm(query), m.k_norm(m.k_proj(u).view(shape)), m.v_proj(u).view(shape)

    def o_proj(self, x: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
        if u is None:
            raise ValueError("a gated attention's output needs the rows' attention input u (its gate)")
        _, gate = self._split(u)
        return self.module.o_proj(x * torch.sigmoid(gate.reshape(x.shape)))


class MLAAttention(GQAAttention):
    """DeepSeek-V3 multi-head latent attention (the family's module: q_proj or q_a/q_b with its norm, the latent
    kv_a_proj_with_mqa and kv_a_layernorm, kv_b_proj per head), keys and values decompressed per head (the same
    products the engines' absorbed kernels sum in another order)."""

    def __init__(self, module: nn.Module, cfg):
        self.module, self.num_heads, self.num_kv = module, cfg.num_attention_heads, cfg.num_attention_heads
        self.head_dim, self.scale = module.qk_head_dim, module.scaling
        fn = "apply_rotary_pos_emb_interleave" if getattr(cfg, "rope_interleave", False) else "apply_rotary_pos_emb"
        self._rotary = _family_function(module, fn)

    def project(self, u: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """u [B, T, H] -> q, k [B, heads, T, nope + rope], v [B, heads, T, v]."""
        m = self.module
        b, t = u.shape[:2]
        q = m.q_proj(u) if m.q_lora_rank is None else m.q_b_proj(m.q_a_layernorm(m.q_a_proj(u)))
        q_pass, q_rot = q.view(b, t, -1, m.qk_head_dim).transpose(1, 2).split([m.qk_nope_head_dim,
                                                                            m.qk_rope_head_dim], dim=-1)
        latent, k_rot = m.kv_a_proj_with_mqa(u).split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        latent = m.kv_a_layernorm(latent).view(b, 1, t, m.kv_lora_rank)
        q_rot, k_rot = self._rotary(q_rot, k_rot.view(b, 1, t, m.qk_rope_head_dim), cos, sin)
        k, v = m.expand_kv(latent, k_rot)                         # [B, heads, T, nope + rope], [B, heads, T, v]
        return torch.cat([q_pass, q_rot], dim=-1), k, v

    def expand_kv(self, x: torch.Tensor) -> torch.Tensor:
        return x


ATTENTIONS = {"gqa": GQAAttention, "gated": GatedAttention, "mla": MLAAttention}


class MTPDraft(nn.Module):
    """One MTP layer of `stack` as a heads/protocol.py `DraftHead` under `convention` (module contract)."""

    def __init__(self, stack: MTPStack, convention: Convention, lm_head: nn.Module, rotary: nn.Module,
                 layer: int = 0):
        super().__init__()
        if convention.schedule != FIRST and stack.config.num_layers != 1:    # one layer: the schedules coincide
            raise ValueError(f"MTPDraft drafts every step with one layer; schedule {convention.schedule!r} of "
                             f"{stack.config.num_layers} layers is not that")
        self.stack, self.lm_head, self.convention = stack, lm_head, convention
        self.rotary = rotary
        self.config: MTPConfig = stack.config
        self.fusion, self.block, self.out_norm = stack.layer(layer)
        self.embed_tokens = None
        device, v = lm_head.weight.device, self.config.vocab_size
        self.register_buffer("d2t", torch.zeros(v, dtype=torch.long, device=device))
        self.register_buffer("t2d", torch.ones(v, dtype=torch.bool, device=device))
        self._attention = ATTENTIONS[self.config.layout.attention](self.block.self_attn, self.config.text_config)

    @property
    def attention(self):
        return self._attention

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """aux [B, T, H]: the target's last hidden state (pre or post its final norm, as the taps say) -> g."""
        return aux.to(self.dtype)

    def rope(self, positions: torch.Tensor):
        """positions [B, T] -> the target's cos, sin [B, T, rotary dims]."""
        probe = torch.empty(0, dtype=self.dtype, device=positions.device)
        cos, sin = self.rotary(probe, positions)
        return cos.to(positions.device), sin.to(positions.device)

    def attention_input(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor | None = None):
        """embeds (the row's token), hidden [B, T, H] -> (u = input_layernorm(x), residual x), x the fusion; the
        embedding of a row at position 0 is zeros when the convention masks it (positions [B, T] then needed)."""
        if self.convention.mask_position0:
            if positions is None:
                raise ValueError("position-0 masking needs the rows' positions")
            embeds = torch.where((positions == 0)[..., None].to(embeds.device), torch.zeros_like(embeds), embeds)
        e, h = self.fusion.emb_norm(embeds), self.fusion.hidden_norm(hidden)
        x = self.fusion.proj(torch.cat([h, e] if self.convention.hidden_first else [e, h], dim=-1))
        return self.block.input_layernorm(x), x

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        """The block's MLP or MoE on [..., H] (the family modules want [B, T, H]; some return (out, router))."""
        flat = x.reshape(1, -1, x.shape[-1])
        out = self.block.mlp(flat)
        return (out[0] if isinstance(out, tuple) else out).reshape(x.shape)

    def finish(self, residual: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """The layer's output handed to the next step: O(o) (chain post) or o (chain pre)."""
        s = residual + attn_out
        out = s + self._mlp(self.block.post_attention_layernorm(s))
        return self.out_norm(out) if self.convention.chain == "post" else out

    def step(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        """Append T pairs to `cache` (loop/draft.py's DraftCache), causal among themselves -> out [B, T, H]."""
        attn = self._attention
        u, residual = self.attention_input(embeds, hidden, positions)
        q, k, v = attn.project(u, *self.rope(positions))
        past = len(cache)
        keys, values = cache.append(k, v)
        t = q.shape[2]
        mask = torch.ones(t, past + t, dtype=torch.bool, device=q.device).tril(diagonal=past)
        return self.finish(residual, attn.attend(q, keys, values, mask, u))

    def lm(self, out: torch.Tensor) -> torch.Tensor:
        """`finish`'s output -> logits [..., V] in the head's dtype: lm_head(O(o))."""
        return self.lm_head(out if self.convention.chain == "post" else self.out_norm(out))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.lm(out).float()

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """The draft vocabulary is the target's."""
        return draft_ids
