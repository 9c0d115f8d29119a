"""GPU benchmark: a Kimi-K2-width target whose routed experts are held as pack-quantized INT4, against the
bf16 copy of the same weights, in one process.

Kimi-K2 / K2.5 widths (hidden 7168, MLA with q_lora 1536 and kv_lora 512, 64 heads, 384 routed experts of
width 2048 with 8 active and one shared, vocab 163840), a few layers (the first dense, the rest MoE),
random weights, and a Llama-style EAGLE-3 head of the same width. The bf16 model is built first; its routed
experts are then quantized the way the release ships them (symmetric INT4, a bf16 scale per 32 inputs,
compressed-tensors' pack-quantized words: tests/quant_fixtures.py::int4_quantize) into a copy held packed
by eagle-eval's modules (PackedInt4Experts, W4A16), and the bf16 model's experts are overwritten with the
dequantized INT4 values, so both models compute with the same weights. Measured side by side, as
bench_deepseek.py --fp8 does: parameter memory, the teacher-forced forward, one batch-1 decode step, the
reference loop per cycle and its parts, the profile step in tokens/s, peak GPU memory, and whether each
loop's tokens equal its own model's greedy decoding (with --fp32-check: the INT4 copy computed in fp32,
where bf16's verify-vs-decode rounding differences are gone).

    python benchmarks/bench_int4.py                        # one H200: 3 layers (1 dense + 2 MoE), ~100 GB
    python benchmarks/bench_int4.py --layers 2 --fp32-check
    python benchmarks/bench_int4.py --tiny                 # CPU smoke run of the same code, tiny shapes

Writes bench_int4.json to --out (default $OUT or .). Random weights accept almost nothing: what is measured
is the cost of a cycle and of a profiled token, not a speedup.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))     # quant_fixtures: the INT4 format

import bench_deepseek  # noqa: E402
import bench_gpu  # noqa: E402
from bench_deepseek import against_greedy, peak_gib, sections  # noqa: E402
from bench_gpu import sync  # noqa: E402
from quant_fixtures import int4_quantize  # noqa: E402

from eagle_eval.models.quant.int4 import PackedExpert, PackedInt4Experts, PackedInt4Linear  # noqa: E402

# Kimi-K2 / K2.5 (text_config of moonshotai/Kimi-K2.5, tests/data/plan/kimi-k2.5/config.json)
KIMI = dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, n_routed_experts=384,
            n_shared_experts=1, num_experts_per_tok=8, n_group=1, topk_group=1, num_attention_heads=64,
            num_key_value_heads=64, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
            v_head_dim=128, vocab_size=163840, routed_scaling_factor=2.827)
TINY = dict(bench_deepseek.TINY, n_routed_experts=16, num_experts_per_tok=4, n_group=1, topk_group=1)
GROUP = {"full": 32, "tiny": 16}


def make_oracle(model, head, num_steps: int, max_new: int):
    """bench_gpu's oracle tapping the last three layers' inputs, HF[N-3..N-1] (the defaults collide at N <= 4)."""
    n = model.config.num_hidden_layers
    return bench_gpu.make_oracle(model, head, num_steps, max_new, aux_hf=tuple(range(n - 3, n)))


def packed_experts(experts, group: int, device) -> tuple[PackedInt4Experts, int]:
    """transformers' fused experts (gate_up_proj [E, 2I, H], down_proj [E, H, I]) quantized one expert at
    a time into PackedInt4Experts on `device`; the fused tensors are overwritten with the dequantized values
    (the same weights in both models). Returns the module and its bytes."""
    num, two_i, hidden = experts.gate_up_proj.shape
    inter = two_i // 2
    out = []
    for e in range(num):
        weights = {"gate_proj": experts.gate_up_proj[e, :inter], "up_proj": experts.gate_up_proj[e, inter:],
                   "down_proj": experts.down_proj[e]}
        projs = {}
        for name, w in weights.items():
            parts = int4_quantize(w.data, group)
            proj = PackedInt4Linear(w.shape[1], w.shape[0], group, torch.bfloat16, device=device)
            with torch.no_grad():
                proj.weight_packed.copy_(parts["weight_packed"])
                proj.weight_scale.copy_(parts["weight_scale"])
                proj.weight_shape.copy_(parts["weight_shape"])
                w.copy_(proj.dequantized(w.dtype))
            projs[name] = proj
        out.append(PackedExpert(**projs))
    module = PackedInt4Experts(out, experts.act_fn)
    return module, sum(t.numel() * t.element_size() for t in module.state_dict().values())


def swapped(model, replace: dict, dtype=None):
    """A model over `model`'s weights with the modules named in `replace` swapped: every module on the way
    to a swapped one is a fresh shallow copy (its own child, parameter and buffer dicts), every other one is
    shared, so `model` is untouched. With `dtype`, the non-swapped weights are copies cast to it (the fp32
    check) and the swapped modules are still shared."""
    import copy

    def build(module, prefix):
        if prefix.rstrip(".") in replace:
            return replace[prefix.rstrip(".")]
        on_path = any(r.startswith(prefix) for r in replace) or prefix == ""
        if not on_path:
            return module if dtype is None else copy.deepcopy(module).to(dtype)
        new = copy.copy(module)
        new._parameters = {k: (v if dtype is None or v is None else torch.nn.Parameter(v.detach().to(dtype),
                                                                                         requires_grad=False))
                           for k, v in module._parameters.items()}
        new._buffers = {k: (v if dtype is None or v is None or not v.is_floating_point() else v.to(dtype))
                        for k, v in module._buffers.items()}
        new._modules = {name: build(child, f"{prefix}{name}.") for name, child in module._modules.items()}
        return new
    return build(model, "").eval()


def int4_copy(model, group: int):
    """(the copy of `model` with its routed experts held packed, the packed experts by name, their bytes);
    `model`'s experts now hold the dequantized INT4 values (module docstring)."""
    device = model.get_input_embeddings().weight.device
    packed = {name: packed_experts(m, group, device) for name, m in model.named_modules()
              if name.endswith("mlp.experts")}
    modules = {name: module for name, (module, _) in packed.items()}
    return swapped(model, modules), modules, sum(nbytes for _, nbytes in packed.values())


