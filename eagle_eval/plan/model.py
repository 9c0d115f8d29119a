"""A plan's target and head as eagle-eval would hold them, built on the meta device: no weight is read.

Contract:
- `held_meta_model(folder, dtype, held, trust_remote_code)` -> HeldModel. The model is the folder's own
  class (its remote code, with `trust_remote_code`), else transformers' class for config.json's model_type,
  else, for a wrapper transformers does not know (Kimi-K2.5's `kimi_k25`), the text model its `text_config`
  names (`architectures`, else `model_type`): a folder holding only config.json is enough.
  held=True builds the weights as they sit in memory once loaded: pack-quantized INT4 modules as
  models/quant/int4's packed modules (which modules: the safetensors headers when the files are there, else
  the index's tensor names, else config.json's targets / ignore, matched as compressed-tensors matches them:
  `re:` patterns with re.match on the module name, other targets as a class name or the exact name), block
  FP8 as the FP8Linear / FP8Experts transformers builds on a GPU with FP8 (its quantizer's own
  `_process_model_before_weight_loading`, transformers 5.24). held=False: every weight in `dtype`
  (transformers' INT4 decompression, its FP8 dequantization without an FP8 GPU).
- `HeldModel.checkpoint`: from the safetensors index when present: its tensors the built model does not
  hold (an MTP layer transformers ignores, a wrapper's vision tower when only its text model was built),
  by pattern, and its `total_size`.
- `head_meta(folder, dtype)` -> (head on the meta device, its config, its kind): the draft head eagle-eval would load.
- `hold_like_target(head, target, folder, dtype, held, names)`: a head read from the target's checkpoint (`--draft
  mtp`) held as the target's weights are, per module, by the same swaps (see the function); returns how.
- Before anything is built, `check_sizes`: every size of config.json (its text_config, the head's config) a
  whole number in range (`SIZES`); once the config object exists and before the model, `no_invented_sizes`:
  no size the file leaves out where the config class would fill in a default of its own. The models are
  built under torch.device("meta"): no tensor is ever made in memory.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from eagle_eval.errors import UserError
from eagle_eval.models.files import read_json_file


class PlanError(UserError, ValueError):
    """A plan's input eagle-eval cannot read; the message names the file, key or option."""


# The sizes of a config a plan reads, directly or through the model transformers builds from it: each a
# whole number in (low, high), or null where the architecture gives null a meaning (a full-rank q, no
# sliding window, head_dim derived from hidden_size). The highs are far above any released model and far
# below what would overflow a meta tensor (a vocabulary of 10^12 is a typo, not a model).
def _sizes(names: str, low: int, high: int, nullable: bool = False) -> dict:
    return dict.fromkeys(names.split(), (low, high, nullable))


SIZES = {
    **_sizes("vocab_size draft_vocab_size", 1, 2**24),                # draft_vocab_size: an EAGLE-3 head's
    **_sizes("hidden_size target_hidden_size n_embd intermediate_size moe_intermediate_size shared_expert_intermediate_size "
             "qk_nope_head_dim qk_rope_head_dim v_head_dim kv_lora_rank", 1, 2**20),
    **_sizes("head_dim q_lora_rank", 1, 2**20, nullable=True),
    **_sizes("num_hidden_layers n_layer num_attention_heads n_head moe_layer_freq decoder_sparse_step", 1, 2**14),
    **_sizes("num_key_value_heads", 1, 2**14, nullable=True),
    **_sizes("first_k_dense_replace", 0, 2**14),                    # 0: every layer has experts
    **_sizes("n_routed_experts num_local_experts num_experts", 1, 2**16),
    **_sizes("n_shared_experts", 0, 2**16, nullable=True),
    **_sizes("max_position_embeddings n_positions", 1, 2**27),
    **_sizes("sliding_window", 1, 2**27, nullable=True),
}


def check_sizes(config: dict, where: Path, at: str = "") -> None:
    """Every size of `config` (and of its nested *_config, a wrapper's text_config) a whole number in its
    range, before anything is built: a PlanError naming the file and the key."""
    for key, value in config.items():
        if isinstance(value, dict) and key.endswith("_config") and key != "quantization_config":
            check_sizes(value, where, f"{at}{key}.")
        elif key in SIZES:
            low, high, nullable = SIZES[key]
            if value is None and nullable:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise PlanError(f"{where}: {at}{key} is {json.dumps(value)}; expected a whole number from {low} to "
                                f"{high:,}" + (" or null" if nullable else ""))


