"""The EAGLE-3 draft head: a decoder layer over (token embedding, fused target features), and for a multi-layer head
(`num_hidden_layers` > 1: the public P-EAGLE heads and speculators' examples have 4) ordinary decoder layers above it.

Contract: `Eagle3Head` computes exactly the per-token math of docs/eagle3.md section 2, with an explicit
`DraftCache`, and the variants the engines ship (`norm_before_fc`, EAGLE-3.1 `fc_norm` / `norm_output`,
interleaved RoPE, scaled RoPE through transformers' initialisers): see heads/eagle3/config.py, which
holds `HeadConfig` and cites where each engine implements each. A head kind changes only the draft
layer's attention and its RoPE tables (`_attention`, `_rope_tables`): heads/mla/layer.py `MLAHead`
(DeepSeek MLA) keeps everything else, so loop/draft.py drives both through the same interface,
`heads/protocol.py` `DraftHead` (`attention_input`, `attention.project/attend/expand_kv/o_proj/scale`,
`finish`, `lm`). It knows
nothing about the target model, tokenizers or the speculative loop; checkpoints are read and written by heads/io.py.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from eagle_eval.heads.eagle3.config import HeadConfig  # noqa: F401  (re-exported: the head's config)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """NeoX-style RoPE partner: dims (i, i + d/2) rotate together (HF Llama, vLLM, SGLang default)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """GPT-J-style (interleaved) RoPE partner: dims (2i, 2i + 1) rotate together."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


class DraftCache:
    """The draft's KV cache: keys/values [B, kv_heads, T, head_dim] and their length.

    `real_len` counts entries computed from target features; entries past it are speculative and
    are dropped by `rollback()` after each verify. A multi-layer head keeps one more such cache per layer above the
    first (`layer(i)`, made on first use); their lengths always equal this one's (`rollback` moves them all).
    """

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.upper: list[DraftCache] = []

    def layer(self, i: int) -> "DraftCache":
        """Layer i's cache (0: this one)."""
        if i == 0:
            return self
        while len(self.upper) < i:
            self.upper.append(DraftCache())
        return self.upper[i - 1]

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
        for upper in self.upper:
            upper.rollback(length)
        assert len(self) == length


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class OutputProjection(nn.Linear):
    """o_proj [.., heads * d] -> [.., H]. `u`, the rows' attention input, is ignored: only an output-gated
    attention reads its gate from it (heads/protocol.py `DraftAttention.o_proj`)."""

    def forward(self, x: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(x)


class _Attention(nn.Module):
    def __init__(self, cfg: HeadConfig, width: int | None = None):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        bias = cfg.attention_bias
        width = 2 * h if width is None else width          # the first layer reads [embeds, hidden]: 2H
        self.q_proj = nn.Linear(width, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(width, self.num_kv * d, bias=bias)
        self.v_proj = nn.Linear(width, self.num_kv * d, bias=bias)
        self.o_proj = OutputProjection(self.num_heads * d, h, bias=bias)
        self.rotate = rotate_pairs if cfg.rope_interleaved else rotate_half
        self.scale = 1.0 / math.sqrt(d)              # softmax scale (the profile in loop/draft.py reads it)

    def project(self, u: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """u [B, T, 2H] -> q [B, heads, T, d], k/v [B, kv_heads, T, d], RoPE applied."""
        b, t, _ = u.shape
        q = self.q_proj(u).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(u).view(b, t, self.num_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(u).view(b, t, self.num_kv, self.head_dim).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, T, d]
        q = q * cos + self.rotate(q) * sin
        k = k * cos + self.rotate(k) * sin
        return q, k, v

    def expand_kv(self, x: torch.Tensor) -> torch.Tensor:
        """[B, kv_heads, T, d] -> [B, heads, T, d] (GQA)."""
        return x.repeat_interleave(self.num_heads // self.num_kv, dim=1)

    def attend(self, q, k, v, mask: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
        """q [B, h, T, d], k/v [B, kv, S, d], mask bool [T, S] or [B, 1, T, S] (True = attend)."""
        out = F.scaled_dot_product_attention(q, self.expand_kv(k), self.expand_kv(v), attn_mask=mask, scale=self.scale)
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
    def __init__(self, cfg: HeadConfig, attention: nn.Module):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = attention
        self.mlp = _MLP(cfg)


class _DecoderLayer(nn.Module):
    """A layer above the first of a multi-layer head: an ordinary pre-norm Llama decoder layer over H (vLLM
    llama_eagle3.py `LlamaDecoderLayer.forward`, layer_idx > 0: qkv over hidden_size, input_layernorm of the running
    sum; speculators models/eagle3/core.py `Eagle3DraftModel.__init__`: transformers' LlamaDecoderLayer)."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = _Attention(cfg, cfg.hidden_size)
        self.mlp = _MLP(cfg)


class Eagle3Head(nn.Module):
    """Parameters named as SpecForge/SGLang name them (`fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`); the layers
    above the first of a multi-layer head are `later.{j}.*` (checkpoint `layers.{j+1}.*`: heads/io.py `key_map`).

    `embed_tokens` exists only when the checkpoint carries its own table (`with_embedding=True`);
    `input_norm` [k*H_t] only with `norm_before_fc`, `fc_norm.{i}` [H_t] only with `fc_norm`, `mask_hidden`
    [1, k*H_t] only with `parallel_drafting` (P-EAGLE, drafted by heads/peagle/)
    (speculators / vLLM names; see heads/eagle3/config.py for the variants and where engines read them).
    """

    def __init__(self, cfg: HeadConfig, with_embedding: bool = False):
        super().__init__()
        self.config = cfg
        self.fc = (nn.Linear(cfg.num_aux * cfg.target_hidden_size, cfg.hidden_size, bias=cfg.fc_bias)
                   if cfg.has_fc else None)
        aux_width = cfg.num_aux * cfg.target_hidden_size
        self.input_norm = RMSNorm(aux_width, cfg.rms_norm_eps) if cfg.norm_before_fc else None
        self.fc_norm = (nn.ModuleList(RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in range(cfg.num_aux))
                        if cfg.fc_norm else None)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if with_embedding else None
        self.midlayer = _MidLayer(cfg, self._attention(cfg))
        # layers 1.. of a multi-layer head (checkpoint keys `layers.{i}.`: heads/io.py key_map); none for one layer
        self.later = nn.ModuleList(_DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers - 1))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool)
                             if cfg.draft_vocab_size == cfg.vocab_size
                             else torch.zeros(cfg.vocab_size, dtype=torch.bool))
        if cfg.parallel_drafting:       # P-EAGLE: the mask rows' target-feature input, before fc (vLLM mask_hidden)
            self.register_buffer("mask_hidden", torch.zeros(1, cfg.num_aux * cfg.target_hidden_size))
        inv_freq, self.attention_scaling = self._rope_tables(cfg)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    # -- what a head kind changes (heads/mla/layer.py overrides both) ----------------------------
    def _attention(self, cfg: HeadConfig) -> nn.Module:
        """The draft layer's attention: GQA with q/k/v_proj over the 2H input."""
        return _Attention(cfg)

    def _rope_tables(self, cfg: HeadConfig) -> tuple[torch.Tensor, float]:
        """(inv_freq [rotary dims / 2], cos/sin scaling) for `rope`."""
        return _rope_inv_freq(cfg)

    @property
    def attention(self) -> nn.Module:
        """The draft layer's attention (heads/protocol.py DraftAttention), what drafting drives."""
        return self.midlayer.self_attn

    @property
    def depth(self) -> int:
        """The number of decoder layers (config num_hidden_layers)."""
        return 1 + len(self.later)

    # -- the per-token math of docs/eagle3.md section 2 ---------------------------------------------
    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """aux [B, T, k*H_t] (target features, low -> high) -> g [B, T, H]; norm_before_fc normalises the
        whole concat, fc_norm each H_t block, before fc."""
        if self.fc is None:
            return aux
        aux = aux.to(self.lm_head.weight.dtype)
        if self.input_norm is not None:
            aux = self.input_norm(aux)
        if self.fc_norm is not None:
            blocks = aux.chunk(len(self.fc_norm), dim=-1)                        # k x [B, T, H_t]
            aux = torch.cat([norm(b) for norm, b in zip(self.fc_norm, blocks)], dim=-1)
        return self.fc(aux)

    def rope(self, positions: torch.Tensor):
        """positions [B, T] -> cos, sin [B, T, head_dim] (frequency i on dims i and i + d/2, or on 2i and
        2i + 1 when interleaved)."""
        freqs = positions[..., None].float() * self.inv_freq.float()
        emb = (freqs.repeat_interleave(2, dim=-1) if self.config.rope_interleaved
               else torch.cat((freqs, freqs), dim=-1))
        dtype = self.lm_head.weight.dtype
        return (emb.cos() * self.attention_scaling).to(dtype), (emb.sin() * self.attention_scaling).to(dtype)

    def attention_input(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor | None = None):
        """embeds, hidden [B, T, H] -> (u [B, T, 2H] embedding first, residual [B, T, H]); the rows' positions are
        not read (an MTP layer masks position 0: heads/protocol.py)."""
        layer = self.midlayer
        h_normed = layer.hidden_norm(hidden)
        residual = h_normed if self.config.norm_before_residual else hidden
        return torch.cat([layer.input_layernorm(embeds), h_normed], dim=-1), residual

    def finish(self, residual: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """residual + attention -> out [B, T, H], the next step's hidden input: pre final norm, or after it
        with norm_output (EAGLE-3.1). For a multi-layer head this is the first layer's output (never normed) and
        `above` runs the rest."""
        s = residual + attn_out
        out = s + self.midlayer.mlp(self.midlayer.post_attention_layernorm(s))
        return self.norm(out) if self.config.norm_output and not self.later else out

    def above(self, out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend) -> torch.Tensor:
        """The layers above the first over the same rows: out [B, T, H] of `finish` -> the head's out [B, T, H];
        the identity for a one-layer head. `attend(i, attention, q, k, v, u)` is the caller's attention of layer i
        (its own cache for layer i, the same mask as the first layer's) -> o_proj'd output [B, T, H]; cos/sin the
        rows' RoPE tables (`rope`), the same for every layer.

        vLLM llama_eagle3.py `LlamaModel.forward` carries (hidden, residual) through `layers` with fused
        add-RMSNorms: layer i > 0 normalises the running sum out = hidden + residual, attends, adds, and its MLP
        adds again; `norm` of the last sum is the logits' input, and the sum itself (or its norm, with norm_output)
        the next step's hidden input. Written here as the plain sums (speculators' LlamaDecoderLayer)."""
        if not self.later:
            return out
        for i, layer in enumerate(self.later, start=1):
            u = layer.input_layernorm(out)
            q, k, v = layer.self_attn.project(u, cos, sin)
            s = out + attend(i, layer.self_attn, q, k, v, u)
            out = s + layer.mlp(layer.post_attention_layernorm(s))
        return self.norm(out) if self.config.norm_output else out

    def attention_of(self, i: int) -> nn.Module:
        """Layer i's attention (0: `attention`)."""
        return self.attention if i == 0 else self.later[i - 1].self_attn

    def step(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
             cache: DraftCache) -> torch.Tensor:
        """Append T pairs to `cache` (causal among themselves, full over the cache; every layer's) -> out [B, T, H]."""
        attn = self.midlayer.self_attn
        u, residual = self.attention_input(embeds, hidden, positions)
        cos, sin = self.rope(positions)
        q, k, v = attn.project(u, cos, sin)
        past = len(cache)
        keys, values = cache.append(k, v)
        t = q.shape[2]
        mask = torch.ones(t, past + t, dtype=torch.bool, device=q.device).tril(diagonal=past)

        def attend(i, attention, q, k, v, u):
            keys, values = cache.layer(i).append(k, v)
            return attention.attend(q, keys, values, mask, u)

        return self.above(self.finish(residual, attn.attend(q, keys, values, mask, u)), cos, sin, attend)

    def lm(self, out: torch.Tensor) -> torch.Tensor:
        """out of `finish` [B, T, H] -> draft-vocab logits [B, T, V_d] in the head's dtype: lm_head(norm(.)),
        the norm already applied by `finish` with norm_output."""
        return self.lm_head(out if self.config.norm_output else self.norm(out))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """out [B, T, H] -> draft-vocab logits [B, T, V_d] (float32)."""
        return self.lm(out).float()

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
