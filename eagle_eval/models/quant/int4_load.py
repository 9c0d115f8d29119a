"""Loading a pack-quantized INT4 checkpoint as it ships: from the files to the devices, packed.

transformers 5 decompresses compressed-tensors pack-quantized routed experts to bf16 while loading
(`integrations/compressed_tensors.py::CompressedTensorsDequantize`, transformers 5.24: only MXFP4 / NVFP4
experts stay packed), so a 1T-parameter Kimi-K2.5 needs ~2 TB. Here, instead:

1. the model is built from config.json on the meta device (`accelerate.init_empty_weights`: parameters
   take no memory, buffers such as RoPE tables are real);
2. every module whose checkpoint tensors are `weight_packed` / `weight_scale` / `weight_shape` is swapped
   for its packed form (models/quant/int4.py): a Linear becomes `PackedInt4Linear`, transformers' fused
   expert tensors become `PackedInt4Experts` (one entry per expert, the checkpoint's own names);
3. the placement is accelerate's, computed on that packed meta model (models/placement.py), so it counts
   packed bytes;
4. each tensor is read from its safetensors file straight onto its device (or into accelerate's disk
   offload folder), one at a time, then accelerate's `dispatch_model` adds the hooks a multi-device or
   offloaded placement needs.
Host and device memory therefore peak near the packed size. Loading is strict: the headers are checked
against the model before any data is read (a missing scale, a packed shape that disagrees with
`weight_shape` or with the model, a scale grid that the group size does not give, a tensor the model does
not have or lacks) and each problem is one `Int4Error` line naming the file and the key.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from eagle_eval.models.files import read_json_file, safetensors_header
from eagle_eval.models.quant.int4 import (
    PER_WORD,
    Int4Error,
    Int4Scheme,
    PackedExpert,
    PackedInt4Experts,
    PackedInt4Linear,
)

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
EXPERT_PROJS = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Entry:
    """One checkpoint tensor, from its file's header (or, for a plan without weights files, as config.json
    says the checkpoint holds it: `file` is then the config)."""
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class HeldPacked:
    linears: tuple[str, ...]              # Linear modules now PackedInt4Linear
    experts: tuple[str, ...]              # fused expert modules now PackedInt4Experts
    expert_linears: int                   # packed projections inside them


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint: those its index names, else every *.safetensors."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = (read_json_file(index, Int4Error, "a safetensors index").get("weight_map") or {}).values()
        return sorted({folder / n for n in names})
    return sorted(folder.glob("*.safetensors"))


def checkpoint_tensors(folder: Path) -> dict[str, Entry]:
    """Every tensor of the checkpoint -> Entry (file, dtype, shape), from the headers only."""
    out = {}
    for file in checkpoint_files(folder):
        for key, info in safetensors_header(file, Int4Error).items():
            if info.get("dtype") not in DTYPES:
                raise Int4Error(f"{file}: tensor {key!r} has dtype {info.get('dtype')!r}, which eagle-eval "
                                f"does not read (one of {sorted(DTYPES)} expected)")
            out[key] = Entry(file, DTYPES[info["dtype"]], tuple(info["shape"]))
    return out


def _weight_shapes(entries: dict[str, Entry], keys: list[str]) -> dict[str, list[int]]:
    """The values of the `weight_shape` tensors (2 integers each), grouped by file."""
    from safetensors import safe_open

    by_file = defaultdict(list)
    for key in keys:
        by_file[entries[key].file].append(key)
    out = {}
    for file, names in by_file.items():
        with safe_open(str(file), "pt") as f:
            for key in names:
                out[key] = [int(v) for v in f.get_tensor(key).flatten().tolist()]
    return out


def _packed_linear(name: str, out_features: int, in_features: int, entries: dict[str, Entry],
                   shapes: dict[str, list[int]], scheme: Int4Scheme, bias: bool, dtype) -> PackedInt4Linear:
    """A meta PackedInt4Linear for checkpoint module `name`, after checking its three tensors' headers
    against the model's [out, in] (from config.json) and the group size."""
    packed, scale, shape = (entries.get(f"{name}.{t}") for t in ("weight_packed", "weight_scale", "weight_shape"))
    where = entries[f"{name}.weight_packed"].file
    for tensor, entry in (("weight_scale", scale), ("weight_shape", shape)):
        if entry is None:
            raise Int4Error(f"{where}: {name}.weight_packed has no {name}.{tensor} (a pack-quantized weight needs "
                            f"its {'group scales' if tensor == 'weight_scale' else '[out, in] shape'})")
    stated = shapes[f"{name}.weight_shape"]
    if stated != [out_features, in_features]:
        raise Int4Error(f"{shape.file}: {name}.weight_shape = {stated}, but the model built from config.json has "
                        f"[{out_features}, {in_features}] there")
    words = math.ceil(in_features / PER_WORD)
    if packed.dtype != torch.int32 or packed.shape != (out_features, words):
        raise Int4Error(f"{packed.file}: {name}.weight_packed is {str(packed.dtype).removeprefix('torch.')} "
                        f"{list(packed.shape)}, which does not hold weight_shape {stated}: int32 "
                        f"[{out_features}, {words}] expected (8 values a word)")
    group = scheme.group_size
    if in_features % group:
        raise Int4Error(f"{scale.file}: {name}: quantization_config.config_groups.{scheme.group}.weights.group_size "
                        f"= {group} does not divide in_features {in_features}; its scales "
                        f"{list(scale.shape)} cannot be read with that group size")
    if scale.shape != (out_features, in_features // group) or not scale.dtype.is_floating_point:
        raise Int4Error(f"{scale.file}: {name}.weight_scale is {str(scale.dtype).removeprefix('torch.')} "
                        f"{list(scale.shape)}; a float [{out_features}, {in_features // group}] is expected for "
                        f"in_features {in_features} at quantization_config.config_groups.{scheme.group}.weights."
                        f"group_size = {group}")
    return PackedInt4Linear(in_features, out_features, group, scale.dtype, bias=bias, dtype=dtype,
                            shape_dtype=shape.dtype, device="meta")


def _is_fused_experts(module) -> bool:
    p = getattr(module, "gate_up_proj", None)
    return isinstance(p, torch.Tensor) and p.dim() == 3 and isinstance(getattr(module, "down_proj", None), torch.Tensor)


def _check_fused(name: str, module, where: Path) -> None:
    """Only the layout whose per-expert forward is act(gate) * up, without biases, is rebuilt."""
    from transformers.integrations import moe

    default = getattr(moe, "_default_apply_gate", None)          # transformers' act(gate) * up (5.24)
    apply_gate = getattr(type(module), "_apply_gate", default)
    if (getattr(module, "is_transposed", False) or getattr(module, "has_bias", False)
            or not getattr(module, "has_gate", True) or apply_gate is not default):
        raise Int4Error(f"{where}: {name} ({type(module).__name__}) holds its routed experts fused in a layout "
                        "eagle-eval does not rebuild packed (transposed, biased, ungated or a custom gate)")


def _packed_experts(name: str, module, entries, shapes, scheme, dtype) -> tuple[PackedInt4Experts, int]:
    """PackedInt4Experts for a fused experts module: every expert's gate/up/down from the checkpoint,
    packed (or plain, `.weight`) as it ships."""
    num, two_i, hidden = module.gate_up_proj.shape
    inter = two_i // 2
    dims = {"gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}
    experts, packed = [], 0
    where = next(e.file for k, e in entries.items() if k.startswith(name + "."))
    _check_fused(name, module, where)
    for e in range(num):
        projs = {}
        for proj in EXPERT_PROJS:
            key, (out_f, in_f) = f"{name}.{e}.{proj}", dims[proj]
            if f"{key}.weight_packed" in entries:
                projs[proj] = _packed_linear(key, out_f, in_f, entries, shapes, scheme, False, dtype)
                packed += 1
            elif f"{key}.weight" in entries:
                projs[proj] = nn.Linear(in_f, out_f, bias=False, device="meta", dtype=dtype)
            else:
                raise Int4Error(f"{where}: the checkpoint has no {key}.weight_packed (nor {key}.weight): "
                                f"{name} has {num} routed experts in the model built from config.json")
        experts.append(PackedExpert(**projs))
    return PackedInt4Experts(experts, module.act_fn), packed


def hold_packed(model, entries: dict[str, Entry], scheme: Int4Scheme, dtype: torch.dtype,
                shapes: dict[str, list[int]] | None = None) -> HeldPacked:
    """Swap, in `model` (on the meta device), every module the checkpoint ships packed for its packed form
    (the module contract). The checks read the headers and the weight_shape values only (`shapes`, when
    given, are those values)."""
    ignore = not_the_models(model)
    names = sorted(k.removesuffix(".weight_packed") for k in entries
                   if k.endswith(".weight_packed") and not any(p.search(k) for p in ignore))
    if shapes is None:
        shapes = _weight_shapes(entries, [f"{n}.weight_shape" for n in names if f"{n}.weight_shape" in entries])
    modules = dict(model.named_modules())
    linears, fused = [], {}
    for name in names:
        module = modules.get(name)
        if isinstance(module, nn.Linear):
            model.set_submodule(name, _packed_linear(name, module.out_features, module.in_features, entries, shapes,
                                                     scheme, module.bias is not None, dtype))
            linears.append(name)
            continue
        parent = name.rsplit(".", 2)[0] if name.count(".") >= 2 else ""
        if _is_fused_experts(modules.get(parent)) and name.rsplit(".", 1)[-1] in EXPERT_PROJS:
            fused[parent] = modules[parent]
            continue
        raise Int4Error(f"{entries[name + '.weight_packed'].file}: {name}.weight_packed: the model built from "
                        f"config.json has no Linear (nor fused routed experts) named {name!r}")
    expert_linears = 0
    for name, module in fused.items():
        new, count = _packed_experts(name, module, entries, shapes, scheme, dtype)
        model.set_submodule(name, new)
        expert_linears += count
    return HeldPacked(tuple(linears), tuple(sorted(fused)), expert_linears)


def not_the_models(model) -> list:
    """Patterns of the checkpoint keys a model does not hold by design: its class's
    `_keys_to_ignore_on_load_unexpected` (transformers': DeepSeek-V3's MTP layer as layer 61, Qwen3-Next's `mtp.`)
    and the MTP layers its config counts (`num_nextn_predict_layers` n: decoder layers N .. N + n - 1, the
    DeepSeek-V3 / Kimi layout), which `--draft mtp` reads on its own, as strictly (heads/mtp/load.py)."""
    import re

    patterns = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected", None) or []]
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else None
    n, big_n = getattr(text, "num_nextn_predict_layers", 0), getattr(text, "num_hidden_layers", None)
    if isinstance(n, int) and not isinstance(n, bool) and n > 0 and isinstance(big_n, int):
        patterns.append(re.compile(rf"(?:^|\.)layers\.(?:{'|'.join(str(big_n + i) for i in range(n))})\."))
    return patterns


def check_keys(model, entries: dict[str, Entry], folder: Path) -> None:
    """Strict: every tensor of the (packed) model has a checkpoint tensor of its shape and every checkpoint
    tensor is the model's (bar `not_the_models`: the class's ignored keys and the MTP layers)."""
    from accelerate.utils import find_tied_parameters

    state = model.state_dict(keep_vars=True)
    tied = {n for group in find_tied_parameters(model) for n in group}
    ignore = not_the_models(model)
    missing = sorted(k for k in state if k not in entries and not (k in tied and any(t in entries for t in tied)))
    if missing:
        raise Int4Error(f"{folder}: the checkpoint has no tensor {missing[0]!r} ({len(missing)} missing), which "
                        f"the model built from config.json needs (shape {list(state[missing[0]].shape)})")
    unexpected = sorted(k for k in entries if k not in state and not any(p.search(k) for p in ignore))
    if unexpected:
        raise Int4Error(f"{entries[unexpected[0]].file}: tensor {unexpected[0]!r} ({len(unexpected)} such) is not "
                        "a tensor of the model built from config.json")
    for key, value in state.items():
        entry = entries.get(key)
        if entry is not None and entry.shape != tuple(value.shape):
            raise Int4Error(f"{entry.file}: tensor {key!r} has shape {list(entry.shape)}, the model built from "
                            f"config.json expects {list(value.shape)}")


def build_empty(folder: Path, auto_class: str, dtype: torch.dtype, trust_remote_code: bool):
    """The model of `folder`'s config.json on the meta device (parameters), its buffers real."""
    import transformers
    from accelerate import init_empty_weights
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(folder), trust_remote_code=trust_remote_code, local_files_only=True)
    with init_empty_weights():
        return getattr(transformers, auto_class).from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)


