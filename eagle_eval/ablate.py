"""Ablations: acceptance and modelled speedup over num_steps (one profile) and over re-run axes.

Contract: a variant is the base RunConfig with some fields replaced (`--vary FIELD=VALUE`); each
variant costs one profile, which gives every num_steps <= max_steps at once. The speedup model is
EAGLE3.md section 5: S(k) = (1 + sum_{i<=k} u_i) / (k c + r(k)), with c and r(k) timed on the
current device (`measure_costs`) or given.

Why here, beside api.py: an ablation is a set of runs (it replaces RunConfig fields and calls the
profile once per variant), so it belongs to the door that wires the stages, not to one stage; its
CSV and PNG writers live in `results/` like every other writer.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, fields, replace

import torch

from eagle_eval.config import ConfigError, RunConfig, parse_ids
from eagle_eval.results.acceptance import speedup


@dataclass(frozen=True)
class Costs:
    """c = T_draft_step / T_target_step and r = T_verify(n tokens) / T_target(1 token), where a
    verify forward holds n = num_steps + 1 tokens for a chain and num_draft_tokens for a tree."""
    cost_ratio: float
    verify_ratio: dict                 # n verify tokens -> r
    source: str                        # "measured on DEVICE" or "given (--cost-ratio)"
    times_ms: dict | None = None

    def r(self, verify_tokens: int) -> float:
        return self.verify_ratio.get(verify_tokens, 1.0)


def parse_variant(text: str) -> tuple[str, dict]:
    """'aux_layers=0,3,6' -> ('aux_layers=0,3,6', {'aux_layers': (0, 3, 6)}); several with ';'."""
    overrides = {}
    types = {f.name: f.type for f in fields(RunConfig)}
    for part in text.split(";"):
        if "=" not in part:
            raise ConfigError(f"--vary {text!r}: expected FIELD=VALUE (e.g. aux_layers=0,3,6 or dtype=bf16)")
        key, value = (s.strip() for s in part.split("=", 1))
        key = key.replace("-", "_")
        if key not in types or key in ("output_dir", "resume", "overwrite", "prompts", "target", "draft", "seed"):
            raise ConfigError(f"--vary {key!r}: not an ablation axis; use a field of `run` such as "
                              "aux_layers, aux_convention, dtype, max_new_tokens, draft_embedding, position_offset")
        overrides[key] = _parse_value(key, types[key], value)
    return text, overrides


def _parse_value(key: str, type_name: str, value: str):
    if key == "aux_layers":
        return parse_ids(value)
    if "bool" in str(type_name):
        if value.lower() not in ("true", "false", "1", "0", "on", "off"):
            raise ConfigError(f"--vary {key}={value}: expected true or false")
        return value.lower() in ("true", "1", "on")
    if "int" in str(type_name) and "None" not in str(type_name).split("|")[0]:
        try:
            return int(value)
        except ValueError as exc:
            raise ConfigError(f"--vary {key}={value}: expected an integer") from exc
    return None if value.lower() == "none" else value


@torch.no_grad()
def measure_costs(oracle, verify_sizes, context: int = 128, reps: int = 5) -> Costs:
    """Time one target token, verify forwards of each size in `verify_sizes` and one draft step."""
    spec = oracle.speculator
    target, head = spec.target, spec.head
    device = spec.draft_device
    vocab = target.info.vocab_size
    ids = torch.randint(0, vocab, (1, context))
    cache = target.new_cache()
    target.forward(ids, cache)

    def timed(fn) -> float:
        samples = []
        for _ in range(reps + 1):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples[1:]) * 1e3        # first call is a warm-up

    def verify(n):
        target.forward(torch.randint(0, vocab, (1, n)), cache)
        target.rollback(cache, context)

    from eagle_eval.spec.draft import DraftState
    state = DraftState(head, spec.embed)
    state.extend(torch.randn(1, context, head.config.num_aux * head.config.target_hidden_size,
                             device=device, dtype=head.lm_head.weight.dtype),
                 torch.randint(0, vocab, (1, context), device=device))
    token = torch.randint(0, vocab, (1, 1), device=device)
    position = torch.tensor([[context]], device=device)

    def draft_step():              # one head forward + lm_head + argmax, as in each decode step
        out = head.step(spec.embed(token), state.last_out, position, state.cache)
        head.logits(out).argmax(-1)
        state.cache.rollback(context)

    t_target = timed(lambda: verify(1))
    t_verify = {n: timed(lambda n=n: verify(n)) for n in sorted(set(verify_sizes))}
    t_draft = timed(draft_step)
    return Costs(cost_ratio=t_draft / t_target, verify_ratio={k: v / t_target for k, v in t_verify.items()},
                 source=f"measured on {device}",
                 times_ms={"target_1_token": t_target, "draft_step": t_draft,
                           "verify": {str(k): v for k, v in t_verify.items()}})


def variant_rows(name: str, by_num_steps: dict, costs: Costs, server: Costs | None, topk: int = 1,
                 num_draft_tokens: int | None = None) -> list[dict]:
    """One row per num_steps; chains verify S+1 tokens, trees num_draft_tokens (given, or the section's)."""
    rows = []
    for s, section in sorted(by_num_steps.items(), key=lambda kv: int(kv[0])):
        k = int(s)
        d = num_draft_tokens or section.get("num_draft_tokens") or k + 1
        u = [p["unconditional_rate"] or 0.0 for p in section["per_position"]]
        a = [p["conditional_rate"] for p in section["per_position"]]
        row = {"variant": name, "num_steps": k, "topk": topk, "num_draft_tokens": d,
               "tau": section["summary"]["accept_length"],
               "cycles": section["summary"]["cycles"], "accepted_drafts": section["summary"]["accepted_drafts"],
               "speedup_model": speedup(u, costs.cost_ratio, costs.r(d))}
        if server is not None:
            row["speedup_server"] = speedup(u, server.cost_ratio, server.r(d))
        row.update({f"u_{i + 1}": v for i, v in enumerate(u)})
        row.update({f"a_{i + 1}": v for i, v in enumerate(a)})
        rows.append(row)
    return rows


def best_num_steps(rows: list[dict], key: str = "speedup_model") -> int:
    return max(rows, key=lambda r: r[key])["num_steps"]


def best_row(rows: list[dict], key: str = "speedup_model") -> dict:
    return max(rows, key=lambda r: r[key])


def apply(base: RunConfig, overrides: dict) -> RunConfig:
    return replace(base, **overrides)
