"""The draft head's shape and variant flags, and reading them from a head's config.json.

Contract: `HeadConfig` is the frozen, validated description of one EAGLE-3 head (docs/eagle3.md section 2)
plus the variants the engines ship; `head_config_from_json` builds it from any dialect's config.json
and `CONSUMED_KEYS` lists every key it reads (heads/eagle3/keys.py audits the rest). No torch here.

| flag                  | what changes                                                  | engines |
|-----------------------|---------------------------------------------------------------|---------|
| `norm_before_residual`| residual = hidden_norm(g) instead of g                        | vLLM `llama_eagle3.py` `LlamaDecoderLayer._norm_before_residual`; speculators |
| `norm_before_fc`      | g = fc(RMSNorm_{k*H_t}(a)), weight `input_norm.weight [k*H_t]` | vLLM PR #36545 (top level), #42143 (in `eagle_config`, NVIDIA gpt-oss exports); SGLang PR #32334; speculators `Eagle3DraftModel.__init__` (`input_norm`) |
| `fc_norm` (EAGLE-3.1) | g = fc(concat(RMSNorm_i(a_i))), weights `fc_norm.{i}.weight [H_t]` | vLLM PR #42764; speculators `core.py` forward (`fc_norm` chunks); exclusive with `norm_before_fc` |
| `norm_output` (EAGLE-3.1) | the next step's hidden input is norm(out), not out; logits = lm_head(norm(out)) as before | speculators `core.py` forward (`norm_output`); vLLM PR #46488; SpecForge PR #879 |
| `rope_interleaved`    | GPT-J-style RoPE (pairs 2i, 2i+1) instead of NeoX halves       | SGLang `llama.py` `LlamaDecoderLayer.__init__` reads `rope_is_neox_style` (default True); vLLM's llama ignores the key |
| `parallel_drafting` (P-EAGLE) | one forward fills K slots: the last real pair, then K - 1 rows (mask token, fc(mask_hidden)); weight `mask_hidden [1, k*H_t]` | vLLM `llama_eagle3.py` `Eagle3LlamaForCausalLM.load_weights` (mask_hidden), `v1/spec_decode/llm_base_proposer.py` (`parallel_drafting`); speculators `models/peagle/core.py`; heads/peagle/ drafts it |
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from eagle_eval.errors import UserError

SPECFORGE, EAGLE, SPECULATORS, MLA = "specforge", "eagle", "speculators", "mla"


class CheckpointError(UserError, ValueError):
    """A draft checkpoint that cannot be read as an EAGLE-3 head; the message names file and key."""


@dataclass(frozen=True)
class MLASettings:
    """The draft layer's multi-head latent attention (DeepSeek-V2/V3), see heads/mla/layer.py."""
    q_lora_rank: int | None               # None: one q_proj [heads*(nope+rope), 2H] instead of q_a/q_b
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    def __post_init__(self):
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: a positive integer is needed for an MLA head")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim={self.qk_rope_head_dim} is odd: RoPE rotates pairs")
        if self.q_lora_rank is not None and (not isinstance(self.q_lora_rank, int) or self.q_lora_rank <= 0):
            raise ValueError(f"q_lora_rank={self.q_lora_rank!r}: a positive integer or null is needed")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int                      # H
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int                       # V, the target vocabulary
    draft_vocab_size: int                 # V_d <= V
    target_hidden_size: int               # H_t
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    num_aux: int = 3                      # aux feature blocks fused by fc (1 without aux states)
    norm_before_residual: bool = False    # speculators/vLLM dialect: residual = hidden_norm(g)
    fc_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    norm_before_fc: bool = False          # one RMSNorm over the aux concat [k*H_t] before fc (gpt-oss)
    fc_norm: bool = False                 # EAGLE-3.1: one RMSNorm per aux block [H_t] before fc
    norm_output: bool = False             # EAGLE-3.1: the recurrence carries norm(out)
    rope_interleaved: bool = False        # GPT-J-style RoPE (SGLang rope_is_neox_style=false)
    mla: MLASettings | None = None        # the draft layer's attention is MLA (heads/mla/layer.py)
    parallel_drafting: bool = False       # P-EAGLE: K drafts from one forward, mask rows fed fc(mask_hidden)
    mask_token_id: int | None = None      # the token of the mask rows (read in vLLM's order: MASK_TOKEN_KEYS)
    num_hidden_layers: int = 1            # decoder layers: the first over [embeds, hidden], the rest over H

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(
                f"draft_vocab_size={self.draft_vocab_size} > vocab_size={self.vocab_size}")
        if self.norm_before_fc and self.fc_norm:
            raise ValueError("norm_before_fc and fc_norm exclude each other (speculators "
                             "Eagle3SpeculatorConfig._check_norm_flags): one norm over the concat, or one per block")
        if self.mla is not None and not self.rope_interleaved:
            raise ValueError("an MLA head rotates GPT-J pairs (vLLM and SGLang build its RoPE with "
                             "is_neox_style=False): rope_interleaved must be True")
        if self.mla is not None and self.norm_before_fc:
            raise ValueError("norm_before_fc: neither engine's MLA head has that norm")
        if (self.norm_before_fc or self.fc_norm) and not self.has_fc:
            raise ValueError("norm_before_fc / fc_norm need an fc layer (aux width k*H_t != H)")
        if self.parallel_drafting and self.mask_token_id is None:
            raise ValueError("parallel drafting needs a mask token id (" + MASK_TOKEN_REFUSAL + ")")
        if not isinstance(self.num_hidden_layers, int) or self.num_hidden_layers < 1:
            raise ValueError(f"num_hidden_layers={self.num_hidden_layers!r}: a positive integer is needed")
        if self.num_hidden_layers > 1 and self.mla is not None:
            raise ValueError("an MLA head has one decoder layer (vLLM deepseek_eagle3.py builds one)")
        if self.parallel_drafting and self.mla is not None:
            raise ValueError("parallel drafting with an MLA head: vLLM loads mask_hidden only in llama_eagle3.py and "
                             "qwen3_eagle3.py")

    @property
    def kind(self) -> str:
        """'mla' (DeepSeek multi-head latent attention) or 'llama' (GQA), the draft layer's attention."""
        return "mla" if self.mla is not None else "llama"

    @property
    def has_fc(self) -> bool:
        """fc fuses the aux concat only when its width differs from H (docs/eagle3.md section 2)."""
        return self.num_aux * self.target_hidden_size != self.hidden_size

    def variant(self) -> dict:
        """The settings that select among the head variants, for the report."""
        mla = {"mla": {**self.mla.__dict__, "rope": "interleaved (GPT-J) on the qk_rope_head_dim part",
                       "softmax_scale": "qk_head_dim^-0.5 * mscale^2 (deepseek_yarn)"}} if self.mla else {}
        return {"kind": self.kind, **mla,
                "norm_before_residual": self.norm_before_residual, "norm_before_fc": self.norm_before_fc,
                "fc_norm": self.fc_norm, "norm_output": self.norm_output,
                "rope": "interleaved (GPT-J)" if self.rope_interleaved else "neox (halves)",
                "rope_theta": self.rope_theta, "rope_scaling": self.rope_scaling,
                "fc_bias": self.fc_bias, "attention_bias": self.attention_bias, "mlp_bias": self.mlp_bias,
                **({"parallel_drafting": True, "mask_token_id": self.mask_token_id} if self.parallel_drafting else {}),
                **({"num_hidden_layers": self.num_hidden_layers} if self.num_hidden_layers > 1 else {})}


