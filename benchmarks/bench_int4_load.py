"""Peak memory of loading a pack-quantized INT4 checkpoint: eagle-eval's packed loader against
transformers' from_pretrained (which decompresses the routed experts to bf16), each in a fresh process.

Writes a Kimi-K2-width DeepSeek-V3 checkpoint (config.json with compressed-tensors pack-quantized INT4,
group 32, on the routed experts only, as Kimi-K2.5 ships them) of a few layers, with random packed words
and scales and random bf16 for everything else, in safetensors shards with an index. Then, in one
subprocess each, loads it onto the device (cuda:0, or the CPU with --tiny):
  eagle-eval     eagle_eval.models.quant.int4_load.load_packed_model (experts stay packed)
  transformers   AutoModelForCausalLM.from_pretrained (needs compressed-tensors; skipped without it)
and reports the host memory the load allocates (the peak anonymous resident memory, sampled, minus the
one before it; the peak RSS too, which also counts the checkpoint's file pages safetensors maps) and the
peak device memory, beside the checkpoint's bytes and the bf16 size of the same weights.

    python benchmarks/bench_int4_load.py                       # one H200: 3 layers, ~26 GB checkpoint in $TMPDIR
    python benchmarks/bench_int4_load.py --folder DIR --keep   # reuse / keep the written checkpoint
    python benchmarks/bench_int4_load.py --tiny                # CPU, small widths (~80 MB packed)

Writes bench_int4_load.json to --out (default $OUT or .).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

KIMI = dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, n_routed_experts=384,
            n_shared_experts=1, num_experts_per_tok=8, n_group=1, topk_group=1, num_attention_heads=64,
            num_key_value_heads=64, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
            v_head_dim=128, vocab_size=163840, routed_scaling_factor=2.827, group=32)
TINY = dict(hidden_size=1024, intermediate_size=2048, moe_intermediate_size=512, n_routed_experts=32,
            n_shared_experts=1, num_experts_per_tok=4, n_group=1, topk_group=1, num_attention_heads=8,
            num_key_value_heads=8, q_lora_rank=256, kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=32,
            v_head_dim=32, vocab_size=4096, routed_scaling_factor=2.827, group=32)
SHARD = 4 << 30


def write_checkpoint(folder: Path, widths: dict, layers: int) -> dict:
    """The checkpoint (module docstring); returns its tensor bytes, split packed / other, and the bf16 bytes
    of the same weights."""
    import torch
    from quant_fixtures import KIMI_IGNORE, _int4_quantization_config
    from safetensors.torch import save_file
    from transformers import DeepseekV3Config

    from eagle_eval.plan.model import _int4_entries, _linear_sites
    from eagle_eval.models.quant.int4 import int4_scheme
    from eagle_eval.models.quant.int4_load import build_empty, hold_packed

    group = widths["group"]
    cfg = DeepseekV3Config(**{k: v for k, v in widths.items() if k != "group"}, num_hidden_layers=layers,
                           first_k_dense_replace=1, max_position_embeddings=8192, rope_theta=50000.0,
                           tie_word_embeddings=False, torch_dtype="bfloat16")
    qc = _int4_quantization_config(group, KIMI_IGNORE)
    folder.mkdir(parents=True, exist_ok=True)
    config = {**cfg.to_dict(), "quantization_config": qc, "architectures": ["DeepseekV3ForCausalLM"]}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    model = build_empty(folder, "AutoModelForCausalLM", torch.bfloat16, False)
    sites = _linear_sites(model)
    packed = {n for n in sites if ".mlp.experts." in n}
    entries, shapes = _int4_entries(sites, packed, folder / "config.json", group)
    hold_packed(model, {k: v for k, v in entries.items() if k.rsplit(".", 1)[0] in packed}, int4_scheme(qc, "x"),
                torch.bfloat16, shapes)
    g = torch.Generator().manual_seed(0)
    shard, shard_bytes, index, n, counts = {}, 0, {}, 0, {"packed": 0, "other": 0, "bf16_equivalent": 0}

    def flush():
        nonlocal shard, shard_bytes, n
        if shard:
            name = f"model-{n:05d}.safetensors"
            save_file(shard, str(folder / name), metadata={"format": "pt"})
            index.update(dict.fromkeys(shard, name))
            shard, shard_bytes, n = {}, 0, n + 1

    for key, t in model.state_dict().items():
        if key.endswith("weight_packed"):
            value = torch.randint(-2**31, 2**31 - 1, tuple(t.shape), generator=g, dtype=torch.int64).to(torch.int32)
            counts["bf16_equivalent"] += t.numel() * 8 * 2
        elif key.endswith("weight_scale"):
            value = (torch.rand(tuple(t.shape), generator=g) * 2e-3 + 1e-3).to(torch.bfloat16)
        elif key.endswith("weight_shape"):
            value = torch.tensor(shapes[key])
        elif key.endswith("e_score_correction_bias"):
            value = torch.zeros(tuple(t.shape), dtype=torch.float32)
        elif "norm" in key:
            value = torch.ones(tuple(t.shape), dtype=torch.bfloat16)
        else:
            value = (torch.randn(tuple(t.shape), generator=g) * 0.02).to(torch.bfloat16)
        counts["packed" if key.rsplit(".", 1)[0] in packed else "other"] += value.numel() * value.element_size()
        if not key.rsplit(".", 1)[0] in packed:
            counts["bf16_equivalent"] += value.numel() * 2
        shard[key] = value
        shard_bytes += value.numel() * value.element_size()
        if shard_bytes >= SHARD:
            flush()
    flush()
    total = counts["packed"] + counts["other"]
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                      "weight_map": index}))
    return {**counts, "checkpoint": total, "shards": n}


def status(field: str) -> int:
    """A /proc/self/status memory field (VmRSS, RssAnon), bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


