"""A quantized target's MTP layers held as the target holds its own weights, by the same code (`--draft mtp`).

Contract: `holding_of(target, folder)` -> `Holding` (None: the checkpoint is not quantized), one of
- `FP8_DEQUANTIZED`: block FP8 where transformers dequantized the target on load (its CPU path): the MTP layer's FP8
  tensors are dequantized by the same formula (models/quant/fp8.py `dequantize_blocks`, in heads/mtp/load.py);
- `FP8_HELD`: block FP8 held in FP8 (transformers' GPU path: `FP8Linear` / `FP8Experts`): the MTP stack's Linear and
  experts modules that the checkpoint ships FP8 are swapped by transformers' own `replace_with_fp8_linear` with the
  target's quantization config (its block, activation scheme, scale format), loaded FP8 with their
  `weight_scale_inv`, and run by the matmul the target's `--fp8-matmul` resolved to (models/quant/fp8.py: eagle-eval's
  dequantizing matmul, or transformers' kernel);
- `INT4_PACKED`: compressed-tensors pack-quantized INT4, held packed by models/quant/int4_load.py: the stack's modules
  the checkpoint ships packed (`weight_packed` / `weight_scale` / `weight_shape`) are swapped by that loader's
  `hold_packed` (PackedInt4Linear, PackedInt4Experts), the others kept as stored, exactly as the target's are (the
  checkpoint's tensors decide, as its `ignore` list left them).
`check_stored(key, tensor, holding)` refuses an MTP tensor that is not held the way the target is (a CheckpointError
naming the file, the key, its dtype and why); `swap(stack, stored, holding, ...)` swaps the modules before the
tensors are read; `finish(stack, holding)` applies the matmul; `describe(stack, holding)` is the report's echo.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from eagle_eval.heads.eagle3.config import CheckpointError

FP8_DEQUANTIZED, FP8_HELD, INT4_PACKED = "fp8-dequantized", "fp8-held", "int4-packed"
FLOATS = ("F32", "F16", "BF16", "F64")
# the tensors each holding reads, by their name's last part (anything else quantized is refused)
HELD_TENSORS = {FP8_DEQUANTIZED: ("weight", "weight_scale_inv"), FP8_HELD: ("weight", "weight_scale_inv"),
                INT4_PACKED: ("weight_packed", "weight_scale", "weight_shape")}
QUANTIZED_SUFFIXES = ("weight_scale_inv", "weight_packed", "weight_scale", "weight_shape", "input_scale")


@dataclass(frozen=True)
class Holding:
    """How the target holds its quantized weights, and so the MTP layers' (module contract)."""
    method: str                                        # FP8_DEQUANTIZED | FP8_HELD | INT4_PACKED
    block: tuple[int, int] | None = None               # block FP8: the checkpoint's weight_block_size
    matmul: str | None = None                          # FP8_HELD: the target's resolved --fp8-matmul
    quantization_config: object = field(default=None, compare=False, repr=False)   # FP8_HELD: transformers' own
    scheme: object = field(default=None, compare=False, repr=False)   # INT4_PACKED: models/quant/int4.py Int4Scheme

    def allows(self, key: str, dtype: str) -> bool:
        """Whether the MTP tensor `key` stored as `dtype` (a safetensors name) is one this holding reads."""
        part = key.rsplit(".", 1)[-1]
        if self.method in (FP8_DEQUANTIZED, FP8_HELD):
            return (part == "weight" and dtype == "F8_E4M3") or (part == "weight_scale_inv" and dtype in FLOATS)
        return part in HELD_TENSORS[INT4_PACKED]


def holding_of(target, folder: Path) -> Holding | None:
    """How the loaded `target` holds the quantized weights of its checkpoint at `folder` (None: not quantized, or
    quantized by a method whose MTP tensors `check_stored` refuses)."""
    from eagle_eval.models.quant.fp8 import held_fp8_modules
    from eagle_eval.models.quant.info import checkpoint_quantization_config

    qc = checkpoint_quantization_config(folder) or {}
    if qc.get("quant_method") == "fp8" and qc.get("weight_block_size"):
        block = tuple(qc["weight_block_size"])
        linears, experts = held_fp8_modules(target.model)
        if not linears and not experts:
            return Holding(FP8_DEQUANTIZED, block)
        quantizer = getattr(target.model, "hf_quantizer", None)
        matmul = ((target.info.quantization or {}).get("fp8_matmul") or {}).get("matmul")
        if quantizer is None or matmul is None:
            raise CheckpointError(f"{folder}: the target holds {len(linears) + len(experts)} FP8 modules, but not "
                                  "through transformers' FP8 quantizer and --fp8-matmul: eagle-eval cannot hold its "
                                  "MTP layer the same way")
        return Holding(FP8_HELD, block, matmul, quantizer.quantization_config)
    if qc.get("quant_method") == "compressed-tensors":
        from eagle_eval.models.quant.int4 import int4_scheme

        scheme = int4_scheme(qc, folder / "config.json")
        if scheme is not None and getattr(target.model, "ee_held_packed", None) is not None:
            return Holding(INT4_PACKED, scheme=scheme)
    return None


def _words(method: str | None) -> str:
    return {FP8_DEQUANTIZED: "block FP8 dequantized on load, as transformers dequantizes the target on the CPU",
            FP8_HELD: "block FP8 held in FP8 (float8_e4m3fn weights with their float weight_scale_inv), as the "
                      "target is held here",
            INT4_PACKED: "compressed-tensors pack-quantized INT4 held packed (weight_packed int32, weight_scale, "
                         "weight_shape), as the target is held"}.get(method, "")


