"""The kind record of the Llama-style EAGLE-3 head (`registry.HEAD_KINDS["llama"]`): its three checkpoint layouts
(SpecForge/SGLang, EAGLE official, speculators: heads/io.py), every engine's default taps HF[2], HF[N//2], HF[N-3]
(docs/eagle3.md section 1), a GQA draft KV cache. Its P-EAGLE variant (parallel drafting: `mask_hidden` in the
weights, or speculators_model_type 'peagle'; heads/io.py `_parallel_drafting`) is wired with heads/peagle/."""

from __future__ import annotations

from eagle_eval.heads import io
from eagle_eval.heads.eagle3.config import MLA
from eagle_eval.heads.eagle3.wire import wire_eagle3
from eagle_eval.heads.kind import HeadKind
from eagle_eval.models.capture import default_hf_layers


def detect(config: dict) -> str | None:
    dialect = io.eagle3_dialect(config)
    return dialect if dialect not in (None, MLA) else None


def kv_bytes(cfg, size: int) -> int:
    """K and V of the draft layers' kv heads, per token (every layer keeps its own)."""
    return 2 * cfg.num_key_value_heads * cfg.head_dim * size * cfg.num_hidden_layers


def meta(config: dict, config_file, dialect: str, names) -> object:
    return io._build_head(config, dialect, config_file, {n: None for n in names})


KIND = HeadKind(
    name="llama", description="EAGLE-3, a Llama-style (GQA) draft layer; P-EAGLE (K drafts per forward) when its "
                              "weights hold mask_hidden",
    architectures="'LlamaForCausalLMEagle3' (SpecForge/SGLang), 'LlamaForCausalLM' (EAGLE official), "
                  "'Eagle3Speculator' / 'PEagleSpeculator' (speculators)",
    detect=detect, load=io.load_eagle3, default_taps=lambda num_layers, cfg: default_hf_layers(num_layers),
    kv_bytes=kv_bytes, meta=meta, info=lambda cfg: {}, wire=wire_eagle3)
