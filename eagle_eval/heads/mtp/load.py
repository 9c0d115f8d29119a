"""Reading the MTP layers from the TARGET's own checkpoint, strictly (`--draft mtp`).

Contract: `load_from_target(target)` -> heads/io.py LoadedHead whose head is a heads/mtp/model.py `MTPStack`: every tensor of the n MTP layers (heads/mtp/layouts.py) is mapped to
one parameter, its shape checked, and every parameter comes from one tensor; a missing, unexpected or mis-shaped
tensor is a CheckpointError naming the file, the key and both shapes. Routed experts stored one per key (the hub
form: `mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`) are stacked into the family's fused `gate_up_proj`
[E, 2I, H] and `down_proj` [E, H, I], as transformers' own conversion does; stored fused, they are read as they are.
A layer's own `embed_tokens` / `shared_head.head` (DeepSeek, GLM) are read, their shapes checked, and compared with
the target's (`checkpoint_tensors` is the writer, the tests' and an export's): no engine uses them (vLLM `_maybe_share_embeddings` / `_maybe_share_lm_head`, SGLang
`set_embed_and_head`, transformers `MtpModel.tie_with_main_model`), so a difference is a note, not an error.
Quantized MTP tensors are held as the target's weights are, or refused with the reason: block-FP8 tensors (with
their `weight_scale_inv`) are dequantized when transformers dequantized the target on load (the CPU); an FP8-held
target (GPU), compressed-tensors INT4 (`weight_packed`) or a quantized MTP tensor in a target that is not block FP8
is refused.
"""

from __future__ import annotations

import copy
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle_eval.heads.eagle3.config import CheckpointError
from eagle_eval.heads.mtp.layouts import DEEPSEEK, GLM, LAYOUTS, QWEN3_NEXT, count_section
from eagle_eval.heads.mtp.model import MTPConfig, MTPStack
from eagle_eval.models.files import read_json_file, safetensors_header

FLOATS = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
QUANTIZED_SUFFIXES = ("weight_scale_inv", "weight_packed", "weight_scale", "weight_shape", "input_scale")
EXPERT = re.compile(r"^(?P<head>.*\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


@dataclass(frozen=True)
class Tensor:
    file: Path
    dtype: str                        # the safetensors dtype name
    shape: tuple[int, ...]


def checkpoint_index(folder: Path) -> dict[str, Tensor]:
    """Every tensor of a safetensors checkpoint (its index's files, else every *.safetensors) from the headers."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({folder / n for n in (read_json_file(index, CheckpointError, "a safetensors index")
                                                .get("weight_map") or {}).values()})
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no *.safetensors weights: --draft mtp reads the MTP layers from the target's "
                              "safetensors checkpoint")
    out = {}
    for file in files:
        for key, info in safetensors_header(file, CheckpointError).items():
            out[key] = Tensor(file, info.get("dtype"), tuple(info.get("shape") or ()))
    return out


def block_config(text_config, family: str):
    """The transformers config one MTP block is built from: the target's, one full-attention layer, its MLP the MoE
    where the family's MTP layer is one (DeepSeek/GLM: transformers' get_mtp_config sets first_k_dense_replace 0)."""
    cfg = copy.deepcopy(text_config)
    cfg.num_hidden_layers = 1
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = ["full_attention"]
    if family in (DEEPSEEK, GLM):
        cfg.first_k_dense_replace = 0
    if family == QWEN3_NEXT:
        cfg.mlp_only_layers, cfg.decoder_sparse_step = [], 1
    return cfg


def layer_count(config: dict, config_file: Path, family: str) -> int:
    """n, the MTP layers the config.json counts; refused when it has none."""
    layout = LAYOUTS[family]
    section, where = count_section(config, layout)
    n = section.get(layout.count_key)
    if n is None or isinstance(n, bool) or not isinstance(n, int) or n < 1:
        said = "absent" if n is None else f"= {n!r}"
        raise CheckpointError(f"{config_file}: key {where}{layout.count_key!r} {said}: a {layout.description} target "
                              "with MTP layers says how many (a positive integer); this checkpoint has none to draft "
                              "with")
    if section.get("mtp_use_dedicated_embeddings"):
        raise CheckpointError(f"{config_file}: key {where}'mtp_use_dedicated_embeddings' = true: MTP layers with an "
                              "embedding table of their own are not read here (no released checkpoint has one; "
                              "SGLang's qwen3_next_mtp.py says the same)")
    return n


class KeyMap:
    """Checkpoint key <-> MTPStack parameter name for one target (module contract)."""

    def __init__(self, family: str, decoder: str, num_target_layers: int, n: int):
        self.layout, self.decoder, self.big_n, self.n = LAYOUTS[family], decoder, num_target_layers, n
        self.prefixes = [self.layout.block(decoder, num_target_layers, i) for i in range(n)]

    def fixed(self) -> dict[str, str]:
        """The fusion and output-norm tensors: checkpoint key -> parameter name."""
        out, lay = {}, self.layout
        for i in range(1 if lay.shared else self.n):
            where = lay.fusion_prefix or self.prefixes[i]
            for stem, name in zip(lay.fusion, ("emb_norm", "hidden_norm", "proj")):
                out[f"{where}{stem}.weight"] = f"fusions.{i}.{name}.weight"
            out[f"{where}{lay.out_norm}.weight"] = f"out_norms.{i}.weight"
        return out

    def unused(self) -> dict[str, int]:
        """A layer's own embedding / head (no engine uses them): checkpoint key -> layer."""
        return {f"{p}{stem}.weight": i for i, p in enumerate(self.prefixes) for stem in self.layout.unused}

    def owner(self, key: str) -> int | None:
        """The MTP layer a block key belongs to, or None."""
        return next((i for i, p in enumerate(self.prefixes) if key.startswith(p)), None)

    def in_mtp_space(self, key: str) -> bool:
        """Keys of an MTP layer this config does not count (a layer index >= n) or of the shared `mtp.` tree."""
        lay = self.layout
        if lay.shared:
            return key.startswith(lay.fusion_prefix)
        base = lay.block_prefix.split("{")[0].format()
        if lay.block_prefix.startswith("{decoder}"):
            m = re.match(re.escape(self.decoder) + r"\.(\d+)\.", key)
            return m is not None and int(m.group(1)) >= self.big_n
        return key.startswith(base)

    def checkpoint_name(self, name: str, expert: int = 0, proj: str | None = None) -> str:
        """The checkpoint key a parameter is read from (fused experts: expert `expert`'s `proj`, by default its
        gate_proj / down_proj)."""
        inverse = {v: k for k, v in self.fixed().items()}
        if name in inverse:
            return inverse[name]
        _, i, rest = name.split(".", 2)
        for fused, first in ((".experts.gate_up_proj", "gate_proj"), (".experts.down_proj", "down_proj")):
            if rest.endswith(fused):
                return f"{self.prefixes[int(i)]}{rest[: -len(fused)]}.experts.{expert}.{proj or first}.weight"
        return self.prefixes[int(i)] + rest


