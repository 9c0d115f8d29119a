"""The MLA EAGLE-3 head's config.json: `Eagle3DeepseekV2ForCausalLM` (DeepSeek-V3 / Kimi-K2.x heads).

Contract: `mla_config_from_json` builds the `HeadConfig` (with `MLASettings`) of a head whose draft layer
is DeepSeek multi-head latent attention, refusing settings no engine's MLA head implements;
`mla_config_json` writes one; `MLA_CONSUMED` / `MLA_HARMLESS` tell heads/eagle3/keys.py which keys
are read and which cannot change the draft. No torch here. Where the engines read each key:

- vLLM `vllm/model_executor/models/deepseek_eagle3.py` (PR #36361, "Kimi k2.5 MLA based eagle3"):
  `DeepseekV2Eagle3DecoderLayer.__init__` builds `DeepseekV2MLAAttention(input_size=2H)` from
  `q_lora_rank`, `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`, turns any
  `rope_scaling` into `deepseek_yarn`, and always a dense `DeepseekV2MLP(intermediate_size)`;
  `DeepseekV2Eagle3Model.__init__` reads `target_hidden_size`, `fc_norm`, `norm_output`;
  the decoder layer reads `norm_before_residual`.
- SGLang `python/sglang/srt/models/deepseek_eagle3.py` `DeepseekEagle3DecoderLayer.__init__` (q_a or
  q_proj over 2H, dense MLP, no norm flags) and its successor `kimi_k25_eagle3.py`
  `Eagle3MLADecoderLayer.__init__` (requires `q_lora_rank`; `Eagle3MLAModel.__init__` reads `fc_norm`,
  its legacy alias `use_aux_norm`, and `norm_output`, PR #26506). Both run `DeepseekV2AttentionMLA`
  (`deepseek_v2.py`): `deepseek_yarn` when `rope_scaling` is set, `is_neox_style=False`, softmax scale
  times `yarn_get_mscale(factor, mscale_all_dim)^2`.
"""

from __future__ import annotations

from pathlib import Path

from eagle_eval.heads.eagle3.config import (
    DEEPSEEK_CONFIG_TYPES,
    CheckpointError,
    HeadConfig,
    MLASettings,
    config_flag,
    config_need,
    config_section,
    read_key,
    rope_settings,
)

MLA_ARCHITECTURES = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")
# kimi_k2: NVIDIA ModelOpt's Kimi-K2 MLA export writes it (modelopt/torch/export/plugins/hf_spec_export.py,
# export_spec_ckpt_config); vLLM maps it to DeepseekV3Config (vllm/transformers_utils/config.py, 0.32)
MLA_MODEL_TYPES = (*DEEPSEEK_CONFIG_TYPES, None)
_YARN = ("yarn", "deepseek_yarn")

MLA_CONSUMED = {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                "rope_interleave"}
_MOE = "the target's MoE layout: the draft layer's MLP is dense in both engines (vLLM deepseek_eagle3.py " \
       "DeepseekV2Eagle3DecoderLayer, SGLang deepseek_eagle3.py DeepseekEagle3DecoderLayer: DeepseekV2MLP)"
MLA_HARMLESS = {
    **{k: _MOE for k in ("n_routed_experts", "n_shared_experts", "moe_intermediate_size", "num_experts_per_tok",
                         "first_k_dense_replace", "moe_layer_freq", "topk_method", "n_group", "topk_group",
                         "norm_topk_prob", "scoring_func", "routed_scaling_factor", "ep_size", "aux_loss_alpha",
                         "seq_aux")},
    "num_nextn_predict_layers": "the target's MTP layers; the EAGLE-3 head is one layer of its own",
    "head_dim": "transformers' DeepseekV3Config sets it to qk_rope_head_dim; the MLA dims decide the shapes",
    "rope_is_neox_style": "SGLang's llama-layer switch; MLA RoPE is GPT-J style in both engines (is_neox_style=False)",
    "mlp_bias": "the engines' DeepseekV2MLP has no bias; a bias tensor would fail strict loading",
}


def _rope(layer: dict, where: Path) -> tuple[float, dict | None]:
    """(rope_theta, DeepSeek yarn parameters or None) as the engines read them."""
    theta, scaling = rope_settings(layer, where)
    if not scaling:
        return theta, None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in _YARN:
        raise CheckpointError(f"{where}: key 'rope_scaling' has type {kind!r}; the engines' MLA heads turn any "
                              "rope_scaling into deepseek_yarn (vLLM DeepseekV2MLAAttention.__init__, SGLang "
                              "DeepseekV2AttentionMLA.__init__), so only 'yarn' is accepted here")
    for key in ("factor", "original_max_position_embeddings"):
        if key not in scaling:
            raise CheckpointError(f"{where}: key 'rope_scaling.{key}' missing (DeepSeek yarn needs it)")
    for key in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        if key in scaling and scaling[key] is not None and not (
                isinstance(scaling[key], (int, float)) and not isinstance(scaling[key], bool)):
            raise CheckpointError(f"{where}: key 'rope_scaling.{key}' = {scaling[key]!r}: expected a number")
    return theta, {k: v for k, v in scaling.items() if k != "rope_theta"}


