"""Tiny quantized DeepSeek-V3-architecture targets, written in the layouts real checkpoints ship.

- `make_fp8_target`: DeepSeek-V3 / Kimi-K2 native block-wise FP8: every attention and MLP projection
  (dense, shared and routed experts, per-expert keys as in the released checkpoints) stored as
  float8_e4m3fn with a float32 `weight_scale_inv` per block (W = fp8 * scale_inv), `quantization_config`
  {quant_method: fp8, weight_block_size}; embeddings, the router (mlp.gate), norms and lm_head stay fp32.
- `make_int4_target`: compressed-tensors pack-quantized int4 with group scales, compressed by the
  compressed-tensors library itself. scope="experts" is the Kimi-K2 Thinking / K2.5 layout (routed
  experts only; attention, shared experts, dense MLPs and lm_head ignored); scope="linear" quantizes
  every decoder projection, so that the loaded model holds packed Linear modules.
- `make_kimi_int4_target`: the same INT4 experts in a Kimi-K2.5-style remote-code wrapper, with fused
  expert tensors or one module per expert (the original remote code's layout).
- `fp8_compress` / `int4_compress`: an existing checkpoint (e.g. a target with an MTP layer, tests/mtp_fixtures.py)
  rewritten in either format.
- `write_int4_dequantized_copy`: compressed-tensors' own decompression of such a target, as a plain
  fp32 checkpoint (the reference the packed model is compared with).
The MLA dims are multiples of the block/group size (see docs/quantized.md for why).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from fixtures import make_target

# MLA with a q LoRA (as DeepSeek-V3); every projection dim a multiple of 16
DSV3 = dict(q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=16, qk_nope_head_dim=8, v_head_dim=12)
PROJ = re.compile(r"model\.layers\.\d+\.(self_attn|mlp)\..*proj\w*\.weight$")   # gate = router: left out
EXPERT = re.compile(r"model\.layers\.\d+\.mlp\.experts\.\d+\.\w+_proj\.weight$")
# every projection and an MTP layer's fusion projection (DeepSeek-V3 ships eh_proj FP8 too)
PROJ_AND_EH = re.compile(PROJ.pattern + r"|model\.layers\.\d+\.eh_proj\.weight$")


def fp8_block_quantize(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (fp8 [N, K], scale_inv [ceil(N/bn), ceil(K/bk)]) with amax/448 per block."""
    (n, k), (bn, bk) = w.shape, block
    sn, sk = -(-n // bn), -(-k // bk)
    padded = torch.zeros(sn * bn, sk * bk, dtype=torch.float32, device=w.device)
    padded[:n, :k] = w
    blocks = padded.view(sn, bn, sk, bk)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / torch.finfo(torch.float8_e4m3fn).max
    q = (blocks / scale[:, None, :, None]).view(sn * bn, sk * bk)[:n, :k].to(torch.float8_e4m3fn)
    return q.contiguous(), scale.contiguous()


def fp8_block_dequantize(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """The inverse the checkpoint format defines: W[i, j] = q[i, j] * scale_inv[i // bn, j // bk]."""
    full = scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    return q.float() * full[: q.shape[0], : q.shape[1]]


def _rewrite(path: Path, tensors: dict, quantization_config: dict) -> Path:
    from safetensors.torch import save_file

    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path


def make_fp8_target(path: Path, block: tuple[int, int] = (16, 16), num_layers: int = 3, seed: int = 0,
                    overrides: dict | None = None) -> Path:
    from safetensors.torch import load_file

    make_target(path, family="deepseek_v3", num_layers=num_layers, seed=seed, overrides=DSV3 | (overrides or {}))
    out = {}
    for key, w in load_file(path / "model.safetensors").items():
        if PROJ.match(key):
            out[key], out[key.removesuffix("weight") + "weight_scale_inv"] = fp8_block_quantize(w, block)
        else:
            out[key] = w
    return _rewrite(path, out, {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                "weight_block_size": list(block)})


def fp8_compress(path: Path, pattern: re.Pattern, block: tuple[int, int]) -> Path:
    """Rewrite the checkpoint at `path` with every weight whose key `pattern` finds stored block FP8 (with its
    weight_scale_inv), and the quantization_config of a DeepSeek-V3 native FP8 checkpoint."""
    from safetensors.torch import load_file

    out = {}
    for key, w in load_file(path / "model.safetensors").items():
        if pattern.search(key):
            out[key], out[key.removesuffix("weight") + "weight_scale_inv"] = fp8_block_quantize(w, block)
        else:
            out[key] = w
    return _rewrite(path, out, {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                "weight_block_size": list(block)})


def write_dequantized_copy(fp8: Path, out: Path, block: tuple[int, int]) -> Path:
    """The FP8 target's weights dequantized key by key with the format's formula (fp8_block_dequantize)
    into a plain fp32 checkpoint at `out`: the same model without quantization_config."""
    from safetensors.torch import load_file, save_file

    stored = load_file(fp8 / "model.safetensors")
    plain = {k: (fp8_block_dequantize(v, stored[k + "_scale_inv"], block) if k + "_scale_inv" in stored else v)
             for k, v in stored.items() if not k.endswith("_scale_inv")}
    out.mkdir(parents=True)
    for f in fp8.iterdir():
        if f.name != "model.safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    config = json.loads((out / "config.json").read_text())
    del config["quantization_config"]
    (out / "config.json").write_text(json.dumps(config))
    save_file(plain, out / "model.safetensors", metadata={"format": "pt"})
    return out


def int4_quantize(w: torch.Tensor, group: int) -> dict:
    """w [N, K] -> the pack-quantized tensors {weight_packed, weight_scale, weight_shape}: symmetric INT4 with
    a bf16 scale per group of `group` inputs (group amax / 7, as the fixtures choose it), quantized in
    compressed-tensors' arithmetic (quantization/lifecycle/forward_helpers.py::_quantize: w / scale in w's
    dtype, clamped to [-8, 7], rounded) and packed with eagle-eval's pack_int4 (compressed-tensors' bit
    order). For machines without compressed-tensors (the GPU image); tests/test_int4.py checks it against
    compressed-tensors' own compressor."""
    from eagle_eval.models.quant.int4 import pack_int4

    n, k = w.shape
    grouped = w.view(n, k // group, group)
    scale = (grouped.abs().amax(-1) / 7).clamp(min=1e-8).to(torch.bfloat16)
    q = torch.clamp(grouped / scale[..., None], -8, 7).round().to(torch.int8).view(n, k)
    return {"weight_packed": pack_int4(q), "weight_scale": scale, "weight_shape": torch.tensor([n, k])}


# Kimi-K2 Thinking / K2.5's ignore list (config.json quantization_config): only the routed experts are INT4
KIMI_IGNORE = ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*"]


def _int4_quantization_config(group_size: int, ignore) -> dict:
    """config.json's quantization_config for the fixtures (the keys compressed-tensors 0.20.1 writes)."""
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "group_size": group_size, "strategy": "group",
               "block_structure": None, "dynamic": False, "actorder": None, "observer": "minmax",
               "observer_kwargs": {}}
    return {"config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                          "output_activations": None, "format": None}},
            "format": "pack-quantized", "ignore": list(ignore), "kv_cache_scheme": None,
            "quantization_status": "compressed", "quant_method": "compressed-tensors"}


def int4_compress(path: Path, pattern: re.Pattern, group_size: int = 16, ignore=("lm_head",),
                  text_config: bool = False, writer: str = "compressed-tensors") -> Path:
    """Rewrite the checkpoint at `path` with every weight whose key `pattern` finds compressed into
    pack-quantized INT4 (symmetric, group scales = group amax / 7 in bf16, as Kimi-K2 ships them) by the
    compressed-tensors library (`writer="eagle-eval"`: by int4_quantize, the same bytes, for machines without
    it), and its quantization_config (also under text_config when `text_config`)."""
    from safetensors.torch import load_file

    if writer == "compressed-tensors":
        from compressed_tensors.compressors import BaseCompressor
        from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme

        scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
            num_bits=4, type="int", symmetric=True, strategy="group", group_size=group_size))
        compressor = BaseCompressor.get_value_from_registry("pack-quantized")
        qc = QuantizationConfig(config_groups={"group_0": scheme}, format="pack-quantized", ignore=list(ignore),
                                quantization_status="compressed")
        qc = {**json.loads(qc.model_dump_json()), "quant_method": "compressed-tensors"}
    else:
        qc = _int4_quantization_config(group_size, ignore)
    out = {}
    for key, w in load_file(path / "model.safetensors").items():
        if not pattern.search(key):
            out[key] = w
            continue
        if writer == "compressed-tensors":
            scale = (w.view(w.shape[0], -1, group_size).abs().amax(-1) / 7).clamp(min=1e-8).to(torch.bfloat16)
            parts = compressor.compress({"weight": w, "weight_scale": scale}, scheme)
        else:
            parts = int4_quantize(w, group_size)
        for name, t in parts.items():
            out[key.removesuffix("weight") + name] = t.contiguous()
    _rewrite(path, out, qc)
    if text_config:
        config = json.loads((path / "config.json").read_text())
        config["text_config"]["quantization_config"] = qc
        (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path


def make_int4_target(path: Path, group_size: int = 16, scope: str = "experts", num_layers: int = 3,
                     seed: int = 0, writer: str = "compressed-tensors") -> Path:
    make_target(path, family="deepseek_v3", num_layers=num_layers, seed=seed, overrides=DSV3)
    ignore = KIMI_IGNORE if scope == "experts" else ["lm_head"]
    return int4_compress(path, {"experts": EXPERT, "linear": PROJ}[scope], group_size, ignore, writer=writer)


ANY_EXPERT = re.compile(r"(^|\.)model\.layers\.\d+\.mlp\.experts\.\d+\.\w+_proj\.weight$")


def make_kimi_int4_target(path: Path, expert_layout: str = "fused", group_size: int = 16, seed: int = 0,
                          writer: str = "compressed-tensors") -> Path:
    """A Kimi-K2.5-style remote-code target (tests/kimi_remote: the wrapper around a DeepSeek-V3 causal LM,
    weights under language_model.) with its routed experts pack-quantized as the release ships them; the
    MoE holds transformers' fused expert tensors ("fused") or one module per expert ("list", the original
    remote code's layout)."""
    from vlm_fixtures import make_kimi_style

    text = make_target(path.parent / f"{path.name}-text", family="deepseek_v3", num_layers=3, seed=seed,
                       overrides=DSV3)
    make_kimi_style(text, path, expert_layout=expert_layout)
    return int4_compress(path, ANY_EXPERT, group_size, KIMI_IGNORE + ["re:.*vision_tower.*", "re:.*mm_projector.*"],
                         text_config=True, writer=writer)


def write_int4_dequantized_copy(packed: Path, out: Path) -> Path:
    """The INT4 target's packed weights decompressed by compressed-tensors itself
    (PackedQuantizationCompressor.decompress: bf16, the scales' dtype) into a plain fp32 checkpoint at `out`:
    the same model without quantization_config, as transformers' decompress-on-load defines it."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from safetensors.torch import load_file, save_file

    config = json.loads((packed / "config.json").read_text())
    qc = config.pop("quantization_config")
    (config.get("text_config") or {}).pop("quantization_config", None)
    scheme = QuantizationScheme(**qc["config_groups"]["group_0"])
    compressor = BaseCompressor.get_value_from_registry("pack-quantized")
    stored = load_file(packed / "model.safetensors")
    plain = {}
    for key, value in stored.items():
        if key.endswith(".weight_packed"):
            module = key.removesuffix(".weight_packed")
            parts = {t: stored[f"{module}.{t}"] for t in ("weight_packed", "weight_scale", "weight_shape")}
            plain[f"{module}.weight"] = compressor.decompress(parts, scheme)["weight"].float()
        elif not key.endswith((".weight_scale", ".weight_shape")):
            plain[key] = value
    out.mkdir(parents=True)
    for f in packed.iterdir():
        if f.is_file() and f.name not in ("model.safetensors", "config.json"):
            (out / f.name).write_bytes(f.read_bytes())
    (out / "config.json").write_text(json.dumps(config))
    save_file(plain, out / "model.safetensors", metadata={"format": "pt"})
    return out
