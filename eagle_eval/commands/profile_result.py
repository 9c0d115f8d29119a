"""What a profile returns, greedy or sampled: `ProfileResult`, the record of each simulated decode, and the
tree shapes (S, D) a profile covers (commands/profile.py and commands/profile_sampling.py share them)."""

from __future__ import annotations

from dataclasses import dataclass

from eagle_eval.oracle import Oracle
from eagle_eval.records import SampleRecord
from eagle_eval.settings import ProfileOptions


@dataclass
class ProfileResult:
    report: dict                       # holds by_num_steps {"1": {summary, per_position, histogram}, ...}
    samples: list[SampleRecord]        # rows carry run_lengths and accepted_per_cycle_by_num_steps
    oracle: Oracle | None = None
    profiled: list = None              # profile.teacher_forced.Profiled per prompt (continuations, run lengths)
    per_start: list | None = None      # per_start.jsonl rows: P(A >= i) of every start (results/expectation.py)


def tree_shapes(r, options: ProfileOptions) -> tuple[dict, list]:
    """Trees: ({S: D} the config's D, capped where the pool of S levels is smaller; [(S, D)] of the grid that fit)."""
    from eagle_eval.loop.tree import pool_size

    k_max, topk = options.max_steps, r.topk
    d_main = {s: min(r.num_draft_tokens, pool_size(s, topk) + 1) for s in range(1, k_max + 1)}
    grid = [(s, d) for d in (options.draft_tokens_grid or ()) for s in range(1, k_max + 1)
            if 2 <= d <= pool_size(s, topk) + 1]
    return d_main, grid


def record_of(p, d) -> SampleRecord:
    rec = SampleRecord(id=p.prompt.id, category=p.prompt.category, prompt_len=len(p.prompt.input_ids),
                       output_ids=d.output_ids, accepted_per_cycle=d.accepted_per_cycle,
                       emitted_per_cycle=d.emitted_per_cycle, verify_count=len(d.accepted_per_cycle))
    if p.tree_runs is not None:
        rec.extra["off_top1_per_cycle"] = d.off_top1_per_cycle
    return rec


def add_context(report: dict, per_start: list[dict], prompts: list) -> None:
    """The profile's acceptance by context from its per-start rows (results/context.py), greedy or sampled."""
    from eagle_eval.results.context import profile_section

    cfg = report["config"]
    report["by_context"] = profile_section(report, per_start, {p.id: len(p.input_ids) for p in prompts},
                                           cfg.get("context_buckets"), cfg.get("train_context"))
