"""The kind record of the MTP layers (`registry.HEAD_KINDS["mtp"]`): named by keyword (`--draft mtp` reads them from
the TARGET's checkpoint: heads/mtp/load.py), wired by heads/mtp/wire.py, the target's last hidden state its one tap,
a draft KV cache of the family's attention (GQA: K and V of the kv heads; MLA: per head, as eagle-eval holds it).
Only this record loads when a head of another kind is read: the rest of heads/mtp is imported by its functions."""

from __future__ import annotations

from eagle_eval.heads.kind import HeadKind
from eagle_eval.models.capture import post_norm_index

# a target's MTP layer exported on its own (SGLang's NextN drafts: the target's config with num_hidden_layers 1, the
# layer as model.layers.0, read by deepseek_weight_loader / glm4_moe.py with nextn_layer_id 0)
NEXTN_ARCHITECTURES = ("DeepseekV3ForCausalLMNextN", "Glm4MoeForCausalLMNextN")
NEXTN_EXPORT = "nextn-export"


def detect(config: dict) -> str | None:
    archs = config.get("architectures") or []
    return NEXTN_EXPORT if isinstance(archs, list) and any(a in NEXTN_ARCHITECTURES for a in archs) else None


def load(path, config_file, config: dict, dialect: str, allow_unknown_keys: bool):
    """A separately exported MTP layer (`--draft FOLDER`), read as strictly as the target's own."""
    from eagle_eval.heads.mtp.load import load_export

    return load_export(path, config_file, config)


def load_from_target(target, allow_unknown_keys: bool = False):
    """The MTP layers of the loaded `target`'s own checkpoint -> heads/io.py LoadedHead (head: MTPStack)."""
    from eagle_eval.heads.mtp.load import load_from_target as load

    return load(target)


def wire(settings, loaded, target, weight_checks: dict):
    from eagle_eval.heads.mtp.wire import wire_mtp

    return wire_mtp(settings, loaded, target, weight_checks)


def variants(settings, resolved) -> list[tuple[str, str, dict]]:
    from eagle_eval.heads.mtp.wire import variants as mtp_variants

    return mtp_variants(settings, resolved)


def meta_from_target(config: dict, config_file, decoder):
    """The MTP layers `--draft mtp` would load, on the meta device (the caller's device context), their config, and
    their heads/mtp/keys.py KeyMap (the checkpoint names of their tensors: `plan` holds them as the target's are)."""
    from eagle_eval.heads.mtp.load import meta_stack

    return meta_stack(config, config_file, decoder)


def kv_bytes(cfg, size: int) -> int:
    """The MTP block's K and V per token, as eagle-eval holds them (MLA: decompressed, per head)."""
    t = cfg.text_config
    if cfg.layout.attention == "mla":
        return t.num_attention_heads * (t.qk_nope_head_dim + t.qk_rope_head_dim + t.v_head_dim) * size
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    return 2 * t.num_key_value_heads * head_dim * size


def _meta(*args, **kwargs):
    from eagle_eval.heads.eagle3.config import CheckpointError

    raise CheckpointError("plan reads an MTP layer from the target's config: --draft mtp")


KIND = HeadKind(
    name="mtp", description="the target's own multi-token-prediction (MTP) layers",
    architectures="--draft mtp (the target's own MTP layers: DeepSeek-V3, GLM-4.5, Qwen3-Next, Qwen3.5, MiMo); "
                  + ", ".join(f"'{a}'" for a in NEXTN_ARCHITECTURES) + " (an MTP layer exported alone, SGLang NextN)",
    detect=detect, load=load,
    default_taps=lambda num_layers, cfg: [post_norm_index(num_layers)],
    kv_bytes=kv_bytes, meta=_meta, info=lambda cfg: {"family": cfg.family},
    wire=wire, keyword="mtp", load_from_target=load_from_target, variants=variants, meta_from_target=meta_from_target,
    sglang_algorithms=("NEXTN", "EAGLE"), options=("mtp_convention", "mtp_planted"))
