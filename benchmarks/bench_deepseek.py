"""GPU benchmark: a DeepSeek-V3-shaped target (MLA + MoE at full width, a few layers, random bf16
weights) with a Llama-style EAGLE-3 head of the same width, on one H200.

Measures, side by side in one process:
  forward   a plain teacher-forced forward of 4096 tokens, and one batch-1 decode step (plain greedy),
            through transformers' DeepseekV3ForCausalLM: the floor eagle-eval's figures are read against
  loop      the reference loop's time per cycle at num_steps S, and its parts (one verify forward of
            S+1 tokens, S draft steps), as in bench_gpu.py
  profile   the profile step alone (all num_steps <= 5 from one teacher-forced pass) in tokens/s
            against the plain forward of the same batch
  memory    peak GPU memory after building, and after each section

With --fp8 the same sections run a second time, in the same process, on a block-FP8 copy of the same
weights (128x128 blocks, scale = amax / 448, as DeepSeek-V3 / Kimi-K2 ship them), held FP8 in the
modules transformers builds for such a checkpoint (FP8Linear / FP8Experts, through its
replace_with_fp8_linear) and run by the matmul `eagle_eval.models.quant.fp8.resolve_fp8_matmul`
picks (offline: eagle-eval's dequantizing matmul, W8A16). The output adds the FP8 copy's parameter
memory, every FP8/bf16 ratio, and whether the FP8 loop's tokens equal the FP8 model's own greedy ones.

    python benchmarks/bench_deepseek.py                    # one H200: 4 layers (1 dense + 3 MoE), ~75 GB
    python benchmarks/bench_deepseek.py --fp8              # + the FP8 copy (~37 GB more)
    python benchmarks/bench_deepseek.py --fp8 --fp8-fp32-check   # + that copy in fp32: loop vs greedy
    python benchmarks/bench_deepseek.py --tiny [--fp8]     # CPU smoke run of the same code, tiny shapes

Random weights accept almost nothing, so a cycle emits about one token: what is measured is the cost
of a cycle and of a profiled token, not a speedup. With N = 4 layers the engine-default taps
HF[2], HF[N//2], HF[N-3] collide, so the head taps HF[1], HF[2], HF[3].
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))     # quant_fixtures: the FP8 format

import bench_gpu  # noqa: E402
from bench_gpu import bench_loop, sync, timed  # noqa: E402
from quant_fixtures import fp8_block_quantize  # noqa: E402

from eagle_eval.api import Oracle  # noqa: E402
from eagle_eval.heads.io import vocab_map_from_used  # noqa: E402
from eagle_eval.heads.eagle3.layer import Eagle3Head, HeadConfig  # noqa: E402
from eagle_eval.profile.teacher_forced import greedy_continuations  # noqa: E402

# DeepSeek-V3 / Kimi-K2 widths (config.json of deepseek-ai/DeepSeek-V3); layers cut to fit one GPU
FULL = dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, n_routed_experts=256,
            n_shared_experts=1, num_experts_per_tok=8, n_group=8, topk_group=4, num_attention_heads=128,
            num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
            qk_rope_head_dim=64, v_head_dim=128, vocab_size=129280, routed_scaling_factor=2.5)
TINY = dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8,
            n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1, num_attention_heads=4,
            num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
            v_head_dim=16, vocab_size=512, routed_scaling_factor=2.5)
HEAD = {"full": dict(heads=56, kv=8, head_dim=128, inter=18432, draft_vocab=32000),
        "tiny": dict(heads=4, kv=2, head_dim=16, inter=128, draft_vocab=256)}


def build(tiny: bool, layers: int, device: str, dtype):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    widths = TINY if tiny else FULL
    cfg = DeepseekV3Config(**widths, num_hidden_layers=layers, first_k_dense_replace=1, max_position_embeddings=8192,
                           rope_theta=10000.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)              # built in bf16 directly: 35B fp32 parameters do not fit
    try:
        with torch.device(device):
            model = DeepseekV3ForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(default)
    h = HEAD["tiny" if tiny else "full"]
    hcfg = HeadConfig(hidden_size=widths["hidden_size"], num_attention_heads=h["heads"], num_key_value_heads=h["kv"],
                      head_dim=h["head_dim"], intermediate_size=h["inter"], vocab_size=widths["vocab_size"],
                      draft_vocab_size=h["draft_vocab"], target_hidden_size=widths["hidden_size"])
    with torch.device(device):
        head = Eagle3Head(hcfg)
    d2t, t2d = vocab_map_from_used(torch.randperm(widths["vocab_size"])[: h["draft_vocab"]], widths["vocab_size"])
    head.d2t.copy_(d2t)
    head.t2d.copy_(t2d)
    return model, head.to(device=device, dtype=dtype).eval()


def fp8_copy(model, block: tuple[int, int] = (128, 128), dtype=None):
    """`model`'s weights as a block-FP8 target held in FP8 (see the module docstring); `dtype` (default
    the model's) for every other parameter and for the compute."""
    from transformers import DeepseekV3ForCausalLM, FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import replace_with_fp8_linear

    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype or model.dtype)
    try:
        with torch.device("meta"):
            fp8 = DeepseekV3ForCausalLM(model.config)
    finally:
        torch.set_default_dtype(default)
    replace_with_fp8_linear(fp8, modules_to_not_convert=["lm_head"],
                            quantization_config=FineGrainedFP8Config(weight_block_size=list(block)))
    device = model.get_input_embeddings().weight.device
    fp8 = fp8.to_empty(device=device).eval()
    source = dict(model.named_parameters()) | dict(model.named_buffers())
    own = dict(fp8.named_parameters())
    with torch.no_grad():
        for name, tensor in list(own.items()) + list(fp8.named_buffers()):
            if name.endswith("_scale_inv"):
                continue
            if tensor.dtype != torch.float8_e4m3fn:
                tensor.copy_(source[name])
                continue
            scale, w = own[name + "_scale_inv"], source[name]
            for e in range(w.shape[0]) if w.dim() == 3 else [None]:      # experts one at a time
                we = w if e is None else w[e]
                # a fused gate_up_proj is the checkpoint's gate_proj over its up_proj, quantized apart
                halves = we.chunk(2) if name.endswith("gate_up_proj") else [we]
                q, s = (torch.cat(t) for t in zip(*(fp8_block_quantize(h, block) for h in halves)))
                (tensor if e is None else tensor[e]).copy_(q)
                (scale if e is None else scale[e]).copy_(s)
    return fp8


