"""The batched loop at temperature > 0 beside greedy, side by side in one process (issue 41).

For B = 1, 16, 64 rows: tokens/s of `batched_decode` at T = 0 (the chain cycle replayed as a CUDA graph where it
can be captured, and eager) and at T = 0.7 (every rule's decision seated per row on its prompt's stream, drawn on
the host: eager), on the Llama-3.1-8B shape (bench_gpu.py, random bf16 weights). Then the DeepSeek-V3 width with a
few layers (bench_deepseek.py, mixture of experts): which experts implementation the load-time probe kept
(models/target.py `probe_experts`), whether the chain cycle can be captured with it, and B = 1, 16, 64 greedy with
and without graphs, tokens equal or not. Every configuration runs the same prompts; random weights accept almost
nothing, so a cycle emits about one token and the figures are the loop's cost per cycle, not a speedup.

    python benchmarks/bench_batched_sampling.py --out benchmarks/results     # one GPU
    python benchmarks/bench_batched_sampling.py --tiny                       # CPU smoke run of the same code

Writes batched_sampling.json under --out (the command is recorded in it) and prints one table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_deepseek  # noqa: E402
import bench_gpu  # noqa: E402
from bench_gpu import sync  # noqa: E402

from eagle_eval.loop.batched import batched_decode  # noqa: E402
from eagle_eval.loop.graphed import capture_blockers  # noqa: E402
from eagle_eval.rules.filters import prompt_generator  # noqa: E402


def one_run(oracle, prompts, num_steps, new, batch, graphs, temperature):
    """One batched_decode of `prompts` -> its figures (and tokens, for the equality checks)."""
    o = oracle if temperature == 0 else oracle.with_(temperature=temperature, seed=0)
    gens = None if temperature == 0 else [prompt_generator(0, str(i)) for i in range(len(prompts))]
    sync()
    t0 = time.perf_counter()
    r = batched_decode(o.speculator, prompts, num_steps, new, set(), batch, cuda_graphs=graphs, generators=gens)
    sync()
    t = time.perf_counter() - t0
    tokens = sum(len(d.output_ids) for d in r.decoded)
    decode = max(t - r.prefill_s - r.capture_s, 1e-9)
    return {"B": batch, "temperature": temperature, "cuda_graphs": r.cuda_graphs, "fallback": r.fallback,
            "prompts": len(prompts), "tokens": tokens, "seconds": t, "tokens_per_s": tokens / t,
            "decode_tokens_per_s": tokens / decode, "prefill_s": r.prefill_s, "capture_s": r.capture_s,
            "cycles": r.cycles, "ms_per_cycle": decode / r.cycles * 1e3}, [d.output_ids for d in r.decoded]


def sweep(oracle, prompts, num_steps, new, sizes, settings, prompts_for):
    """Every (B, graphs, T) of `settings`, in turn, each over the same prompts; a warm-up run first."""
    one_run(oracle, prompts[:2], num_steps, 4, 2, False, 0.0)                    # warm-up (kernels, allocator)
    rows, tokens = [], {}
    for b in sizes:
        for graphs, temperature in settings:
            row, toks = one_run(oracle, prompts[: prompts_for(b)], num_steps, new, b, graphs, temperature)
            tokens[(b, graphs, temperature)] = toks
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows, tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run: tiny shapes, B = 1, 4")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--skip-moe", action="store_true")
    args = ap.parse_args()
    gpu = torch.cuda.is_available() and not args.tiny
    device, dtype = ("cuda", torch.bfloat16) if gpu else ("cpu", torch.float32)
    res = {"command": "python " + " ".join(sys.argv), "device": torch.cuda.get_device_name() if gpu else "cpu",
           "dtype": str(dtype), "torch": torch.__version__, "transformers": __import__("transformers").__version__,
           "date": time.strftime("%Y-%m-%d")}
    sizes = [1, 16, 64] if not args.tiny else [1, 4]
    prompts_for = (lambda b: min(64, max(8, 2 * b))) if not args.tiny else (lambda b: 4)

    model, head = bench_gpu.build("tiny" if args.tiny else "8b", device, dtype)
    num_steps, new, plen = (5, 64, 128) if not args.tiny else (3, 12, 16)
    oracle = bench_gpu.make_oracle(model, head, num_steps, new)
    g = torch.Generator().manual_seed(1)
    vocab = oracle.speculator.target.info.vocab_size
    prompts = [torch.randint(10, vocab, (plen,), generator=g).tolist() for _ in range(64)]
    rows, _ = sweep(oracle, prompts, num_steps, new, sizes, [(True, 0.0), (False, 0.0), (False, 0.7)], prompts_for)
    res["8b" if not args.tiny else "tiny"] = {"num_steps": num_steps, "new_tokens": new, "prompt_tokens": plen,
                                              "capture_blocker": capture_blockers(oracle.speculator), "runs": rows}
    del model, head, oracle
    if gpu:
        torch.cuda.empty_cache()

    if not args.skip_moe:
        layers = 4
        model, head = bench_deepseek.build(args.tiny, layers, device, dtype)
        oracle = bench_deepseek.make_oracle(model, head, 3, 32 if not args.tiny else 8)
        vocab = oracle.speculator.target.info.vocab_size
        prompts = [torch.randint(10, vocab, (64 if not args.tiny else 12,), generator=g).tolist() for _ in range(64)]
        rows, tokens = sweep(oracle, prompts, 3, 32 if not args.tiny else 8, sizes, [(True, 0.0), (False, 0.0)],
                             prompts_for)
        res["deepseek_moe"] = {
            "layers": layers, "experts": oracle.resolved.target.experts,
            "capture_blocker": capture_blockers(oracle.speculator), "runs": rows,
            "graph_tokens_equal_eager": {str(b): tokens[(b, True, 0.0)] == tokens[(b, False, 0.0)] for b in sizes}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "batched_sampling.json").write_text(json.dumps(res, indent=2))
    print(table(res))


def table(res) -> str:
    lines = [f"{res['device']}, {res['dtype']}: batched_decode tokens/s (decode only, prefill and capture apart)"]
    for name in ("8b", "tiny", "deepseek_moe"):
        if name not in res:
            continue
        lines.append(f"[{name}] capture blocker: {res[name]['capture_blocker']}")
        for r in res[name]["runs"]:
            how = "graph" if r["cuda_graphs"] else "eager"
            lines.append(f"[{name}] B={r['B']:>3} T={r['temperature']:.1f} {how:5} {r['tokens_per_s']:>9.0f} tokens/s "
                         f"{r['decode_tokens_per_s']:>9.0f} decode tokens/s {r['ms_per_cycle']:>7.1f} ms/cycle")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
