"""The GPU benchmark's own code, run with tiny shapes on the CPU: its comparison must hold there."""

import json
import subprocess
import sys

from eagle_eval.settings import REPO_ROOT


def test_gpu_benchmark_profile_section_runs_tiny_and_agrees(tmp_path):
    cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / "bench_gpu.py"), "--tiny", "--sections", "profile",
           "--prompts", "4", "--new-tokens", "12", "--loop-prompts", "2", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    prof = json.loads((tmp_path / "bench_gpu.json").read_text())["profile"]
    assert prof["loop_equals_profile"] is True
    assert prof["cycles_in_common_prefix"] == prof["cycles_equal_in_common_prefix"] > 0
    assert prof["tokens_part_at_by_num_steps"] == [12] * 16        # 8 S x 2 prompts, never part
    assert prof["own_generation_numeric_divergences"] == 0


def test_deepseek_benchmark_shapes_run_tiny_and_the_loop_is_lossless():
    """The DeepSeek-V3 benchmark's target (MLA + MoE, first layer dense) and head, tiny, in fp32: the
    reference loop's output equals plain greedy decoding, and the profile equals the loop."""
    import torch

    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from bench_deepseek import build, make_oracle

    from eagle_eval.speculative.chain import speculative_decode
    from eagle_eval.speculative.greedy import plain_greedy
    from eagle_eval.speculative.profile import greedy_continuations, profile_batch, simulate_cycles

    model, head = build(tiny=True, layers=4, device="cpu", dtype=torch.float32)
    assert type(model).__name__ == "DeepseekV3ForCausalLM" and model.config.n_routed_experts == 8
    oracle = make_oracle(model, head, 3, 12)
    spec = oracle.speculator
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(10, 512, (9,), generator=g).tolist() for _ in range(2)]
    for p in prompts:
        out = speculative_decode(spec, p, 3, 12, set())
        assert out.output_ids == plain_greedy(spec.target, p, 12, set())
    conts = greedy_continuations(spec, prompts, 12 + 3, 0, 1 << 30)
    items = [(type("P", (), {"id": str(i), "category": "", "input_ids": p})(), c)
             for i, (p, c) in enumerate(zip(prompts, conts))]
    for (p, _), res in zip(items, profile_batch(spec, items, 3, 12, 0)):
        loop = speculative_decode(spec, p.input_ids, 3, 12, set())
        sim = simulate_cycles(res.run_lengths, res.continuation, 3, 12, set())
        assert sim.accepted_per_cycle == loop.accepted_per_cycle


def test_deepseek_benchmark_fp8_copy_holds_fp8_and_its_loop_is_lossless():
    """--fp8's copy: every decoder projection held float8 with per-block scales that reproduce the bf16
    weights to FP8 precision, run by eagle-eval's dequantizing matmul; its loop equals its greedy."""
    import torch

    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from bench_deepseek import build, fp8_copy, make_oracle

    from eagle_eval.models.quant.fp8 import dequantize_blocks, held_fp8_modules, resolve_fp8_matmul
    from eagle_eval.speculative.chain import speculative_decode
    from eagle_eval.speculative.greedy import plain_greedy

    model, head = build(tiny=True, layers=4, device="cpu", dtype=torch.float32)
    fp8 = fp8_copy(model)
    linears, experts = held_fp8_modules(fp8)
    assert (len(linears), len(experts)) == (4 * 5 + 3 + 3 * 3, 3)     # MLA 5; dense MLP 3; shared experts 3
    w = model.model.layers[0].self_attn.o_proj.weight
    back = dequantize_blocks(linears[4][1].weight, linears[4][1].weight_scale_inv, (128, 128), torch.float32)
    assert linears[4][0] == "model.layers.0.self_attn.o_proj"
    assert 0 < (back - w).abs().max() <= w.abs().max() / 16                 # e4m3: 3 mantissa bits
    assert resolve_fp8_matmul(fp8, "dequantize")["matmul"] == "dequantize"
    spec = make_oracle(fp8, head, 3, 12).speculator
    p = torch.randint(10, 512, (9,), generator=torch.Generator().manual_seed(3)).tolist()
    assert speculative_decode(spec, p, 3, 12, set()).output_ids == plain_greedy(spec.target, p, 12, set())