def checkpoint_tensors(stack: MTPStack, decoder: str = "model.layers") -> dict[str, torch.Tensor]:
    """The writer: an MTPStack's parameters under the checkpoint names they are read from (experts one per key, the
    hub form), so that `read_stack` of them gives the stack back."""
    cfg = stack.config
    keys = KeyMap(cfg.family, decoder, cfg.target_layers, cfg.num_layers)
    out = {}
    for name, t in stack.state_dict().items():
        t = t.detach()
        if name.endswith(".experts.gate_up_proj"):
            for e in range(t.shape[0]):
                gate, up = t[e].chunk(2, dim=0)
                out[keys.checkpoint_name(name, e, "gate_proj")] = gate
                out[keys.checkpoint_name(name, e, "up_proj")] = up
        elif name.endswith(".experts.down_proj"):
            for e in range(t.shape[0]):
                out[keys.checkpoint_name(name, e)] = t[e]
        else:
            out[keys.checkpoint_name(name)] = t
    return {k: v.contiguous().clone() for k, v in out.items()}


@dataclass(frozen=True)
class Fp8:
    """How the target holds its block-FP8 weights, and so the MTP layer's: `block` when transformers dequantized the
    target on load (its CPU path), the MTP layer then dequantized the same way; `refusal` when the target is held in
    FP8 (on a GPU), which this loader does not do for an MTP layer."""
    block: tuple[int, int] | None
    refusal: str | None = None


def _refuse_quantized(key: str, t: Tensor, fp8: Fp8 | None) -> None:
    if t.dtype == "F8_E4M3" and fp8 is not None and fp8.block is not None:
        return
    if key.rsplit(".", 1)[-1] in QUANTIZED_SUFFIXES or t.dtype not in FLOATS:
        why = (fp8.refusal if fp8 is not None and fp8.refusal else
               "eagle-eval reads a quantized MTP layer only as the target holds its own: block FP8 dequantized on "
               "load, as transformers dequantizes the target on the CPU")
        raise CheckpointError(f"{t.file}: MTP tensor {key!r} is stored {t.dtype}"
                              + (" (a quantization scale or packed weight)" if t.dtype in FLOATS else "")
                              + f": {why}; use a checkpoint whose MTP layers are unquantized (SGLang keeps some "
                              "unquantized: models/qwen3_5_mtp.py _mtp_quant_config)")


