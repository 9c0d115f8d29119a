"""Where the real vLLM 0.32 CPU build's impossible tokens at temperature > 0 sit (scripts/probe_vllm_sampling.py
finds them): for each token of each answer, p under the target at the run's settings and its place in the
server's verify cycles (its per-step accepted counts: an accepted draft, or the token a cycle adds after them,
the recovered or bonus token); and whether an impossible token is a draft-vocab id emitted without d2t.

    python scripts/probe_vllm_sampling_tokens.py --out benchmarks/results/vllm_cpu_sampling_tokens.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]


def main() -> int:
    import torch
    from safetensors.torch import load_file
    from scripts_by_path import load_script

    from eagle_eval.oracle import checked_workload, load_oracle
    from eagle_eval.servers.check import run_server_check
    from eagle_eval.servers.options import ServerCheckOptions
    from eagle_eval.settings import Settings
    from eagle_eval.rules.filters import target_probs

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "vllm_cpu_sampling_tokens.json"))
    ap.add_argument("--limit", type=int, default=6)
    args = ap.parse_args()
    vllm_cpu = load_script("vllm_cpu")
    target, draft = REPO / "checkpoints" / "target", REPO / "checkpoints" / "draft"
    settings = Settings.of(num_steps=5, dtype="fp32", limit=args.limit, max_new_tokens=48, temperature=0.7, top_p=0.95)
    oracle = load_oracle(settings)
    d2t = load_file(str(next(draft.glob("*.safetensors"))))["d2t"].long()
    with vllm_cpu.serve(target, draft, {"num_speculative_tokens": 5},
                        extra_args=("--per-request-spec-decode-metrics", "detailed")) as server:
        res = run_server_check(settings, ServerCheckOptions(backend="vllm", url=server.url), oracle=oracle)
    prompts = {p.id: p for p in checked_workload(oracle).first_prompts}
    where = {"prefill": [0, 0], "accepted draft": [0, 0], "added after the drafts": [0, 0]}   # [tokens, impossible]
    below, mapped_possible = 0, 0
    for row in res.report["requests"]:
        answer, steps = row["output_ids"], row["server"]["accepted_per_cycle"] or []
        ids = torch.tensor([prompts[row["id"]].input_ids + answer[:-1]], device=oracle.speculator.target.input_device)
        with torch.no_grad():
            logits = oracle.speculator.target.forward(ids, None)[0, len(prompts[row["id"]].input_ids) - 1:]
        p = target_probs(logits, settings.decoding).cpu()
        kind = ["prefill"]
        for n in steps:
            kind += ["accepted draft"] * n + ["added after the drafts"]
        for j, t in enumerate(answer):
            k = kind[j] if j < len(kind) else "added after the drafts"
            impossible = bool(p[j, t] == 0)
            where[k][0] += 1
            where[k][1] += impossible
            if impossible and t < len(d2t):
                below += 1
                mapped_possible += bool(p[j, t + int(d2t[t])] > 0)
    out = {"settings": {"temperature": 0.7, "top_p": 0.95, "num_speculative_tokens": 5, "prompts": args.limit,
                        "max_new_tokens": 48},
           "tokens_by_place": {k: {"tokens": v[0], "impossible": v[1]} for k, v in where.items()},
           "impossible_below_draft_vocab": below, "of_those_possible_after_d2t": mapped_possible,
           "verdict": res.report["verdict"], "reasons": res.report["reasons"]}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