class AnonPeak:
    """The peak anonymous resident memory while it runs, sampled every 5 ms: what the load allocates on the
    host, without the checkpoint's file pages that safetensors maps (they count in RSS, but are page cache)."""

    def __enter__(self):
        import threading

        self.peak, self.done = status("RssAnon"), False
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while not self.done:
            self.peak = max(self.peak, status("RssAnon"))
            time.sleep(0.005)

    def __exit__(self, *exc):
        self.done = True
        self.thread.join()
        self.peak = max(self.peak, status("RssAnon"))


def measure(loader: str, folder: Path, device: str) -> dict:
    """Load `folder` with `loader` onto `device` in this process; the memory it took. Everything either loader
    imports is imported before the baselines are read."""
    import accelerate  # noqa: F401
    import safetensors.torch  # noqa: F401
    import torch
    from transformers import AutoModelForCausalLM, DeepseekV3ForCausalLM  # noqa: F401

    from eagle_eval.models.quant.info import checkpoint_quantization_config
    from eagle_eval.models.quant.int4 import int4_scheme
    from eagle_eval.models.quant.int4_load import load_packed_model

    if loader == "transformers":
        import compressed_tensors.compressors  # noqa: F401
        import transformers.integrations.compressed_tensors  # noqa: F401
    if device.startswith("cuda"):
        torch.zeros(1, device=device)                                    # the CUDA context, before the baselines
    before, anon_before = status("VmRSS"), status("RssAnon")
    t0 = time.perf_counter()
    with AnonPeak() as anon:
        if loader == "eagle-eval":
            scheme = int4_scheme(checkpoint_quantization_config(folder), folder / "config.json")
            model = load_packed_model(folder, "AutoModelForCausalLM", scheme, torch.bfloat16, {"": device}, None,
                                      False, None)
        else:
            model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16, device_map={"": device})
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    held = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return {"loader": loader, "seconds": seconds, "host_rss_before": before, "host_peak_added": peak - before,
            "host_anon_peak_added": anon.peak - anon_before,
            "device_peak": torch.cuda.max_memory_allocated() if device.startswith("cuda") else None,
            "held_bytes": held, "held_dtypes": sorted({str(t.dtype).removeprefix("torch.")
                                                       for t in model.state_dict().values()})}


def run_measure(loader: str, folder: Path, device: str) -> dict:
    cmd = [sys.executable, __file__, "--measure", loader, "--folder", str(folder), "--device", device]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        return {"loader": loader, "error": (done.stderr.strip().splitlines() or ["?"])[-1][:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="CPU, small widths")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--folder", default=None, help="checkpoint folder (written unless it holds one)")
    ap.add_argument("--keep", action="store_true", help="keep the written checkpoint")
    ap.add_argument("--device", default=None)
    ap.add_argument("--measure", choices=["eagle-eval", "transformers"], help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    device = args.device or ("cuda:0" if torch.cuda.is_available() and not args.tiny else "cpu")
    if args.measure:
        print(json.dumps(measure(args.measure, Path(args.folder), device)))
        return
    folder = Path(args.folder) if args.folder else Path(tempfile.mkdtemp(prefix="int4-load-")) / "ckpt"
    t0 = time.perf_counter()
    written = None
    if not (folder / "config.json").is_file():
        written = write_checkpoint(folder, TINY if args.tiny else KIMI, args.layers)
    results = {"device": torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu", "folder": str(folder),
               "widths": "tiny" if args.tiny else "Kimi-K2", "layers": args.layers, "checkpoint": written,
               "write_s": time.perf_counter() - t0, "torch": torch.__version__,
               "transformers": __import__("transformers").__version__}
    print(json.dumps(results), flush=True)
    for loader in ("eagle-eval", "transformers"):
        results[loader] = run_measure(loader, folder, device)
        print(json.dumps(results[loader]), flush=True)
    if written:
        ours, theirs = results["eagle-eval"], results["transformers"]
        results["over_checkpoint"] = {
            f"{name}_{what}": (m[what] / written["checkpoint"]) if m.get(what) is not None else None
            for name, m in (("eagle_eval", ours), ("transformers", theirs))
            for what in ("host_anon_peak_added", "host_peak_added", "device_peak", "held_bytes")}
        results["bf16_over_checkpoint"] = written["bf16_equivalent"] / written["checkpoint"]
    if args.folder is None and not args.keep:
        shutil.rmtree(folder.parent, ignore_errors=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "bench_int4_load.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
