"""A DFlash / DFlash2 config.json of either layout <-> `DFlashConfig` (dflash/config.py).

Contract: `dflash_config_from_json(config, config_file)` builds the config, every value typed (heads/config.py
`read_key`: never coerced), and returns the notes a reader must see (settings the engines read differently);
`CONSUMED` lists every key it reads (dflash/keys.py audits the rest); `config_json(cfg, layout)` writes one.
No torch here.

| layout | config.json | the block settings |
|---|---|---|
| `z-lab` (published `z-lab/*-DFlash*`, what vLLM and SGLang read natively) | the draft's Qwen3 config (`model_type: qwen3`, `architectures: [DFlashDraftModel]` or `[DFlash2DraftModel]`) | `dflash_config.*`, else the same key at the top level (z-lab PyPI 0.1.0 `dflash/model.py` `_draft_value`; SGLang `dflash_utils.parse_dflash_draft_config`); `block_size` and `num_target_layers` at the top level in the Qwen3/LLaMA checkpoints |
| `speculators` (`speculators_model_type: dflash`) | `transformer_layer_config` (Qwen3) | top level: `block_size`, `aux_hidden_state_layer_ids` (= z-lab id + 1), `mask_token_id`, `draft_vocab_size`, `target_hidden_size`, `sliding_window_non_causal`, `sample_from_anchor` (speculators `models/dflash/config.py` `DFlashSpeculatorConfig`) |
"""

from __future__ import annotations

import json
from pathlib import Path

from eagle_eval.heads.eagle3.config import REQUIRED, CheckpointError, config_section, read_key, rope_settings
from eagle_eval.heads.dflash.config import (
    ARCHITECTURES,
    DEFAULT_BLOCK_SIZE,
    DFLASH,
    DFLASH2,
    DFLASH2_KEYS,
    FULL,
    SLIDING,
    SPECULATORS,
    SPECULATORS_ARCHITECTURES,
    ZLAB,
    DFlashConfig,
    default_target_layer_ids,
)

# keys read, by section: "layer" = the Qwen3 draft-layer keys (top level for z-lab, transformer_layer_config for
# speculators), "zlab" = the z-lab top level besides them, "dflash_config" = z-lab's nested dict,
# "speculators" = the speculators top level
CONSUMED = {
    "layer": {"model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "intermediate_size", "vocab_size", "rms_norm_eps", "rope_theta", "rope_parameters",
              "rope_scaling", "max_position_embeddings", "hidden_act", "attention_bias", "layer_types",
              "sliding_window", "use_sliding_window", "max_window_layers", "is_causal"},
    "zlab": {"architectures", "block_size", "num_target_layers", "dflash_config", "mask_token_id", "target_layer_ids",
             "input_embedding_scale", "output_multiplier", "final_logit_softcapping", *DFLASH2_KEYS,
             "eagle_aux_hidden_state_layer_ids"},
    "dflash_config": {"mask_token_id", "target_layer_ids", "block_size", "input_embedding_scale", "output_multiplier",
                      "final_logit_softcapping", "causal", *DFLASH2_KEYS},
    "speculators": {"architectures", "speculators_model_type", "transformer_layer_config", "draft_vocab_size",
                    "block_size", "target_hidden_size", "aux_hidden_state_layer_ids", "mask_token_id",
                    "sliding_window_non_causal", "sample_from_anchor", "speculators_config"},
}


def detect_layout(config: dict, config_file: Path) -> tuple[str, str]:
    """(layout, kind) from `architectures` / `speculators_model_type`."""
    archs = read_key(config, "architectures", config_file, "names", [])
    spec_type = read_key(config, "speculators_model_type", config_file, "str", None)
    if spec_type is not None or any(a in SPECULATORS_ARCHITECTURES for a in archs):
        if spec_type != DFLASH:
            raise CheckpointError(f"{config_file}: key 'speculators_model_type' = {spec_type!r}; expected 'dflash' "
                                  "(speculators has no DFlash2 model; vLLM's update_dflash2 names no tensors)")
        return SPECULATORS, DFLASH
    kinds = {ARCHITECTURES[a] for a in archs if a in ARCHITECTURES}
    if len(kinds) != 1:
        raise CheckpointError(f"{config_file}: key 'architectures' = {archs!r}; expected ['DFlashDraftModel'] or "
                              "['DFlash2DraftModel'] (z-lab layout) or speculators_model_type 'dflash'")
    return ZLAB, kinds.pop()