def no_invented_sizes(cfg, config: dict, where: Path, at: str = "", context_given: bool = False) -> None:
    """A size the built config holds but config.json does not give, where the config class would put its own
    default (Llama's vocabulary of 32000, 2048 positions): refused, naming the key. A size the class derives
    from others when it is absent (head_dim from hidden_size / heads, num_key_value_heads = heads in Llama)
    is the model's own. Nested configs (text_config) likewise; the positions need not be given with
    --max-context."""
    import inspect

    from transformers import PretrainedConfig

    params = inspect.signature(type(cfg).__init__).parameters
    aliases = getattr(cfg, "attribute_map", None) or {}
    for name, value in vars(cfg).items():
        spellings = [name] + [a for a, real in aliases.items() if real == name]
        given = next((s for s in spellings if s in config), None)
        if isinstance(value, PretrainedConfig) and name.endswith("_config"):
            if given is None:
                raise PlanError(f"{where}: {at}{name} is missing; transformers would build its default "
                                f"{type(value).__name__}, not this model")
            if isinstance(config[given], dict):
                no_invented_sizes(value, config[given], where, f"{at}{given}.", context_given)
            continue
        if name not in SIZES or given is not None or isinstance(value, bool) or not isinstance(value, int):
            continue
        default = next((params[s].default for s in spellings if s in params), None)
        if isinstance(default, bool) or not isinstance(default, int):
            continue                                       # derived from the sizes given, not a default
        if name in ("max_position_embeddings", "n_positions") and context_given:
            continue
        hint = "; give it, or --max-context N" if name in ("max_position_embeddings", "n_positions") else ""
        raise PlanError(f"{where}: {at}{name} is missing; transformers would fill in its default {value} "
                        f"({type(cfg).__name__}), which is not this model's{hint}")


@dataclass
class HeldModel:
    model: nn.Module
    built: str                                   # what was built, from what
    notes: list[str] = field(default_factory=list)
    formats: dict = field(default_factory=dict)  # quantization as held: method, what, source
    checkpoint: dict | None = None               # the index's view (see the module contract)
    prefix: str = ""                             # the checkpoint's names of the model's tensors: prefix + name
    index_names: list[str] | None = None         # the safetensors index's tensor names, when there is an index


def _text_class(text: dict, where: Path):
    """transformers' causal-LM class and config class for a wrapper's text_config."""
    import transformers
    from transformers import CONFIG_MAPPING
    from transformers.models.auto import modeling_auto

    for arch in text.get("architectures") or []:
        cls = getattr(transformers, arch, None)
        if cls is not None and hasattr(cls, "config_class"):
            return cls, cls.config_class
    kind = text.get("model_type")
    if kind in CONFIG_MAPPING and kind in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return getattr(transformers, modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[kind]), CONFIG_MAPPING[kind]
    raise PlanError(f"{where}: text_config names architectures {text.get('architectures')} and model_type {kind!r}, "
                    "none of which transformers builds; pass --trust-remote-code for the folder's own code")


def _build(folder: Path, config: dict, dtype: torch.dtype, trust_remote_code: bool,
           context_given: bool = False) -> tuple[nn.Module, str, str]:
    """(meta model, what was built, the checkpoint-name prefix of its tensors: 'language_model.' when only a
    wrapper's text model was built). A wrapper without its remote code is built as its text model even when
    transformers knows the wrapper (5.24 has Kimi-K2.5's, under renamed keys): the checkpoint's names stay
    the checkpoint's, and the parts left out are named from the index."""
    import transformers
    from accelerate import init_empty_weights
    from transformers import CONFIG_MAPPING, AutoConfig

    from eagle_eval.models.target import auto_class_name

    from transformers.models.auto import modeling_auto

    where = folder / "config.json"
    remote = trust_remote_code and "auto_map" in config
    kind = config.get("model_type")
    native = kind in CONFIG_MAPPING and (kind in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
                                         or not isinstance(config.get("text_config"), dict))
    try:
        if remote or native:
            cfg = AutoConfig.from_pretrained(str(folder), trust_remote_code=remote, local_files_only=True)
            no_invented_sizes(cfg, config, where, context_given=context_given)
            auto = auto_class_name(config, remote)
            with torch.device("meta"), init_empty_weights():     # nothing allocated, not even for a moment
                model = getattr(transformers, auto).from_config(cfg, dtype=dtype, trust_remote_code=remote)
            how = "its remote code" if remote else "transformers"
            return model, f"{type(model).__name__} ({how}, from config.json)", ""
        text = config.get("text_config")
        if not isinstance(text, dict):
            raise PlanError(f"{where}: model_type {config.get('model_type')!r} is not one transformers builds and "
                            "there is no text_config; pass --trust-remote-code for the folder's own code")
        cls, config_cls = _text_class(text, where)
        text_cfg = config_cls(**text)
        no_invented_sizes(text_cfg, text, where, "text_config.", context_given)
        with torch.device("meta"), init_empty_weights():
            model = cls._from_config(text_cfg, dtype=dtype)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError) as exc:
        if isinstance(exc, UserError):
            raise
        from eagle_eval.models.files import said_by
        raise said_by(f"{where}: transformers cannot build the model on the meta device", exc, PlanError) from exc
    return (model, f"{cls.__name__} from text_config (the {config.get('model_type')} wrapper's own code not run: "
                   "its other parts are not counted)", "language_model.")


