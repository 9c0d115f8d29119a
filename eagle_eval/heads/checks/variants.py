"""Load-time checks of the head variants, called by heads/checks/sanity.py.

Contract: `head_variant_findings(loaded, aux)` returns `Finding`s for the shipped variant flags and
which engines honour them (norm_before_fc with its input norm, EAGLE-3.1 fc_norm / norm_output,
interleaved RoPE), norm weights left at their init, a boundary id N (the final pre-norm state) and
the config-key audit of heads/eagle3/keys.py. Looks at weights and configs only; a check that cannot
run becomes an info finding (`results.findings.guarded`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eagle_eval.findings import Finding, guarded, info, warning


def _left_at_init(weight: torch.Tensor) -> bool:
    """An RMSNorm weight still all ones: what an engine holds when the checkpoint lacks the tensor."""
    return bool(torch.all(weight.detach() == 1))


def norm_variant_findings(loaded, raw: dict) -> list[Finding]:
    """norm_before_fc / fc_norm / norm_output: weights left at init, and the engine versions that read them."""
    head, cfg, out = loaded.head, loaded.head.config, []
    nested = raw.get("eagle_config") or {}
    if cfg.norm_before_fc:
        where = "eagle_config" if "norm_before_fc" in nested else "the top level"
        out.append(info("norm-before-fc", f"norm_before_fc=True (set at {where}): fc reads RMSNorm(concat of the "
                                          f"{cfg.num_aux} aux blocks); vLLM honours it since PR #36545 (top level) and "
                                          "#42143 (eagle_config), SGLang since PR #32334; older servers skip the norm"))
        if "norm_before_fc" in nested and "norm_before_fc" not in raw:
            out.append(warning("norm-before-fc-nested-only", "norm_before_fc is set only in eagle_config: vLLM "
                                                             "before PR #42143 reads the top-level key and skips the norm"))
        if _left_at_init(head.input_norm.weight):
            out.append(warning("input_norm-untrained", "input_norm.weight is all ones, the RMSNorm init: trained "
                                                       "heads move it (speculators loads checkpoints without it as ones)"))
    if cfg.fc_norm:
        out.append(info("fc-norm", "fc_norm=True (EAGLE-3.1): one RMSNorm per aux block before fc (vLLM PR #42764); "
                                   "a server that ignores it feeds fc the raw blocks"))
        idle = [i for i, n in enumerate(head.fc_norm) if _left_at_init(n.weight)]
        if idle:
            out.append(warning("fc_norm-untrained", f"fc_norm.{idle}.weight all ones, the RMSNorm init"))
    if cfg.norm_output:
        out.append(info("norm-output", "norm_output=True (EAGLE-3.1): each draft step after the first reads "
                                       "norm(out); a server that ignores it (vLLM before PR #46488 for speculators "
                                       "configs) feeds the pre-norm out and accepts less past step 1"))
    return out


def rope_variant_findings(loaded, raw: dict) -> list[Finding]:
    cfg = loaded.head.config
    if not cfg.rope_interleaved or cfg.mla is not None:     # MLA always rotates pairs (heads/mla/checks.py)
        return []
    return [warning("rope-interleaved", "rope_is_neox_style=false: GPT-J-style (interleaved) RoPE; SGLang's llama "
                                        "layer reads the key, vLLM's llama ignores it and rotates NeoX halves, so "
                                        "the servers disagree")]


def boundary_findings(aux) -> list[Finding]:
    if not getattr(aux, "final_prenorm", False):
        return []
    n = aux.num_layers
    return [warning("aux-final-prenorm", f"boundary id {n} taps the output of layer {n - 1} before the final norm: "
                                         "SGLang captures it only for gpt-oss targets (PR #32334); vLLM for models on "
                                         "EagleModelMixin (PR #36063; DeepSeek in PR #46788); elsewhere the id "
                                         "captures nothing")]


def head_key_findings(loaded) -> list[Finding]:
    """The config-key audit (heads/eagle3/keys.py) as findings."""
    audit = loaded.key_audit
    if audit is None:
        return []
    out = [info("head-keys", f"config.json keys: {len(audit.consumed)} consumed, {len(audit.harmless)} ignored as "
                             f"harmless, {len(audit.engine_math)} engine-math, {len(audit.unknown)} unknown",
                harmless=sorted(audit.harmless))]
    for key, what in audit.engine_math.items():
        out.append(warning("head-key-engine-math", f"config key {key!r} = {what}; not implemented here "
                                                   "(--allow-unknown-head-keys): the results may match no engine"))
    if audit.unknown:
        out.append(warning("head-key-unknown", f"config keys not read by eagle-eval: {audit.unknown}"))
    return out


def head_variant_findings(loaded, aux) -> list[Finding]:
    """Every head-variant check (called once from `load_findings`)."""
    raw = json.loads((Path(loaded.path) / "config.json").read_text())
    out = guarded("norm-variants", norm_variant_findings, loaded, raw)
    out += guarded("rope-variants", rope_variant_findings, loaded, raw)
    out += guarded("boundary", boundary_findings, aux)
    return out + guarded("head-keys", head_key_findings, loaded)