def _device_for(key: str, device_map: dict):
    """The device_map entry owning `key` (its longest prefix), as a torch device string or 'disk'."""
    name = key
    while name not in device_map:
        if not name:
            raise KeyError(key)
        name = name.rpartition(".")[0]
    dev = device_map[name]
    return f"cuda:{dev}" if isinstance(dev, int) else str(dev)


def load_tensors(model, entries: dict[str, Entry], device_map: dict, offload_folder: str | None) -> None:
    """Each checkpoint tensor of the model from its file onto its device, in the model tensor's dtype
    (a packed tensor and its scale keep the checkpoint's), one tensor at a time; "disk" entries go to
    accelerate's offload folder instead (a disk module's buffers to the CPU, where dispatch_model wants them)."""
    from accelerate.utils import find_tied_parameters, offload_weight, retie_parameters, save_offload_index
    from accelerate.utils.modeling import set_module_tensor_to_device
    from safetensors import safe_open

    tied = find_tied_parameters(model)
    state = model.state_dict(keep_vars=True)
    buffers = {name for name, _ in model.named_buffers()}
    plan = defaultdict(lambda: defaultdict(list))               # file -> device -> keys
    for key in state:
        if key in entries:
            device = _device_for(key, device_map)
            # dispatch_model keeps buffers on the execution device (offload_buffers=False): never on disk
            plan[entries[key].file]["cpu" if device == "disk" and key in buffers else device].append(key)
    index: dict = {}
    for file, by_device in sorted(plan.items()):
        for device, keys in sorted(by_device.items()):
            with safe_open(str(file), "pt", device="cpu" if device == "disk" else device) as f:
                for key in keys:
                    tensor = f.get_tensor(key).to(state[key].dtype)
                    if device == "disk":
                        offload_weight(tensor, key, offload_folder, index=index)
                    else:
                        set_module_tensor_to_device(model, key, device, value=tensor)
                    del tensor
    if index:
        save_offload_index(index, offload_folder)
    retie_parameters(model, tied)


