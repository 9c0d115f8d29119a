"""Reading the MTP layers from the TARGET's own checkpoint, strictly (`--draft mtp`).

Contract: `load_from_target(target)` -> heads/io.py LoadedHead whose head is a heads/mtp/model.py `MTPStack`: every
tensor of the n MTP layers (heads/mtp/layouts.py) is mapped to one parameter (heads/mtp/keys.py), its shape and
dtype checked, and every parameter comes from one tensor; a missing, unexpected or mis-shaped tensor is a
CheckpointError naming the file, the key and both shapes. Routed experts are read one per key (the hub form) and
stacked as transformers does, or read fused as they are. A layer's own `embed_tokens` / `shared_head.head`
(DeepSeek, GLM) are read, their shapes checked, and compared with the target's: no engine uses them (vLLM
`_maybe_share_embeddings` / `_maybe_share_lm_head`, SGLang `set_embed_and_head`, transformers
`MtpModel.tie_with_main_model`), so a difference is a note, not an error. Quantized MTP tensors are held as the
target's weights are, by the same code, or refused with the reason (heads/mtp/quant.py): block FP8 dequantized on
load where transformers dequantized the target (the CPU), held FP8 in transformers' FP8Linear / FP8Experts where
the target is (the GPU path) and run by the target's --fp8-matmul; compressed-tensors pack-quantized INT4 held
packed (PackedInt4Linear / PackedInt4Experts) as the target is. The stack is built on the meta device and every
tensor assigned from the checkpoint. `load_export` reads an MTP layer exported alone; `meta_stack` builds one for
`plan`.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from eagle_eval.heads.eagle3.config import CheckpointError
from eagle_eval.heads.mtp.layouts import DEEPSEEK, GLM, LAYOUTS, QWEN3_NEXT, count_section
from eagle_eval.heads.mtp.model import MTPConfig, MTPStack
from eagle_eval.heads.mtp.keys import KeyMap, per_expert, stack_experts
from eagle_eval.heads.mtp.quant import Holding
from eagle_eval.models.files import read_json_file, safetensors_header

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


def _dequantize(tensors: dict, index: dict[str, Tensor], holding: Holding, dtype: torch.dtype) -> int:
    """Block-FP8 weights (in place): W = fp8 * weight_scale_inv per block (models/quant/fp8.py dequantize_blocks, the
    formula transformers applies to the target); returns how many."""
    from eagle_eval.models.quant.fp8 import dequantize_blocks

    done = 0
    for key in [k for k, t in tensors.items() if t.dtype == torch.float8_e4m3fn]:
        scale_key = key + "_scale_inv"
        if scale_key not in index:
            raise CheckpointError(f"{index[key].file}: MTP tensor {key!r} is float8_e4m3fn without its "
                                  f"{scale_key!r}")
        tensors[key] = dequantize_blocks(tensors[key], _read(index, [scale_key])[scale_key], holding.block, dtype)
        done += 1
    return done


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


def _stored(index: dict[str, Tensor], state_keys: dict[str, str], holding: Holding | None):
    """(stack name -> (file, dtype, shape) of each MTP tensor as stored; INT4: stack name -> weight_shape values)."""
    stored = {state_keys[k]: (index[k].file, index[k].dtype, index[k].shape) for k in state_keys}
    shape_keys = [k for k in state_keys if k.endswith(".weight_shape")] if holding is not None else []
    values = {state_keys[k]: [int(v) for v in t.flatten().tolist()] for k, t in _read(index, shape_keys).items()}
    return stored, values


@dataclass(frozen=True)
class Source:
    """Where the MTP layers are read from, for the messages: the folder, its index, the key map, the config."""
    folder: Path
    index: dict
    keys: KeyMap
    cfg: MTPConfig
    config_file: Path


def _keys_read(src: Source, dequantizing: bool) -> dict[str, str]:
    """checkpoint key -> stack tensor name of every MTP tensor read (a block-FP8 scale dequantized with its weight is
    read with it); a key in the MTP layers' space that is none of theirs is refused."""
    index, keys, cfg = src.index, src.keys, src.cfg
    unused, state_keys = keys.unused(), {}
    for key in index:
        if key in unused:
            continue
        if dequantizing and key.endswith(".weight_scale_inv") \
                and index.get(key.removesuffix("_scale_inv"), Tensor(None, "", ())).dtype == "F8_E4M3":
            continue                                       # read with its weight (_dequantize)
        if (name := keys.parameter(key)) is not None:
            state_keys[key] = name
        elif keys.in_mtp_space(key):
            raise CheckpointError(f"{index[key].file}: unexpected MTP tensor {key!r}: {src.config_file} counts "
                                  f"{cfg.num_layers} MTP layer(s) ({cfg.layout.count_key}), and this key is none "
                                  "of theirs")
    if not state_keys:
        raise CheckpointError(f"{src.folder}: no MTP layer weights in the checkpoint (expected e.g. "
                              f"{keys.checkpoint_name('fusions.0.proj.weight')!r}); {src.config_file} says "
                              f"{cfg.layout.count_key} = {cfg.num_layers}. The checkpoint may have been exported or "
                              "quantized without its MTP layers")
    return state_keys


