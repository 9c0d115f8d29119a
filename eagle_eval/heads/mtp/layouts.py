"""Where each family keeps its MTP layers inside the TARGET's checkpoint, and what each key is (no torch).

Contract: `family_of(config)` names the layout of a target's config.json (its text part for a multimodal wrapper),
or None; `LAYOUTS[family]` is its record: the config key that counts the MTP layers, the checkpoint names of the
fusion (two norms and the 2H -> H projection), of the output norm and of the decoder block of layer i, the tensors
a layer carries that no engine uses (its own embedding and head: every engine shares the target's), and the fusion
order. The key tables below are what `load` reads, one row per tensor (docs/mtp.md section 1):

| family | layer i lives under | fusion (embedding norm, hidden norm, projection) | output norm | fusion order |
|---|---|---|---|---|
| DeepSeek-V3 / Kimi-K2 | `model.layers.{N+i}.` (the text decoder's own prefix) | `enorm`, `hnorm`, `eh_proj` | `shared_head.norm` | embedding first |
| GLM-4.5 (`glm4_moe`) | `model.layers.{N+i}.` | `enorm`, `hnorm`, `eh_proj` | `shared_head.norm` | embedding first |
| Qwen3-Next, Qwen3.5 | `mtp.layers.{i}.` | `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.fc` (shared by the layers) | `mtp.norm` (shared) | embedding first |
| MiMo | `model.mtp_layers.{i}.` | `token_layernorm`, `hidden_layernorm`, `input_proj` | `final_layernorm` | HIDDEN first |

Sources (read, not copied): vLLM 0.32 `model_executor/models/deepseek_mtp.py`, `glm4_moe_mtp.py`,
`qwen3_next_mtp.py`, `qwen3_5_mtp.py`, `mimo_mtp.py` (each `*MultiTokenPredictorLayer.__init__` / `load_weights`);
SGLang 0.5.23 `models/deepseek_nextn.py`, `glm4_moe_nextn.py`, `qwen3_next_mtp.py`, `qwen3_5_mtp.py`,
`mimo_mtp.py`; transformers 5.25 `modeling_layers.py` `MtpLayer` and `conversion_mapping.py` `mapping["MtpModel"]`.
"""

from __future__ import annotations

from dataclasses import dataclass

DEEPSEEK, GLM, QWEN3_NEXT, QWEN3_5, MIMO = "deepseek_v3", "glm4_moe", "qwen3_next", "qwen3_5", "mimo"


@dataclass(frozen=True)
class Layout:
    family: str
    description: str
    count_key: str                    # config.json key holding the number of MTP layers n
    block_prefix: str                 # format with decoder (checkpoint prefix of the text decoder layers), N, i
    fusion: tuple[str, str, str]      # (embedding norm, hidden norm, projection) key stems, under `fusion_prefix`
    fusion_prefix: str                # "" = under the layer's block prefix; else a fixed prefix (shared by layers)
    out_norm: str                     # the output norm's key stem (under fusion_prefix, or the block prefix)
    unused: tuple[str, ...]           # a layer's tensors no engine uses (the target's embedding and lm_head are)
    hidden_first: bool                # the fusion concatenates [hidden, embedding] (MiMo) instead of [embedding, hidden]
    attention: str                    # "mla" | "gqa" | "gated": how `model` drives the block's attention
    model_types: tuple[str, ...]      # the text config's model_type values of this family

    def block(self, decoder: str, num_layers: int, i: int) -> str:
        """The checkpoint prefix of MTP layer i's decoder block (and, unless shared, its fusion)."""
        return self.block_prefix.format(decoder=decoder, index=num_layers + i, i=i)

    @property
    def shared(self) -> bool:
        """The fusion and the output norm are one set for every layer (Qwen's `mtp.fc`, `mtp.norm`)."""
        return bool(self.fusion_prefix)


LAYOUTS = {
    DEEPSEEK: Layout(DEEPSEEK, "DeepSeek-V3 (MLA + MoE)", "num_nextn_predict_layers", "{decoder}.{index}.",
                     ("enorm", "hnorm", "eh_proj"), "", "shared_head.norm", ("embed_tokens", "shared_head.head"),
                     False, "mla", ("deepseek_v3", "kimi_k2")),
    GLM: Layout(GLM, "GLM-4.5 (GQA, partial rotary, bias + MoE)", "num_nextn_predict_layers", "{decoder}.{index}.",
                ("enorm", "hnorm", "eh_proj"), "", "shared_head.norm", ("embed_tokens", "shared_head.head"),
                False, "gqa", ("glm4_moe",)),
    QWEN3_NEXT: Layout(QWEN3_NEXT, "Qwen3-Next (gated full attention, zero-centred norms + MoE)",
                       "mtp_num_hidden_layers", "mtp.layers.{i}.",
                       ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "fc"), "mtp.", "norm", (), False, "gated",
                       ("qwen3_next",)),
    QWEN3_5: Layout(QWEN3_5, "Qwen3.5 (gated full attention, zero-centred norms, dense or MoE)",
                    "mtp_num_hidden_layers", "mtp.layers.{i}.",
                    ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "fc"), "mtp.", "norm", (), False, "gated",
                    ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_5", "qwen3_5_moe")),
    MIMO: Layout(MIMO, "MiMo (Qwen2 body, hidden first)", "num_nextn_predict_layers", "model.mtp_layers.{i}.",
                 ("token_layernorm", "hidden_layernorm", "input_proj"), "", "final_layernorm", (), True, "gqa",
                 ("mimo",)),
}
MIMO_ARCHITECTURES = ("MiMoForCausalLM",)


def family_of(config: dict) -> str | None:
    """The MTP layout of a target config.json (a multimodal wrapper: its text_config), or None.

    >>> family_of({"model_type": "glm4_moe"}), family_of({"model_type": "qwen2", "architectures": ["MiMoForCausalLM"]})
    ('glm4_moe', 'mimo')
    >>> family_of({"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text"}}), family_of({"model_type": "llama"})
    ('qwen3_5', None)
    """
    archs = config.get("architectures") or []
    if isinstance(archs, list) and any(a in MIMO_ARCHITECTURES for a in archs):
        return MIMO
    types = [config.get("model_type")]
    if isinstance(config.get("text_config"), dict):
        types.insert(0, config["text_config"].get("model_type"))
    for t in types:
        for layout in LAYOUTS.values():
            if t in layout.model_types:
                return layout.family
    return None


def count_section(config: dict, layout: Layout) -> tuple[dict, str]:
    """(the part of config.json that holds the layer count, its name in messages): Qwen3.5's text_config."""
    if layout.count_key not in config and isinstance(config.get("text_config"), dict):
        return config["text_config"], "text_config."
    return config, ""
