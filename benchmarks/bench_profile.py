"""Profile vs the reference loop, side by side in one run (issue 3), on any target + head (CPU or GPU).

    python benchmarks/bench_profile.py                      # the bundled pair on the bundled prompts
    python benchmarks/bench_profile.py --target DIR --draft DIR --prompts FILE --max-steps 8

Times: the profile for every num_steps <= max_steps (continuations generated, and separately read
back with --responses), the reference loop run once per num_steps, and checks that both give the same
per-cycle acceptance. Ratios are what to quote from a CPU; absolute times only from a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle_eval import api  # noqa: E402
from eagle_eval.settings import ProfileOptions, Settings  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    base = Settings.of()
    ap.add_argument("--target", default=base.model.target)
    ap.add_argument("--draft", default=base.model.draft)
    ap.add_argument("--prompts", default=base.workload.prompts)
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", default=None, help="write bench_profile.json here")
    args = ap.parse_args()
    run = Settings.of(target=args.target, draft=args.draft, prompts=args.prompts, max_new_tokens=args.max_new_tokens)
    oracle = api.load_oracle(run)

    t0 = time.perf_counter()
    prof = api.profile(run, ProfileOptions(max_steps=args.max_steps), progress=False, oracle=oracle)
    t_profile = time.perf_counter() - t0
    responses = Path(tempfile.mkdtemp()) / "responses.jsonl"
    responses.write_text("".join(json.dumps({"id": s.id, "output_ids": s.output_ids}) + "\n" for s in prof.samples))
    t0 = time.perf_counter()
    again = api.profile(run, ProfileOptions(max_steps=args.max_steps, responses=str(responses)), progress=False,
                        oracle=oracle)
    t_responses = time.perf_counter() - t0

    t_loop, equal, taus = 0.0, True, {}
    prompts = api.checked_workload(oracle).first_prompts
    for s in range(1, args.max_steps + 1):
        variant = oracle.with_(num_steps=s)
        t0 = time.perf_counter()
        samples = [variant.decode(p) for p in prompts]
        t_loop += time.perf_counter() - t0
        for a, b in zip(samples, prof.samples):
            equal &= a.accepted_per_cycle == b.extra["accepted_per_cycle_by_num_steps"][str(s)]
        taus[s] = prof.report["by_num_steps"][str(s)]["summary"]["accept_length"]
    result = {"target": args.target, "draft": args.draft, "prompts": len(prof.samples),
              "max_new_tokens": args.max_new_tokens, "max_steps": args.max_steps,
              "profile_s": t_profile, "profile_responses_s": t_responses, "loop_sweep_s": t_loop,
              "speedup": t_loop / t_profile, "speedup_responses": t_loop / t_responses,
              "profile_equals_loop": equal, "same_with_responses": again.report["by_num_steps"] ==
              prof.report["by_num_steps"], "tau_by_num_steps": taus}
    print(json.dumps(result, indent=2))
    print(f"\nprofile (S=1..{args.max_steps}) {t_profile:.2f}s, with --responses {t_responses:.2f}s, "
          f"loop once per S {t_loop:.2f}s: {result['speedup']:.1f}x / {result['speedup_responses']:.1f}x faster; "
          f"identical acceptance: {equal}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
