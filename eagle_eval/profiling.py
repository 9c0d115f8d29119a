"""`profile`: exact per-cycle acceptance for every num_steps <= max_steps from one teacher-forced pass.

Contract: the orchestration of speculative/profile.py over a workload: the continuations (the target's own
batched greedy, or a responses file checked against the target's argmax and repaired in one batch),
the profile of every prompt, the cycle simulation per num_steps (and per num_draft_tokens of a tree
grid), the report and its output folder. Reached through `eagle_eval.api.profile`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle_eval.oracle import Oracle, checked_workload, load_oracle
from eagle_eval.parallel import group as parallel
from eagle_eval.parallel.settings import loaded_digests, settings_digests
from eagle_eval.results.records import Prompt, SampleRecord, read_jsonl
from eagle_eval.results.resume import workload_digests
from eagle_eval.results.run_folder import open_run_output


@dataclass
class ProfileResult:
    report: dict                       # holds by_num_steps {"1": {summary, per_position, histogram}, ...}
    samples: list[SampleRecord]        # rows carry run_lengths and accepted_per_cycle_by_num_steps
    oracle: Oracle | None = None


def _read_responses(path: str, prompts: list[Prompt], tokenizer, vocab_size: int) -> list[list[int]]:
    """Continuations from a JSONL file (`output_ids` or `text` per row), matched by `id` or by order."""
    from eagle_eval.workload.data import DataError

    rows = read_jsonl(Path(path))
    by_id = {str(r["id"]): r for r in rows if "id" in r}
    out = []
    for i, p in enumerate(prompts):
        row = by_id.get(p.id) if by_id else (rows[i] if i < len(rows) else None)
        if row is None:
            raise DataError(f"{path}: no response for prompt id {p.id!r}")
        if "output_ids" in row:
            ids = row["output_ids"]
            if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise DataError(f"{path}: response for {p.id!r}: key 'output_ids' must be a list of integers")
            bad = next((t for t in ids if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise DataError(f"{path}: response for {p.id!r}: key 'output_ids' holds token id {bad}, outside "
                                f"the target's vocabulary 0..{vocab_size - 1}")
            out.append(ids)
        elif isinstance(row.get("text"), str):
            out.append(tokenizer(row["text"], add_special_tokens=False)["input_ids"])
        else:
            raise DataError(f"{path}: response for {p.id!r} has neither 'output_ids' (a list) nor 'text' (a string)")
    return out


def profile(pcfg, progress: bool = True, oracle: Oracle | None = None) -> ProfileResult:
    """Teacher-forced profile: exact per-cycle acceptance for every num_steps <= max_steps. In a
    launched run (eagle_eval/parallel) the prompts are split between the processes and the profiles
    all-gathered, so every rank returns the same result; rank 0 alone writes the folder."""
    cfg = pcfg.run
    group = parallel.current()               # first: a replica's GPUs are chosen before CUDA starts
    torch.manual_seed(cfg.seed)
    inputs = {**cfg.input_paths(), "responses": pcfg.responses}
    group.check_same("settings", settings_digests("profile", pcfg.as_dict(), inputs))
    folder = group.on_main(lambda: open_run_output("profile", cfg, pcfg.as_dict(), inputs))
    try:
        return _profile(pcfg, folder, progress, oracle, group)
    finally:
        if folder is not None:
            folder.close()


def _profile(pcfg, folder, progress: bool, oracle: Oracle | None, group) -> ProfileResult:
    from eagle_eval.results.report import DEFINITIONS, provenance, summarize, training_prediction
    from eagle_eval.speculative import profile as prof
    from eagle_eval.speculative.tree import pool_size
    cfg, k_max = pcfg.run, pcfg.max_steps
    oracle = oracle or load_oracle(cfg)
    spec, tok = oracle.speculator, oracle.tokenizer
    need = cfg.max_new_tokens + k_max
    workload = checked_workload(cfg, oracle, need + 1)   # the same datasets, templates and filters as `run`
    prompts = workload.first_prompts              # the profile covers first turns only
    group.check_same("loaded target, head and prompts", loaded_digests(
        oracle.resolved, workload_digests(prompts), {**cfg.input_paths(), "responses": pcfg.responses}))
    vocab = oracle.limits()[0]
    pad = tok.pad_token_id if tok.pad_token_id is not None else (min(oracle.eos_ids) if oracle.eos_ids else 0)
    given = (_read_responses(pcfg.responses, prompts, tok, vocab) if pcfg.responses else [None] * len(prompts))
    # trees: the config's D (capped where the pool of S levels is smaller) and any grid D that fits
    d_main = {s: min(oracle.resolved["num_draft_tokens"], pool_size(s, cfg.topk) + 1) for s in range(1, k_max + 1)}
    grid = [(s, d) for d in (pcfg.draft_tokens_grid or ()) for s in range(1, k_max + 1)
            if 2 <= d <= pool_size(s, cfg.topk) + 1]
    tree = (cfg.topk, sorted(set(d_main.items()) | set(grid))) if cfg.topk > 1 else (1, None)
    profiled = group.map_shards(list(zip(prompts, given)),
                                lambda part: _profiled(spec, pcfg, part, need, pad, tree, progress and group.is_main),
                                weight=lambda item: len(item[0].input_ids) + need)
    found = [{"id": p.prompt.id, **p.divergence} for p in profiled if p.divergence is not None]
    # responses that are not the target's greedy were profiled on its greedy sequence from there on;
    # without responses, our own batched greedy vs the teacher-forced argmax is rounding (near-ties)
    divergences, numeric = (found, []) if pcfg.responses else ([], found)

    def simulate(p, s, d=None):
        if p.tree_runs is None:
            return prof.simulate_cycles(p.run_lengths, p.continuation, s, cfg.max_new_tokens, oracle.eos_ids)
        runs, off = p.tree_runs[(s, d or d_main[s])]
        return prof.simulate_cycles(runs, p.continuation, s, cfg.max_new_tokens, oracle.eos_ids, off)

    sims = {s: [simulate(p, s) for p in profiled] for s in range(1, k_max + 1)}
    by_steps = {}
    for s, decoded in sims.items():
        recs = [_record(p, d) for p, d in zip(profiled, decoded)]
        by_steps[str(s)] = summarize(recs, s)
        if oracle.resolved.get("train_acc") and cfg.topk == 1:
            by_steps[str(s)]["training_prediction"] = training_prediction(oracle.resolved["train_acc"],
                                                                          by_steps[str(s)], s)
        if cfg.topk > 1:
            by_steps[str(s)]["num_draft_tokens"] = d_main[s]
        if s == min(cfg.num_steps, k_max):
            samples = recs
    by_draft_tokens = {}
    for s, d in grid:
        recs = [_record(p, simulate(p, s, d)) for p in profiled]
        by_draft_tokens.setdefault(str(d), {})[str(s)] = summarize(recs, s)
    for i, (rec, p) in enumerate(zip(samples, profiled)):
        s_run = min(cfg.num_steps, k_max)
        rec.extra["run_lengths"] = p.run_lengths if p.tree_runs is None else p.tree_runs[(s_run, d_main[s_run])][0]
        rec.extra["accepted_per_cycle_by_num_steps"] = {str(s): sims[s][i].accepted_per_cycle for s in sims}
        rec.extra["response_divergence"] = p.divergence
    report = {"schema_version": 1, "config": {**pcfg.as_dict(), **oracle.resolved, **workload.resolved},
              "by_num_steps": by_steps, "response_divergences": divergences,
              "numeric_divergences": numeric,
              **({"by_num_draft_tokens": by_draft_tokens} if grid else {}),
              "definitions": DEFINITIONS, "warnings": oracle.warnings, "provenance": provenance(cfg.seed)}
    if folder is not None:
        folder.record_workload(workload_digests(prompts), resume=False)
        folder.write_text("samples.jsonl", "".join(json.dumps(r.to_json()) + "\n" for r in samples))
        folder.write_json("profile.json", report)
        folder.finish()
    return ProfileResult(report=report, samples=samples, oracle=oracle)


def _profiled(spec, pcfg, items: list[tuple[Prompt, list[int] | None]], need: int, pad: int, tree,
              progress: bool) -> list:
    """The profile of each (prompt, given response or None): the part of a profile that is split
    between processes. A response that departs from the target's argmax is profiled again on the
    target's greedy sequence from the divergence on (its `divergence` kept)."""
    from tqdm import tqdm

    from eagle_eval.speculative import profile as prof
    cfg, k_max = pcfg.run, pcfg.max_steps
    prompts = [p for p, _ in items]
    if pcfg.responses:
        conts = _extend(spec, prompts, [c[:need] for _, c in items], need, pad, pcfg.batch_tokens)
    else:
        conts = prof.greedy_continuations(spec, [p.input_ids for p in prompts], need, pad, pcfg.batch_tokens)

    def run_profile(indices, desc):
        out = {}
        seqs = [prompts[i].input_ids + conts[i] for i in indices]
        for batch in tqdm(list(prof._batches(seqs, 0, pcfg.batch_tokens)), desc=desc, unit="batch",
                          disable=not progress):
            items = [(prompts[indices[j]], conts[indices[j]]) for j in batch]
            for j, res in zip(batch, prof.profile_batch(spec, items, k_max, cfg.max_new_tokens, pad, *tree)):
                out[indices[j]] = res
        return out

    profiled = run_profile(list(range(len(prompts))), "profile")
    bad = [i for i in range(len(prompts)) if profiled[i].divergence is not None]
    if pcfg.responses and bad:
        cut = [conts[i][: profiled[i].divergence["position"]] for i in bad]
        for i, c in zip(bad, _extend(spec, [prompts[i] for i in bad], cut, need, pad, pcfg.batch_tokens)):
            conts[i] = c
        for i, res in run_profile(bad, "re-profile").items():
            res.divergence = profiled[i].divergence
            profiled[i] = res
    return [profiled[i] for i in range(len(prompts))]


def _extend(spec, prompts: list[Prompt], conts: list[list[int]], need: int, pad: int,
            batch_tokens: int) -> list[list[int]]:
    """Extend continuations greedily to `need` tokens, in batches (responses stop at max_new_tokens
    or EOS; the loop's last verify looks num_steps tokens further)."""
    from eagle_eval.speculative import profile as prof

    short = [i for i, c in enumerate(conts) if len(c) < need]
    out = [c[:need] for c in conts]
    if short:
        missing = max(need - len(conts[i]) for i in short)
        more = prof.greedy_continuations(spec, [prompts[i].input_ids + conts[i] for i in short], missing, pad,
                                         batch_tokens)
        for i, m in zip(short, more):
            out[i] = (conts[i] + m)[:need]
    return out


def _record(p, d) -> SampleRecord:
    rec = SampleRecord(id=p.prompt.id, category=p.prompt.category, prompt_len=len(p.prompt.input_ids),
                       output_ids=d.output_ids, accepted_per_cycle=d.accepted_per_cycle,
                       emitted_per_cycle=d.emitted_per_cycle, verify_count=len(d.accepted_per_cycle))
    if p.tree_runs is not None:
        rec.extra["off_top1_per_cycle"] = d.off_top1_per_cycle
    return rec