def make_oracle(model, head, num_steps: int, max_new: int) -> Oracle:
    """bench_gpu's oracle with the taps HF[1, 2, 3] (the defaults collide at N = 4)."""
    return bench_gpu.make_oracle(model, head, num_steps, max_new, aux_hf=(1, 2, 3))


def peak_gib() -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def bench_forward(oracle, vocab: int, tokens: int, seq: int) -> dict:
    """Plain teacher-forced forward of `tokens` tokens (batch tokens // seq), and one batch-1 decode step."""
    target = oracle.speculator.target
    ids = torch.randint(10, vocab, (tokens // seq, seq))
    t_forward = timed(lambda: target.forward(ids, None, upcast=False), reps=3)
    cache = target.new_cache()
    target.forward(torch.randint(10, vocab, (1, seq)), cache)

    def decode_step():
        target.forward(torch.randint(10, vocab, (1, 1)), cache)
        target.rollback(cache, seq)
    t_decode = timed(decode_step, reps=10)
    return {"forward_tokens": tokens, "forward_ms": t_forward * 1e3, "forward_tokens_per_s": tokens / t_forward,
            "decode_step_ms": t_decode * 1e3, "decode_context": seq}


def bench_profile_step(oracle, prompts, max_steps: int, max_new: int) -> dict:
    """The profile step alone (every num_steps <= max_steps at once) vs a plain forward of the same batch."""
    from eagle_eval.profile import teacher_forced as prof

    spec = oracle.speculator
    conts = greedy_continuations(spec, prompts, max_new + max_steps, 0, 1 << 30)
    items = [(SimpleNamespace(id=str(i), category="", input_ids=p), c) for i, (p, c) in enumerate(zip(prompts, conts))]
    n_tokens = sum(len(p) + len(c) for p, c in zip(prompts, conts))
    t_step = timed(lambda: prof.profile_batch(spec, items, max_steps, max_new, 0), reps=3)
    ids = torch.tensor([p + c for p, c in zip(prompts, conts)])
    t_forward = timed(lambda: spec.target.forward(ids, None, upcast=False), reps=3)
    return {"prompts": len(prompts), "tokens": n_tokens, "max_steps": max_steps,
            "profile_step_tokens_per_s": n_tokens / t_step, "forward_tokens_per_s": n_tokens / t_forward,
            "profile_step_share_of_forward": t_forward / t_step}


def sections(oracle, prompts, vocab: int, tiny: bool, num_steps: int, new: int) -> dict:
    """forward, loop and profile of one target, each with the peak memory after it."""
    out = {"forward": bench_forward(oracle, vocab, 256 if tiny else 4096, len(prompts[0]))}
    out["forward"]["peak_gib"] = peak_gib()
    print(json.dumps(out["forward"]), flush=True)
    loop = bench_loop(oracle, prompts, num_steps, new)
    out["loop_tokens"] = loop.pop("tokens")
    out["loop"] = {**loop, "peak_gib": peak_gib()}
    print(json.dumps(out["loop"]), flush=True)
    out["profile"] = {**bench_profile_step(oracle, prompts, 5, new), "peak_gib": peak_gib()}
    print(json.dumps(out["profile"]), flush=True)
    f = out["forward"]
    out["against_the_floor"] = {
        "loop_cycle_over_decode_step": out["loop"]["loop_ms_per_cycle"] / f["decode_step_ms"],
        "verify_over_decode_step": out["loop"]["verify_ms"] / f["decode_step_ms"],
        "profile_tokens_per_s_over_forward": out["profile"]["profile_step_share_of_forward"]}
    return out


def against_greedy(target, prompt: list[int], loop_tokens: list[int]) -> dict:
    """The loop's tokens against plain greedy decoding of the same target; at the first difference,
    the teacher-forced logit margin there (top-1 minus the loop's token): in bf16 a verify of S+1
    tokens and a 1-token decode are different matmuls, so a near-tie can resolve either way."""
    from bench_gpu import plain_greedy

    greedy = plain_greedy(target, prompt, len(loop_tokens), set())
    out = {"loop_equals_its_greedy": loop_tokens == greedy}
    diff = next((i for i, (a, b) in enumerate(zip(loop_tokens, greedy)) if a != b), None)
    if diff is not None:
        logits = target.forward(torch.tensor([prompt + greedy[:diff + 1]]), None)[0, len(prompt) + diff - 1]
        top = logits.topk(2)
        out.update(first_difference=diff, greedy_logit_margin_top2=(top.values[0] - top.values[1]).item(),
                   loop_token_logit_below_top=(top.values[0] - logits[loop_tokens[diff]]).item(),
                   logit_scale_std=logits.std().item())
    return out


def fp8_section(model, head, prompts, args, bf16: dict) -> dict:
    """The FP8 copy of the same weights: its memory, the same sections, ratios to bf16, losslessness."""
    from eagle_eval.models.quant.fp8 import resolve_fp8_matmul

    before = torch.cuda.memory_allocated() if torch.cuda.is_available() else None
    t0 = time.perf_counter()
    fp8 = fp8_copy(model)
    matmul = resolve_fp8_matmul(fp8, "auto")
    sync()
    out = {"build_s": time.perf_counter() - t0, "fp8_matmul": matmul,
           "parameter_gib": sum(p.numel() * p.element_size() for p in fp8.parameters()) / 2**30,
           "bf16_parameter_gib": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30,
           "allocated_gib_added": (torch.cuda.memory_allocated() - before) / 2**30 if before is not None else None}
    print(json.dumps(out), flush=True)
    oracle = make_oracle(fp8, head, args.num_steps, 64)
    measured = sections(oracle, prompts, fp8.config.vocab_size, args.tiny, args.num_steps, len(bf16["loop_tokens"]))
    out.update(measured)
    out["against_greedy"] = against_greedy(oracle.speculator.target, prompts[0], measured["loop_tokens"])
    del oracle, fp8
    if args.fp8_fp32_check:         # the same FP8 weights computed in fp32: where bf16's shape-dependence is gone
        import copy
        import gc

        from eagle_eval.loop.reference import speculative_decode

        gc.collect()                # the dequantizing forwards are bound methods: module <-> method cycles
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        fp32 = fp8_copy(model, dtype=torch.float32)
        resolve_fp8_matmul(fp32, "auto")
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
        "parameter_memory": out["parameter_gib"] / out["bf16_parameter_gib"]}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run with tiny shapes")
    ap.add_argument("--fp8", action="store_true", help="also run a block-FP8 copy of the same weights")
    ap.add_argument("--fp8-fp32-check", action="store_true",
                    help="with --fp8: also the FP8 copy computed in fp32, its loop against its greedy decoding")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (the first dense, the rest MoE)")
    ap.add_argument("--num-steps", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    gpu = torch.cuda.is_available() and not args.tiny
    device, dtype = ("cuda:0", torch.bfloat16) if gpu else ("cpu", torch.float32)
    t0 = time.perf_counter()
    model, head = build(args.tiny, args.layers, device, dtype)
    sync()
    vocab = model.config.vocab_size
    results = {"device": torch.cuda.get_device_name(0) if gpu else "cpu", "dtype": str(dtype),
               "layers": args.layers, "dense_layers": 1, "moe_layers": args.layers - 1,
               "target_params_b": sum(p.numel() for p in model.parameters()) / 1e9,
               "head_params_b": sum(p.numel() for p in head.parameters()) / 1e9,
               "build_s": time.perf_counter() - t0, "peak_gib_built": peak_gib(),
               "torch": torch.__version__, "transformers": __import__("transformers").__version__}
    print(json.dumps(results), flush=True)
    oracle = make_oracle(model, head, args.num_steps, 64)
    g = torch.Generator().manual_seed(1)
    prompt_len, new = (32, 16) if args.tiny else (512, 64)
    prompts = [torch.randint(10, vocab, (prompt_len,), generator=g).tolist() for _ in range(8)]
    results.update(sections(oracle, prompts, vocab, args.tiny, args.num_steps, new))
    results["against_greedy"] = against_greedy(oracle.speculator.target, prompts[0], results["loop_tokens"])
    print(json.dumps(results["against_greedy"]), flush=True)
    if args.fp8:
        results["fp8"] = fp8_section(model, head, prompts, args, results)
        results["fp8"].pop("loop_tokens")
    results.pop("loop_tokens")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "bench_deepseek.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
