"""compressed-tensors pack-quantized INT4 held packed: the format, and the modules that run it (W4A16).

Kimi-K2 Thinking / K2.5 ship their routed experts as compressed-tensors `pack-quantized` INT4 (symmetric,
group size 32): per Linear `weight_packed` int32 [out, ceil(in / 8)] (eight 4-bit values a word),
`weight_scale` [out, in / group] (bf16 in the released checkpoints) and `weight_shape` [2] = (out, in).
transformers decompresses such experts to bf16 at load; here they stay packed and each forward expands
only the weights it multiplies by (one Linear, or one routed expert, at a time).

Contract:
- `int4_scheme(qc, where)`: the checkpoint's `quantization_config` -> `Int4Scheme` (the group size and the
  config group's targets / ignore), or None when it is not compressed-tensors pack-quantized. Anything but
  symmetric INT4 with group scales and unquantized activations (W4A16) is an `Int4Error` naming the config
  group and the key: asymmetric (a zero point), other bit widths, channel / tensor / block strategies.
- `unpack_int4(packed, columns)` -> int8 in [-8, 7]. The bit order is compressed-tensors' own
  (`compressed_tensors/compressors/pack_quantized/helpers.py`, `pack_to_int32` / `unpack_from_int32`,
  0.20.1): element i of a row sits at bits 4i..4i+3 of the row's stream of 32-bit words, i.e. word i // 8,
  LOW nibble first, stored as value + 8 (the offset 1 << (num_bits - 1)). `pack_int4` is the inverse.
- `dequantize_int4(packed, scale, columns, dtype)`: W[r, c] = int4[r, c] * scale[r, c // group], the
  product taken in the scale's dtype, as compressed-tensors' decompression does
  (`quantization/lifecycle/forward_helpers.py::_dequantize`: `x_q.to(scale.dtype) * scale`), then cast to
  `dtype`. Bit-identical to `PackedQuantizationCompressor.decompress` followed by transformers' `.to(dtype)`.
- `PackedInt4Linear`: holds the three checkpoint tensors under the checkpoint's names and computes
  F.linear(x, dequantize(W)) in the activation dtype (W4A16: activations are not quantized).
- `PackedInt4Experts`: a module list `E x {gate_proj, up_proj, down_proj}` (the checkpoint's per-expert
  names, so its state dict IS the checkpoint's) that replaces transformers' fused expert tensors and runs
  transformers' own eager expert loop (`DeepseekV3Experts.forward`, transformers 5.24) on the experts the
  batch routed to. Per-expert module lists (Kimi's remote code) keep their own MoE forward: only their
  Linear layers become `PackedInt4Linear`.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from eagle_eval.errors import UserError

PACKED_TENSORS = ("weight_packed", "weight_scale", "weight_shape")
BITS = 4
PER_WORD = 32 // BITS                     # values per int32 word
OFFSET = 1 << (BITS - 1)                  # stored value = int4 + 8


class Int4Error(UserError, ValueError):
    """A pack-quantized checkpoint eagle-eval cannot hold packed; the message names the file and key."""


@dataclass(frozen=True)
class Int4Scheme:
    group: str                            # the config group's name, e.g. "group_0"
    group_size: int
    targets: tuple[str, ...]              # compressed-tensors targets: class names or "re:" patterns
    ignore: tuple[str, ...]

    def describe(self) -> str:
        return f"INT4 symmetric, group {self.group_size}, pack-quantized (int32 words, 8 values each)"


def _refuse(where, path: str, value, why: str) -> Int4Error:
    return Int4Error(f"{where}: quantization_config.{path} = {value!r}: {why}; eagle-eval holds compressed-tensors "
                     "pack-quantized INT4 only as symmetric group-quantized weights with unquantized "
                     "activations (W4A16)")


def int4_scheme(qc: dict | None, where) -> Int4Scheme | None:
    """The pack-quantized INT4 scheme of `qc` (a config.json quantization_config), or None (see the contract)."""
    if not qc or qc.get("quant_method") != "compressed-tensors":
        return None
    groups = qc.get("config_groups") or {}
    packed = {n: g for n, g in groups.items() if (g.get("format") or qc.get("format")) == "pack-quantized"}
    if not packed:
        return None
    schemes = []
    for name, group in sorted(groups.items()):
        path = f"config_groups.{name}"
        fmt = group.get("format") or qc.get("format")
        if fmt != "pack-quantized":
            raise _refuse(where, f"{path}.format", fmt, "a checkpoint mixing pack-quantized INT4 with another "
                                                        "compressed-tensors format is not supported")
        w = group.get("weights") or {}
        for key, want, why in (("type", "int", "only integer weights are packed this way"),
                               ("num_bits", BITS, "only 4-bit weights are supported"),
                               ("symmetric", True, "asymmetric INT4 (a zero point per group) is not supported"),
                               ("strategy", "group", "only group-wise scales are supported")):
            if w.get(key) != want:
                raise _refuse(where, f"{path}.weights.{key}", w.get(key), why)
        size = w.get("group_size")
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise _refuse(where, f"{path}.weights.group_size", size, "the group size must be a positive integer")
        for act in ("input_activations", "output_activations"):
            if group.get(act):
                raise _refuse(where, f"{path}.{act}", group[act], "quantized activations are not supported")
        schemes.append(Int4Scheme(name, size, tuple(group.get("targets") or ()), tuple(qc.get("ignore") or ())))
    if len({s.group_size for s in schemes}) > 1:
        sizes = ", ".join(f"{s.group}: {s.group_size}" for s in schemes)
        raise Int4Error(f"{where}: quantization_config.config_groups use different group sizes ({sizes}); "
                        "eagle-eval holds one group size per checkpoint")
    return schemes[0]


def unpack_int4(packed: torch.Tensor, columns: int) -> torch.Tensor:
    """[..., N, W] int32 words -> [..., N, columns] int8 in [-8, 7] (bit order: module contract)."""
    if packed.dtype != torch.int32:
        raise ValueError(f"packed INT4 words must be int32, got {packed.dtype}")
    nibbles = packed.contiguous().view(torch.uint8)          # [..., N, 4W]: word bytes, low byte first
    if sys.byteorder == "big" and packed.device.type == "cpu":
        nibbles = nibbles.unflatten(-1, (-1, 4)).flip(-1).flatten(-2)
    values = torch.stack((nibbles & 0xF, nibbles >> 4), dim=-1).flatten(-2)   # [..., N, 8W], low nibble first
    return (values[..., :columns].view(torch.int8) - OFFSET)


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """[..., N, K] int8 in [-8, 7] -> [..., N, ceil(K / 8)] int32 words (the inverse of unpack_int4)."""
    if values.dtype != torch.int8 or values.numel() and (values.min() < -OFFSET or values.max() >= OFFSET):
        raise ValueError("pack_int4 takes int8 values in [-8, 7]")
    k = values.shape[-1]
    pad = -k % PER_WORD
    stored = F.pad(values.to(torch.int32) + OFFSET, (0, pad)).unflatten(-1, (-1, PER_WORD))   # [..., N, W, 8]
    shifts = torch.arange(0, 32, BITS, dtype=torch.int32, device=values.device)
    return _sum_words(stored << shifts)                                     # 15 << 28 wraps: bits, not a number


def _sum_words(parts: torch.Tensor) -> torch.Tensor:
    """[..., W, 8] int32 nibble fields (disjoint bits) -> [..., W] int32: their bitwise or."""
    out = parts[..., 0].clone()
    for i in range(1, PER_WORD):
        out |= parts[..., i]
    return out


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, columns: int, dtype: torch.dtype) -> torch.Tensor:
    """[..., N, W] int32 and [..., N, G] scales -> [..., N, columns] in `dtype` (module contract)."""
    groups = scale.shape[-1]
    if columns % groups:
        raise ValueError(f"{columns} columns do not split into {groups} scale groups")
    q = unpack_int4(packed, columns).to(scale.dtype)                         # exact: |q| <= 8
    w = q.unflatten(-1, (groups, columns // groups)) * scale[..., None]       # in the scale's dtype
    return w.flatten(-2).to(dtype)


class PackedInt4Linear(nn.Module):
    """A Linear held as compressed-tensors pack-quantized INT4 (module contract)."""

    def __init__(self, in_features: int, out_features: int, group_size: int, scale_dtype: torch.dtype,
                 bias: bool = False, dtype: torch.dtype | None = None, shape_dtype: torch.dtype = torch.int64,
                 device=None):
        super().__init__()
        if in_features % group_size:
            raise ValueError(f"in_features {in_features} is not a multiple of the group size {group_size}")
        # Kimi-K2.5 has 69,120 of these: filled in directly, without nn.Module.__setattr__'s per-value
        # isinstance checks (a plan builds them all on the meta device in seconds instead of minutes)
        self.__dict__.update(in_features=in_features, out_features=out_features, group_size=group_size)
        words = math.ceil(in_features / PER_WORD)
        shape = torch.tensor([out_features, in_features], dtype=shape_dtype)
        self._parameters.update(
            weight_packed=nn.Parameter(torch.empty(out_features, words, dtype=torch.int32, device=device),
                                       requires_grad=False),
            weight_scale=nn.Parameter(torch.empty(out_features, in_features // group_size, dtype=scale_dtype,
                                                  device=device), requires_grad=False),
            bias=nn.Parameter(torch.empty(out_features, dtype=dtype, device=device)) if bias else None)
        self._buffers["weight_shape"] = shape if device is None else shape.to(device)     # persistent

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """W [out, in] in `dtype`: expanded for one use, never kept."""
        return dequantize_int4(self.weight_packed, self.weight_scale, self.in_features, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.dequantized(x.dtype), bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, int4 group "
                f"{self.group_size}, bias={self.bias is not None}")


def expert_weight(proj: nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """One expert projection's weight [out, in] in `dtype`: dequantized when packed, cast when not."""
    return proj.dequantized(dtype) if isinstance(proj, PackedInt4Linear) else proj.weight.to(dtype)


