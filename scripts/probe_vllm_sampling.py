"""What the real vLLM 0.32 CPU build does when sampling with EAGLE-3, for each speculative sampling setting it
takes, judged by server-check at temperature > 0 (servers/sampled.py) on the bundled pair.

    python scripts/probe_vllm_sampling.py --out benchmarks/results/vllm_cpu_sampling.json

For each speculative config (the default; draft_sample_method "probabilistic"; rejection_sample_method "block";
and no speculation at all, the control), one server is started (scripts/vllm_cpu.py, 1-2 minutes each on 2
cores) and checked at temperature 0.7, top-p 0.95, a seed per request, 8 bundled prompts of 48 new tokens; the
verdict, the distribution check of the answers and the server's mean accept length are written side by side.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

CONFIGS = {
    "speculative, default (draft_sample_method greedy, rejection_sample_method standard)": {},
    "draft_sample_method probabilistic": {"draft_sample_method": "probabilistic"},
    "rejection_sample_method block": {"rejection_sample_method": "block"},
    "no speculative decoding (control)": None,
}


def main() -> int:
    from scripts_by_path import load_script

    from eagle_eval.oracle import load_oracle
    from eagle_eval.servers.check import run_server_check
    from eagle_eval.servers.options import ServerCheckOptions
    from eagle_eval.settings import Settings

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "vllm_cpu_sampling.json"))
    ap.add_argument("--limit", type=int, default=8)
    args = ap.parse_args()
    vllm_cpu = load_script("vllm_cpu")
    target, draft = REPO / "checkpoints" / "target", REPO / "checkpoints" / "draft"
    settings = Settings.of(num_steps=5, dtype="fp32", limit=args.limit, max_new_tokens=48, temperature=0.7, top_p=0.95)
    oracle = load_oracle(settings)
    results = {}
    for name, extra in CONFIGS.items():
        spec = None if extra is None else {"num_speculative_tokens": 5, **extra}
        flags = ("--per-request-spec-decode-metrics", "detailed") if spec else ()
        try:
            with vllm_cpu.serve(target, draft if spec else None, spec, extra_args=flags) as server:
                rule = "vllm-probabilistic" if (extra or {}).get("draft_sample_method") == "probabilistic" else "vllm"
                res = run_server_check(settings.with_(accept_rule=rule), ServerCheckOptions(
                    backend="vllm", url=server.url), oracle=oracle.with_(accept_rule=rule))
                r = res.report
                results[name] = {"speculative_config": spec, "rule_checked": rule, "verdict": r["verdict"],
                                 "exit_status": res.exit_status, "reasons": r["reasons"],
                                 "plausibility": {k: r["plausibility"].get(k) for k in (
                                     "verdict", "message", "tokens", "outside_support", "mean_log_p",
                                     "mean_log_p_of_samples", "p_value")},
                                 "server_mean_accept_length": r["acceptance"]["server_mean_accept_length"],
                                 "redrafted_accept_length": r["acceptance"]["redrafted_accept_length"]}
        except Exception as exc:                       # a config this build refuses: say so
            results[name] = {"speculative_config": spec, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
        print(name, json.dumps(results[name])[:600], flush=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
