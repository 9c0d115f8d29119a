"""A target bigger than the GPU budget, on one GPU: the cost per cycle of accelerate's CPU offload, and the
loop's tokens against the all-on-GPU run's.

Builds a Llama-3.1-8B-shaped target (bench_gpu.py's, random bf16 weights) and an 8B-shaped head on cuda:0,
runs the reference loop (time per cycle, its verify forward and draft steps, the tokens), then moves the
target to the CPU and places it as `--max-memory 0=BUDGET,cpu=...` would (models/placement.py, what
load_target does: the first layers on the GPU, the rest on the CPU, copied to the GPU by accelerate's
hooks at every forward), runs the same loop again and prints both side by side with the bytes that live
on the CPU and the host-to-GPU bandwidth the extra time implies. The head stays on the GPU.

    python benchmarks/bench_offload.py                         # one H200: half of the 8B target offloaded
    python benchmarks/bench_offload.py --gpu-fraction 0.25     # three quarters offloaded
    python benchmarks/bench_offload.py --tiny                  # CPU: the split is cpu + disk instead

Writes bench_offload.json to --out (default $OUT or .).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_gpu import SHAPES, bench_loop, build, make_oracle, sync  # noqa: E402

from eagle_eval.models.placement import resolve_device_map  # noqa: E402


def offload(model, budget: int, device: str, offload_folder: str) -> dict:
    """Place `model` (on the CPU) with `budget` bytes on `device` and the rest on the CPU ("disk" when the
    device is the CPU itself), and dispatch it with accelerate's hooks, as load_target does."""
    from accelerate import dispatch_model

    model.to("cpu")
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        max_memory = {int(device.partition(":")[2] or 0): budget, "cpu": 1 << 40}
    else:
        max_memory = {"cpu": budget}
    placement = resolve_device_map(model, "auto", max_memory)
    dispatch_model(model, device_map=placement, offload_dir=offload_folder,
                   skip_keys=getattr(model, "_skip_keys_device_placement", None))
    model.hf_device_map = placement
    return placement


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run: cpu + disk instead of GPU + cpu")
    ap.add_argument("--gpu-fraction", type=float, default=0.5, help="share of the target's bytes kept on the GPU")
    ap.add_argument("--num-steps", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=None)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    gpu = torch.cuda.is_available() and not args.tiny
    device, dtype, shape = ("cuda:0", torch.bfloat16, "8b") if gpu else ("cpu", torch.float32, "tiny")
    new = args.new_tokens or (16 if gpu else 24)
    model, head = build(shape, device, dtype)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    g = torch.Generator().manual_seed(1)
    prompt = [torch.randint(10, SHAPES[shape]["vocab"], (128,), generator=g).tolist()]
    results = {"device": torch.cuda.get_device_name(0) if gpu else "cpu", "shape": shape, "dtype": str(dtype),
               "target_bytes": size, "num_steps": args.num_steps, "new_tokens": new, "torch": torch.__version__,
               "transformers": __import__("transformers").__version__}
    whole = bench_loop(make_oracle(model, head, args.num_steps, new), prompt, args.num_steps, new)
    results["resident"] = {k: v for k, v in whole.items() if k != "tokens"}
    print(json.dumps(results["resident"]), flush=True)
    t0 = time.perf_counter()
    placement = offload(model, int(size * args.gpu_fraction), device, tempfile.mkdtemp(prefix="offload-"))
    sync()
    dispatch_s = time.perf_counter() - t0
    where = {}
    for name, p in model.named_parameters():
        key = next((k for k in sorted(placement, key=len, reverse=True) if name == k or name.startswith(k + ".")
                    or k == ""), "")
        dev = str(placement[key])
        where[dev] = where.get(dev, 0) + p.numel() * p.element_size()
    split = bench_loop(make_oracle(model, head, args.num_steps, new), prompt, args.num_steps, new)
    results["offloaded"] = {**{k: v for k, v in split.items() if k != "tokens"}, "dispatch_s": dispatch_s,
                            "bytes_by_device": where, "placement": {k: str(v) for k, v in placement.items()}}
    off = sum(v for d, v in where.items() if d in ("cpu", "disk")) if gpu else where.get("disk", 0)
    extra = (split["verify_ms"] - whole["verify_ms"]) / 1e3
    results["comparison"] = {
        "tokens_equal": split["tokens"] == whole["tokens"], "offloaded_bytes": off,
        "loop_ms_per_cycle_over_resident": split["loop_ms_per_cycle"] / whole["loop_ms_per_cycle"],
        "verify_ms_over_resident": split["verify_ms"] / whole["verify_ms"],
        "implied_copy_gb_per_s": off / extra / 1e9 if extra > 0 else None}
    print(json.dumps(results["offloaded"]), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "bench_offload.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
