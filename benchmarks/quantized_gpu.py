"""GPU check of a block-wise FP8 DeepSeek-V3-architecture target kept FP8 on the GPU (issue 16).

Builds the tiny FP8 target of tests/quant_fixtures.py (float8_e4m3fn weights + weight_scale_inv per
16x16 block, as DeepSeek-V3 / Kimi-K2 ship them), loads it on cuda:0 through eagle-eval's load_target
(transformers' fine-grained FP8 path: FP8Linear / FP8Experts keep the weights in fp8), runs the loop
over a few prompts and compares every output with the same model's greedy `generate`. Prints one JSON
object: the resolved quantization, whether the FP8 matmul kernel ran, and per-prompt equality.
transformers' FP8 matmuls come from the `kernels` package (kernels-community/finegrained-fp8, fetched
from the Hub on first use); where they cannot load the forward raises and the JSON says so.

    python benchmarks/quantized_gpu.py [--dtype bf16|fp32] [--out DIR]
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
    from quant_fixtures import make_fp8_target

    from eagle_eval import api
    from eagle_eval.config import RunConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="quant-gpu-"))
    target = make_fp8_target(root / "fp8")
    cfg = RunConfig(target=str(target), draft=str(make_head(root / "head")),
                    prompts=str(write_prompts(root / "prompts.jsonl", n=4)), max_new_tokens=24, num_steps=3,
                    aux_layers=(0, 1, 2), aux_convention="hf", dtype=args.dtype, device_map="cuda:0")
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
    for sample, prompt in zip(loop.samples, api.load_workload(cfg, oracle.tokenizer).first_prompts):
        ids = torch.tensor([prompt.input_ids], device="cuda:0")
        ref = model.generate(ids, max_new_tokens=cfg.max_new_tokens, do_sample=False,
                             eos_token_id=sorted(oracle.eos_ids), pad_token_id=0)[0, ids.shape[1]:].tolist()
        rows.append({"id": sample.id, "equal_to_generate": sample.output_ids == ref,
                     "tokens": len(ref), "cycles": len(sample.accepted_per_cycle)})
    summary["prompts"] = rows
    summary["lossless_vs_generate"] = all(r["equal_to_generate"] for r in rows)
    summary["accept_length"] = loop.report["summary"]["accept_length"]
    print(json.dumps(summary, indent=2, default=str))
    return 0 if summary["lossless_vs_generate"] else 1


if __name__ == "__main__":
    sys.exit(main())
