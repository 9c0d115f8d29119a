"""Block-FP8 targets held in FP8: which matmul runs them, and eagle-eval's own dequantizing one.

transformers loads a DeepSeek-V3 / Kimi-K2 native FP8 checkpoint on a GPU as `FP8Linear` and
`FP8Experts` modules whose weights stay float8_e4m3fn with a float32 `weight_scale_inv` per block
(`transformers/integrations/finegrained_fp8.py`). Their forward calls a Triton kernel that
transformers fetches at the first forward through the `kernels` package from the Hub
(`kernels-community/finegrained-fp8`); on a machine without the package or without the Hub the
first forward raises: ImportError (seen on the GPU machine), or ValueError from kernels 0.19.1,
whose publisher-trust check asks the Hub before it loads a kernel. On the CPU transformers instead dequantizes every weight at load.

Contract:
- `held_fp8_modules(model)` -> (linears, experts): the FP8Linear / FP8Experts modules whose weights
  are still one byte wide.
- `kernel_status()` -> (bool, reason): whether transformers' FP8 kernel loads here.
- `dequantize_blocks(weight, scale_inv, block, dtype)`: W[i, j] = fp8[i, j] * scale_inv[i // bn, j // bk],
  the product taken in float32, then cast to `dtype`. The scale grid must be ceil(N / bn) x
  ceil(K / bk): the last block of a dim that is not a multiple of the block is partial. The block
  is the module's (the checkpoint's `weight_block_size`), never one inferred from the grid.
- `use_dequantizing_matmul(model)`: every held FP8 module computes F.linear(x, dequantize(W)) in the
  activation dtype; the weights stay FP8 in memory (one weight, or one expert's, is expanded at a
  time). Activations are not quantized: W8A16, where the kernel and the engines' block-FP8 paths run
  W8A8 with per-token-group activation scales, so near-ties can resolve differently from a server.
  Routed experts run an eager loop over the experts a batch selects (transformers' own eager
  order: gate_up, gate, down, routing weight, fp32 accumulation).
- `resolve_fp8_matmul(model, mode)` applies `mode` (auto | kernel | dequantize; auto = the kernel
  when it loads and every FP8 module is on a GPU, else dequantize) and returns the dict the report
  carries, or None when the model holds no FP8 module. Trying the kernel is transformers' own loader:
  on an online machine with the `kernels` package it may fetch the kernel from the Hub, as transformers
  does at its first FP8 forward; `dequantize` never tries it.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from eagle_eval.errors import UserError

FP8_MATMUL_CHOICES = ("auto", "kernel", "dequantize")


class Fp8MatmulError(UserError, ValueError):
    """An FP8 module eagle-eval cannot run, or a matmul mode that cannot be used here."""


def held_fp8_modules(model) -> tuple[list[tuple[str, torch.nn.Module]], list[tuple[str, torch.nn.Module]]]:
    linears, experts = [], []
    for name, module in model.named_modules():
        if type(module).__name__ == "FP8Linear" and module.weight.element_size() == 1:
            linears.append((name, module))
        elif hasattr(module, "down_proj_scale_inv") and getattr(module, "down_proj").element_size() == 1:
            experts.append((name, module))          # FP8Experts (its class is rebuilt per experts implementation)
    return linears, experts


def kernel_status() -> tuple[bool, str]:
    try:
        from transformers.integrations.finegrained_fp8 import load_finegrained_fp8_kernel
    except ImportError as exc:
        return False, f"transformers has no fine-grained FP8 kernel loader ({exc})"
    try:
        load_finegrained_fp8_kernel()
    except Exception as exc:            # ImportError / ValueError (kernels' trust check) offline; others (hub, CUDA)
        return False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return True, "transformers' fine-grained FP8 kernel (kernels-community/finegrained-fp8) loaded"


def dequantize_blocks(weight: torch.Tensor, scale_inv: torch.Tensor, block, dtype: torch.dtype,
                      name: str = "weight") -> torch.Tensor:
    """[..., N, K] FP8 weight and its [..., ceil(N/bn), ceil(K/bk)] scales -> [..., N, K] in `dtype`."""
    if weight.dtype == torch.int8:
        raise Fp8MatmulError(f"{name}: FP4-packed (int8) weights are not supported by eagle-eval's dequantizing "
                             "matmul; use --fp8-matmul kernel")
    scale = scale_inv.to(torch.float32)
    if block is None or scale.dim() == 0 or scale.numel() == 1:
        return (weight.to(torch.float32) * scale.reshape(())).to(dtype)
    bn, bk = int(block[0]), int(block[1])
    rows, cols = weight.shape[-2:]
    expected = (-(-rows // bn), -(-cols // bk))
    if tuple(scale.shape[-2:]) != expected:
        raise Fp8MatmulError(f"{name}: weight {tuple(weight.shape)} with block {bn}x{bk} needs a scale grid "
                             f"{expected[0]}x{expected[1]}, the checkpoint has {tuple(scale.shape)}")
    if rows % bn == 0 and cols % bk == 0:       # whole blocks: scale a blocked view, no expanded grid
        return _blocked_dequantize(weight, scale, bn, bk, dtype)
    w = weight.to(torch.float32)                 # a partial last block (e.g. 576 rows at 128): expand the grid
    full = scale.repeat_interleave(bn, dim=-2)[..., :rows, :].repeat_interleave(bk, dim=-1)[..., :cols]
    return w.mul_(full).to(dtype)


def _blocked_dequantize(weight: torch.Tensor, scale: torch.Tensor, bn: int, bk: int, dtype: torch.dtype):
    """[..., N, K] with N, K multiples of the block: fp8 -> fp32, times the block's scale (in place), ->
    `dtype`. Eager on purpose: torch.compile's fused kernel of this expression measured 2.1-2.6x slower
    on an H200 (benchmarks/fp8_dequant_gpu.py, benchmarks/results/h200_fp8_dequant.json)."""
    *lead, rows, cols = weight.shape
    blocked = weight.to(torch.float32).view(*lead, rows // bn, bn, cols // bk, bk)
    return blocked.mul_(scale[..., :, None, :, None]).view(weight.shape).to(dtype)


def _linear_forward(self, input: torch.Tensor) -> torch.Tensor:
    weight = dequantize_blocks(self.weight, self.weight_scale_inv, self.block_size, input.dtype, self._ee_name)
    return F.linear(input, weight, None if self.bias is None else self.bias.to(input.dtype))


def _expert_weight(self, proj: str, index: int, dtype: torch.dtype) -> torch.Tensor:
    """One expert's dequantized projection. A fused gate_up_proj holds the checkpoint's gate_proj and
    up_proj one above the other, each with its own scale rows (transformers allocates at least two
    scale rows for it, `_alloc_expert_proj(min_sf_out=2)`): where the grid is two half-grids, each half
    is dequantized on its own; where I is a multiple of the block the two readings are the same."""
    weight, scale = getattr(self, proj)[index], getattr(self, proj + "_scale_inv")[index]
    name = f"{self._ee_name}.{proj}[{index}]"
    if proj == "gate_up_proj" and self.block_size is not None and scale.dim() == 2:
        half, bn = weight.shape[-2] // 2, int(self.block_size[0])
        rows = -(-half // bn)
        if scale.shape[-2] == 2 * rows != -(-weight.shape[-2] // bn):
            return torch.cat([dequantize_blocks(weight[:half], scale[:rows], self.block_size, dtype, name + ".gate"),
                              dequantize_blocks(weight[half:], scale[rows:], self.block_size, dtype, name + ".up")])
    return dequantize_blocks(weight, scale, self.block_size, dtype, name)


def _experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                     top_k_weights: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(hidden_states, dtype=torch.float32)
    up_name = "gate_up_proj" if self.has_gate else "up_proj"
    dtype = hidden_states.dtype
    for expert in torch.unique(top_k_index).tolist():
        if expert < 0 or expert >= self.num_experts:       # expert-parallel sentinel ids
            continue
        token, slot = torch.where(top_k_index == expert)
        x = F.linear(hidden_states[token], _expert_weight(self, up_name, expert, dtype))
        x = self._apply_gate(x) if self.has_gate else self.act_fn(x)
        x = F.linear(x, _expert_weight(self, "down_proj", expert, dtype))
        x = x * top_k_weights[token, slot, None].to(x.dtype)
        out.index_add_(0, token, x.to(torch.float32))
    return out.to(dtype)


def use_dequantizing_matmul(model) -> int:
    """Route every held FP8 module through the dequantizing matmul (module contract); returns the count."""
    linears, experts = held_fp8_modules(model)
    for name, module in linears:
        module._ee_name = name
        module.forward = types.MethodType(_linear_forward, module)
    for name, module in experts:
        missing = [a for a in ("num_experts", "has_gate", "block_size", "act_fn") if not hasattr(module, a)]
        if missing or (module.has_gate and not hasattr(module, "_apply_gate")):
            raise Fp8MatmulError(f"{name}: {type(module).__name__} lacks {missing or ['_apply_gate']} "
                                 "(a transformers version eagle-eval does not know); use --fp8-matmul kernel")
        if getattr(module, "activation_scheme", "dynamic") == "static":
            raise Fp8MatmulError(f"{name}: static activation scales are not supported by the dequantizing matmul")
        module._ee_name = name
        module.forward = types.MethodType(_experts_forward, module)
    return len(linears) + len(experts)


def resolve_fp8_matmul(model, mode: str = "auto") -> dict | None:
    """Apply `mode` to the model's held FP8 modules; the report's `fp8_matmul` entry (None: no FP8 held)."""
    if mode not in FP8_MATMUL_CHOICES:
        raise Fp8MatmulError(f"--fp8-matmul must be one of {FP8_MATMUL_CHOICES}, got {mode!r}")
    linears, experts = held_fp8_modules(model)
    if not linears and not experts:
        return None
    on_gpu = all(p.device.type == "cuda" for _, m in linears + experts for p in m.parameters(recurse=False))
    loads, reason = kernel_status() if mode != "dequantize" else (False, "not tried (--fp8-matmul dequantize)")
    if mode == "kernel" and not (loads and on_gpu):
        raise Fp8MatmulError(f"--fp8-matmul kernel: transformers' FP8 kernel cannot run here: "
                             f"{reason if not loads else 'some FP8 modules are not on a GPU'}; "
                             "use --fp8-matmul dequantize (or auto)")
    counts = {"linear_modules": len(linears), "expert_modules": len(experts)}
    if loads and on_gpu:
        return {"matmul": "kernel", "detail": "transformers' fine-grained FP8 (W8A8, dynamic per-token-group "
                "activation scales)", "kernel": reason, **counts}
    use_dequantizing_matmul(model)
    return {"matmul": "dequantize", "detail": "eagle-eval dequantizes each FP8 weight per forward (fp32 product, "
            "then the compute dtype) and runs W8A16: activations are not quantized, unlike the kernel and the "
            "engines' W8A8", "kernel": reason, **counts}