def _either(dflash: dict, top: dict, key: str, where: Path, kind: str, default=None):
    """dflash_config[key], else top[key] (z-lab PyPI `_draft_value`); both given and different is an error: the
    speculators converter reads block_size from the top level first, z-lab and SGLang from dflash_config."""
    nested = read_key(dflash, key, where, kind, None, "dflash_config.")
    flat = read_key(top, key, where, kind, None)
    if nested is not None and flat is not None and nested != flat:
        raise CheckpointError(f"{where}: key {key!r} = {flat!r} at the top level but dflash_config.{key} = {nested!r}: "
                              "the engines read different values")
    return nested if nested is not None else flat if flat is not None else default


def _layer(layer: dict, where: Path, section: str) -> dict:
    """The Qwen3 draft-layer settings (shapes required: Qwen3Config's own defaults, e.g. head_dim 128, are not
    assumed), the sliding-window resolution of transformers' Qwen3Config.__post_init__ included."""
    model_type = read_key(layer, "model_type", where, "str", "qwen3", section)
    if model_type != "qwen3":
        raise CheckpointError(f"{where}: key {section}'model_type' = {model_type!r}; the DFlash draft layer is Qwen3's "
                              "(q/k norms; z-lab and vLLM build it from a Qwen3Config)")

    def size(key, default=REQUIRED):
        return read_key(layer, key, where, "size", default, section)

    n = size("num_hidden_layers")
    use_window = read_key(layer, "use_sliding_window", where, "bool", False, section)
    window = size("sliding_window", None) if use_window else None
    threshold = read_key(layer, "max_window_layers", where, "int", 28, section)
    types = read_key(layer, "layer_types", where, "names", None, section)
    if types is None:                      # Qwen3Config.__post_init__ builds them so
        types = [SLIDING if window is not None and i >= threshold else FULL for i in range(n)]
    _check_rope(layer, where, section)
    theta, scaling = rope_settings(layer, where, section)
    return dict(hidden_size=size("hidden_size"), num_hidden_layers=n, num_attention_heads=size("num_attention_heads"),
                num_key_value_heads=size("num_key_value_heads"), head_dim=size("head_dim"),
                intermediate_size=size("intermediate_size"), vocab_size=size("vocab_size"),
                rms_norm_eps=float(read_key(layer, "rms_norm_eps", where, "number", 1e-6, section)),
                rope_theta=theta, rope_scaling=scaling,
                max_position_embeddings=size("max_position_embeddings", 32768),
                hidden_act=read_key(layer, "hidden_act", where, "str", "silu", section),
                attention_bias=read_key(layer, "attention_bias", where, "bool", False, section),
                layer_types=tuple(types), sliding_window=window)


def _softcap(dflash: dict, top: dict, where: Path) -> float | None:
    """final_logit_softcapping: applied by z-lab PyPI only when > 0 (absent, null and 0 mean none)."""
    if all(d.get("final_logit_softcapping") is None or (type(d["final_logit_softcapping"]) in (int, float)
                                                         and d["final_logit_softcapping"] == 0) for d in (dflash, top)):
        return None
    return float(_either(dflash, top, "final_logit_softcapping", where, "number"))


