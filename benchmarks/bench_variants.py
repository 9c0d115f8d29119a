"""Variants of a run: an 8-variant ablation through `oracle.with_` (the target and the head loaded once)
against the same 8 profiles each loading the oracle afresh (what `ablate` did before the settings object),
side by side in one run.

    python benchmarks/bench_variants.py            # the bundled pair, 8 prompts, max_new_tokens 16

Also the oracles alone: 8 variants through `with_` against 8 fresh loads (the wall-clock comparison that was a
unit test, tests/test_settings.py, until it raced on a loaded machine; the unit tests count the loads instead).

Ratios are what to quote from a CPU; the profiles themselves are identical (checked).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle_eval.commands.ablate import parse_variant  # noqa: E402
from eagle_eval.commands.profile import profile_oracle  # noqa: E402
from eagle_eval.oracle import load_oracle  # noqa: E402
from eagle_eval.settings import ProfileOptions, Settings  # noqa: E402

EIGHT = ("aux_layers=1,3,4", "aux_layers=3,5,6", "aux_convention=vllm", "position_offset=1",
         "draft_embedding=target", "max_new_tokens=12", "no_chat_template=true", "num_steps=3")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--max-steps", type=int, default=5)
    args = ap.parse_args()
    base = Settings.of(limit=args.limit, max_new_tokens=args.max_new_tokens)
    options = ProfileOptions(max_steps=args.max_steps)
    variants = [parse_variant(v)[1] for v in EIGHT]

    first = load_oracle(base)                       # also the warm-up: imports and first-load caches
    t0 = time.perf_counter()
    for v in variants:
        load_oracle(base.with_(**v))
    t_load_each = time.perf_counter() - t0
    t0 = time.perf_counter()
    for v in variants:
        first.with_(**v)
    t_with_only = time.perf_counter() - t0

    t0 = time.perf_counter()
    reloaded = [profile_oracle(load_oracle(base.with_(**v)), options).report["by_num_steps"] for v in variants]
    t_reload = time.perf_counter() - t0

    t0 = time.perf_counter()
    oracle = load_oracle(base)
    rewired = [profile_oracle(oracle.with_(**v), options).report["by_num_steps"] for v in variants]
    t_with = time.perf_counter() - t0

    result = {"variants": len(EIGHT), "prompts": args.limit, "max_new_tokens": args.max_new_tokens,
              "reload_each_s": t_reload, "with_s": t_with, "speedup": t_reload / t_with,
              "same_profiles": reloaded == rewired,
              "oracles": {"reload_each_s": t_load_each, "with_s": t_with_only, "speedup": t_load_each / t_with_only}}
    print(json.dumps(result, indent=2))
    print(f"\n8 variants: reloading the target and head for each {t_reload:.1f}s, through with_ {t_with:.1f}s "
          f"({result['speedup']:.2f}x); identical profiles: {result['same_profiles']}")
    print(f"the oracles alone: 8 fresh loads {t_load_each:.2f}s, 8 through with_ {t_with_only:.3f}s "
          f"({result['oracles']['speedup']:.0f}x)")


if __name__ == "__main__":
    main()