def _dequantize(tensors: dict, index: dict[str, Tensor], fp8: Fp8 | None, dtype: torch.dtype) -> None:
    """Block-FP8 weights (in place): W = fp8 * weight_scale_inv per block (models/quant/fp8.py dequantize_blocks, the
    formula transformers applies to the target)."""
    from eagle_eval.models.quant.fp8 import dequantize_blocks

    for key in [k for k, t in tensors.items() if t.dtype == torch.float8_e4m3fn]:
        scale_key = key + "_scale_inv"
        if scale_key not in index:
            raise CheckpointError(f"{index[key].file}: MTP tensor {key!r} is float8_e4m3fn without its "
                                  f"{scale_key!r}")
        tensors[key] = dequantize_blocks(tensors[key], _read(index, [scale_key])[scale_key], fp8.block, dtype)


def _read(index: dict[str, Tensor], keys) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    by_file = defaultdict(list)
    for key in keys:
        by_file[index[key].file].append(key)
    out = {}
    for file, names in by_file.items():
        with safe_open(str(file), "pt") as f:
            for key in names:
                out[key] = f.get_tensor(key)
    return out


def _stack_experts(state: dict[str, torch.Tensor], origin: dict[str, str], expected: dict) -> None:
    """Per-expert checkpoint tensors -> the fused parameters the family's experts module holds (in place)."""
    groups = defaultdict(dict)
    for name in [n for n in state if EXPERT.match(n)]:
        m = EXPERT.match(name)
        groups[m["head"]].setdefault(m["proj"], {})[int(m["e"])] = (state.pop(name), origin.pop(name))
    for head, projs in groups.items():
        if f"{head}.gate_up_proj" not in expected:
            key = next(iter(next(iter(projs.values())).values()))[1]
            raise CheckpointError(f"{key}: per-expert tensor, but the block's experts module has no fused "
                                  f"gate_up_proj ({head}): an unexpected tensor for this family")
        count = expected[f"{head}.gate_up_proj"][0]
        sample = next(iter(next(iter(projs.values())).values()))[1]
        where = sample.rsplit(".", 3)[0]                      # the checkpoint's "...mlp.experts"
        if f"{head}.gate_up_proj" in state or f"{head}.down_proj" in state:
            raise CheckpointError(f"{where}: the experts are stored both fused ({where}.gate_up_proj) and one per "
                                  f"key ({sample}): which to read is ambiguous")
        for proj in ("gate_proj", "up_proj", "down_proj"):
            got = projs.get(proj, {})
            missing = [e for e in range(count) if e not in got]
            extra = [e for e in got if e >= count]
            if missing:
                raise CheckpointError(f"missing MTP tensor '{where}.{missing[0]}.{proj}.weight' (experts {missing[:4]} "
                                      f"of {proj} absent; the config has {count} routed experts)")
            if extra:
                raise CheckpointError(f"unexpected MTP tensor '{where}.{extra[0]}.{proj}.weight': the config has "
                                      f"{count} routed experts")
        gate_up = [torch.cat([projs["gate_proj"][e][0], projs["up_proj"][e][0]], dim=0) for e in range(count)]
        if len({tuple(t.shape) for t in gate_up + [projs["down_proj"][e][0] for e in range(count)]}) > 2:
            shapes = sorted({tuple(projs[p][e][0].shape) for p in projs for e in range(count)})
            raise CheckpointError(f"{projs['gate_proj'][0][1]}: the experts' tensors disagree in shape ({shapes})")
        state[f"{head}.gate_up_proj"] = torch.stack(gate_up)
        state[f"{head}.down_proj"] = torch.stack([projs["down_proj"][e][0] for e in range(count)])
        origin[f"{head}.gate_up_proj"] = projs["gate_proj"][0][1]
        origin[f"{head}.down_proj"] = projs["down_proj"][0][1]


