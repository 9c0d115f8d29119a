"""The speedup model's costs for `ablate`: given (--cost-ratio, a server's step times) or timed on this device, and
the rows they turn a profile's counts into.

Contract: `Costs` holds c (a draft step over a target step; a block drafter's one draft forward, per block length
where timed) and r(n) (a verify forward of n tokens over a target step); `measure_costs(oracle, sizes)` times them
(profile/costs.py `measure_timings`, interleaved rounds until narrow); `variant_rows` makes one ablation row per
num_steps of a profile section: tau, u_i, a_i and the modelled speedup (docs/eagle3.md section 5)
S(k) = (1 + sum_{i<=k} u_i) / (k c + r(k)), or for a block drafter (`one_forward`: the k drafts of a cycle come from
one forward of k + 1 rows) S(k) = (1 + sum u_i) / (c(k + 1) + r(k)). `timings_of` gives stats/advice.py the samples
it decides from.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from eagle_eval.results.expectation import section_rates
from eagle_eval.settings import AblateOptions
from eagle_eval.stats.acceptance import speedup


@dataclass(frozen=True)
class Costs:
    """c = T_draft_step / T_target_step and r = T_verify(n tokens) / T_target(1 token), where a
    verify forward holds n = num_steps + 1 tokens for a chain and num_draft_tokens for a tree."""
    cost_ratio: float
    verify_ratio: dict                 # n verify tokens -> r
    source: str                        # "measured on DEVICE" or "given (--cost-ratio)"
    times_ms: dict | None = None
    block_ratio: dict = field(default_factory=dict)    # a block drafter: n rows -> c of its one draft forward

    def r(self, verify_tokens: int) -> float:
        return self.verify_ratio.get(verify_tokens, 1.0)

    def c(self, num_steps: int, one_forward: bool) -> float:
        """c of one draft forward: a block drafter's block of num_steps + 1 rows where timed, else cost_ratio."""
        return self.block_ratio.get(num_steps + 1, self.cost_ratio) if one_forward else self.cost_ratio


CHAIN_MODEL = ("S = (1 + sum_{i<=S} u_i) / (S c + r), c = T_draft_step / T_target_step, "
               "r = T_verify(S+1 tokens, or num_draft_tokens for a tree) / T_target(1 token)")
BLOCK_MODEL = ("S = (1 + sum_{i<=S} u_i) / (c(S+1) + r), c(n) = T_draft(one forward of a block of n rows) / "
               "T_target_step, r = T_verify(S+1 tokens) / T_target(1 token)")


def measure_costs(oracle, verify_sizes, progress: bool = False) -> tuple[Costs, object]:
    """The speedup model's costs timed on this device (profile/costs.py: interleaved rounds of every
    timing until each median interval is narrow, or a limit) -> (Costs from the medians, the TimingRun)."""
    from eagle_eval.profile.costs import measure_timings

    run = measure_timings(oracle.speculator, verify_sizes)
    t = run.timings
    sizes = sorted(t.verify_ms)
    c = t.ratios(sizes[0] if sizes else 1)[0]
    costs = Costs(cost_ratio=c, verify_ratio={n: t.ratios(n)[1] for n in sizes},
                  block_ratio={n: t.block_ratio(n) for n in t.block_ms},
                  source=f"measured on {oracle.speculator.draft_device} ({run.rounds} rounds, "
                         f"{'narrow' if run.narrow else 'NOT narrow: widest median interval '}"
                         f"{'' if run.narrow else f'+-{run.widest:.1%}'})",
                  times_ms={"target_1_token": statistics.median(t.target_ms), "draft_step": statistics.median(t.draft_ms),
                            "verify": {str(n): statistics.median(xs) for n, xs in t.verify_ms.items()},
                            **({"draft_block": {str(n): statistics.median(xs) for n, xs in t.block_ms.items()}}
                               if t.block_ms else {})})
    return costs, run


def variant_rows(name: str, by_num_steps: dict, costs: Costs, server: Costs | None, topk: int = 1,
                 num_draft_tokens: int | None = None, temperature: float = 0.0,
                 one_forward: bool = False) -> list[dict]:
    """One row per num_steps; chains verify S+1 tokens, trees num_draft_tokens (given, or the section's). At
    temperature > 0, tau and u_i are the expectation (results/expectation.py `section_rates` says which one, in
    `rates`), tau_sampled the accept length realized along the sampled continuations. `one_forward`: a block
    drafter's rows, whose drafts cost one draft forward per cycle (module docstring)."""
    rows = []
    for s, section in sorted(by_num_steps.items(), key=lambda kv: int(kv[0])):
        k = int(s)
        d = num_draft_tokens or section.get("num_draft_tokens") or k + 1
        rates = section_rates(section)
        u, a, summary = rates["u"], rates["a"], section.get("summary") or {}
        row = {"variant": name, "num_steps": k, "topk": topk, "num_draft_tokens": d, "temperature": temperature,
               "tau": rates["tau"], "rates": rates["source"],
               "tau_sampled": summary.get("accept_length") if temperature > 0 else None,
               "cycles": summary.get("cycles"), "accepted_drafts": summary.get("accepted_drafts"),
               "speedup_model": speedup(u, costs.c(k, one_forward), costs.r(d), one_forward)}
        if server is not None:
            row["speedup_server"] = speedup(u, server.c(k, one_forward), server.r(d), one_forward)
        row.update({f"u_{i + 1}": v for i, v in enumerate(u)})
        row.update({f"a_{i + 1}": v for i, v in enumerate(a)})
        rows.append(row)
    return rows


def timings_of(timing, options: AblateOptions):
    """The timings the advice is decided from: measured, or given (--cost-ratio: no timing noise)."""
    from eagle_eval.stats.advice import Timings

    return timing.timings if timing is not None else Timings.given(options.cost_ratio)


def timing_dict(timing) -> dict | None:
    if timing is None:
        return None
    t = timing.timings
    return {"rounds": timing.rounds, "narrow": timing.narrow, "widest": timing.widest, "rule": timing.rule,
            "samples_ms": {"target_1_token": list(t.target_ms), "draft_step": list(t.draft_ms),
                           "verify": {str(n): list(xs) for n, xs in t.verify_ms.items()}}}
