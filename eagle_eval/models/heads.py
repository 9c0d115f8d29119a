"""The EAGLE-3 draft head: one decoder layer over (token embedding, fused target features).

Contract: `Eagle3Head` computes exactly the per-token math of EAGLE3.md section 2, with an explicit
`DraftCache`; it knows nothing about the target model, tokenizers or the speculative loop. The
checkpoint dialects (SpecForge/SGLang, EAGLE official, speculators) are read and written here, each
through a visible key map; loading is strict (a missing, unexpected or mis-shaped tensor is an error
naming the file, the key and both shapes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int                      # H
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int                       # V, the target vocabulary
    draft_vocab_size: int                 # V_d <= V
    target_hidden_size: int               # H_t
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    num_aux: int = 3                      # aux feature blocks fused by fc (1 without aux states)
    norm_before_residual: bool = False    # speculators/vLLM dialect: residual = hidden_norm(g)
    fc_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(
                f"draft_vocab_size={self.draft_vocab_size} > vocab_size={self.vocab_size}")

    @property
    def has_fc(self) -> bool:
        """fc fuses the aux concat only when its width differs from H (EAGLE3.md section 2)."""
        return self.num_aux * self.target_hidden_size != self.hidden_size


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class DraftCache:
    """The draft's KV cache: keys/values [B, kv_heads, T, head_dim] and their length.

    `real_len` counts entries computed from target features; entries past it are speculative and
    are dropped by `rollback()` after each verify.
    """

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys is None:
            self.keys, self.values = k, v
        else:
            self.keys = torch.cat([self.keys, k], dim=2)
            self.values = torch.cat([self.values, v], dim=2)
        return self.keys, self.values

    def rollback(self, length: int) -> None:
        if length > len(self):
            raise ValueError(f"cannot roll the draft cache forward ({len(self)} -> {length})")
        if self.keys is not None:
            self.keys = self.keys[:, :, :length]
            self.values = self.values[:, :, :length]
        assert len(self) == length


class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class _Attention(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(2 * h, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(2 * h, self.num_kv * d, bias=bias)
        self.v_proj = nn.Linear(2 * h, self.num_kv * d, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=bias)

    def project(self, u: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """u [B, T, 2H] -> q [B, heads, T, d], k/v [B, kv_heads, T, d], RoPE applied."""
        b, t, _ = u.shape
        q = self.q_proj(u).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(u).view(b, t, self.num_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(u).view(b, t, self.num_kv, self.head_dim).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, T, d]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v

    def expand_kv(self, x: torch.Tensor) -> torch.Tensor:
        """[B, kv_heads, T, d] -> [B, heads, T, d] (GQA)."""
        return x.repeat_interleave(self.num_heads // self.num_kv, dim=1)

    def attend(self, q, k, v, mask: torch.Tensor) -> torch.Tensor:
        """q [B, h, T, d], k/v [B, kv, S, d], mask bool [T, S] or [B, 1, T, S] (True = attend)."""
        out = F.scaled_dot_product_attention(q, self.expand_kv(k), self.expand_kv(v), attn_mask=mask)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class _MLP(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        h, i, bias = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)
        if cfg.hidden_act not in ("silu", "swish"):
            raise ValueError(f"hidden_act={cfg.hidden_act!r}: only SwiGLU ('silu') draft heads are supported")

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.input_layernorm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = _Attention(cfg)
        self.mlp = _MLP(cfg)


class Eagle3Head(nn.Module):
    """Parameters named as SpecForge/SGLang name them (`fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`).

    `embed_tokens` exists only when the checkpoint carries its own table (`with_embedding=True`).
    """

    def __init__(self, cfg: HeadConfig, with_embedding: bool = False):
        super().__init__()
        self.config = cfg
        self.fc = (nn.Linear(cfg.num_aux * cfg.target_hidden_size, cfg.hidden_size, bias=cfg.fc_bias)
                   if cfg.has_fc else None)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if with_embedding else None
        self.midlayer = _MidLayer(cfg)
        self.norm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool)
                             if cfg.draft_vocab_size == cfg.vocab_size
                             else torch.zeros(cfg.vocab_size, dtype=torch.bool))
        inv_freq, self.attention_scaling = _rope_inv_freq(cfg)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    # -- the per-token math of EAGLE3.md section 2 ---------------------------------------------
    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """aux [B, T, k*H_t] (target features, low -> high) -> g [B, T, H]."""
        return self.fc(aux.to(self.lm_head.weight.dtype)) if self.fc is not None else aux

    def rope(self, positions: torch.Tensor):
        """positions [B, T] -> cos, sin [B, T, head_dim]."""
        freqs = positions[..., None].float() * self.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        dtype = self.lm_head.weight.dtype
        return (emb.cos() * self.attention_scaling).to(dtype), (emb.sin() * self.attention_scaling).to(dtype)

    def attention_input(self, embeds: torch.Tensor, hidden: torch.Tensor):
        """embeds, hidden [B, T, H] -> (u [B, T, 2H] embedding first, residual [B, T, H])."""
        layer = self.midlayer
        h_normed = layer.hidden_norm(hidden)
        residual = h_normed if self.config.norm_before_residual else hidden
        return torch.cat([layer.input_layernorm(embeds), h_normed], dim=-1), residual

    def finish(self, residual: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """residual + attention -> out [B, T, H] (pre final norm; the next step's hidden input)."""
        s = residual + attn_out
        return s + self.midlayer.mlp(self.midlayer.post_attention_layernorm(s))

    def step(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
             cache: DraftCache) -> torch.Tensor:
        """Append T pairs to `cache` (causal among themselves, full over the cache) -> out [B, T, H]."""
        attn = self.midlayer.self_attn
        u, residual = self.attention_input(embeds, hidden)
        q, k, v = attn.project(u, *self.rope(positions))
        past = len(cache)
        keys, values = cache.append(k, v)
        t = q.shape[2]
        mask = torch.ones(t, past + t, dtype=torch.bool, device=q.device).tril(diagonal=past)
        return self.finish(residual, attn.attend(q, keys, values, mask))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """out [B, T, H] -> draft-vocab logits [B, T, V_d] (float32)."""
        return self.lm_head(self.norm(out)).float()

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """draft vocab ids -> target vocab ids (target_id = draft_id + d2t[draft_id])."""
        return draft_ids + self.d2t[draft_ids]


def _rope_inv_freq(cfg: HeadConfig) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim/2], attention scaling) from the draft config's RoPE settings, through transformers' own
    initialisers so that scaled variants (llama3, linear, dynamic, yarn) follow the library."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = dict(cfg.rope_scaling or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    theta = cfg.rope_theta
    if kind == "default":
        d = cfg.head_dim
        return 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)), 1.0
    lcfg = LlamaConfig(hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_attention_heads,
                       head_dim=cfg.head_dim, rope_theta=theta, rope_scaling=scaling,
                       max_position_embeddings=max(cfg.max_position_embeddings,
                                                   scaling.get("original_max_position_embeddings", 0) + 1))
    if kind not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"rope_scaling type {kind!r} is not known to transformers")
    inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](lcfg, "cpu")
    return inv_freq, float(scale)