def _mla_settings(layer: dict, where: Path) -> MLASettings:
    if read_key(layer, "attention_bias", where, "bool", False):
        raise CheckpointError(f"{where}: key 'attention_bias' = true; the engines build every MLA projection "
                              "without bias (vLLM DeepseekV2MLAAttention.__init__)")
    try:
        return MLASettings(q_lora_rank=read_key(layer, "q_lora_rank", where, "size", None),
                           kv_lora_rank=config_need(layer, "kv_lora_rank", where),
                           qk_nope_head_dim=config_need(layer, "qk_nope_head_dim", where),
                           qk_rope_head_dim=config_need(layer, "qk_rope_head_dim", where),
                           v_head_dim=config_need(layer, "v_head_dim", where))
    except ValueError as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"{where}: {exc}") from exc


def mla_config_from_json(config: dict, config_file: Path) -> HeadConfig:
    """The MLA head's shape and flags from a flat (SpecForge/TorchSpec-style) config.json; every value
    typed (config.read_key: never coerced)."""
    model_type = read_key(config, "model_type", config_file, "str", None)
    if model_type not in MLA_MODEL_TYPES:
        raise CheckpointError(f"{config_file}: key 'model_type' = {model_type!r}; an Eagle3DeepseekV2ForCausalLM "
                              f"head is expected to say one of {[t for t in MLA_MODEL_TYPES if t]}")
    layers = read_key(config, "num_hidden_layers", config_file, "size", 1)
    if layers != 1:
        raise CheckpointError(f"{config_file}: key 'num_hidden_layers' = {layers!r}; MLA EAGLE-3 heads have one "
                              "layer (SGLang Eagle3DeepseekV2ForCausalLM.__init__ refuses more)")
    if read_key(config, "tie_word_embeddings", config_file, "bool", False):
        raise CheckpointError(f"{config_file}: key 'tie_word_embeddings' = true: SGLang then uses embed_tokens "
                              "as the draft lm_head; not supported")
    eagle_cfg = config_section(config, "eagle_config", config_file)
    if config_flag(config, eagle_cfg, "norm_before_fc", config_file):
        raise CheckpointError(f"{config_file}: key 'norm_before_fc' = true; neither engine's MLA head has that "
                              "norm (vLLM deepseek_eagle3.py, SGLang kimi_k25_eagle3.py)")
    mla = _mla_settings(config, config_file)
    theta, scaling = _rope(config, config_file)
    heads = config_need(config, "num_attention_heads", config_file)
    hidden = config_need(config, "hidden_size", config_file)
    vocab = config_need(config, "vocab_size", config_file)
    try:
        return HeadConfig(
            hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=heads,   # per-head k/v after kv_b
            head_dim=mla.qk_head_dim, intermediate_size=config_need(config, "intermediate_size", config_file),
            vocab_size=vocab, draft_vocab_size=read_key(config, "draft_vocab_size", config_file, "size", vocab),
            target_hidden_size=read_key(config, "target_hidden_size", config_file, "size", hidden),
            rms_norm_eps=float(read_key(config, "rms_norm_eps", config_file, "number", 1e-6)),
            rope_theta=theta, rope_scaling=scaling,
            max_position_embeddings=read_key(config, "max_position_embeddings", config_file, "size", 2048),
            hidden_act=read_key(config, "hidden_act", config_file, "str", "silu"),
            num_aux=3 if read_key(eagle_cfg, "use_aux_hidden_state", config_file, "bool", True,
                                  "eagle_config.") else 1,
            norm_before_residual=read_key(config, "norm_before_residual", config_file, "bool", False),
            fc_norm=config_flag(config, eagle_cfg, "fc_norm", config_file),
            norm_output=config_flag(config, eagle_cfg, "norm_output", config_file),
            rope_interleaved=True, mla=mla)
    except ValueError as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"{config_file}: {exc}") from exc


def mla_config_json(cfg: HeadConfig) -> dict:
    """config.json of an MLA head, as TorchSpec-trained Kimi heads carry it (flat, deepseek_v3)."""
    mla = cfg.mla
    return {
        "architectures": [MLA_ARCHITECTURES[0]], "model_type": "deepseek_v3",
        "hidden_size": cfg.hidden_size, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_attention_heads, "intermediate_size": cfg.intermediate_size,
        "q_lora_rank": mla.q_lora_rank, "kv_lora_rank": mla.kv_lora_rank,
        "qk_nope_head_dim": mla.qk_nope_head_dim, "qk_rope_head_dim": mla.qk_rope_head_dim,
        "v_head_dim": mla.v_head_dim, "vocab_size": cfg.vocab_size, "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": cfg.rope_scaling,
        "max_position_embeddings": cfg.max_position_embeddings, "hidden_act": cfg.hidden_act,
        "num_hidden_layers": 1, "attention_bias": False, "tie_word_embeddings": False,
        **{f: True for f in ("norm_before_residual", "fc_norm", "norm_output") if getattr(cfg, f)},
    }
