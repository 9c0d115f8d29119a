"""The MLA EAGLE-3 head: the EAGLE-3 draft layer with DeepSeek multi-head latent attention.

Contract: `MLAHead` is `Eagle3Head` (fc, fc_norm, the norms, the dense SwiGLU MLP, lm_head, d2t/t2d,
`DraftCache`, and the variants `norm_before_residual` / `fc_norm` / `norm_output`) with the draft
layer's attention replaced by `MLAAttention` and its RoPE tables by DeepSeek's yarn. The 2H input
u = concat(input_layernorm(embed), hidden_norm(g)), embedding first, enters the two down-projections;
per token, with `h` heads, nope/rope/v = qk_nope/qk_rope/v_head_dim:

| step | definition |
|---|---|
| query | `q = q_b_proj(q_a_layernorm(q_a_proj(u)))`, or `q_proj(u)` when `q_lora_rank` is null; `[h, nope + rope]` |
| latent | `[c, k_pe] = kv_a_proj_with_mqa(u)`, `c [kv_lora_rank]`, `k_pe [rope]` shared by all heads |
| keys/values | `[k_nope, v] = kv_b_proj(kv_a_layernorm(c))` per head `[nope + v]` |
| RoPE | on `q[..., nope:]` and `k_pe` only, GPT-J pairs (2i, 2i+1), DeepSeek yarn frequencies and cos/sin scale |
| scores | `q . [k_nope, k_pe] * qk_head_dim^-0.5 * mscale^2`, `mscale = yarn_get_mscale(factor, mscale_all_dim)` |
| output | `o_proj(softmax . v)`, `[h * v] -> H` |

Sources (read, not copied): vLLM `vllm/model_executor/models/deepseek_eagle3.py`
`DeepseekV2Eagle3DecoderLayer` (MLA with `input_size=2H`, dense MLP, norms as llama_eagle3) and
`deepseek_v2.py` `DeepseekV2MLAAttention.__init__` / `DeepseekV2Attention.forward` (the formulas
above, `is_neox_style=False`, the mscale^2 softmax scale); `rotary_embedding/deepseek_scaling_rope.py`
`DeepseekScalingRotaryEmbedding` (yarn frequencies, cos/sin times mscale(factor, mscale) /
mscale(factor, mscale_all_dim)). SGLang `python/sglang/srt/models/deepseek_eagle3.py`
`DeepseekEagle3DecoderLayer` and `kimi_k25_eagle3.py` `Eagle3MLADecoderLayer` (the fused q_a/kv_a
projection widened to 2H), `deepseek_v2.py` `DeepseekV2AttentionMLA.__init__` (same RoPE and scale).

The engines cache the latent (c, k_pe) and absorb kv_b_proj into q and o (the "MLA" kernels); this
reference caches the decompressed per-head keys and values instead: the same products, summed in
another order. Checkpoint tensors are named as both engines load them (`midlayer.` or `layers.0.`
prefix; heads/io.py): `self_attn.{q_a_proj, q_a_layernorm, q_b_proj | q_proj, kv_a_proj_with_mqa,
kv_a_layernorm, kv_b_proj, o_proj}.weight`.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from eagle_eval.heads.eagle3.config import HeadConfig
from eagle_eval.heads.eagle3.layer import Eagle3Head, OutputProjection, RMSNorm, rotate_pairs


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature 0.1 * mscale * ln(scale) + 1 (1 for scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def deepseek_yarn(dim: int, theta: float, scaling: dict) -> tuple[torch.Tensor, float]:
    """(inv_freq [dim/2], cos/sin scale) of DeepSeek's yarn, defaults as the engines' (beta_fast 32,
    beta_slow 1, mscale 1, mscale_all_dim 0): frequencies below the correction range interpolated by
    `factor`, above it kept, a linear ramp between."""
    factor, orig = float(scaling["factor"]), scaling["original_max_position_embeddings"]
    fast, slow = scaling.get("beta_fast", 32), scaling.get("beta_slow", 1)

    def correction_dim(rotations: float) -> float:   # the dim whose wavelength fits `rotations` times in orig
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = max(math.floor(correction_dim(fast)), 0), min(math.ceil(correction_dim(slow)), dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / ((high - low) or 0.001)).clamp(0, 1)
    keep = 1 - ramp                                                                   # 1: extrapolate
    base_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)   # [dim/2]
    inv_freq = base_freq / factor * (1 - keep) + base_freq * keep
    scale = yarn_get_mscale(factor, float(scaling.get("mscale", 1))) / \
        yarn_get_mscale(factor, float(scaling.get("mscale_all_dim", 0)))
    return inv_freq, scale


def softmax_scale(cfg: HeadConfig) -> float:
    """qk_head_dim^-0.5, times yarn_get_mscale(factor, mscale_all_dim)^2 with rope scaling."""
    scale = cfg.mla.qk_head_dim ** -0.5
    if cfg.rope_scaling:
        m = yarn_get_mscale(float(cfg.rope_scaling["factor"]), float(cfg.rope_scaling.get("mscale_all_dim", 0)))
        scale *= m * m
    return scale


class MLAAttention(nn.Module):
    """The draft layer's MLA over the 2H input; the `_Attention` interface loop/draft.py drives."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        m, h2 = cfg.mla, 2 * cfg.hidden_size
        self.num_heads = self.num_kv = cfg.num_attention_heads
        self.nope, self.rope_dim, self.v_dim, self.kv_rank = (m.qk_nope_head_dim, m.qk_rope_head_dim,
                                                              m.v_head_dim, m.kv_lora_rank)
        self.head_dim = m.qk_head_dim
        q_out = self.num_heads * self.head_dim
        if m.q_lora_rank is None:
            self.q_proj = nn.Linear(h2, q_out, bias=False)
        else:
            self.q_a_proj = nn.Linear(h2, m.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(m.q_lora_rank, cfg.rms_norm_eps)
            self.q_b_proj = nn.Linear(m.q_lora_rank, q_out, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h2, m.kv_lora_rank + m.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(m.kv_lora_rank, self.num_heads * (m.qk_nope_head_dim + m.v_head_dim), bias=False)
        self.o_proj = OutputProjection(self.num_heads * m.v_head_dim, cfg.hidden_size, bias=False)
        self.scale = softmax_scale(cfg)

    def _query(self, u: torch.Tensor) -> torch.Tensor:
        """u [B, T, 2H] -> q [B, T, heads * (nope + rope)]."""
        if hasattr(self, "q_proj"):
            return self.q_proj(u)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(u)))

    def project(self, u: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """u [B, T, 2H], cos/sin [B, T, rope] -> q, k [B, heads, T, nope + rope], v [B, heads, T, v]."""
        b, t, _ = u.shape
        q = self._query(u).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        latent, k_pe = self.kv_a_proj_with_mqa(u).split([self.kv_rank, self.rope_dim], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(b, t, self.num_heads, self.nope + self.v_dim)
        k_nope, v = kv.transpose(1, 2).split([self.nope, self.v_dim], dim=-1)     # [B, heads, T, *]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)                              # [B, 1, T, rope]
        q_nope, q_pe = q.split([self.nope, self.rope_dim], dim=-1)
        q_pe = q_pe * cos + rotate_pairs(q_pe) * sin
        k_pe = k_pe.unsqueeze(1)                                                   # [B, 1, T, rope]: one for all heads
        k_pe = (k_pe * cos + rotate_pairs(k_pe) * sin).expand(-1, self.num_heads, -1, -1)
        return torch.cat([q_nope, q_pe], dim=-1), torch.cat([k_nope, k_pe], dim=-1), v

    def expand_kv(self, x: torch.Tensor) -> torch.Tensor:
        """Keys and values are per head already."""
        return x

    def attend(self, q, k, v, mask: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
        """q/k [B, h, T|S, nope + rope], v [B, h, S, v], mask bool (True = attend) -> [B, T, H]."""
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLAHead(Eagle3Head):
    """An EAGLE-3 head whose draft layer attends with MLA (`Eagle3DeepseekV2ForCausalLM` checkpoints)."""

    def _attention(self, cfg: HeadConfig) -> nn.Module:
        if cfg.mla is None:
            raise ValueError("MLAHead needs HeadConfig.mla (the MLA ranks and head dims)")
        return MLAAttention(cfg)

    def _rope_tables(self, cfg: HeadConfig) -> tuple[torch.Tensor, float]:
        d = cfg.mla.qk_rope_head_dim
        if not cfg.rope_scaling:
            return 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d), 1.0
        return deepseek_yarn(d, cfg.rope_theta, cfg.rope_scaling)


def build_head(cfg: HeadConfig, with_embedding: bool = False) -> Eagle3Head:
    """The head of `cfg`'s kind: `MLAHead` when `cfg.mla` is set, else `Eagle3Head` (GQA draft layer)."""
    return (MLAHead if cfg.mla is not None else Eagle3Head)(cfg, with_embedding=with_embedding)