def read_stack(folder: Path, family: str, cfg: MTPConfig, block_class, decoder: str, config_file: Path,
               fp8: Fp8 | None = None) -> tuple[MTPStack, dict, list[str]]:
    """(the loaded MTPStack, {unused key: tensor}, notes): every MTP tensor of the checkpoint read strictly; block-FP8
    tensors dequantized when `fp8` says the target was (their weight_scale_inv read with them)."""
    index = checkpoint_index(folder)
    keys = KeyMap(family, decoder, cfg.target_layers, cfg.num_layers)
    stack = MTPStack(cfg, block_class)
    expected = {k: tuple(v.shape) for k, v in stack.state_dict().items()}
    fixed, unused = keys.fixed(), keys.unused()
    state_keys, origin = {}, {}
    for key in index:
        if key in fixed:
            state_keys[key] = fixed[key]
        elif key in unused:
            continue
        elif key.endswith(".weight_scale_inv") and fp8 is not None and fp8.block is not None \
                and index.get(key.removesuffix("_scale_inv"), Tensor(None, "", ())).dtype == "F8_E4M3":
            continue                                       # read with its weight (_dequantize)
        elif (i := keys.owner(key)) is not None:
            state_keys[key] = f"blocks.{i}.{key[len(keys.prefixes[i]):]}"
        elif keys.in_mtp_space(key):
            raise CheckpointError(f"{index[key].file}: unexpected MTP tensor {key!r}: {config_file} counts "
                                  f"{cfg.num_layers} MTP layer(s) ({cfg.layout.count_key}), and this key is none "
                                  "of theirs")
    if not state_keys:
        raise CheckpointError(f"{folder}: no MTP layer weights in the checkpoint (expected e.g. "
                              f"{keys.checkpoint_name('fusions.0.proj.weight')!r}); {config_file} says "
                              f"{cfg.layout.count_key} = {cfg.num_layers}. The checkpoint may have been exported or "
                              "quantized without its MTP layers")
    for key in list(state_keys) + [k for k in unused if k in index]:
        _refuse_quantized(key, index[key], fp8)
    tensors = _read(index, state_keys)
    _dequantize(tensors, index, fp8, torch.float32)
    state = {state_keys[k]: v for k, v in tensors.items()}
    origin = {state_keys[k]: k for k in tensors}
    _stack_experts(state, origin, expected)
    for name, shape in expected.items():
        if name not in state:
            key = keys.checkpoint_name(name)
            raise CheckpointError(f"{folder}: missing MTP tensor {key!r} (expected shape "
                                  f"{_per_expert(name, shape)}; {config_file} counts {cfg.num_layers} MTP layer(s))")
    for name, t in state.items():
        if name not in expected:
            raise CheckpointError(f"{index[origin[name]].file}: unexpected MTP tensor {origin[name]!r}: the "
                                  f"{cfg.block_class} block built from {config_file} has no such parameter")
        if tuple(t.shape) != expected[name]:
            raise CheckpointError(f"{index[origin[name]].file}: MTP tensor {origin[name]!r} has shape "
                                  f"{list(_per_expert(name, tuple(t.shape)))}, expected "
                                  f"{list(_per_expert(name, expected[name]))} (from {config_file})")
    dtype = next(iter(stack.parameters())).dtype
    stack.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True)
    present = {k: v for k, v in _read(index, [k for k in unused if k in index]).items()}
    return stack.eval(), present, []


