"""No key of a DFlash config.json goes unread: each is consumed, known harmless, or reported.

Contract: `audit_dflash_keys(config, layout)` sorts every key (the nested `dflash_config.*`,
`transformer_layer_config.*` and `speculators_config.*` included) as heads/eagle3/keys.py does for EAGLE-3
heads, into the same `KeyAudit`: consumed (dflash/layouts.py `CONSUMED`), harmless (heads/keys.py `HARMLESS`
plus `DFLASH_HARMLESS` below, each with its reason, or an engine-math key at its neutral value), engine math
(`ENGINE_MATH` of heads/keys.py plus `DFLASH_ENGINE_MATH`: a key some engine reads that changes the drafts,
holding a value not implemented here) and unknown. heads/keys.py `check_keys` then raises on engine math
unless allowed and warns on unknown keys. `auto_map` is harmless because nothing in a checkpoint folder is
ever imported or run.
"""

from __future__ import annotations

from eagle_eval.heads.dflash.config import SPECULATORS
from eagle_eval.heads.dflash.layouts import CONSUMED
from eagle_eval.heads.eagle3.keys import ENGINE_MATH, HARMLESS, EngineKey, KeyAudit

DFLASH_HARMLESS = {
    "tie_word_embeddings": "the draft's embedding and lm_head are the target's (z-lab) or loaded by name "
                           "(speculators lm_head.weight is required): no tying happens in either engine's DFlash",
    "mask_token": "SGLang's fallback (DFlashWorker._resolve_mask_token_id) when mask_token_id is absent; "
                  "mask_token_id is required here",
    "speculators_version": "the writer's speculators version",
}

DFLASH_ENGINE_MATH = {
    "use_swa": EngineKey((False, None), "vLLM qwen3_dflash._resolve_layer_attention: every draft layer "
                                        "sliding-window"),
    "swa_window_size": EngineKey((None,), "vLLM qwen3_dflash._resolve_layer_attention: the window, over "
                                          "sliding_window"),
    "use_aux_hidden_state": EngineKey((True, None), "vLLM qwen3_dflash.DFlashQwen3Model.__init__: false drops fc "
                                                    "(the target's last state feeds the draft as is)"),
    "attention_sink_bias": EngineKey((None, False), "SGLang models/dflash.py (MiMo): an attention-sink bias on "
                                                    "sliding layers"),
    "add_swa_attention_sink_bias": EngineKey((None, False), "vLLM qwen3_dflash.DFlashQwen3Attention (MiMo): an "
                                                            "attention-sink bias on sliding layers"),
    "attention_value_scale": EngineKey((None, 1, 1.0), "vLLM qwen3_dflash.DFlashQwen3Attention.forward: v *= scale "
                                                       "(MiMo)"),
    "projector_type": EngineKey((None,), "SGLang models/dflash.py: 'domino' replaces fc by another projector"),
    "sample_from_anchor": EngineKey((False, None), "the anchor row drafts too (DSpark-style); vLLM V1 ignores it, "
                                                   "V2 refuses it for DFlash"),
    "layer_ids": EngineKey((None,), "vLLM eagle3_utils.get_eagle3_aux_layers_from_config: aux ids when no "
                                    "target_layer_ids"),
}


def _sections(config: dict, layout: str) -> list[tuple[str, dict, set]]:
    """(prefix, dict, consumed keys) for the top level and each nested config read."""
    if layout == SPECULATORS:
        out = [("", config, CONSUMED["speculators"])]
        for name, consumed in (("transformer_layer_config", CONSUMED["layer"]), ("speculators_config", set())):
            if isinstance(config.get(name), dict):
                out.append((name + ".", config[name], consumed))
        return out
    out = [("", config, CONSUMED["layer"] | CONSUMED["zlab"])]
    if isinstance(config.get("dflash_config"), dict):
        out.append(("dflash_config.", config["dflash_config"], CONSUMED["dflash_config"]))
    return out


def audit_dflash_keys(config: dict, layout: str) -> KeyAudit:
    audit = KeyAudit()
    for prefix, section, consumed in _sections(config, layout):
        for key, value in section.items():
            name = prefix + key
            spec = DFLASH_ENGINE_MATH.get(key, ENGINE_MATH.get(key))
            if key in consumed:
                audit.consumed.append(name)
            elif key in DFLASH_HARMLESS or key in HARMLESS:
                audit.harmless[name] = DFLASH_HARMLESS.get(key) or HARMLESS[key]
            elif spec is not None and _neutral(value, spec):
                audit.harmless[name] = f"neutral value {value!r} ({spec.where})"
            elif spec is not None:
                audit.engine_math[name] = f"{value!r}: {spec.where}"
            else:
                audit.unknown.append(name)
    return audit


def _neutral(value, spec: EngineKey) -> bool:
    """value among the neutral ones, by type as well (JSON true is not 1)."""
    return any(type(value) is type(n) and value == n or value is n for n in spec.neutral)