# Keys head_config_from_json / load_head read, by section ("top", "layer" = the decoder-layer keys,
# top level or speculators' transformer_layer_config, "eagle_config" = SGLang's nested dict).
CONSUMED_KEYS = {
    "top": {"architectures", "draft_vocab_size", "target_hidden_size", "norm_before_residual", "norm_before_fc",
            "fc_norm", "norm_output", "eagle_aux_hidden_state_layer_ids", "eagle_config",
            "transformer_layer_config", "speculators_config", "speculators_model_type",
            "mask_token_id", "dspark_noise_token_id", "pard_token", "ptd_token_id"},
    "layer": {"hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
              "vocab_size", "rms_norm_eps", "rope_theta", "rope_parameters", "rope_scaling",
              "max_position_embeddings", "hidden_act", "attention_bias", "mlp_bias", "num_hidden_layers",
              "rope_is_neox_style", "tie_word_embeddings", "model_type"},
    "eagle_config": {"eagle_aux_hidden_state_layer_ids", "use_aux_hidden_state", "norm_before_fc",
                     "fc_norm", "norm_output"},
}


DEEP_TREES_REFUSED = ("--topk {topk}: a {depth}-layer draft head drafts chains only here (vLLM 0.32, which serves "
                      "multi-layer EAGLE-3 heads, has no token tree; trees are built for one draft layer); "
                      "use --topk 1")


