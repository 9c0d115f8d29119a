"""The profile at temperature > 0 against the greedy profile on the same prompts, side by side (issue 23).

    python benchmarks/bench_sampling_profile.py                     # CPU: the bundled pair and prompts
    python benchmarks/bench_sampling_profile.py --gpu-8b            # GPU: Llama-3.1-8B shapes, random bf16 weights

Times, each the median of --reps runs after a warm-up, on one loaded oracle:
  with generation   `profile_prompts` generating its continuations: greedy (argmax) vs T > 0 (sampled)
  given responses   the same with the continuations given (greedy: the greedy ones; T > 0: the sampled ones,
                    taken as they are): the pass alone, no generation
and the ratio T > 0 / greedy of each (the bound of issue 23: <= 1.3). The T > 0 profile reads p on the
continuation where the drafts follow it and runs the other drafts as branch tokens over the pass's cache:
`branch_tokens_per_start` says how many it ran. With random weights no draft follows a sampled
continuation: every start's first draft runs off it, and deeper ones while P(A >= i) >= --expectation-floor.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle_eval import api  # noqa: E402
from eagle_eval.commands.profile import profile_prompts  # noqa: E402
from eagle_eval.results.records import Prompt  # noqa: E402
from eagle_eval.settings import ProfileOptions, Settings  # noqa: E402


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, reps: int) -> tuple[float, object]:
    out = fn()                                          # warm-up
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def branch_tokens_per_start(profiled, max_new: int) -> float:
    """Target tokens the T > 0 profile ran off the continuation, per start (chains)."""
    return sum(p.expected.branch_nodes for p in profiled) / max(1, max_new * len(profiled))


def run(oracle, prompts, args) -> dict:
    opts = ProfileOptions(max_steps=args.max_steps, batch_tokens=args.batch_tokens,
                          expectation_floor=args.expectation_floor)
    sampled = oracle.with_(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    t_greedy, g = timed(lambda: profile_prompts(oracle, prompts, opts), args.reps)
    t_sampled, s = timed(lambda: profile_prompts(sampled, prompts, opts), args.reps)
    g_conts = [p.continuation for p in g.profiled]
    s_conts = [p.continuation for p in s.profiled]
    t_greedy_r, _ = timed(lambda: profile_prompts(oracle, prompts, opts, g_conts), args.reps)
    t_sampled_r, s_r = timed(lambda: profile_prompts(sampled, prompts, opts, s_conts), args.reps)
    key = str(args.max_steps)
    return {
        "prompts": len(prompts), "max_new_tokens": oracle.settings.workload.max_new_tokens,
        "max_steps": args.max_steps, "expectation_floor": args.expectation_floor, "temperature": args.temperature,
        "top_p": args.top_p, "top_k": args.top_k,
        "accept_rule": sampled.settings.decoding.accept_rule, "reps": args.reps,
        "greedy_s": t_greedy, "sampled_s": t_sampled, "ratio_with_generation": t_sampled / t_greedy,
        "greedy_responses_s": t_greedy_r, "sampled_responses_s": t_sampled_r,
        "ratio_given_responses": t_sampled_r / t_greedy_r,
        "branch_tokens_per_start": branch_tokens_per_start(s.profiled, oracle.settings.workload.max_new_tokens),
        "sequence_tokens": sum(len(p.prompt.input_ids) + len(p.continuation) for p in s.profiled),
        "branch_tokens": sum(p.expected.branch_nodes for p in s.profiled),
        "greedy_tau": g.report["by_num_steps"][key]["summary"]["accept_length"],
        "sampled_tau": s.report["by_num_steps"][key]["summary"]["accept_length"],
        "sampled_expected_along": s.report["by_num_steps"][key]["expected"]["along_trajectories"][
            "expected_tokens_per_step"]["value"],
        "same_with_responses": s_r.report["by_num_steps"] == s.report["by_num_steps"],
    }


def gpu_8b(args):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_gpu import SHAPES, build, make_oracle

    model, head = build("8b", "cuda:0", torch.bfloat16)
    oracle = make_oracle(model, head, 5, args.max_new_tokens)
    g = torch.Generator().manual_seed(1)
    ids = [torch.randint(10, SHAPES["8b"]["vocab"], (128,), generator=g).tolist() for _ in range(args.prompts)]
    return oracle, [Prompt(id=f"p{i}", category="", input_ids=p) for i, p in enumerate(ids)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu-8b", action="store_true", help="Llama-3.1-8B shapes with random bf16 weights on cuda:0")
    ap.add_argument("--prompts", type=int, default=64, help="--gpu-8b: number of prompts (128 tokens each)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default 64 (CPU), 256 (--gpu-8b)")
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--batch-tokens", type=int, default=None, help="default 16384 (CPU), 32768 (--gpu-8b)")
    ap.add_argument("--expectation-floor", type=float, default=ProfileOptions().expectation_floor)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None, help="write bench_sampling_profile.json into this folder")
    args = ap.parse_args()
    if args.gpu_8b:
        args.max_new_tokens = args.max_new_tokens or 256
        args.batch_tokens = args.batch_tokens or 32768
        oracle, prompts = gpu_8b(args)
    else:
        torch.set_num_threads(1)
        args.max_new_tokens = args.max_new_tokens or 64
        args.batch_tokens = args.batch_tokens or 16384
        oracle = api.load_oracle(Settings.of(max_new_tokens=args.max_new_tokens))
        prompts = api.checked_workload(oracle).first_prompts
    result = {"device": torch.cuda.get_device_name(0) if args.gpu_8b else "cpu (1 thread)",
              "target": "llama-3.1-8b shapes, random bf16" if args.gpu_8b else "the bundled pair",
              "torch": torch.__version__, **run(oracle, prompts, args)}
    print(json.dumps(result, indent=2))
    print(f"\nprofile at T = {args.temperature} vs greedy: {result['ratio_with_generation']:.2f}x with generation, "
          f"{result['ratio_given_responses']:.2f}x with the continuations given "
          f"({result['branch_tokens_per_start']:.2f} branch tokens per start)")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "bench_sampling_profile.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