class PackedExpert(nn.Module):
    """One routed expert as the checkpoint names it: gate_proj, up_proj [I, H] and down_proj [H, I]."""

    def __init__(self, gate_proj: nn.Module, up_proj: nn.Module, down_proj: nn.Module):
        super().__init__()
        self._modules.update(gate_proj=gate_proj, up_proj=up_proj, down_proj=down_proj)    # as PackedInt4Linear


class PackedInt4Experts(nn.ModuleList):
    """transformers' fused routed experts (`gate_up_proj` [E, 2I, H], `down_proj` [E, H, I]) held per expert,
    packed; the forward is transformers' eager expert loop (module contract)."""

    def __init__(self, experts: list[PackedExpert], act_fn):
        super().__init__(experts)
        self.num_experts = len(experts)
        # not a child module: the list's entries (and its state dict) are exactly the checkpoint's experts
        object.__setattr__(self, "act_fn", act_fn)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        """hidden_states [T, H], top_k_index / top_k_weights [T, k] -> [T, H], in transformers' order:
        experts ascending; x @ [gate; up]^T split in halves, act(gate) * up, @ down^T, times the routing
        weight, index_add_ into zeros in the activation dtype."""
        out = torch.zeros_like(hidden_states)
        dtype = hidden_states.dtype
        for expert in torch.unique(top_k_index).tolist():
            if expert < 0 or expert >= self.num_experts:        # expert-parallel sentinel ids
                continue
            token, slot = torch.where(top_k_index == expert)
            e = self[expert]
            gate_up = torch.cat([expert_weight(e.gate_proj, dtype), expert_weight(e.up_proj, dtype)])
            gate, up = F.linear(hidden_states[token], gate_up).chunk(2, dim=-1)
            x = F.linear(self.act_fn(gate) * up, expert_weight(e.down_proj, dtype))
            x = x * top_k_weights[token, slot, None]
            out.index_add_(0, token, x.to(out.dtype))
        return out
