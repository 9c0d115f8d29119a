"""Quantized targets: what the checkpoint says is quantized, and what transformers kept quantized.

Contract: `quantization_info(model, folder)` reads the folder's `config.json` `quantization_config`
and the safetensors headers (names and shapes only, no tensor data), inspects the loaded model's
parameters, and returns a JSON-ready dict, or None for an unquantized checkpoint. It never changes
the model. Two layouts are named: block-wise FP8 (DeepSeek-V3 / Kimi-K2 native: `quant_method: fp8`,
`weight_block_size`, `<module>.weight_scale_inv`) and compressed-tensors (Kimi-K2 Thinking / K2.5:
`quant_method: compressed-tensors`, `<module>.weight_packed` + `weight_scale` for pack-quantized int).
A module counts as quantized in the checkpoint when it ships a scale companion next to its weight;
every other module with a 2-D or larger weight is listed as left unquantized.
`place(module, device, dtype)` is `module.to(device, dtype)` for a module that may hold quantized weights (an MTP
layer held as its target is): the narrow weights and the scales of held modules keep their dtype.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

COMPANIONS = ("weight_scale_inv", "weight_packed", "weight_scale")   # a quantized module ships one of these
NARROW = {torch.float8_e4m3fn, torch.float8_e5m2, torch.int8, torch.uint8, torch.int32}


def module_pattern(name: str) -> str:
    """'model.layers.12.mlp.experts.3.gate_proj' -> 'model.layers.*.mlp.experts.*.gate_proj'."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)", "*", name)


def checkpoint_modules(folder: Path) -> tuple[dict[str, int], dict[str, int]]:
    """(quantized, unquantized) module patterns -> module counts, from the safetensors headers."""
    from safetensors import safe_open

    weights, quantized = {}, set()
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for key in f.keys():
                module, _, tensor = key.rpartition(".")
                if tensor in COMPANIONS:
                    quantized.add(module)
                elif tensor == "weight" and len(f.get_slice(key).get_shape()) >= 2:
                    weights[module] = True
    counts: tuple[dict[str, int], dict[str, int]] = ({}, {})
    for module in sorted(quantized | set(weights)):
        side = counts[0] if module in quantized else counts[1]
        side[module_pattern(module)] = side.get(module_pattern(module), 0) + 1
    return counts


def _scheme(qc: dict) -> dict:
    """The fields of the checkpoint's quantization_config that say what a weight is stored as."""
    method = qc.get("quant_method")
    if method == "fp8":
        return {"method": "fp8", "bits": 8, "format": qc.get("fmt", "e4m3"),
                "weight_block_size": qc.get("weight_block_size"),
                "activation_scheme": qc.get("activation_scheme", "dynamic"),
                "modules_to_not_convert": qc.get("modules_to_not_convert")}
    if method == "compressed-tensors":
        groups = []
        for name, group in sorted((qc.get("config_groups") or {}).items()):
            w = group.get("weights") or {}
            groups.append({"group": name, "targets": group.get("targets"), "type": w.get("type"),
                           "bits": w.get("num_bits"), "strategy": w.get("strategy"),
                           "group_size": w.get("group_size"), "block_structure": w.get("block_structure"),
                           "symmetric": w.get("symmetric"), "format": group.get("format") or qc.get("format")})
        bits = sorted({g["bits"] for g in groups if g["bits"] is not None})
        return {"method": "compressed-tensors", "bits": bits[0] if len(bits) == 1 else bits,
                "format": qc.get("format"), "groups": groups, "ignore": qc.get("ignore")}
    return {"method": str(method)}


def holds_quantized(module) -> bool:
    """Whether `module`'s own weights are stored narrow (fp8, packed int) or packed."""
    own = dict(module.named_parameters(recurse=False))
    return "weight_packed" in own or any(p.dtype in NARROW and p.dim() >= 2 for p in own.values())


def place(module, device, dtype: torch.dtype) -> None:
    """Move every tensor of `module` to `device` and cast its floating-point tensors to `dtype`, except what a held
    quantized module keeps: its narrow weights (float8, packed int) and its scales, as the target keeps them
    (transformers' FP8 scales float32, compressed-tensors' the checkpoint's dtype). nn.Module.to(dtype) would cast
    float8 weights too: float8 is a floating-point dtype."""
    for m in module.modules():
        held = holds_quantized(m)
        for store in (m._parameters, m._buffers):
            for name, t in store.items():
                if t is None:
                    continue
                keep = not t.is_floating_point() or (held and (t.dtype in NARROW or "scale" in name))
                moved = t.data.to(device=device, dtype=None if keep else dtype)
                if store is m._parameters:
                    t.data = moved
                else:
                    store[name] = moved


