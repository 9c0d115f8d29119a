"""The profile at temperature > 0 against the greedy profile on the same prompts, side by side.

    python benchmarks/bench_sampling_profile.py                     # the bundled pair and prompts (CPU)
    python benchmarks/bench_sampling_profile.py --random 8b --out DIR   # GPU: Llama-3.1-8B shapes, random bf16
    python benchmarks/bench_sampling_profile.py --random tiny       # the same code on the CPU, tiny shapes

Times, each the median of --reps runs after a warm-up, greedy and T > 0 in turn, on one loaded oracle:
  with generation   `profile_prompts` generating its continuations: greedy (argmax) vs T > 0 (sampled)
  given responses   the same with the continuations given (greedy: the greedy ones; T > 0: the sampled ones,
                    taken as they are): no generation (greedy: re-profiled where bf16 near-ties move the argmax)
  pass only         the batch function alone on the same batches: the teacher-forced pass, the drafting and
                    the expectations, nothing else
--topk K --num-draft-tokens D: trees (SGLang's rule unless --accept-rule says another).
and the ratio T > 0 / greedy of each (the bound asked for: <= 1.3). The T > 0 profile reads p on the
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
from eagle_eval.records import Prompt  # noqa: E402
from eagle_eval.settings import ProfileOptions, Settings  # noqa: E402


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def side_by_side(greedy, sampled, reps: int) -> tuple[float, float, object, object]:
    """(median seconds of greedy, of sampled, their last outputs): one warm-up each, then the two run in
    turn, rep after rep, so a slow spell of the machine falls on both."""
    out_g, out_s = greedy(), sampled()
    sync()
    times = ([], [])
    for _ in range(reps):
        for i, fn in enumerate((greedy, sampled)):
            t0 = time.perf_counter()
            out = fn()
            sync()
            times[i].append(time.perf_counter() - t0)
            out_g, out_s = (out, out_s) if i == 0 else (out_g, out)
    return statistics.median(times[0]), statistics.median(times[1]), out_g, out_s


def branch_tokens_per_start(profiled, max_new: int) -> float:
    """Target tokens the T > 0 profile ran off the continuation, per start."""
    return sum(p.expected.branch_nodes for p in profiled) / max(1, max_new * len(profiled))


def pass_only(oracle, sampled, g, s, args) -> tuple[float, float]:
    """The pass alone, batch by batch, on the same continuations' batches: `profile.profile_batch` (greedy) vs
    `profile_sampled.profile_batch_sampled` (T > 0): forward, drafting, run lengths, expectations; no generation,
    no report, no re-profiling of a continuation the greedy check finds off the argmax (bf16 near-ties)."""
    from eagle_eval.profile import teacher_forced as prof
    from eagle_eval.rules.base import rule
    from eagle_eval.profile.sampled import profile_batch_sampled, profile_batch_weighted

    spec, k, max_new = oracle.speculator, args.max_steps, oracle.settings.workload.max_new_tokens
    tok = oracle.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    items_g = [(p.prompt, p.continuation) for p in g.profiled]
    items_s = [(p.prompt, p.continuation) for p in s.profiled]
    batches = list(prof.batches([p.input_ids + c for p, c in items_g], 0, args.batch_tokens))
    dec = sampled.settings.decoding
    topk = oracle.resolved.topk
    shapes = None
    if topk > 1:                                     # the shapes the profile runs: the config's D per S
        from eagle_eval.commands.profile_result import tree_shapes

        shapes = sorted(tree_shapes(oracle.resolved, ProfileOptions(max_steps=k))[0].items())
    t_g, t_s, _, _ = side_by_side(
        lambda: [prof.profile_batch(spec, [items_g[j] for j in b], k, max_new, pad, topk, shapes) for b in batches],
        lambda: [profile_batch_weighted(spec, [items_s[j] for j in b], k, max_new, pad, dec)
                 if rule(dec.accept_rule).sampled_drafts else
                 profile_batch_sampled(spec, [items_s[j] for j in b], k, max_new, pad, dec, topk, shapes,
                                       floor=args.expectation_floor) for b in batches], args.reps)
    return t_g, t_s


def run(oracle, prompts, args) -> dict:
    opts = ProfileOptions(max_steps=args.max_steps, batch_tokens=args.batch_tokens,
                          expectation_floor=args.expectation_floor)
    sampled = oracle.with_(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                           accept_rule=args.accept_rule or ("sglang" if args.topk > 1 else "vllm"))
    t_greedy, t_sampled, g, s = side_by_side(lambda: profile_prompts(oracle, prompts, opts),
                                             lambda: profile_prompts(sampled, prompts, opts), args.reps)
    g_conts = [p.continuation for p in g.profiled]
    s_conts = [p.continuation for p in s.profiled]
    if s.report["sampling"]["draft_estimator"] is None:
        t_greedy_r, t_sampled_r, _, s_r = side_by_side(lambda: profile_prompts(oracle, prompts, opts, g_conts),
                                                       lambda: profile_prompts(sampled, prompts, opts, s_conts),
                                                       args.reps)
    else:        # sampled drafts: given responses need rollouts (the one-pass estimate weights sampled texts)
        t_greedy_r = t_sampled_r = s_r = None
    tree = oracle.resolved.topk > 1
    t_pass_g, t_pass_s = pass_only(oracle, sampled, g, s, args)
    key = str(args.max_steps)
    return {
        "prompts": len(prompts), "max_new_tokens": oracle.settings.workload.max_new_tokens,
        "max_steps": args.max_steps, "expectation_floor": args.expectation_floor, "temperature": args.temperature,
        "top_p": args.top_p, "top_k": args.top_k,
        "accept_rule": sampled.settings.decoding.accept_rule, "reps": args.reps,
        "topk": oracle.resolved.topk, "num_draft_tokens": oracle.resolved.num_draft_tokens if tree else None,
        "greedy_s": t_greedy, "sampled_s": t_sampled, "ratio_with_generation": t_sampled / t_greedy,
        "greedy_responses_s": t_greedy_r, "sampled_responses_s": t_sampled_r,
        "ratio_given_responses": t_sampled_r / t_greedy_r if t_sampled_r else None,
        "greedy_pass_s": t_pass_g, "sampled_pass_s": t_pass_s,
        "ratio_pass_only": t_pass_s / t_pass_g,
        "branch_tokens_per_start": branch_tokens_per_start(s.profiled, oracle.settings.workload.max_new_tokens),
        "sequence_tokens": sum(len(p.prompt.input_ids) + len(p.continuation) for p in s.profiled),
        "branch_tokens": sum(p.expected.branch_nodes for p in s.profiled),
        "greedy_tau": g.report["by_num_steps"][key]["summary"]["accept_length"],
        # sampled drafts: no realized counts (the accepted count is not a function of the text), per-context only
        "sampled_tau": s.report["by_num_steps"][key].get("summary", {}).get("accept_length"),
        "sampled_expected_along": s.report["by_num_steps"][key]["expected"].get("along_trajectories", {}).get(
            "expected_tokens_per_step", {}).get("value"),
        "sampled_expected_per_context": s.report["by_num_steps"][key]["expected"]["per_context"][
            "expected_tokens_per_step"]["value"],
        "same_with_responses": s_r.report["by_num_steps"] == s.report["by_num_steps"] if s_r else None,
    }


def random_pair(args):
    """bench_gpu.py's random-weight target + head of that shape (bf16 on cuda:0, else fp32 on the CPU) and
    random 128-token prompts."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_gpu import SHAPES, build, make_oracle

    gpu = torch.cuda.is_available()
    model, head = build(args.random, "cuda:0" if gpu else "cpu", torch.bfloat16 if gpu else torch.float32)
    trees = dict(topk=args.topk, num_draft_tokens=args.num_draft_tokens) if args.topk > 1 else {}
    oracle = make_oracle(model, head, 5, args.max_new_tokens, **trees)
    g = torch.Generator().manual_seed(1)
    ids = [torch.randint(10, SHAPES[args.random]["vocab"], (128,), generator=g).tolist() for _ in range(args.prompts)]
    return oracle, [Prompt(id=f"p{i}", category="", input_ids=p) for i, p in enumerate(ids)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--random", choices=("8b", "tiny"), default=None,
                    help="random weights of bench_gpu.py's shapes (8b: Llama-3.1-8B; bf16 on a GPU) instead of the bundled pair")
    ap.add_argument("--prompts", type=int, default=64, help="--random: number of prompts (128 tokens each)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default 64 (bundled), 256 (--random)")
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--topk", type=int, default=1, help="> 1: trees")
    ap.add_argument("--num-draft-tokens", type=int, default=None, help="trees: verify nodes, root included")
    ap.add_argument("--accept-rule", default=None, help="default: vllm for chains, sglang for trees")
    ap.add_argument("--batch-tokens", type=int, default=None, help="default 16384 (bundled), 32768 (--random)")
    ap.add_argument("--expectation-floor", type=float, default=ProfileOptions().expectation_floor)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None, help="write bench_sampling_profile.json into this folder")
    args = ap.parse_args()
    if args.random:
        args.max_new_tokens = args.max_new_tokens or 256
        args.batch_tokens = args.batch_tokens or 32768
        oracle, prompts = random_pair(args)
    else:
        torch.set_num_threads(1)
        args.max_new_tokens = args.max_new_tokens or 64
        args.batch_tokens = args.batch_tokens or 16384
        oracle = api.load_oracle(Settings.of(max_new_tokens=args.max_new_tokens, topk=args.topk,
                                             num_draft_tokens=args.num_draft_tokens))
        prompts = api.checked_workload(oracle).first_prompts
    gpu = args.random and torch.cuda.is_available()
    result = {"device": torch.cuda.get_device_name(0) if gpu else "cpu (1 thread)" if not args.random else "cpu",
              "target": f"{args.random} shapes, random weights ({oracle.resolved.dtype})" if args.random else
              "the bundled pair",
              "torch": torch.__version__, **run(oracle, prompts, args)}
    print(json.dumps(result, indent=2))
    alone = (f", {result['ratio_pass_only']:.2f}x the pass alone ({result['branch_tokens_per_start']:.2f} branch "
             f"tokens per start)")
    shape = f"trees topk {result['topk']}, {result['num_draft_tokens']} nodes, " if result["topk"] > 1 else ""
    print(f"\nprofile at T = {args.temperature} ({shape}{result['accept_rule']}) vs greedy: "
          f"{result['ratio_with_generation']:.2f}x with generation, "
          + (f"{result['ratio_given_responses']:.2f}x with the continuations given"
             if result["ratio_given_responses"] else "no given-continuations run (sampled drafts)") + alone)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "bench_sampling_profile.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
