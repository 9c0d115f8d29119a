"""Load-time checks that apply only to an MLA head (heads/mla/layer.py), called by heads/checks/sanity.py.

Contract: `mla_findings(loaded, raw, target_cfg)` returns `Finding`s about the head's MLA settings
against its target and against what each engine's MLA head honours: the DeepSeek yarn parameters
(factor, original context, betas, mscales, base, rotary width) compared one by one with the target's,
`q_lora_rank: null` (one SGLang MLA head refuses it), the norm flags each engine reads, and
transformers' `rope_interleave` switch that no engine reads. Looks at configs only; no decoding.
"""

from __future__ import annotations

from eagle_eval.findings import Finding, info, warning

# yarn keys and the engines' defaults (vLLM rotary_embedding/deepseek_scaling_rope.py
# DeepseekScalingRotaryEmbedding.__init__, the mscale_all_dim default of DeepseekV2MLAAttention.__init__)
_YARN_DEFAULTS = {"factor": None, "original_max_position_embeddings": None, "beta_fast": 32, "beta_slow": 1,
                  "mscale": 1, "mscale_all_dim": 0}


def _target_yarn(target_cfg) -> tuple[float | None, dict | None]:
    params = getattr(target_cfg, "rope_parameters", None) or getattr(target_cfg, "rope_scaling", None) or {}
    theta = params.get("rope_theta", getattr(target_cfg, "rope_theta", None))
    kind = params.get("rope_type", params.get("type", "default"))
    return (float(theta) if theta is not None else None), (params if kind != "default" else None)


def rope_parameter_findings(cfg, target_cfg) -> list[Finding]:
    """The draft's DeepSeek yarn vs the target's, key by key (engine defaults filled in on both sides)."""
    theta, target = _target_yarn(target_cfg)
    diffs = []
    if theta is not None and abs(cfg.rope_theta - theta) > 1e-6 * theta:
        diffs.append(f"rope_theta {cfg.rope_theta:g} vs {theta:g}")
    t_rope = getattr(target_cfg, "qk_rope_head_dim", None)
    if t_rope is not None and t_rope != cfg.mla.qk_rope_head_dim:
        diffs.append(f"qk_rope_head_dim {cfg.mla.qk_rope_head_dim} vs {t_rope}")
    if cfg.rope_scaling and target:
        for key, default in _YARN_DEFAULTS.items():
            mine, theirs = cfg.rope_scaling.get(key, default), target.get(key, default)
            if mine is not None and theirs is not None and float(mine) != float(theirs):
                diffs.append(f"rope_scaling.{key} {mine} vs {theirs}")
    if diffs:
        return [warning("mla-rope-mismatch", "the MLA head's RoPE differs from the target's (draft vs target): "
                                             + "; ".join(diffs) + ": right only if the head was trained so")]
    how = (f"DeepSeek yarn factor {cfg.rope_scaling['factor']}" if cfg.rope_scaling else "no scaling")
    return [info("mla-rope", f"MLA RoPE on {cfg.mla.qk_rope_head_dim} dims, GPT-J pairs, base {cfg.rope_theta:g}, "
                             f"{how}: as the target's where the target says")]


def engine_findings(cfg, raw: dict) -> list[Finding]:
    """What each engine's MLA head does with this head's settings."""
    out = []
    if cfg.mla.q_lora_rank is None:
        out.append(warning("mla-q-proj", "q_lora_rank is null (one q_proj over 2H): vLLM deepseek_eagle3.py and SGLang "
                                         "deepseek_eagle3.py serve it, SGLang kimi_k25_eagle3.py Eagle3MLADecoderLayer "
                                         "refuses it"))
    if cfg.norm_before_residual:
        out.append(warning("mla-norm-before-residual", "norm_before_residual=True: vLLM deepseek_eagle3.py "
                                                       "(DeepseekV2Eagle3DecoderLayer) honours it, SGLang's MLA heads "
                                                       "keep the residual before hidden_norm: the servers disagree"))
    flags = [f for f in ("fc_norm", "norm_output") if getattr(cfg, f)]
    if flags:
        out.append(info("mla-eagle3.1", f"{', '.join(flags)} (EAGLE-3.1) on an MLA head: read by vLLM "
                                        "deepseek_eagle3.py and SGLang kimi_k25_eagle3.py (PR #26506), not by "
                                        "SGLang deepseek_eagle3.py"))
    if raw.get("rope_interleave") is False:
        out.append(warning("mla-rope-interleave", "rope_interleave=false: transformers' DeepseekV3 would rotate NeoX "
                                                  "halves; vLLM and SGLang rotate GPT-J pairs regardless "
                                                  "(is_neox_style=False), and so does this run"))
    return out


def mla_findings(loaded, raw: dict, target_cfg) -> list[Finding]:
    cfg = loaded.head.config
    if cfg.mla is None:
        return []
    m = cfg.mla
    t_dims = {k: getattr(target_cfg, k, None) for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                                         "qk_rope_head_dim", "v_head_dim")}
    same = "the target's MLA dims" if t_dims == m.__dict__ else f"target {t_dims}"
    out = [info("mla-head", f"MLA draft layer: q_lora_rank {m.q_lora_rank}, kv_lora_rank {m.kv_lora_rank}, "
                            f"qk_nope/rope/v {m.qk_nope_head_dim}/{m.qk_rope_head_dim}/{m.v_head_dim} ({same}); "
                            "served as Eagle3DeepseekV2ForCausalLM by vLLM deepseek_eagle3.py (PR #36361) and "
                            "SGLang deepseek_eagle3.py / kimi_k25_eagle3.py")]
    return out + rope_parameter_findings(cfg, target_cfg) + engine_findings(cfg, raw)
