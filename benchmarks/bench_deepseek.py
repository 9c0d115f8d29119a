"""GPU benchmark: a DeepSeek-V3-shaped target (MLA + MoE at full width, a few layers, random bf16
weights) with a Llama-style EAGLE-3 head of the same width, on one H200 (issue 16).

Measures, side by side in one process:
  forward   a plain teacher-forced forward of 4096 tokens, and one batch-1 decode step (plain greedy),
            through transformers' DeepseekV3ForCausalLM: the floor eagle-eval's figures are read against
  loop      the reference loop's time per cycle at num_steps S, and its parts (one verify forward of
            S+1 tokens, S draft steps), as in bench_gpu.py
  profile   the profile step alone (all num_steps <= 5 from one teacher-forced pass) in tokens/s
            against the plain forward of the same batch
  memory    peak GPU memory after building, and after each section

    python benchmarks/bench_deepseek.py                    # one H200: 4 layers (1 dense + 3 MoE), ~75 GB
    python benchmarks/bench_deepseek.py --tiny             # CPU smoke run of the same code, tiny shapes

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

import bench_gpu  # noqa: E402
from bench_gpu import bench_loop, sync, timed  # noqa: E402

from eagle_eval.api import Oracle  # noqa: E402
from eagle_eval.models.head_io import vocab_map_from_used  # noqa: E402
from eagle_eval.models.heads import Eagle3Head, HeadConfig  # noqa: E402
from eagle_eval.spec.profile import greedy_continuations  # noqa: E402

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
    from eagle_eval.spec import profile as prof

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run with tiny shapes")
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
    results["forward"] = bench_forward(oracle, vocab, 256 if args.tiny else 4096, prompt_len)
    results["forward"]["peak_gib"] = peak_gib()
    print(json.dumps(results["forward"]), flush=True)
    loop = bench_loop(oracle, prompts, args.num_steps, new)
    loop.pop("tokens")
    results["loop"] = {**loop, "peak_gib": peak_gib()}
    print(json.dumps(results["loop"]), flush=True)
    results["profile"] = {**bench_profile_step(oracle, prompts, 5, new), "peak_gib": peak_gib()}
    print(json.dumps(results["profile"]), flush=True)
    f = results["forward"]
    results["against_the_floor"] = {
        "loop_cycle_over_decode_step": results["loop"]["loop_ms_per_cycle"] / f["decode_step_ms"],
        "verify_over_decode_step": results["loop"]["verify_ms"] / f["decode_step_ms"],
        "profile_tokens_per_s_over_forward": results["profile"]["profile_step_share_of_forward"]}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "bench_deepseek.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