def _zlab(config: dict, kind: str, where: Path, notes: list[str]) -> dict:
    dflash = config_section(config, "dflash_config", where)
    layer = _layer(config, where, "")
    n_target = read_key(config, "num_target_layers", where, "size", None)
    block = _either(dflash, config, "block_size", where, "size", None)
    if block is None:
        block = DEFAULT_BLOCK_SIZE
        notes.append(f"{where}: no block_size (top level or dflash_config): {DEFAULT_BLOCK_SIZE} assumed, as z-lab "
                     "PyPI and SGLang assume; the speculators converter refuses such a config")
    mask = _either(dflash, config, "mask_token_id", where, "int", None)
    if mask is None:
        raise CheckpointError(f"{where}: missing key 'dflash_config.mask_token_id' (vLLM refuses a DFlash draft "
                              "without it; SGLang would look up a '<|MASK|>' token in the tokenizer)")
    ids = _either(dflash, config, "target_layer_ids", where, "ids", None)
    defaulted = ids is None
    if defaulted:
        if n_target is None:
            raise CheckpointError(f"{where}: missing key 'dflash_config.target_layer_ids' and no 'num_target_layers' "
                                  "to build z-lab's default from")
        ids = default_target_layer_ids(n_target, layer["num_hidden_layers"])
        notes.append(f"{where}: no target_layer_ids: z-lab's default {ids} for num_target_layers={n_target} "
                     "(build_target_layer_ids); vLLM 0.32 finds no ids in such a config "
                     "(eagle3_utils.get_eagle3_aux_layers_from_config) and does not build that default")
    is_causal = read_key(config, "is_causal", where, "bool", None)
    causal = (is_causal,) * layer["num_hidden_layers"] if is_causal is not None else ()
    vllm_ids = read_key(config, "eagle_aux_hidden_state_layer_ids", where, "ids", None)
    extra = {k: _either(dflash, config, k, where, "size", None) for k in DFLASH2_KEYS}
    return dict(**layer, kind=kind, layout=ZLAB, block_size=block, mask_token_id=mask, target_layer_ids=tuple(ids),
                causal=causal, num_target_layers=n_target, ids_defaulted=defaulted,
                input_embedding_scale=float(_either(dflash, config, "input_embedding_scale", where, "number", 1.0)),
                output_multiplier=float(_either(dflash, config, "output_multiplier", where, "number", 1.0)),
                final_logit_softcapping=_softcap(dflash, config, where),
                vllm_aux_ids=tuple(vllm_ids) if vllm_ids is not None else None, **extra)


def _served_tokens(config: dict, block: int, where: Path) -> list[str]:
    """speculators_config.proposal_methods[0].speculative_tokens, the num_speculative_tokens vLLM takes when this
    folder is served (vLLM speculators base.py): a note when it is not block_size - 1."""
    methods = config_section(config, "speculators_config", where).get("proposal_methods") or []
    if not isinstance(methods, list):
        raise CheckpointError(f"{where}: key speculators_config.'proposal_methods' = {json.dumps(methods)[:60]}: "
                              "expected a list")
    first = methods[0] if methods and isinstance(methods[0], dict) else {}
    tokens = read_key(first, "speculative_tokens", where, "size", None, "speculators_config.proposal_methods[0].")
    if tokens is None or tokens == block - 1:
        return []
    return [f"{where}: speculators_config.proposal_methods[0].speculative_tokens = {tokens}, block_size = {block}: "
            f"vLLM serving this folder runs blocks of {tokens + 1} rows, not the trained {block}"]


def _speculators(config: dict, where: Path, notes: list[str]) -> dict:
    section = "transformer_layer_config."
    layer_cfg = read_key(config, "transformer_layer_config", where, "object")
    layer = _layer(layer_cfg, where, section)
    if read_key(config, "sample_from_anchor", where, "bool", False):
        raise CheckpointError(f"{where}: key 'sample_from_anchor' = true: the anchor row drafts too (DSpark-style); "
                              "vLLM's V1 runner ignores it and V2 refuses it for DFlash; not implemented here")
    aux = read_key(config, "aux_hidden_state_layer_ids", where, "ids")
    if any(i < 1 for i in aux):
        raise CheckpointError(f"{where}: key 'aux_hidden_state_layer_ids' = {aux}: speculators ids are z-lab ids + 1, "
                              "so >= 1 (vLLM update_dflash subtracts 1)")
    block = read_key(config, "block_size", where, "size", 8)
    notes += _served_tokens(config, block, where)
    non_causal_sliding = read_key(config, "sliding_window_non_causal", where, "bool", False)
    causal = tuple(t == SLIDING and not non_causal_sliding for t in layer["layer_types"])
    return dict(**layer, kind=DFLASH, layout=SPECULATORS,
                block_size=block,
                mask_token_id=read_key(config, "mask_token_id", where, "int"),
                target_layer_ids=tuple(i - 1 for i in aux), causal=causal,
                draft_vocab_size=read_key(config, "draft_vocab_size", where, "size", layer["vocab_size"]),
                target_hidden_size=read_key(config, "target_hidden_size", where, "size", layer["hidden_size"]))