def _match(name: str, module, patterns) -> bool:
    """compressed-tensors' is_match for one side (compressed_tensors/utils/match.py, 0.20.1): a `re:`
    pattern re.match-ed on the name, else the exact name or a class name in the module's MRO."""
    for p in patterns:
        if p.startswith("re:"):
            if re.match(p[3:], name):
                return True
        elif p == name or any(c.__name__ == p for c in type(module).__mro__):
            return True
    return False


def _linear_sites(model) -> dict[str, tuple[int, int]]:
    """Every Linear as the checkpoint names it -> (out, in): the model's Linear layers, and each routed
    expert's gate_proj / up_proj / down_proj inside transformers' fused expert tensors."""
    from eagle_eval.models.quant.int4_load import EXPERT_PROJS, _is_fused_experts

    sites = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            sites[name] = (module.out_features, module.in_features)
        elif _is_fused_experts(module):
            num, two_i, hidden = module.gate_up_proj.shape
            inter = two_i // 2
            dims = {"gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}
            sites.update({f"{name}.{e}.{p}": dims[p] for e in range(num) for p in EXPERT_PROJS})
    return sites


def _text_model_prefix(model) -> str:
    """'language_model.' for a wrapper whose text decoder is language_model.model, '' for a causal LM: the
    quantization of a multimodal release covers its text model (Kimi-K2.5's vision tower ships bf16
    though its config's ignore list does not name it)."""
    from eagle_eval.models.text_decoder import find_text_decoder

    path = find_text_decoder(model, type(model).__name__, PlanError).path     # "model.<decoder>"
    parts = path.split(".")[1:-1]                                             # the decoder's parents
    return ".".join(parts) + "." if parts else ""


def _int4_entries(sites: dict, packed: set, where: Path, group: int):
    """Entries and weight_shape values for a checkpoint whose packed modules are `packed` (no file read):
    int32 words, bf16 scales (as Kimi-K2 ships them), an int64 shape (compressed-tensors writes one)."""
    from eagle_eval.models.quant.int4 import PER_WORD
    from eagle_eval.models.quant.int4_load import Entry

    entries, shapes = {}, {}
    for name, (out, inp) in sites.items():
        if name in packed:
            entries[f"{name}.weight_packed"] = Entry(where, torch.int32, (out, math.ceil(inp / PER_WORD)))
            groups = inp // group if inp % group == 0 else -1       # -1: _packed_linear names the group size
            entries[f"{name}.weight_scale"] = Entry(where, torch.bfloat16, (out, groups))
            entries[f"{name}.weight_shape"] = Entry(where, torch.int64, (2,))
            shapes[f"{name}.weight_shape"] = [out, inp]
        else:
            entries[f"{name}.weight"] = Entry(where, torch.bfloat16, (out, inp))
    return entries, shapes


def _prefixed(prefix: str):
    """A checkpoint key -> the model's tensor name (the key less `prefix`), None for a key without it."""
    return lambda key: key[len(prefix):] if key.startswith(prefix) else None


def _hold_int4(model, folder: Path, scheme, dtype, prefix: str, index_names: list[str] | None,
               own=None, checkpoint_name=None) -> tuple[str, int]:
    """Swap the INT4 modules (module contract); (where the list of packed modules came from, how many).
    `own`: checkpoint key -> the model's tensor name or None (default: the key less `prefix`);
    `checkpoint_name`: a module's name as config.json's targets / ignore see it (default: the target's own names,
    those of its text model)."""
    from eagle_eval.models.quant.int4_load import _weight_shapes, checkpoint_tensors, hold_packed, not_the_models

    own = own or _prefixed(prefix)
    sites = _linear_sites(model)
    if any(folder.glob("*.safetensors")):
        stored = checkpoint_tensors(folder)
        names = {k: name for k in stored if (name := own(k)) is not None}
        shapes = {names[k]: v for k, v in _weight_shapes(stored, [k for k in names if k.endswith(".weight_shape")])
                  .items()}                                # read under the checkpoint's keys, named as the model's
        held = hold_packed(model, {name: stored[k] for k, name in names.items()}, scheme, dtype, shapes)
        source = "the safetensors headers"
    else:
        if index_names is not None:                    # less what the model does not hold (hold_packed's rule)
            skip = not_the_models(model)
            packed = {name.removesuffix(".weight_packed") for k in index_names if k.endswith(".weight_packed")
                      and (name := own(k)) is not None and not any(p.search(name) for p in skip)}
            source = "the safetensors index's tensor names"
        else:
            modules = dict(model.named_modules())
            linear = nn.Linear(1, 1, device="meta")
            text = "" if checkpoint_name else _text_model_prefix(model)
            seen = checkpoint_name or (lambda n: n)
            packed = {n for n in sites if n.startswith(text)
                      and _match(seen(n), modules.get(n, linear), scheme.targets)
                      and not _match(seen(n), modules.get(n, linear), scheme.ignore)}
            source = ("config.json's quantization_config targets / ignore"
                      + (", on the checkpoint's names" if checkpoint_name else ", on the text model")
                      + (f" ({text.rstrip('.')})" if text else ""))
        modules = dict(model.named_modules())
        fused = sorted({n.rsplit(".", 2)[0] for n in packed if n not in modules})
        for name in fused:
            model.set_submodule(name, _stacked_experts(modules[name], packed, name, scheme.group_size, dtype))
        linears = {n: d for n, d in sites.items() if n in packed and n in modules}
        entries, shapes = _int4_entries(linears, set(linears), folder / "config.json", scheme.group_size)
        held = hold_packed(model, entries, scheme, dtype, shapes)
        return source, len(held.linears) + sum(n.rsplit(".", 2)[0] in fused for n in packed)
    return source, len(held.linears) + held.expert_linears


class StackedPackedExperts(nn.Module):
    """A plan's stand-in for PackedInt4Experts: each projection's packed words, scales and shapes stacked
    over the experts ([E, out, in / 8] int32, [E, out, in / group] bf16, [E, 2] int64): the same bytes as
    the loader's per-expert modules in 9 tensors instead of 9 E, and a decoder layer is never split, so
    accelerate places it the same (tests/test_plan.py checks the plan's map against the loader's)."""

    def __init__(self, num: int, dims: dict, packed: dict, group: int, dtype: torch.dtype):
        super().__init__()
        from eagle_eval.models.quant.int4 import PER_WORD

        for proj, (out, inp) in dims.items():
            if packed[proj]:
                self.register_parameter(f"{proj}_packed", nn.Parameter(torch.empty(
                    num, out, math.ceil(inp / PER_WORD), dtype=torch.int32, device="meta"), requires_grad=False))
                self.register_parameter(f"{proj}_scale", nn.Parameter(torch.empty(
                    num, out, inp // group, dtype=torch.bfloat16, device="meta"), requires_grad=False))
                self.register_buffer(f"{proj}_shape", torch.empty(num, 2, dtype=torch.int64, device="meta"))
            else:
                self.register_parameter(f"{proj}_weight", nn.Parameter(torch.empty(num, out, inp, dtype=dtype,
                                                                                   device="meta")))


def _stacked_experts(module, packed: set, name: str, group: int, dtype) -> StackedPackedExperts:
    from eagle_eval.models.quant.int4 import Int4Error
    from eagle_eval.models.quant.int4_load import EXPERT_PROJS

    num, two_i, hidden = module.gate_up_proj.shape
    dims = {"gate_proj": (two_i // 2, hidden), "up_proj": (two_i // 2, hidden), "down_proj": (hidden, two_i // 2)}
    for proj, (_, inp) in dims.items():
        if inp % group:
            raise Int4Error(f"{name}.*.{proj}: the group size {group} does not divide in_features {inp}")
    quantized = {p: all(f"{name}.{e}.{p}" in packed for e in range(num)) for p in EXPERT_PROJS}
    return StackedPackedExperts(num, dims, quantized, group, dtype)


def _hold_fp8(model, qc: dict) -> int:
    """transformers' own GPU path for a block-FP8 checkpoint: its quantizer swaps in FP8Linear / FP8Experts."""
    from accelerate import init_empty_weights
    from transformers.quantizers.auto import AutoHfQuantizer

    from eagle_eval.models.quant.fp8 import held_fp8_modules

    quantizer = AutoHfQuantizer.from_config(dict(qc), pre_quantized=True)
    with init_empty_weights():
        quantizer._process_model_before_weight_loading(model)
    linears, experts = held_fp8_modules(model)
    return len(linears) + len(experts)


def held_meta_model(folder: Path, dtype: torch.dtype, held: bool = True, trust_remote_code: bool = False,
                    context_given: bool = False) -> HeldModel:
    """The target of `folder` on the meta device, as held (module contract). `context_given`: the plan has
    its own context length, so config.json need not give max_position_embeddings."""
    from eagle_eval.models.quant.info import checkpoint_quantization_config
    from eagle_eval.models.quant.int4 import int4_scheme

    if not (folder / "config.json").is_file():
        raise PlanError(f"{folder / 'config.json'}: missing (a plan needs the target's config.json)")
    config = read_json_file(folder / "config.json", PlanError, "a Hugging Face model config (a JSON object)")
    check_sizes(config, folder / "config.json")
    index_file = folder / "model.safetensors.index.json"
    index = read_json_file(index_file, PlanError, "a safetensors index") if index_file.is_file() else None
    names = sorted((index or {}).get("weight_map") or {}) if index else None
    model, built, prefix = _build(folder, config, dtype, trust_remote_code, context_given)
    out = HeldModel(model=model.eval(), built=built, prefix=prefix, index_names=names)
    qc = checkpoint_quantization_config(folder) or {}
    scheme = int4_scheme(qc, folder / "config.json")
    if scheme is not None and held:
        source, count = _hold_int4(model, folder, scheme, dtype, prefix, names)
        out.formats = {"method": "int4", "held": f"{count} Linear weights packed ({scheme.describe()})",
                       "source": source}
    elif qc.get("quant_method") == "fp8" and held:
        count = _hold_fp8(model, qc)
        out.formats = {"method": "fp8", "held": f"{count} modules in FP8 (block {qc.get('weight_block_size')}, fp32 "
                       "scales), as transformers loads them on a GPU with FP8 (compute capability >= 8.9)",
                       "source": "transformers' FP8 quantizer on config.json"}
    elif qc:
        what = "dequantized" if scheme is not None or qc.get("quant_method") == "fp8" else "counted"
        out.formats = {"method": str(qc.get("quant_method")), "held": f"{what} at {str(dtype).removeprefix('torch.')}",
                       "source": "--quantized dequantized" if not held else "not a format eagle-eval holds"}
    if names is not None:
        out.checkpoint = _index_view(model, names, index, prefix)
    return out


def hold_like_target(head, target: HeldModel, folder: Path, dtype: torch.dtype, held: bool, names) -> str:
    """Hold `head`, a draft read from the target's own checkpoint (`--draft mtp`: its MTP layers, on the meta device,
    in `dtype`), as the target's weights are held (module contract); returns how, for the report. `names`: the
    head's checkpoint names (heads/mtp/keys.py KeyMap: `parameter(key)`, `checkpoint_name(tensor)`, `unused()`).
    Per module, as the MTP loader holds it (heads/mtp/quant.py) and by the target's rules here:
    - pack-quantized INT4: `_hold_int4`, the target's code: the modules the safetensors headers ship packed, else the
      index's `weight_packed` names, else config.json's targets / ignore matched on the checkpoint's module names
      (an `eh_proj` no ignore pattern names is packed, as a target's Linear would be);
    - block FP8 held: transformers' FP8Linear / FP8Experts (heads/mtp/quant.py `swap_fp8`) for the modules the headers
      ship F8_E4M3, else those with a `weight_scale_inv` in the index, else transformers' rule on config.json (every
      Linear and experts module but `modules_to_not_convert`, matched by transformers' `should_convert_module` on the
      checkpoint's names);
    - otherwise (not quantized, dequantized, a format not held): every weight in `dtype`, as the target's."""
    from eagle_eval.heads.mtp.quant import fp8_convertible, fp8_modules, swap_fp8
    from eagle_eval.models.quant.info import checkpoint_quantization_config
    from eagle_eval.models.quant.int4 import Int4Error, int4_scheme
    from eagle_eval.models.quant.int4_load import checkpoint_tensors

    qc = checkpoint_quantization_config(folder) or {}
    scheme = int4_scheme(qc, folder / "config.json")
    rest = f"the rest at {str(dtype).removeprefix('torch.')}"
    unused = {k.rpartition(".")[0] for k in names.unused()}
    strip = _prefixed(target.prefix)

    def own(key: str) -> str | None:
        key = strip(key)
        return None if key is None or key.rpartition(".")[0] in unused else names.parameter(key)

    def checkpoint_name(module: str) -> str:
        return names.checkpoint_name(module + ".weight").removesuffix(".weight")

    if scheme is not None and held:
        try:
            source, count = _hold_int4(head, folder, scheme, dtype, target.prefix, target.index_names, own,
                                       checkpoint_name)
        except Int4Error as exc:
            raise Int4Error(names.in_checkpoint_words(str(exc))) from exc
        return f"held as the target's: {count} Linear weights packed ({scheme.describe()}), from {source}; {rest}"
    if qc.get("quant_method") == "fp8" and held:
        from transformers.quantizers.auto import AutoHfQuantizer
        from transformers.quantizers.quantizers_utils import should_convert_module

        if any(folder.glob("*.safetensors")):
            fp8 = fp8_modules(name for k, e in checkpoint_tensors(folder).items()
                              if e.dtype == torch.float8_e4m3fn and (name := own(k)) is not None)
            source = "the safetensors headers"
        elif target.index_names is not None:
            fp8 = fp8_modules(name.removesuffix("_scale_inv") for k in target.index_names
                              if k.endswith(".weight_scale_inv") and (name := own(k)) is not None)
            source = "the safetensors index's weight_scale_inv names"
        else:
            skip = qc.get("modules_to_not_convert")
            fp8 = {n for n in fp8_convertible(head) if should_convert_module(checkpoint_name(n), skip)}
            source = ("transformers' FP8 rule on config.json (every Linear and experts module but "
                      "modules_to_not_convert)")
        swap_fp8(head, fp8, AutoHfQuantizer.from_config(dict(qc), pre_quantized=True).quantization_config)
        return (f"held as the target's: {len(fp8)} modules in FP8 (block {qc.get('weight_block_size')}, fp32 scales), "
                f"from {source}; {rest}")
    return f"at {str(dtype).removeprefix('torch.')}, as the target's" + (
        f" ({target.formats['held']})" if target.formats else " (not quantized)")


def _index_view(model, names: list[str], index: dict, prefix: str) -> dict:
    """The index's tensors the model does not hold, grouped by the first module the model lacks
    ("model.layers.61", "vision_tower"), and its total_size."""
    from eagle_eval.models.quant.int4_load import _is_fused_experts

    held = set(model.state_dict(keep_vars=True))
    modules = {".".join(k.split(".")[:i]) for k in held for i in range(1, k.count(".") + 1)}
    fused = {n for n, m in model.named_modules() if _is_fused_experts(m) or isinstance(m, StackedPackedExperts)}
    groups: dict[str, int] = {}
    for name in names:
        own = name[len(prefix):] if name.startswith(prefix) else None
        if own in held or (own is not None and own.count(".") >= 3 and own.rsplit(".", 3)[0] in fused):
            continue                                       # held, or one expert's tensor inside fused experts
        parts = (own or name).split(".")
        depth = next((i for i in range(1, len(parts)) if ".".join(parts[:i]) not in modules), len(parts))
        key = ("" if own is None or not prefix else prefix) + ".".join(parts[:depth])
        groups[key] = groups.get(key, 0) + 1
    return {"tensors": len(names), "not_held": dict(sorted(groups.items())),
            "total_size": (index.get("metadata") or {}).get("total_size")}


def head_meta(folder: Path, dtype: torch.dtype):
    """(the draft head on the meta device in `dtype`, its config, its head kind's name); its own embedding table
    when the checkpoint ships one (headers only)."""
    from eagle_eval.heads.io import _read_config
    from eagle_eval.heads.kind import kind_of
    from eagle_eval.models.files import safetensors_header

    config_file, config = _read_config(folder)
    check_sizes(config, config_file)
    kind, dialect = kind_of(config, config_file)
    weights = folder / "model.safetensors"
    names = set(safetensors_header(weights, PlanError)) if weights.is_file() else set()
    with torch.device("meta"):
        head = kind.meta(config, config_file, dialect, names)
    return head.to(dtype), head.config, kind.name