def held_quantized(model) -> int:
    """Modules of the loaded model whose weights are still stored narrow (fp8, packed int) or packed."""
    held = 0
    for module in model.modules():
        if holds_quantized(module):
            held += 1
    return held


def held_bytes(model) -> int:
    """Bytes of every tensor the model's state dict holds (parameters and persistent buffers, a tied
    tensor once, an offloaded one at its size): what the checkpoint's tensors take as loaded."""
    seen, total = set(), 0
    for tensor in model.state_dict(keep_vars=True).values():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()
    return total


def describe(info: dict) -> str:
    """One line for the terminal table: scheme; what stayed quantized; what the checkpoint left alone."""
    if info["method"] == "fp8":
        block = info.get("weight_block_size")
        scheme = f"fp8 {info['format']} weights, block {'x'.join(map(str, block)) if block else 'per-tensor'}"
    elif info["method"] == "compressed-tensors":
        parts = [f"{g['type']}{g['bits']} {g['strategy']}" + (f" {g['group_size']}" if g["group_size"] else "")
                 for g in info["groups"]]
        scheme = f"compressed-tensors {info['format']} ({'; '.join(parts)})"
    else:
        scheme = info["method"]
    left = ", ".join(info["unquantized_modules"]) or "none"
    return (f"{scheme}; {info['quantized_module_count']} modules quantized in the checkpoint, "
            f"{info['held_quantized_modules']} held quantized in memory ({info['in_memory']}); "
            f"left unquantized: {left}")


def checkpoint_quantization_config(folder: Path) -> dict | None:
    """config.json's `quantization_config` (a multimodal wrapper's under `text_config`), or None."""
    config = json.loads((Path(folder) / "config.json").read_text())
    return config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config")


def quantization_info(model, folder: Path, fp8_matmul: dict | None = None,
                      int4_matmul: dict | None = None) -> dict | None:
    """The resolved quantization of a loaded target (see the module contract), or None. `fp8_matmul` is
    models/quant/fp8.resolve_fp8_matmul's answer for a target that holds FP8 modules, `int4_matmul`
    models/quant/int4_load.int4_matmul_info's for one loaded packed."""
    qc = checkpoint_quantization_config(folder)
    if not qc:
        return None
    quantized, unquantized = checkpoint_modules(Path(folder))
    held = held_quantized(model)
    info = {**_scheme(qc), "quantized_modules": quantized, "quantized_module_count": sum(quantized.values()),
            "unquantized_modules": sorted(unquantized), "held_quantized_modules": held,
            "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "held_bytes": held_bytes(model)}
    if held == 0:
        dtypes = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters() if p.dim() >= 2})
        info["in_memory"] = f"dequantized on load to {', '.join(dtypes)}"
    elif info["method"] == "compressed-tensors" and int4_matmul:
        info["in_memory"] = (f"held packed INT4 ({held} modules); eagle-eval expands each weight for its matmul "
                             "(W4A16), routed experts only when routed to")
    elif info["method"] == "compressed-tensors":
        info["in_memory"] = "packed at load; compressed-tensors decompresses each module on its first forward"
    elif fp8_matmul and fp8_matmul["matmul"] == "dequantize":
        info["in_memory"] = "kept fp8; eagle-eval's dequantizing matmul (W8A16)"
    elif fp8_matmul:
        info["in_memory"] = "kept fp8; transformers' FP8 kernel (W8A8)"
    else:
        info["in_memory"] = "kept quantized"
    if fp8_matmul:
        info["fp8_matmul"] = fp8_matmul
    if int4_matmul:
        info["int4_matmul"] = int4_matmul
    info["summary"] = describe(info)
    return info


def partial_fp8_blocks(folder: Path) -> list[str]:
    """Block-FP8 weights whose shape is not a multiple of `weight_block_size` (safetensors headers only):
    'name NxK (grid GnxGk)'. transformers' dequantize-on-load (Fp8Dequantize in
    transformers/integrations/finegrained_fp8.py, 5.17..5.24) takes the block as shape // grid, which is
    wrong when the last block is partial: it raises for some shapes and silently mis-scales others."""
    from safetensors import safe_open

    qc = checkpoint_quantization_config(folder) or {}
    block = qc.get("weight_block_size")
    if qc.get("quant_method") != "fp8" or not block:
        return []
    found = []
    for file in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            keys = set(f.keys())
            for key in sorted(k for k in keys if k.endswith(".weight_scale_inv")):
                weight = key.removesuffix("_scale_inv")
                if weight not in keys:
                    continue
                shape, grid = f.get_slice(weight).get_shape(), f.get_slice(key).get_shape()
                if len(shape) >= 2 and (shape[-2] % block[0] or shape[-1] % block[1]):
                    found.append(f"{weight} {shape[-2]}x{shape[-1]} (grid {'x'.join(map(str, grid[-2:]))})")
    return found