def check_stored(key: str, file: Path, dtype: str, holding: Holding | None) -> None:
    """Refuse an MTP tensor stored quantized in a way the target's holding does not read (module contract)."""
    quantized = key.rsplit(".", 1)[-1] in QUANTIZED_SUFFIXES or dtype not in FLOATS
    if not quantized or (holding is not None and holding.allows(key, dtype)):
        return
    if holding is None:
        why = ("the target's checkpoint is not quantized in a way eagle-eval holds (block FP8, compressed-tensors "
               "pack-quantized INT4), so its MTP layer cannot be held the way the target is")
    else:
        why = (f"the target is {_words(holding.method)}; this tensor is not part of that format (an MTP layer "
               "quantized otherwise than its target, or with static activation scales, is not read)")
    raise CheckpointError(f"{file}: MTP tensor {key!r} is stored {dtype}"
                          + (" (a quantization scale or packed weight)" if dtype in FLOATS else "")
                          + f": {why}; use a checkpoint whose MTP layers are quantized as the target is, or "
                          "unquantized (SGLang keeps some unquantized: models/qwen3_5_mtp.py _mtp_quant_config)")


class _Holder(nn.Module):
    """The stack under a model-like root: transformers' replace_with_fp8_linear reads `model.config`."""

    def __init__(self, stack: nn.Module):
        super().__init__()
        self.config = stack.config.text_config
        self.stack = stack


def fp8_convertible(stack: nn.Module) -> list[str]:
    """The stack's modules transformers' FP8 swap can convert: its Linear layers and experts modules."""
    return [n for n, m in stack.named_modules() if type(m) is nn.Linear or n.endswith(".experts")]


def fp8_modules(weights) -> set[str]:
    """The stack modules that hold the FP8 weight tensors named `weights` (an expert's: its experts module)."""
    modules = set()
    for name in weights:
        module = name.rsplit(".", 1)[0]
        m = re.match(r"^(.*\.experts)\.\d+\.(gate_proj|up_proj|down_proj)$", module)
        modules.add(m[1] if m else module)
    return modules


def swap_fp8(stack: nn.Module, fp8: set[str], quantization_config) -> None:
    """transformers' own swap of the target's modules (FineGrainedFP8HfQuantizer before loading), on the stack:
    a Linear or experts module named in `fp8` becomes FP8Linear / FP8Experts (`quantization_config`: the target's,
    transformers' object). Also `plan`'s, on the meta device."""
    from transformers.integrations.finegrained_fp8 import replace_with_fp8_linear

    keep = [re.escape(f"stack.{n}") for n in fp8_convertible(stack) if n not in fp8]
    replace_with_fp8_linear(_Holder(stack), modules_to_not_convert=keep, quantization_config=quantization_config,
                            pre_quantized=True)


def swap(stack: nn.Module, stored: dict, holding: Holding | None, shapes: dict[str, list[int]], dtype) -> None:
    """Swap the stack's modules for the target's held forms before its tensors are read (module contract).
    `stored`: stack tensor name -> (file, safetensors dtype, shape) of the MTP tensors as the checkpoint holds them
    (experts one per key); `shapes`: the INT4 weight_shape values by stack name."""
    if holding is None or holding.method == FP8_DEQUANTIZED:
        return
    if holding.method == FP8_HELD:
        swap_fp8(stack, fp8_modules(n for n, (_, dt, _) in stored.items() if dt == "F8_E4M3"),
                 holding.quantization_config)
        return
    from eagle_eval.models.quant.int4_load import DTYPES, Entry, hold_packed

    entries = {n: Entry(Path(file), DTYPES[dt], tuple(shape)) for n, (file, dt, shape) in stored.items()}
    stack.ee_held_packed = hold_packed(stack, entries, holding.scheme, dtype, shapes)


def finish(stack: nn.Module, holding: Holding | None) -> None:
    """Held FP8: the target's matmul (its --fp8-matmul resolved to dequantize: eagle-eval's dequantizing matmul on
    the stack's FP8 modules too; to the kernel: transformers' forward, as the target's)."""
    if holding is not None and holding.method == FP8_HELD and holding.matmul == "dequantize":
        from eagle_eval.models.quant.fp8 import use_dequantizing_matmul

        use_dequantizing_matmul(stack)


def describe(stack: nn.Module, holding: Holding | None, dequantized: int = 0) -> str:
    """The report's echo of how the MTP layers' weights are held (module contract)."""
    if holding is None:
        return "as stored (unquantized)"
    if holding.method == FP8_DEQUANTIZED:
        return (f"block FP8 {holding.block[0]}x{holding.block[1]}, {dequantized} weights dequantized on load by the "
                "formula transformers applied to the target (W = fp8 * weight_scale_inv per block), as the target "
                "is held here")
    if holding.method == FP8_HELD:
        from eagle_eval.models.quant.fp8 import held_fp8_modules

        linears, experts = held_fp8_modules(stack)
        how = ("eagle-eval's dequantizing matmul (W8A16)" if holding.matmul == "dequantize"
               else "transformers' FP8 kernel (W8A8)")
        return (f"held FP8 as the target's: {len(linears)} FP8Linear, {len(experts)} FP8Experts (transformers' "
                f"modules, block {holding.block[0]}x{holding.block[1]}); the target's --fp8-matmul: {how}")
    held = stack.ee_held_packed
    return (f"held packed INT4 as the target's: {len(held.linears)} PackedInt4Linear, {len(held.experts)} "
            f"PackedInt4Experts ({held.expert_linears} packed expert projections), group "
            f"{holding.scheme.group_size}; the rest as stored; eagle-eval's dequantizing matmul (W4A16)")