# P-EAGLE (parallel drafting): where vLLM 0.32 looks for the mask rows' token, in its order
# (v1/spec_decode/llm_base_proposer.py `_init_parallel_drafting_params`; dflash_config.mask_token_id comes first
# there, a DFlash key: a P-EAGLE head is an EAGLE-3 config), and the speculators type it maps to eagle3 +
# parallel_drafting (transformers_utils/configs/speculators/algos.py `update_peagle`, base.py)
MASK_TOKEN_KEYS = ("mask_token_id", "dspark_noise_token_id", "pard_token", "ptd_token_id")
PEAGLE = "peagle"
MASK_TOKEN_REFUSAL = ("vLLM refuses parallel drafting unless the draft's config.json names the mask token: "
                      "one of " + ", ".join(MASK_TOKEN_KEYS) + " (llm_base_proposer._init_parallel_drafting_params)")
MASK_HIDDEN_REFUSAL = ("vLLM refuses parallel drafting without the learned mask row 'mask_hidden' in the weights "
                       "(llama_eagle3.py Eagle3LlamaForCausalLM.load_weights)")


def mask_token(config: dict, config_file: Path, vocab_size: int) -> tuple[int | None, str | None]:
    """(the mask token id, the key it was read from) in vLLM's order (MASK_TOKEN_KEYS), or (None, None); a
    speculators P-EAGLE config reads `mask_token_id` only (update_peagle maps it to pard_token). An id outside the
    vocabulary is refused naming the key (the mask rows are embedded like any token)."""
    peagle = config.get("speculators_model_type") == PEAGLE
    for key in MASK_TOKEN_KEYS[:1] if peagle else MASK_TOKEN_KEYS:
        value = read_key(config, key, config_file, "int", None)
        if value is None:
            continue
        if not 0 <= value < vocab_size:
            raise CheckpointError(f"{config_file}: key {key!r} = {value}: the mask token must be a row of the "
                                  f"embedding table, 0..{vocab_size - 1}")
        return value, key
    return None, None


REQUIRED = object()


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)          # JSON true is not 1 here


# kind -> (test, what was expected); JSON null counts as "not given" for every kind
KINDS = {
    "size": (lambda v: _is_int(v) and v > 0, "a positive integer"),
    "int": (_is_int, "an integer"),
    "number": (lambda v: (_is_int(v) or isinstance(v, float)) and math.isfinite(v) and v > 0, "a positive number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "object": (lambda v: isinstance(v, dict), "a JSON object"),
    "ids": (lambda v: isinstance(v, list) and all(_is_int(i) for i in v), "a list of integer layer ids"),
    "names": (lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v), "a list of strings"),
}


