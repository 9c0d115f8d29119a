"""No key of a head's config.json goes unread: each is consumed, known harmless, or reported.

Contract: `audit_keys(config, dialect, config_file)` sorts every key, nested ones included
(`eagle_config.*`, speculators' `transformer_layer_config.*` and `speculators_config.*`), into
- consumed: read by `config.head_config_from_json` / `io.load_head` (`CONSUMED_KEYS`);
- harmless: on `HARMLESS` below, each with the reason it cannot change the draft's output, or a key of
  `ENGINE_MATH` that holds its neutral value;
- engine math: a key some engine's loader reads and that changes the draft's math, holding a value
  eagle-eval does not implement (`ENGINE_MATH`, each citing where the engine reads it);
- unknown: anything else.
`check_keys` raises `HeadKeyError` naming every engine-math key and the file, unless
`allow_unknown=True` (`--allow-unknown-head-keys`); unknown keys are warnings. The audit is echoed in
every report (`config.head.keys`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from eagle_eval.heads.eagle3.config import CONSUMED_KEYS, MLA, SPECULATORS, CheckpointError
from eagle_eval.heads.mla.config import MLA_CONSUMED, MLA_HARMLESS

_GENERIC = "Hugging Face PretrainedConfig generic attribute (output / generation / task switches), not the head's math"
HARMLESS = {
    "torch_dtype": "storage dtype; the head runs in the target's dtype (load-time checks report the stored one)",
    "dtype": "storage dtype (transformers 5 name of torch_dtype)",
    "transformers_version": "the writer's transformers version",
    "speculators_version": "the writer's speculators version",
    "_name_or_path": "where the writer loaded the config from",
    "model_type": "config class name at the speculators top level ('speculators'); the decoder layer's is checked",
    "bos_token_id": "tokenizer id; the target's tokenizer decides",
    "eos_token_id": "tokenizer id; the target's generation config and tokenizer decide EOS",
    "pad_token_id": "tokenizer id, padding only",
    "use_cache": "HF's KV-cache switch; the loop owns the draft cache",
    "attention_dropout": "training-time dropout, off at inference",
    "initializer_range": "training init std; read only by the untrained-weight check",
    "pretraining_tp": "HF's sliced matmuls from tensor-parallel pretraining: the same product",
    "embed_requires_grad": "speculators training switch (frozen embedding)",
    "auto_map": "remote-code class pointers; heads never run remote code here",
    "max_window_layers": "Qwen2 config's sliding-window layer threshold, inert unless sliding_window is set (an "
                         "engine-math key here); the Llama draft layers of SGLang and vLLM (llama_eagle3.py) do not "
                         "read it (SpecForge configs/kimi-k2-eagle3.json, kimi-k25-eagle3.json carry it)",
    "next_layer_regular": "ModelOpt layout of the layers after the first; a one-layer head has none",
    "has_lm_head": "ModelOpt export switch; strict loading requires lm_head.weight regardless",
    "parallel_draft_heads_num_layers": "ModelOpt parallel drafting; unused when parallel_draft_step = 1",
    "algorithm": "speculators_config: the algorithm name (eagle3)",
    "default_proposal_method": "speculators_config: a serving default; eagle-eval is greedy",
    "proposal_methods": "speculators_config: serving defaults (speculative_tokens); --num-steps decides",
    "verifier": "speculators_config: the verifier the head was trained for; --target decides",
    **{k: _GENERIC for k in (
        "output_attentions", "output_hidden_states", "return_dict", "torchscript", "use_bfloat16",
        "chunk_size_feed_forward", "is_decoder", "is_encoder_decoder", "add_cross_attention",
        "tie_encoder_decoder", "pruned_heads", "problem_type", "id2label", "label2id", "tokenizer_class",
        "prefix", "sep_token_id", "decoder_start_token_id", "task_specific_params", "finetuning_task",
        "cross_attention_hidden_size", "tf_legacy_loss", "return_dict_in_generate", "output_scores")},
    # transformers 4.x PretrainedConfig kept generation defaults in config.json; exports that copy the
    # target's config attributes (ModelOpt hf_spec_export.py export_spec_ckpt_config) write them
    **{k: "transformers 4.x generation default kept in the config (sampling / search); engines take sampling "
          "from the request, eagle-eval decodes greedily" for k in (
        "do_sample", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
        "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "num_beams", "num_beam_groups", "diversity_penalty",
        "early_stopping", "max_length", "min_length", "num_return_sequences", "forced_bos_token_id",
        "forced_eos_token_id", "remove_invalid_values", "bad_words_ids", "exponential_decay_length_penalty",
        "suppress_tokens", "begin_suppress_tokens")},
}


@dataclass(frozen=True)
class EngineKey:
    neutral: tuple            # values that leave the standard EAGLE-3 head unchanged
    where: str                # where an engine reads it and what it does


ENGINE_MATH = {
    "logit_scale": EngineKey((1, 1.0, None), "vLLM llama_eagle3.py Eagle3LlamaForCausalLM.__init__: "
                                             "LogitsProcessor(scale=logit_scale) scales the draft logits"),
    "qkv_bias": EngineKey((False, None), "vLLM llama_eagle3.py LlamaDecoderLayer.__init__: attention bias"),
    "bias": EngineKey((False, None), "SGLang llama_eagle3.py LlamaModel.__init__: fc bias; vLLM llama_eagle3.py "
                                     "LlamaDecoderLayer.__init__: attention bias"),
    "is_causal": EngineKey((True, None), "vLLM llama_eagle3.py LlamaDecoderLayer.__init__: False selects "
                                         "bidirectional attention"),
    "partial_rotary_factor": EngineKey((1, 1.0, None), "speculators models/eagle3/rotary_partial.py: RoPE on "
                                                       "part of head_dim"),
    "sliding_window": EngineKey((None,), "speculators models/eagle3/core.py Eagle3DraftModel.__init__: sliding "
                                         "window attention on layers typed sliding_attention"),
    "use_sliding_window": EngineKey((False, None), "sliding window attention (speculators core.py)"),
    "layer_types": EngineKey((None, ("full_attention",), ["full_attention"]),
                             "speculators core.py Eagle3DraftModel.__init__: per-layer attention type"),
    "intermediate_size_mlp": EngineKey((None,), "SGLang llama_eagle3.py LlamaDecoderLayer.__init__: MLP width "
                                                "for llama4_text"),
    "original_max_position_embeddings": EngineKey((None,), "SGLang llama.py LlamaDecoderLayer.__init__: copied "
                                                           "into rope_scaling (llama3 / yarn scaling)"),
    "use_input_layernorm_in_first_layer": EngineKey((True, None), "ModelOpt unified_export_megatron.py: the head "
                                                    "was trained without its first-layer norm; SGLang and vLLM apply "
                                                    "hidden_norm regardless"),
    "use_last_layernorm": EngineKey((True, None), "ModelOpt unified_export_megatron.py: the head was trained without "
                                                  "its final norm; SGLang and vLLM apply norm regardless"),
    "use_mtp_layernorm": EngineKey((False, None), "ModelOpt unified_export_megatron.py: MTP-style enorm/hnorm"),
    "parallel_draft_step": EngineKey((1, None), "ModelOpt parallel drafting (several tokens per draft forward)"),
    # MLA heads (heads/mla/config.py)
    "index_topk": EngineKey((None,), "vLLM deepseek_v2.py DeepseekV2MLAAttention.__init__: is_v32 = hasattr(config, "
                                     "'index_topk') adds DeepSeek-V3.2's sparse-attention indexer"),
    "apply_yarn_scaling": EngineKey((True, None), "vLLM deepseek_v2.py DeepseekV2MLAAttention.__init__: False turns "
                                                  "deepseek_yarn into deepseek_llama_scaling"),
    "use_aux_norm": EngineKey((False, None), "SGLang kimi_k25_eagle3.py Eagle3MLAModel.__init__: legacy alias of "
                                             "fc_norm (per-aux RMSNorm before fc); vLLM reads only fc_norm"),
}


class HeadKeyError(CheckpointError):
    """A head config key that changes the draft's math in an engine but not here."""


