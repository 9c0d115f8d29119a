"""Training-time validation of a draft head: per-step teacher-forced accuracy and simulated accept lengths.

Contract: `validation_metrics` runs the chain from every pair at once (eagle_eval.loop.unroll.unroll_chains,
the training-time-test pattern) over build_bundled `HeadBatch`es and returns integer counts plus the
rates derived from them; `metrics_file` assembles training_metrics.json with the definitions below.
"""

from __future__ import annotations

import torch

DEFINITIONS = {
    "pair, start": "pair q = (target feature of x_q, token x_{q+1}); a chain starts at pair p >= prompt_len - 1 "
                   "(the last prompt pair or later: where a decode drafts from)",
    "acc_k": "SpecForge's per-step token accuracy at TTT step k, teacher-forced: over every start p whose "
             "step-k label exists, the share where the k-th draft of the chain from p (inputs: the true tokens "
             "x_{p+1..p+k}, the draft's own hidden states) equals the target's argmax after x_{p+k}; labels "
             "outside the draft vocab count as misses (SpecForge divides by loss_mask.sum())",
    "simulated_accept_length_specforge": "1 + sum_{k<=S} prod_{j<=k} acc_j (SpecForge's simulated_acc_len "
                                         "plus the bonus token), S = 5",
    "chain_accept_length": "1 + mean over starts p (with labels for all S steps) of the number of leading "
                           "correct drafts, capped at S: the accept length tau of a greedy chain cycle starting "
                           "at p, exactly (leading correct drafts are the true tokens, so teacher forcing is "
                           "the chain's own input); averaged over all starts, not over a decode's cycles",
    "in_draft_vocab": "share of step-1 labels that lie in the draft vocab (an upper bound on acc_1)",
    "run_histogram": "run_histogram[n] = starts whose chain has exactly n leading correct drafts (n = 0..S)",
}
SIM_STEPS = 5


def _shift_left(x: torch.Tensor, n: int, fill) -> torch.Tensor:
    """y[:, q] = x[:, q + n] (fill past the end)."""
    if n == 0:
        return x
    return torch.cat([x[:, n:], torch.full_like(x[:, :n], fill)], dim=1)


@torch.no_grad()
def validation_metrics(head, target, batches: list, num_steps: int) -> dict:
    """Counts and rates over `batches` (see DEFINITIONS); num_steps >= SIM_STEPS."""
    from eagle_eval.profile.unroll import unroll_chains

    embed = target.get_input_embeddings()
    layers = sorted(batches[0].hidden)
    correct, total = [0] * num_steps, [0] * num_steps
    in_vocab = 0
    hist = [0] * (SIM_STEPS + 1)
    for b in batches:
        aux = torch.cat([b.hidden[i] for i in layers], dim=-1)        # [B, T, k*H_t]
        drafts = unroll_chains(head, aux, embed(b.ids[:, 1:]), num_steps=num_steps, argmax_only=True)
        t = b.labels.shape[1]
        q = torch.arange(t)
        start_ok = q[None] >= b.first_start[:, None]                  # [B, T] chain starts
        hits_by_start = []                                             # step j's hit, indexed by start p
        for j in range(num_steps):
            label = _shift_left(b.labels, j, -1)                       # label of step j for start p: at pair p + j
            draft = _shift_left(drafts[j], j, -2)
            valid = start_ok & (label >= 0)
            hit = valid & (draft == label)
            correct[j] += int(hit.sum())
            total[j] += int(valid.sum())
            if j == 0:
                in_vocab += int((valid & head.t2d[label.clamp(min=0)]).sum())
            hits_by_start.append((hit, valid))
        full = start_ok & torch.stack([v for _, v in hits_by_start[:SIM_STEPS]]).all(0)   # all S labels exist
        run = torch.zeros_like(b.labels)
        alive = full.clone()
        for j in range(SIM_STEPS):
            alive &= hits_by_start[j][0]
            run += alive.long()
        hist = [h + int(((run == n) & full).sum()) for n, h in enumerate(hist)]
    acc = [c / max(n, 1) for c, n in zip(correct, total)]
    sim, prod = 1.0, 1.0
    for a in acc[:SIM_STEPS]:
        prod *= a
        sim += prod
    starts = sum(hist)
    reached = [sum(hist[n:]) for n in range(SIM_STEPS + 1)]           # starts with >= n leading hits
    return {
        "counts": {"correct": correct, "total": total, "in_draft_vocab": in_vocab, "run_histogram": hist},
        "acc": acc,
        "summary": {
            "acc": [round(a, 4) for a in acc],
            "simulated_accept_length_specforge": round(sim, 4),
            "chain_accept_length": round(1 + sum(n * h for n, h in enumerate(hist)) / max(starts, 1), 4),
            "chain_conditional_rates": [round(reached[n + 1] / max(reached[n], 1), 4) for n in range(SIM_STEPS)],
            "in_draft_vocab": round(in_vocab / max(total[0], 1), 4),
            "starts": starts,
        },
    }


def metrics_file(recipe: dict, seeds: dict, aux_hf: tuple, data: dict, phases: dict, val: dict, train: dict,
                 target: str, capture_check: dict) -> dict:
    import json
    import platform
    from importlib import metadata
    from pathlib import Path

    marker = Path(target) / "eagle-eval-source.json"
    source = json.loads(marker.read_text()) if marker.is_file() else {}
    return {
        "schema": 1,
        "head": "EAGLE-3 draft head for SmolLM2-135M-Instruct (SpecForge/SGLang layout, bf16 weights)",
        "aux_layers": {"hf": list(aux_hf), "sglang": [i - 1 for i in aux_hf], "vllm": list(aux_hf),
                       "rule": "engine default HF[2], HF[N//2], HF[N-3], N = 30"},
        "definitions": DEFINITIONS,
        "validation": {"split": "held-out instructions (own seed), the target's greedy answers", **val["summary"],
                       "counts": val["counts"]},
        "train_slice": {"split": "training batches, as many as validation has", **train["summary"],
                        "counts": train["counts"]},
        "capture_check": {"what": "features and argmax captured during generation vs one teacher-forced "
                                  "forward per sequence (first validation sequences)", **capture_check},
        "recipe": recipe,
        "seeds": seeds,
        "data": data,
        "phases_s": {k: round(v, 1) for k, v in phases.items()},
        "target": {"source": source.get("source"), "gguf_sha256": source.get("gguf_sha256"),
                   "model_safetensors_sha256": source.get("model_safetensors_sha256")},
        "builder": "scripts/build_smollm2_head.py",
        "versions": {p: metadata.version(p) for p in ("torch", "transformers", "safetensors")}
                    | {"python": platform.python_version()},
    }