def read_key(cfg: dict, key: str, where: Path, kind: str, default=REQUIRED, section: str = ""):
    """cfg[key] checked against `kind` (KINDS), never coerced: a string where a size is expected, `true`
    as an integer or a list where a string is expected is a CheckpointError naming the file and the key
    (`section` is its parent, e.g. 'eagle_config.'). Absent or null: `default`, or missing when required."""
    value = cfg.get(key)
    if value is None:
        if default is REQUIRED:
            raise CheckpointError(f"{where}: missing key {section}{key!r} (needed to build the draft head)")
        return default
    test, expected = KINDS[kind]
    if not test(value):
        raise CheckpointError(f"{where}: key {section}{key!r} = {json.dumps(value)[:60]}: expected {expected}")
    return value


def config_need(cfg: dict, key: str, where: Path, default=None, kind: str = "size", section: str = ""):
    """A required key (or one with a default), a positive integer unless `kind` says otherwise."""
    return read_key(cfg, key, where, kind, REQUIRED if default is None else default, section)


def config_flag(top: dict, eagle_cfg: dict, key: str, where: Path) -> bool:
    """A variant flag read where the engines read it: nested eagle_config first (NVIDIA exports, vLLM
    PR #42143), else the top level (speculators, vLLM `getattr(config, key)`); both must agree. true or
    false only: a string "false" is not read as true."""
    nested = read_key(eagle_cfg, key, where, "bool", None, "eagle_config.")
    flat = read_key(top, key, where, "bool", None)
    if nested is not None and flat is not None and nested != flat:
        raise CheckpointError(f"{where}: key {key!r} = {flat!r} at the top level but eagle_config.{key} = "
                              f"{nested!r}: the engines read different values")
    return bool(nested if nested is not None else flat)


def config_section(cfg: dict, key: str, where: Path) -> dict:
    """A nested object (eagle_config, transformer_layer_config, rope_parameters) or {} when absent."""
    return read_key(cfg, key, where, "object", {})


# A LlamaForCausalLMEagle3 head whose config names the DeepSeek-V3-family target's config class: SpecForge
# ships Kimi-K2 heads so (configs/kimi-k2-eagle3.json: model_type kimi_k2). SGLang and vLLM pick the draft
# layer by `architectures` (llama_eagle3.py in both); the model_type only picks the config class (vLLM maps
# kimi_k2 to DeepseekV3Config, vllm/transformers_utils/config.py). Loaded as Llama, with a warning.
DEEPSEEK_CONFIG_TYPES = ("deepseek_v2", "deepseek_v3", "kimi_k2")


def model_type_note(config: dict, dialect: str, config_file: Path) -> list[str]:
    """The warning for a Llama-style head whose model_type is a DeepSeek-family config class."""
    model_type = config.get("model_type")
    if dialect in (SPECULATORS, MLA) or model_type not in DEEPSEEK_CONFIG_TYPES:
        return []
    return [f"{config_file}: key 'model_type' = {model_type!r} on a Llama-style head ({config.get('architectures')}): "
            "loaded as a Llama draft layer, as SGLang and vLLM choose it by architecture; vLLM builds its config as "
            "DeepseekV3Config, whose MLA defaults (kv_lora_rank 512, ...) then sit in the draft config though the "
            "head has no MLA: unchecked whether a vLLM version treats such a draft as MLA"]


def _check_supported(layer: dict, where: Path, speculators: bool = False, section: str = "") -> int:
    """Values of consumed keys that select math this head does not implement -> num_hidden_layers (any positive
    count: the first layer reads [embeds, hidden], the others are ordinary decoder layers, as vLLM llama_eagle3.py
    `LlamaModel` and speculators models/eagle3/core.py `Eagle3DraftModel` build them)."""
    layers = read_key(layer, "num_hidden_layers", where, "size", 1, section)
    if read_key(layer, "tie_word_embeddings", where, "bool", False, section):
        raise CheckpointError(f"{where}: key 'tie_word_embeddings' = true: SGLang (LlamaForCausalLMEagle3.__init__) "
                              "then uses embed_tokens [V, H] as the draft lm_head; not supported")
    model_type = read_key(layer, "model_type", where, "str", "llama", section)
    if model_type in DEEPSEEK_CONFIG_TYPES and not speculators:
        return layers                # a Llama-style head in the target's config class: see DEEPSEEK_CONFIG_TYPES
    if model_type not in ("llama", None):
        raise CheckpointError(f"{where}: key 'model_type' = {model_type!r}; only Llama-style draft layers are "
                              "supported (speculators model_definitions.py: qwen3 adds q/k norms; SGLang reads "
                              "intermediate_size_mlp for llama4_text)")
    return layers