@dataclass
class KeyAudit:
    consumed: list[str] = field(default_factory=list)
    harmless: dict[str, str] = field(default_factory=dict)            # key -> reason
    engine_math: dict[str, str] = field(default_factory=dict)         # key -> "value: where"
    unknown: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"consumed": self.consumed, "harmless": self.harmless, "engine_math": self.engine_math,
                "unknown": self.unknown}


def _sections(config: dict, dialect: str) -> list[tuple[str, dict, set]]:
    """(prefix, dict, consumed keys) for the top level and each nested config the loader knows."""
    top_keys = CONSUMED_KEYS["top"] | (set() if dialect == SPECULATORS else CONSUMED_KEYS["layer"]) | \
        (MLA_CONSUMED if dialect == MLA else set())
    if dialect == MLA:                       # Llama-layer keys an MLA layer does not read (MLA_HARMLESS says why)
        top_keys -= set(MLA_HARMLESS)
    out = [("", config, top_keys)]
    for name, consumed in (("transformer_layer_config", CONSUMED_KEYS["layer"]),
                           ("eagle_config", CONSUMED_KEYS["eagle_config"]), ("speculators_config", set())):
        if isinstance(config.get(name), dict):
            out.append((name + ".", config[name], consumed))
    return out


def audit_keys(config: dict, dialect: str) -> KeyAudit:
    audit = KeyAudit()
    for prefix, section, consumed in _sections(config, dialect):
        for key, value in section.items():
            name = prefix + key
            spec = ENGINE_MATH.get(key)
            if key in consumed:
                audit.consumed.append(name)
            elif key in HARMLESS:
                audit.harmless[name] = HARMLESS[key]
            elif dialect == MLA and key in MLA_HARMLESS:
                audit.harmless[name] = MLA_HARMLESS[key]
            elif spec is not None and value in spec.neutral:
                audit.harmless[name] = f"neutral value {value!r} ({spec.where})"
            elif spec is not None:
                audit.engine_math[name] = f"{value!r}: {spec.where}"
            else:
                audit.unknown.append(name)
    # transformers 5 may keep partial_rotary_factor inside rope_parameters (the rest of it is the RoPE the loader
    # reads): an engine that honours it rotates part of head_dim (speculators#613: served acceptance ~1)
    for prefix, section, _ in _sections(config, dialect):
        rope = section.get("rope_parameters")
        if isinstance(rope, dict) and "partial_rotary_factor" in rope:
            spec, value = ENGINE_MATH["partial_rotary_factor"], rope["partial_rotary_factor"]
            name = f"{prefix}rope_parameters.partial_rotary_factor"
            if value in spec.neutral:
                audit.harmless[name] = f"neutral value {value!r} ({spec.where})"
            else:
                audit.engine_math[name] = f"{value!r}: {spec.where}"
    return audit


def check_keys(audit: KeyAudit, config_file: Path, allow_unknown: bool = False) -> list[str]:
    """Raise on engine-math keys (unless allowed); return the warnings to show."""
    notes = [f"{config_file}: key {k!r} changes the draft's math in an engine ({v}); proceeding without it "
             "(--allow-unknown-head-keys): no engine may match these results" for k, v in audit.engine_math.items()]
    if audit.engine_math and not allow_unknown:
        listed = "; ".join(f"{k!r} = {v}" for k, v in audit.engine_math.items())
        raise HeadKeyError(f"{config_file}: key(s) that change the draft's math in an engine but are not "
                           f"implemented by eagle-eval: {listed}. Pass --allow-unknown-head-keys to proceed anyway")
    if audit.unknown:
        notes.append(f"{config_file}: unknown key(s) {audit.unknown}: not read by eagle-eval, and not among the "
                     "keys SGLang, vLLM or speculators are known to read for the draft's math")
    return notes