def dispatch(model, device_map: dict, offload_folder: str | None):
    """accelerate's dispatch_model, as transformers' from_pretrained calls it (skip_keys: the KV cache
    argument is never moved by the hooks). An offloaded PackedInt4Experts loads all its experts when its
    forward starts (`preload_module_classes`): it reads its experts' tensors without calling their forward,
    which is where accelerate's per-module hooks would load them."""
    from accelerate import dispatch_model

    dispatch_model(model, device_map=device_map, offload_dir=offload_folder,
                   skip_keys=getattr(model, "_skip_keys_device_placement", None),
                   preload_module_classes=[PackedInt4Experts.__name__])
    model.hf_device_map = device_map
    return model.eval()


def load_packed_model(folder: Path, auto_class: str, scheme: Int4Scheme, dtype: torch.dtype, device_map,
                      max_memory: dict | None, trust_remote_code: bool, offload_folder: str | None):
    """The checkpoint at `folder` loaded packed (module contract) with `device_map` ("auto" or a dict) and
    `max_memory`; the model carries `ee_held_packed` (what was swapped) and `hf_device_map`."""
    from eagle_eval.models.placement import resolve_device_map

    entries = checkpoint_tensors(folder)
    model = build_empty(folder, auto_class, dtype, trust_remote_code)
    held = hold_packed(model, entries, scheme, dtype)
    check_keys(model, entries, folder)
    placement = resolve_device_map(model, device_map, max_memory)
    if "disk" in placement.values() and offload_folder is None:
        raise Int4Error(f"{folder}: the placement puts modules on disk, but no offload folder was given")
    load_tensors(model, entries, placement, offload_folder)
    model = dispatch(model, placement, offload_folder)
    model.ee_held_packed = held
    return model


def int4_matmul_info(model) -> dict | None:
    """The report's `int4_matmul` entry for a model loaded packed, else None."""
    held = getattr(model, "ee_held_packed", None)
    if held is None:
        return None
    return {"matmul": "dequantize", "detail": "eagle-eval keeps the INT4 weights packed and expands each one "
            "(a Linear, or a routed expert the batch was routed to) for its matmul in the compute dtype: W4A16, "
            "activations are not quantized", "linear_modules": len(held.linears),
            "expert_modules": len(held.experts), "expert_linears": held.expert_linears}
