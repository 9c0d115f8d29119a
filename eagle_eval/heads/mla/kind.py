"""The kind record of the EAGLE-3 head with DeepSeek multi-head latent attention (`registry.HEAD_KINDS["mla"]`:
Kimi-K2.x / DeepSeek-V3 heads, `Eagle3DeepseekV2ForCausalLM`): the EAGLE-3 family's loader with the mla dialect,
every engine's default taps, an MLA draft KV cache (per head: the rope and nope parts of K, and V), its own load-time
checks (heads/mla/checks.py)."""

from __future__ import annotations

from eagle_eval.heads import io
from eagle_eval.heads.eagle3.config import MLA
from eagle_eval.heads.eagle3.wire import wire_eagle3
from eagle_eval.heads.kind import HeadKind
from eagle_eval.heads.mla.checks import mla_findings
from eagle_eval.models.capture import default_hf_layers


def kv_bytes(cfg, size: int) -> int:
    """K (qk_head_dim) and V (v_head_dim) of every head, per token."""
    return cfg.num_attention_heads * (cfg.mla.qk_head_dim + cfg.mla.v_head_dim) * size


def meta(config: dict, config_file, dialect: str, names) -> object:
    return io._build_head(config, dialect, config_file, {n: None for n in names})


KIND = HeadKind(
    name="mla", description="EAGLE-3 with a DeepSeek multi-head latent attention draft layer",
    architectures="'Eagle3DeepseekV2ForCausalLM' (MLA draft layer)",
    detect=lambda config: MLA if io.eagle3_dialect(config) == MLA else None, load=io.load_eagle3,
    default_taps=lambda num_layers, cfg: default_hf_layers(num_layers), kv_bytes=kv_bytes, meta=meta,
    info=lambda cfg: {"mla": cfg.variant()["mla"]}, wire=wire_eagle3, checks=mla_findings)