def rope_settings(layer: dict, where: Path, section: str = "") -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling or None) from rope_theta / rope_scaling, or transformers 5's rope_parameters."""
    rope = config_section(layer, "rope_parameters", where)
    scaling = read_key(layer, "rope_scaling", where, "object", None, section) or None
    if scaling is None and read_key(rope, "rope_type", where, "str", "default", "rope_parameters.") != "default":
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    if scaling is not None:
        for key in ("rope_type", "type"):
            read_key(scaling, key, where, "str", None, "rope_scaling.")
    theta = read_key(layer, "rope_theta", where, "number", None, section)
    theta = theta if theta is not None else read_key(rope, "rope_theta", where, "number", 10000.0, "rope_parameters.")
    return float(theta), scaling


def head_config_from_json(config: dict, dialect: str, config_file: Path) -> HeadConfig:
    """The head's shape and variant flags from config.json, for any dialect; every value typed
    (`read_key`: never coerced)."""
    section = "transformer_layer_config." if dialect == SPECULATORS else ""
    layer = config_need(config, "transformer_layer_config", config_file, kind="object") if dialect == SPECULATORS else config
    top = config
    layers = _check_supported(layer, config_file, speculators=dialect == SPECULATORS, section=section)

    def size(key: str, default=REQUIRED, where: dict = layer, prefix: str = section):
        return read_key(where, key, config_file, "size", default, prefix)

    hidden = size("hidden_size")
    heads = size("num_attention_heads")
    theta, scaling = rope_settings(layer, config_file, section)
    eagle_cfg = config_section(top, "eagle_config", config_file)
    vocab = size("vocab_size")
    settings = dict(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=size("num_key_value_heads", heads),
        head_dim=size("head_dim", hidden // heads),
        intermediate_size=size("intermediate_size"),
        vocab_size=vocab,
        draft_vocab_size=size("draft_vocab_size", vocab, top, ""),
        target_hidden_size=size("target_hidden_size", hidden, top, ""),
        rms_norm_eps=float(read_key(layer, "rms_norm_eps", config_file, "number", 1e-6, section)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=size("max_position_embeddings", 2048),
        hidden_act=read_key(layer, "hidden_act", config_file, "str", "silu", section),
        num_aux=3 if read_key(eagle_cfg, "use_aux_hidden_state", config_file, "bool", True, "eagle_config.") else 1,
        norm_before_residual=read_key(top, "norm_before_residual", config_file, "bool", False),
        attention_bias=read_key(layer, "attention_bias", config_file, "bool", False, section),
        mlp_bias=read_key(layer, "mlp_bias", config_file, "bool", False, section),
        norm_before_fc=config_flag(top, eagle_cfg, "norm_before_fc", config_file),
        fc_norm=config_flag(top, eagle_cfg, "fc_norm", config_file),
        norm_output=config_flag(top, eagle_cfg, "norm_output", config_file),
        rope_interleaved=read_key(layer, "rope_is_neox_style", config_file, "bool", True, section) is False,
        mask_token_id=mask_token(top, config_file, vocab)[0],
        parallel_drafting=top.get("speculators_model_type") == PEAGLE,
        num_hidden_layers=layers,
    )
    if settings["parallel_drafting"] and settings["mask_token_id"] is None:
        raise CheckpointError(f"{config_file}: missing key 'mask_token_id': speculators_model_type 'peagle' needs it "
                              "(vLLM update_peagle reads it as pard_token; " + MASK_TOKEN_REFUSAL + ")")
    try:
        return HeadConfig(**settings)
    except ValueError as exc:
        raise CheckpointError(f"{config_file}: {exc}") from exc