def int4_section(model, held, packed: dict, packed_bytes: int, head, prompts, args, bf16: dict) -> dict:
    """The INT4 copy: memory, the same sections, ratios to bf16, losslessness."""
    bf16_experts = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".mlp.experts." in n)
    out = {"build_s": bf16["int4_build_s"], "group_size": GROUP["tiny" if args.tiny else "full"],
           "matmul": "eagle-eval dequantizes each routed expert per forward (W4A16)",
           "experts_packed_gib": packed_bytes / 2**30, "experts_bf16_gib": bf16_experts / 2**30,
           "parameter_gib": (bf16["parameter_bytes"] - bf16_experts + packed_bytes) / 2**30,
           "bf16_parameter_gib": bf16["parameter_bytes"] / 2**30,
           "allocated_gib_added": bf16["int4_allocated_gib_added"]}
    print(json.dumps(out), flush=True)
    oracle = make_oracle(held, head, args.num_steps, 64)
    measured = sections(oracle, prompts, held.config.vocab_size, args.tiny, args.num_steps, len(bf16["loop_tokens"]))
    out.update(measured)
    out["against_greedy"] = against_greedy(oracle.speculator.target, prompts[0], measured["loop_tokens"])
    del oracle
    if args.fp32_check:
        import copy
        import gc

        from eagle_eval.loop.reference import speculative_decode

        gc.collect()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        fp32 = swapped(model, packed, dtype=torch.float32)            # the same packed experts, fp32 around them
        spec = make_oracle(fp32, copy.deepcopy(head).float(), args.num_steps, 64).speculator
        t0 = time.perf_counter()
        run = speculative_decode(spec, prompts[0], args.num_steps, len(bf16["loop_tokens"]), set())
        out["fp32_check"] = {**against_greedy(spec.target, prompts[0], run.output_ids),
                             "seconds": time.perf_counter() - t0, "peak_gib": peak_gib()}
        print(json.dumps(out["fp32_check"]), flush=True)
    out["tokens_equal_to_bf16"] = sum(a == b for a, b in zip(measured["loop_tokens"], bf16["loop_tokens"]))
    out["over_bf16"] = {
        "forward_tokens_per_s": measured["forward"]["forward_tokens_per_s"] / bf16["forward"]["forward_tokens_per_s"],
        "decode_step_ms": measured["forward"]["decode_step_ms"] / bf16["forward"]["decode_step_ms"],
        "loop_ms_per_cycle": measured["loop"]["loop_ms_per_cycle"] / bf16["loop"]["loop_ms_per_cycle"],
        "profile_step_tokens_per_s": (measured["profile"]["profile_step_tokens_per_s"]
                                      / bf16["profile"]["profile_step_tokens_per_s"]),
        "expert_memory": packed_bytes / bf16_experts,
        "parameter_memory": out["parameter_gib"] / out["bf16_parameter_gib"]}
    out.pop("loop_tokens")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run with tiny shapes")
    ap.add_argument("--layers", type=int, default=3, help="decoder layers (the first dense, the rest MoE)")
    ap.add_argument("--num-steps", type=int, default=3)
    ap.add_argument("--fp32-check", action="store_true", help="also the INT4 copy computed in fp32: loop vs greedy")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    gpu = torch.cuda.is_available() and not args.tiny
    device, dtype = ("cuda:0", torch.bfloat16) if gpu else ("cpu", torch.float32)
    bench_deepseek.TINY, bench_deepseek.FULL = TINY, KIMI           # build() reads the widths from there
    t0 = time.perf_counter()
    model, head = bench_deepseek.build(args.tiny, args.layers, device, dtype)
    sync()
    vocab = model.config.vocab_size
    results = {"device": torch.cuda.get_device_name(0) if gpu else "cpu", "dtype": str(dtype), "widths": "tiny" if
               args.tiny else "Kimi-K2", "layers": args.layers, "dense_layers": 1, "moe_layers": args.layers - 1,
               "routed_experts": model.config.n_routed_experts, "active_experts": model.config.num_experts_per_tok,
               "target_params_b": sum(p.numel() for p in model.parameters()) / 1e9,
               "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
               "head_params_b": sum(p.numel() for p in head.parameters()) / 1e9,
               "build_s": time.perf_counter() - t0, "torch": torch.__version__,
               "transformers": __import__("transformers").__version__}
    print(json.dumps(results), flush=True)
    g = torch.Generator().manual_seed(1)
    prompt_len, new = (32, 16) if args.tiny else (512, 64)
    prompts = [torch.randint(10, vocab, (prompt_len,), generator=g).tolist() for _ in range(8)]
    # the INT4 copy first: it writes the dequantized INT4 values into the bf16 model's experts, and shares
    # every other weight with it (only the packed experts are added)
    before = torch.cuda.memory_allocated() if gpu else None
    t0 = time.perf_counter()
    held, packed, packed_bytes = int4_copy(model, GROUP["tiny" if args.tiny else "full"])
    sync()
    build = {"int4_build_s": time.perf_counter() - t0,
             "int4_allocated_gib_added": (torch.cuda.memory_allocated() - before) / 2**30 if gpu else None}
    results["peak_gib_built"] = peak_gib()
    oracle = make_oracle(model, head, args.num_steps, 64)
    results["bf16"] = sections(oracle, prompts, vocab, args.tiny, args.num_steps, new)
    results["bf16"]["against_greedy"] = against_greedy(oracle.speculator.target, prompts[0],
                                                       results["bf16"]["loop_tokens"])
    del oracle
    bf16 = {**results["bf16"], "parameter_bytes": results["parameter_bytes"], **build}
    results["int4"] = int4_section(model, held, packed, packed_bytes, head, prompts, args, bf16)
    results["bf16"].pop("loop_tokens")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "bench_int4.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