def _vllm_causal(config: dict, cfg: DFlashConfig, where: Path) -> tuple[tuple[bool, ...], str]:
    """The causality vLLM 0.32 serves per draft layer (`qwen3_dflash._dflash_layer_causal`): the draft HF config's
    is_causal, else dflash_config.causal (for speculators, `update_dflash` sets it to not sliding_window_non_causal,
    True when absent), each for EVERY layer; else sliding layers causal."""
    layer = read_key(config, "transformer_layer_config", where, "object") if cfg.layout == SPECULATORS else config
    section = "transformer_layer_config." if cfg.layout == SPECULATORS else ""
    is_causal = read_key(layer, "is_causal", where, "bool", None, section)
    if is_causal is not None:
        return (is_causal,) * cfg.num_hidden_layers, f"{section}is_causal = {is_causal}"
    if cfg.layout == ZLAB:
        override = read_key(config_section(config, "dflash_config", where), "causal", where, "bool", None,
                            "dflash_config.")
        reason = f"dflash_config.causal = {override}"
    else:
        flag = read_key(config, "sliding_window_non_causal", where, "bool", None)
        override, reason = not (flag if flag is not None else True), \
            f"update_dflash sets causal = not sliding_window_non_causal ({flag})"
    if override is not None:
        return (override,) * cfg.num_hidden_layers, reason
    return tuple(t == SLIDING for t in cfg.layer_types), "layer_types"


def _causal_notes(config: dict, cfg: DFlashConfig, where: Path) -> list[str]:
    """A note where vLLM 0.32 serves another causality than the one read (z-lab PyPI's, or speculators' training)."""
    served, reason = _vllm_causal(config, cfg, where)
    if served == cfg.causal:
        return []
    return [f"{where}: vLLM 0.32 serves the draft layers as causal = {list(served)} ({reason}); read here as "
            f"{list(cfg.causal)} (z-lab PyPI / speculators training): vLLM's drafts differ"]


def _check_rope(layer: dict, where: Path, section: str) -> None:
    """RoPE settings beyond theta and the scaling type are refused where they would be dropped in silence: a
    partial_rotary_factor below 1 rotates part of head_dim in vLLM and not in HF training (speculators#613: served
    acceptance about 1 with nothing said)."""
    for name in ("rope_parameters", "rope_scaling"):
        for key, value in (read_key(layer, name, where, "object", None, section) or {}).items():
            if key == "partial_rotary_factor" and value not in (1, 1.0):
                raise CheckpointError(f"{where}: key {section}{name}.partial_rotary_factor = {value!r}: partial RoPE "
                                      "is not implemented (vLLM rotates that fraction of head_dim, HF training "
                                      "rotates all of it: speculators#613)")


def dflash_config_from_json(config: dict, config_file: Path) -> tuple[DFlashConfig, list[str]]:
    """(the config, notes for the reader) from a DFlash config.json of either layout."""
    layout, kind = detect_layout(config, config_file)
    notes: list[str] = []
    settings = _zlab(config, kind, config_file, notes) if layout == ZLAB else _speculators(config, config_file, notes)
    try:
        cfg = DFlashConfig(**settings)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{config_file}: {exc}") from exc
    notes += _causal_notes(config, cfg, config_file)
    if cfg.vllm_aux_ids is not None and cfg.vllm_aux_ids != cfg.aux_hf:
        notes.append(f"{config_file}: key 'eagle_aux_hidden_state_layer_ids' = {list(cfg.vllm_aux_ids)}: vLLM 0.32 "
                     f"taps those HF indices (the eagle key wins), z-lab and SGLang HF {list(cfg.aux_hf)} "
                     f"(target_layer_ids {list(cfg.target_layer_ids)} + 1); read here as z-lab does")
    if cfg.kind == DFLASH and (cfg.input_embedding_scale, cfg.output_multiplier, cfg.final_logit_softcapping) != (
            1.0, 1.0, None):
        notes.append(f"{config_file}: input_embedding_scale / output_multiplier / final_logit_softcapping = "
                     f"{cfg.input_embedding_scale} / {cfg.output_multiplier} / {cfg.final_logit_softcapping}: applied "
                     "as z-lab PyPI applies them; vLLM's DFlash (qwen3_dflash.py) ignores all three")
    return cfg, notes