def _load(stack: MTPStack, state: dict, origin: dict, expected: dict, src: Source) -> None:
    """Every tensor to its parameter, checked: present, expected, its shape, its dtype (a quantized tensor goes only
    where the module holds it quantized; a float one is cast to the parameter's float dtype)."""
    folder, index, keys, cfg, config_file = src.folder, src.index, src.keys, src.cfg, src.config_file
    for name, (shape, _) in expected.items():
        if name not in state:
            key = keys.checkpoint_name(name)
            raise CheckpointError(f"{folder}: missing MTP tensor {key!r} (expected shape "
                                  f"{per_expert(name, shape)}; {config_file} counts {cfg.num_layers} MTP layer(s))")
    narrow = (torch.float8_e4m3fn, torch.float8_e5m2)
    out = {}
    for name, t in state.items():
        file = index[origin[name]].file
        if name not in expected:
            raise CheckpointError(f"{file}: unexpected MTP tensor {origin[name]!r}: the "
                                  f"{cfg.block_class} block built from {config_file} has no such parameter")
        shape, dtype = expected[name]
        if tuple(t.shape) != shape:
            raise CheckpointError(f"{file}: MTP tensor {origin[name]!r} has shape "
                                  f"{list(per_expert(name, tuple(t.shape)))}, expected "
                                  f"{list(per_expert(name, shape))} (from {config_file})")
        if t.dtype != dtype and (t.dtype in narrow or dtype in narrow or not t.is_floating_point()
                                 or not dtype.is_floating_point):
            raise CheckpointError(f"{file}: MTP tensor {origin[name]!r} is {str(t.dtype).removeprefix('torch.')}, "
                                  f"where the target's way of holding it needs {str(dtype).removeprefix('torch.')} "
                                  "(a module stored quantized in part, or otherwise than the target's)")
        out[name] = t.to(dtype)
    stack.load_state_dict(out, strict=True, assign=True)


def read_stack(folder: Path, family: str, cfg: MTPConfig, block_class, decoder: str, config_file: Path,
               holding: Holding | None = None) -> tuple[MTPStack, dict, list[str]]:
    """(the loaded MTPStack, {unused key: tensor}, notes): every MTP tensor of the checkpoint read strictly, held as
    `holding` says the target's weights are (heads/mtp/quant.py; None: as stored, quantized tensors refused)."""
    from eagle_eval.heads.mtp import quant
    from eagle_eval.models.quant.int4 import Int4Error

    src = Source(Path(folder), checkpoint_index(folder), KeyMap(family, decoder, cfg.target_layers, cfg.num_layers),
                 cfg, config_file)
    index, keys, unused = src.index, src.keys, src.keys.unused()
    with torch.device("meta"):                 # every tensor comes from the checkpoint (assigned on load)
        stack = MTPStack(cfg, block_class)
    dequantizing = holding is not None and holding.method == quant.FP8_DEQUANTIZED
    state_keys = _keys_read(src, dequantizing)
    for key in sorted([*state_keys, *(k for k in unused if k in index)],   # a module's weight before its scales
                      key=lambda k: (k.rpartition(".")[0], k.rpartition(".")[2] != "weight")):
        quant.check_stored(key, index[key].file, index[key].dtype, holding)
    stored, weight_shapes = _stored(index, state_keys, holding)
    try:
        quant.swap(stack, stored, holding, weight_shapes, torch.float32)
    except Int4Error as exc:
        raise CheckpointError(keys.in_checkpoint_words(str(exc))) from exc
    expected = {k: (tuple(v.shape), v.dtype) for k, v in stack.state_dict().items()}
    tensors = _read(index, state_keys)
    dequantized = _dequantize(tensors, index, holding, torch.float32) if dequantizing else 0
    state = {state_keys[k]: v for k, v in tensors.items()}
    origin = {state_keys[k]: k for k in tensors}
    stack_experts(state, origin, {k: shape for k, (shape, _) in expected.items()})
    _load(stack, state, origin, expected, src)
    quant.finish(stack, holding)
    stack.config = replace(cfg, weights=quant.describe(stack, holding, dequantized))
    present = {k: v for k, v in _read(index, [k for k in unused if k in index]).items()}
    return stack.eval(), present, []


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


def meta_stack(config: dict, config_file: Path, decoder) -> tuple[MTPStack, MTPConfig, KeyMap]:
    """(the MTPStack `--draft mtp` would load for this target, built in the caller's device context, e.g. meta; its
    config; its KeyMap: the checkpoint names of its tensors, in the names of the model the decoder is in) from the
    target's config.json and its text decoder (models/text_decoder.py), no weight read (`plan`)."""
    block_class = type(decoder.layers[0])
    cfg = _config(config, config_file, decoder.config, len(decoder.layers), decoder.config.hidden_size,
                  decoder.output_embeddings.weight.shape[0], block_class)
    keys = KeyMap(cfg.family, decoder.path.partition(".")[2] + ".layers", cfg.target_layers, cfg.num_layers)
    return MTPStack(cfg, block_class), cfg, keys


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


def load_from_target(target):
    """The MTP layers of the loaded `target`'s own checkpoint -> heads/io.py LoadedHead (head: MTPStack)."""
    from eagle_eval.heads.io import LoadedHead
    from eagle_eval.heads.mtp.quant import holding_of

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
    stack, unused, notes = read_stack(folder, family, cfg, block_class, decoder, config_file,
                                      holding_of(target, folder))
    notes += _compare_unused(unused, target)
    return LoadedHead(head=stack, kind="mtp", dialect=family, path=str(folder), weights_file=f"{folder} (MTP layers)",
                      own_embedding=False, aux_ids_sglang=None, aux_ids_vllm=None, d2t_in_checkpoint=False,
                      key_notes=tuple(notes))
