"""The loop at temperature > 0 against the greedy loop, side by side in one process.

For each accept rule: the same prompts decoded by the reference loop at temperature 0 and at --temperature,
each timed over --repeats passes (best pass kept), as seconds per emitted token and cycle; the ratio
sampling / greedy per emitted token is what the sampling rule costs (target_probs on every verified row,
float64 coins and inverse-CDF draws on the CPU, per-node Python). Tau differs between the two (sampling
accepts less), so the per-token ratio mixes the cost per cycle with the number of cycles; both are printed.

    python benchmarks/bench_sampling_loop.py                         # bundled pair, CPU, 8 prompts x 48 tokens
    python benchmarks/bench_sampling_loop.py --target DIR --draft DIR --device-map cuda:0 --dtype bf16
"""

from __future__ import annotations

import argparse
import time

import torch

RULES = [("vllm", 1, None), ("vllm-probabilistic", 1, None), ("sglang", 1, None), ("eagle", 1, None),
         ("sglang", 3, 8), ("eagle", 3, 8)]


def _timed(oracle, prompts, repeats: int) -> tuple[float, int, int]:
    """(best seconds over repeats, emitted tokens, cycles) of decoding every prompt once; tau is about
    (tokens - prompts) / cycles (each prompt's first token comes from the prefill)."""
    best, tokens, cycles = float("inf"), 0, 0
    oracle.decode(prompts[0])                                   # warm-up
    for _ in range(repeats):
        start = time.perf_counter()
        recs = [oracle.decode(p) for p in prompts]
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
        tokens, cycles = sum(len(r.output_ids) for r in recs), sum(r.verify_count for r in recs)
    return best, tokens, cycles


def main() -> None:
    from eagle_eval.oracle import checked_workload, load_oracle
    from eagle_eval.settings import Settings

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("--target", "--draft"):
        ap.add_argument(name, help="default: the bundled pair")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device-map", default="auto")
    ap.add_argument("--temperature", type=float, default=0.7)
    for name, default in (("--prompts", 8), ("--max-new-tokens", 48), ("--num-steps", 4), ("--repeats", 3)):
        ap.add_argument(name, type=int, default=default)
    args = ap.parse_args()
    paths = {k: v for k, v in (("target", args.target), ("draft", args.draft)) if v}
    base = load_oracle(Settings.of(**paths, dtype=args.dtype, device_map=args.device_map,
                                   max_new_tokens=args.max_new_tokens, num_steps=args.num_steps))
    prompts = checked_workload(base).first_prompts[: args.prompts]
    print(f"{len(prompts)} prompts x {args.max_new_tokens} tokens, num_steps {args.num_steps}, "
          f"T = {args.temperature}, best of {args.repeats}; device {base.resolved.draft_device}, {base.resolved.dtype}")
    print(f"{'rule':<20} {'topk':>4}  {'greedy ms/tok':>13} {'sampling ms/tok':>15} {'ratio/tok':>9} "
          f"{'ratio/cycle':>11} {'tau greedy':>10} {'tau sampling':>12}")
    for rule, topk, d in RULES:
        greedy = base.with_(accept_rule=rule, topk=topk, num_draft_tokens=d)
        sampled = greedy.with_(temperature=args.temperature)
        g_s, g_tok, g_cyc = _timed(greedy, prompts, args.repeats)
        s_s, s_tok, s_cyc = _timed(sampled, prompts, args.repeats)
        print(f"{rule:<20} {topk:>4}  {1e3 * g_s / g_tok:>13.2f} {1e3 * s_s / s_tok:>15.2f} "
              f"{(s_s / s_tok) / (g_s / g_tok):>9.2f} {(s_s / s_cyc) / (g_s / g_cyc):>11.2f} "
              f"{(g_tok - len(prompts)) / g_cyc:>10.2f} {(s_tok - len(prompts)) / s_cyc:>12.2f}")


if __name__ == "__main__":
    main()