def _per_expert(name: str, shape: tuple) -> tuple:
    """A fused experts shape as the checkpoint's one-expert tensor shows it (gate_up: [2I, H] -> gate [I, H])."""
    if name.endswith(".experts.gate_up_proj") and len(shape) == 3:
        return (shape[1] // 2, shape[2])
    if name.endswith(".experts.down_proj") and len(shape) == 3:
        return tuple(shape[1:])
    return shape


def _compare_unused(present: dict, target) -> list[str]:
    """A layer's own embed_tokens / shared_head.head against the target's (no engine reads them)."""
    notes = []
    tables = {"embed_tokens": target.input_embeddings.weight, "shared_head.head": target.output_embeddings.weight}
    for key, t in present.items():
        stem = next(s for s in tables if key.endswith(s + ".weight"))
        ours = tables[stem]
        if tuple(t.shape) != tuple(ours.shape):
            raise CheckpointError(f"MTP tensor {key!r} has shape {list(t.shape)}, the target's "
                                  f"{'embedding' if stem == 'embed_tokens' else 'lm_head'} is {list(ours.shape)}")
        if not torch.equal(t.to(ours.dtype), ours.detach().cpu()):
            notes.append(f"MTP tensor {key!r} differs from the target's "
                         f"{'embedding' if stem == 'embed_tokens' else 'lm_head'}: no engine reads it (vLLM, SGLang "
                         "and transformers share the target's), so neither does the oracle")
    return notes


def _config(config: dict, config_file: Path, text_config, num_target_layers: int, hidden: int, vocab: int,
            block_class) -> MTPConfig:
    from eagle_eval.heads.mtp.layouts import family_of

    family = family_of(config)
    if family is None:
        raise CheckpointError(f"{config_file}: model_type {config.get('model_type')!r} (architectures "
                              f"{config.get('architectures')}): --draft mtp reads the MTP layers of "
                              + ", ".join(lay.description for lay in LAYOUTS.values()) + " targets")
    n = layer_count(config, config_file, family)
    return MTPConfig(family=family, num_layers=n, target_layers=num_target_layers, hidden_size=hidden,
                     vocab_size=vocab, block_class=block_class.__name__,
                     text_config=block_config(text_config, family))


def meta_stack(config: dict, config_file: Path, decoder) -> tuple[MTPStack, MTPConfig]:
    """(the MTPStack `--draft mtp` would load for this target, built in the caller's device context, e.g. meta; its
    config) from the target's config.json and its text decoder (models/text_decoder.py), no weight read (`plan`)."""
    block_class = type(decoder.layers[0])
    cfg = _config(config, config_file, decoder.config, len(decoder.layers), decoder.config.hidden_size,
                  decoder.output_embeddings.weight.shape[0], block_class)
    return MTPStack(cfg, block_class), cfg


def load_export(path: Path, config_file: Path, config: dict):
    """A target's MTP layer exported alone (SGLang's NextN form: the target's config.json with `num_hidden_layers`
    1 and the layer as `model.layers.0.`, or with the target's N and the layer at `model.layers.{N}.`, SGLang's
    `nextn_layer_id` rule) -> heads/io.py LoadedHead; the block class is transformers' for its model_type, and the
    wiring checks it against the target it is run with."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from eagle_eval.heads.io import LoadedHead
    from eagle_eval.models.files import said_by

    path = Path(path)
    try:
        text_config = AutoConfig.from_pretrained(str(path), local_files_only=True).get_text_config(decoder=True)
        with torch.device("meta"):
            one = copy.deepcopy(text_config)
            one.num_hidden_layers = 1
            block_class = type(AutoModelForCausalLM.from_config(one).model.layers[0])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise said_by(f"{config_file}: transformers cannot build this model_type's decoder layer", exc,
                      CheckpointError) from exc
    big_n = 0 if text_config.num_hidden_layers == 1 else text_config.num_hidden_layers
    cfg = _config(config, config_file, text_config, big_n, text_config.hidden_size, text_config.vocab_size,
                  block_class)
    stack, _unused, notes = read_stack(path, cfg.family, cfg, block_class, "model.layers", config_file)
    return LoadedHead(head=stack, kind="mtp", dialect=f"{cfg.family} (NextN export)", path=str(path),
                      weights_file=f"{path} (MTP layer)", own_embedding=False, aux_ids_sglang=None, aux_ids_vllm=None,
                      d2t_in_checkpoint=False, key_notes=tuple(notes))


def _fp8_of(target, folder: Path) -> Fp8 | None:
    """How a block-FP8 target holds its weights (None: not a block-FP8 checkpoint)."""
    from eagle_eval.models.quant.fp8 import held_fp8_modules
    from eagle_eval.models.quant.info import checkpoint_quantization_config

    qc = checkpoint_quantization_config(folder) or {}
    if qc.get("quant_method") != "fp8" or not qc.get("weight_block_size"):
        return None
    linears, experts = held_fp8_modules(target.model)
    if linears or experts:
        return Fp8(None, f"the target is held in FP8 here ({len(linears) + len(experts)} FP8 modules, transformers' "
                         "GPU path); an MTP layer held in FP8 beside it is not implemented")
    return Fp8(tuple(qc["weight_block_size"]))


def load_from_target(target):
    """The MTP layers of the loaded `target`'s own checkpoint -> heads/io.py LoadedHead (head: MTPStack)."""
    from eagle_eval.heads.io import LoadedHead

    if target is None or not target.info.path:
        raise CheckpointError("--draft mtp reads the MTP layers from the target's checkpoint folder: a target loaded "
                              "from a folder is needed")
    folder = Path(target.info.path)
    config_file = folder / "config.json"
    block_class = type(target.layers[0])
    cfg = _config(read_json_file(config_file, CheckpointError), config_file, target.text_config, target.num_layers,
                  target.info.hidden_size, target.info.vocab_size, block_class)
    family = cfg.family
    decoder = target.info.decoder.split(".", 1)[1]          # "model.model.layers" -> the checkpoint's "model.layers"
    stack, unused, notes = read_stack(folder, family, cfg, block_class, decoder, config_file, _fp8_of(target, folder))
    notes += _compare_unused(unused, target)
    return LoadedHead(head=stack, kind="mtp", dialect=family, path=str(folder), weights_file=f"{folder} (MTP layers)",
                      own_embedding=False, aux_ids_sglang=None, aux_ids_vllm=None, d2t_in_checkpoint=False,
                      key_notes=tuple(notes))