# -- writing ------------------------------------------------------------------------------------------------------

def _layer_json(cfg: DFlashConfig) -> dict:
    rope = {"rope_type": "default", **(cfg.rope_scaling or {}), "rope_theta": cfg.rope_theta}
    window = {"use_sliding_window": True, "sliding_window": cfg.sliding_window, "max_window_layers": 0} \
        if SLIDING in cfg.layer_types else {"use_sliding_window": False, "sliding_window": None}
    return {"model_type": "qwen3", "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_hidden_layers,
            "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim, "intermediate_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size,
            "rms_norm_eps": cfg.rms_norm_eps, "rope_parameters": rope,
            "max_position_embeddings": cfg.max_position_embeddings, "hidden_act": cfg.hidden_act,
            "attention_bias": cfg.attention_bias, "layer_types": list(cfg.layer_types), **window,
            "tie_word_embeddings": False}


def _causal_json(cfg: DFlashConfig) -> dict:
    """The keys that give cfg.causal: none when it is the default, else one is_causal for every layer."""
    default = tuple(t == SLIDING for t in cfg.layer_types)
    if cfg.causal == default:
        return {}
    if len(set(cfg.causal)) == 1:
        return {"is_causal": cfg.causal[0]}
    raise ValueError(f"causal {list(cfg.causal)}: per-layer causality other than the layer types' default has no "
                     "config key (is_causal sets every layer)")


def config_json(cfg: DFlashConfig, layout: str) -> dict:
    """The config.json of `cfg` in `layout` (the z-lab one readable by z-lab PyPI's from_pretrained)."""
    if layout == ZLAB:
        extra = {k: getattr(cfg, k) for k in ("input_embedding_scale", "output_multiplier", "final_logit_softcapping")
                 if getattr(cfg, k) not in (1.0, None)}
        dflash = {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids),
                  **{k: getattr(cfg, k) for k in DFLASH2_KEYS if getattr(cfg, k) is not None}, **extra}
        if cfg.num_target_layers is None:        # z-lab PyPI reads it even when the ids are given
            raise ValueError("the z-lab layout carries num_target_layers (DFlashDraftModel.__init__ reads it)")
        arch = "DFlash2DraftModel" if cfg.kind == DFLASH2 else "DFlashDraftModel"
        return {"architectures": [arch], **_layer_json(cfg), **_causal_json(cfg), "block_size": cfg.block_size,
                "num_target_layers": cfg.num_target_layers, "dflash_config": dflash}
    if cfg.kind == DFLASH2 or cfg.input_embedding_scale != 1.0 or cfg.output_multiplier != 1.0 \
            or cfg.final_logit_softcapping is not None:
        raise ValueError("the speculators layout has no DFlash2 model and no embedding scale / logit multiplier keys")
    sliding = [c for c, t in zip(cfg.causal, cfg.layer_types) if t == SLIDING]
    if any(c for c, t in zip(cfg.causal, cfg.layer_types) if t != SLIDING) or len(set(sliding)) > 1:
        raise ValueError(f"causal {list(cfg.causal)}: speculators trains full layers non-causal and every sliding "
                         "layer alike (sliding_window_non_causal)")
    return {"architectures": ["DFlashSpeculator"], "speculators_model_type": "dflash",
            "transformer_layer_config": _layer_json(cfg), "draft_vocab_size": cfg.draft_vocab_size,
            "block_size": cfg.block_size, "target_hidden_size": cfg.target_hidden_size,
            "aux_hidden_state_layer_ids": list(cfg.aux_hf), "mask_token_id": cfg.mask_token_id,
            "sliding_window_non_causal": bool(sliding) and not sliding[0], "sample_from_anchor": False,
            "speculators_config": {"algorithm": "dflash", "default_proposal_method": "greedy", "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": cfg.block_size - 1}]}}
