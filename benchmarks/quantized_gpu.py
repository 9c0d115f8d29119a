"""GPU check of a block-wise FP8 DeepSeek-V3-architecture target kept FP8 on the GPU (issue 16).

Builds the tiny FP8 target of tests/quant_fixtures.py (float8_e4m3fn weights + weight_scale_inv per
16x16 block, as DeepSeek-V3 / Kimi-K2 ship them), loads it on cuda:0 through eagle-eval's load_target
(transformers' fine-grained FP8 path: FP8Linear / FP8Experts keep the weights in fp8; the matmul is
the one `--fp8-matmul` resolves to, see eagle_eval/models/quant/fp8.py), runs the loop and the
profile over a few prompts and compares every output with the same model's greedy `generate` and the
profile with the loop. Then the partial-block case: a 64x64-block copy (dims 48, 80, 96: partial last
blocks; the experts' gate_up below the block) held FP8 on the GPU, its logits against the same
weights dequantized by the test's formula into a plain checkpoint (fp32 only: the same arithmetic).
Prints one JSON object; exit 1 on any inequality.

    python benchmarks/quantized_gpu.py [--dtype bf16|fp32] [--fp8-matmul auto|kernel|dequantize] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> int:
    import torch
    import transformers
    from fixtures import make_head, write_prompts
    from quant_fixtures import make_fp8_target, write_dequantized_copy

    from eagle_eval import api
    from eagle_eval.settings import ProfileOptions, Settings
    from eagle_eval.models.target import load_target
    from eagle_eval.workload.conversations import load_workload

    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--fp8-matmul", default="auto")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="quant-gpu-"))
    target = make_fp8_target(root / "fp8")
    cfg = Settings.of(target=str(target), draft=str(make_head(root / "head")),
                    prompts=str(write_prompts(root / "prompts.jsonl", n=4)), max_new_tokens=24, num_steps=3,
                    aux_layers=(0, 1, 2), aux_convention="hf", dtype=args.dtype, device_map="cuda:0",
                    fp8_matmul=args.fp8_matmul)
    summary = {"torch": torch.__version__, "transformers": transformers.__version__,
               "device": torch.cuda.get_device_name(0), "dtype": args.dtype}
    oracle = api.load_oracle(cfg)
    model = oracle.speculator.target.model
    summary["quantization"] = oracle.speculator.target.info.quantization
    summary["module_types"] = sorted({type(m).__name__ for m in model.modules() if "FP8" in type(m).__name__})
    try:
        model(torch.tensor([[1, 5, 9]], device="cuda:0"))
        summary["fp8_forward"] = "ran"
    except Exception as e:                       # the kernel import is the expected failure offline
        summary["fp8_forward"] = f"{type(e).__name__}: {e}"
        summary["traceback_tail"] = traceback.format_exc().splitlines()[-6:]
        print(json.dumps(summary, indent=2, default=str))
        return 1
    loop = api.evaluate(cfg, progress=False)
    rows = []
    for sample, prompt in zip(loop.samples, load_workload(cfg.workload, oracle.tokenizer).first_prompts):
        ids = torch.tensor([prompt.input_ids], device="cuda:0")
        ref = model.generate(ids, max_new_tokens=cfg.workload.max_new_tokens, do_sample=False,
                             eos_token_id=sorted(oracle.eos_ids), pad_token_id=0)[0, ids.shape[1]:].tolist()
        rows.append({"id": sample.id, "equal_to_generate": sample.output_ids == ref,
                     "tokens": len(ref), "cycles": len(sample.accepted_per_cycle)})
    summary["prompts"] = rows
    summary["lossless_vs_generate"] = all(r["equal_to_generate"] for r in rows)
    summary["accept_length"] = loop.report["summary"]["accept_length"]
    prof = api.profile(cfg, ProfileOptions(max_steps=3, batch_tokens=120), progress=False, oracle=oracle)
    summary["profile_equals_loop"] = prof.report["by_num_steps"]["3"]["per_position"] == loop.report["per_position"]
    ok = summary["lossless_vs_generate"] and summary["profile_equals_loop"]
    if args.dtype == "fp32":
        held = make_fp8_target(root / "fp8-64", block=(64, 64))
        plain = write_dequantized_copy(held, root / "dequantized-64", (64, 64))
        a, _ = load_target(str(held), dtype="fp32", device_map="cuda:0", fp8_matmul=args.fp8_matmul)
        b, _ = load_target(str(plain), dtype="fp32", device_map="cuda:0")
        ids = torch.randint(5, 90, (2, 9), generator=torch.Generator().manual_seed(0))
        la, lb = a.forward(ids, None), b.forward(ids, None)
        summary["partial_blocks_64"] = {"held": a.info.quantization["summary"], "logits_equal": torch.equal(la, lb),
                                        "max_abs_diff": (la - lb).abs().max().item()}
        ok = ok and summary["partial_blocks_64"]["logits_equal"]
    print(json.dumps(summary, indent=2, default=str))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"quantized_gpu_{args.dtype}.json").write_text(json.dumps(summary, indent=2, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
