"""GPU: eagle-eval's FP8 dequantization per weight, eager against torch.compile-fused, side by side
(why `eagle_eval.models.quant.fp8` stays eager: on the H200, torch 2.11, the compiled kernel measured
2.1-2.6x slower, benchmarks/results/h200_fp8_dequant.json).

For the DeepSeek-V3 weight shapes at 128x128 blocks (a routed expert's gate_up and down, the dense
MLP, MLA's q_b / kv_b / o projections), times `_blocked_dequantize` (what `dequantize_blocks` runs for whole blocks)
eager and through torch.compile(dynamic=True), and `dequantize_blocks` itself on
kv_a_proj_with_mqa's 576 rows (a partial last block, eager); checks that compiled and eager give
identical bf16 values, and prints one JSON object (times in microseconds, the median of 20 after 3
warm-ups, and GB/s counting the fp8 read and the bf16 write).

    python benchmarks/fp8_dequant_gpu.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {"expert gate_up [2x2048, 7168]": (4096, 7168), "expert down [7168, 2048]": (7168, 2048),
          "dense gate [18432, 7168]": (18432, 7168), "q_b_proj [24576, 1536]": (24576, 1536),
          "kv_b_proj [32768, 512]": (32768, 512), "o_proj [7168, 16384]": (7168, 16384),
          "kv_a_proj_with_mqa [576, 7168] (partial)": (576, 7168)}


def median_us(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def main():
    from eagle_eval.models.quant.fp8 import _blocked_dequantize, dequantize_blocks

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    fused = torch.compile(_blocked_dequantize, dynamic=True)
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "shapes": {}}
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, (n, k) in SHAPES.items():
        w = (torch.randn(n, k, device="cuda", generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
        s = torch.rand(-(-n // 128), -(-k // 128), device="cuda", generator=g) / 448
        if n % 128:
            row = {"partial_block_eager_us": median_us(lambda: dequantize_blocks(w, s, (128, 128), torch.bfloat16))}
        else:
            eager = _blocked_dequantize(w, s, 128, 128, torch.bfloat16)
            row = {"equal_fused_eager": torch.equal(fused(w, s, 128, 128, torch.bfloat16), eager),
                   "eager_us": median_us(lambda: _blocked_dequantize(w, s, 128, 128, torch.bfloat16)),
                   "fused_us": median_us(lambda: fused(w, s, 128, 128, torch.bfloat16))}
            row["eager_over_fused"] = row["eager_us"] / row["fused_us"]
        row["gb_s"] = n * k * 3 / row.get("fused_us", row.get("partial_block_eager_us")) / 1e3
        out["shapes"][name] = row
        print(name, json.dumps(row), flush=True)
    out["all_equal"] = all(r["equal_fused_eager"] for r in out["shapes"].values() if "equal_fused_eager" in r)
    print(json.dumps(out, indent=2))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "fp8_dequant_gpu.json").write_text(json.dumps(out, indent=2))
    return 0 if out["all_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
