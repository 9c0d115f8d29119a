"""`profile`: exact per-cycle acceptance for every num_steps <= max_steps from one teacher-forced pass.

Contract: `profile_prompts(oracle, prompts, options, continuations)` is the orchestration of
profile/teacher_forced.py over prompts in memory: the continuations (given, checked against the target's
argmax and repaired in one batch, or the target's own batched greedy), the profile of every prompt, the
cycle simulation per num_steps (and per num_draft_tokens of a tree grid) and the report. `profile(settings,
options)` is the command: it reads the workload and a --responses file and owns the output folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eagle_eval.commands.folder import agree_on_loaded, open_folder
from eagle_eval.errors import stage
from eagle_eval.commands.profile_result import ProfileResult, add_context, record_of, tree_shapes  # noqa: F401  (ProfileResult: api)
from eagle_eval.oracle import Oracle, checked_workload, load_oracle
from eagle_eval import parallel
from eagle_eval.records import Prompt, read_jsonl
from eagle_eval.results.resume import workload_digests
from eagle_eval.settings import ProfileOptions, Settings


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


def profile(settings: Settings, options: ProfileOptions = ProfileOptions(), progress: bool = True,
            oracle: Oracle | None = None) -> ProfileResult:
    """Teacher-forced profile of the settings' workload: exact per-cycle acceptance for every num_steps <= max_steps."""
    from eagle_eval.commands.effect import refuse_no_effect, refuse_unfit_grid

    topks = (settings.speculation.topk,)
    refuse_no_effect([settings.decoding], options, topks, responses=options.responses is not None)
    refuse_unfit_grid(topks, options)
    torch.manual_seed(settings.decoding.seed)
    folder = open_folder("profile", settings, options)
    try:
        oracle = load_oracle(settings, like=oracle)
        oracle.refuse_load_errors()
        result = profile_oracle(oracle, options, progress)
        if folder is not None:
            folder.record_workload(workload_digests([p.prompt for p in result.profiled]), resume=False)
            folder.write_text("samples.jsonl", "".join(json.dumps(r.to_json()) + "\n" for r in result.samples))
            folder.write_json("profile.json", result.report)
            if result.per_start is not None:
                folder.write_text("per_start.jsonl", "".join(json.dumps(r) + "\n" for r in result.per_start))
            folder.finish()
        return result
    finally:
        if folder is not None:
            folder.close()


def profile_oracle(oracle: Oracle, options: ProfileOptions = ProfileOptions(), progress: bool = False) -> ProfileResult:
    """The profile of the oracle's own workload (its settings' prompts, first turns, the same datasets, templates
    and filters as `run`), on the continuations of --responses when given."""
    workload = checked_workload(oracle, oracle.settings.workload.max_new_tokens + options.max_steps + 1)
    prompts = workload.first_prompts
    agree_on_loaded(oracle, prompts)
    conts = (_read_responses(options.responses, prompts, oracle.tokenizer, oracle.limits()[0])
             if options.responses else None)
    return profile_prompts(oracle, prompts, options, conts, progress, workload=(workload.resolved, workload.warnings))


def profile_prompts(oracle: Oracle, prompts: list[Prompt], options: ProfileOptions = ProfileOptions(),
                    continuations: list[list[int]] | None = None, progress: bool = False,
                    workload: tuple[dict, list] = ({}, [])) -> ProfileResult:
    """The profile of `prompts` (first turns) with the oracle's settings. continuations: given responses
    (token ids per prompt, e.g. a server's), checked against the target's argmax; None = the target's own
    greedy. workload: (what the workload resolved, its warnings), echoed in the report. In a launched run the
    prompts are split between the processes and every rank returns the same result. At temperature > 0:
    commands/profile_sampling.py (continuations sampled, or given ones taken as they are)."""
    if not oracle.settings.decoding.greedy:
        from eagle_eval.commands.profile_sampling import profile_prompts_sampled
        return profile_prompts_sampled(oracle, prompts, options, continuations, progress, workload)

    from eagle_eval.results.expectation import cycle_starts, per_start_rows
    from eagle_eval.results.report import DEFINITIONS, provenance, summarize, training_prediction
    from eagle_eval.profile import teacher_forced as prof
    settings, r, k_max = oracle.settings, oracle.resolved, options.max_steps
    max_new, topk = settings.workload.max_new_tokens, r.topk
    tok = oracle.tokenizer
    need = max_new + k_max
    pad = tok.pad_token_id if tok.pad_token_id is not None else (min(oracle.eos_ids) if oracle.eos_ids else 0)
    given = continuations is not None
    d_main, grid = tree_shapes(r, options)
    tree = (topk, sorted(set(d_main.items()) | set(grid))) if topk > 1 else (1, None)
    group = parallel.current()           # in a launched run: the prompts split, the profiles all-gathered
    items = list(zip(prompts, continuations if given else [None] * len(prompts)))
    profiled = group.map_shards(items, lambda part: _profiled(oracle, part, options, need, pad, tree, given,
                                                             progress and group.is_main),
                                weight=lambda item: len(item[0].input_ids) + need)
    found = [{"id": p.prompt.id, **p.divergence} for p in profiled if p.divergence is not None]
    # given responses that are not the target's greedy were profiled on its greedy sequence from there on;
    # without them, our own batched greedy vs the teacher-forced argmax is rounding (near-ties, e.g. in bf16)
    divergences, numeric = (found, []) if given else ([], found)

    def simulate(p, s, d=None):
        if p.tree_runs is None:
            return prof.simulate_cycles(p.runs(s), p.continuation, s, max_new, oracle.eos_ids)
        runs, off = p.tree_runs[(s, d or d_main[s])]
        return prof.simulate_cycles(runs, p.continuation, s, max_new, oracle.eos_ids, off)

    sims = {s: [simulate(p, s) for p in profiled] for s in range(1, k_max + 1)}
    by_steps = {}
    s_run = min(r.num_steps, k_max)
    for s, decoded in sims.items():
        recs = [record_of(p, d) for p, d in zip(profiled, decoded)]
        by_steps[str(s)] = summarize(recs, s)
        if r.train_acc and topk == 1:
            by_steps[str(s)]["training_prediction"] = training_prediction(r.train_acc, by_steps[str(s)], s)
        if topk > 1:
            by_steps[str(s)]["num_draft_tokens"] = d_main[s]
        if s == s_run:
            samples = recs
    by_draft_tokens = {}
    for s, d in grid:
        recs = [record_of(p, simulate(p, s, d)) for p in profiled]
        by_draft_tokens.setdefault(str(d), {})[str(s)] = summarize(recs, s)
    for i, (rec, p) in enumerate(zip(samples, profiled)):
        rec.extra["run_lengths"] = p.runs(s_run) if p.tree_runs is None else p.tree_runs[(s_run, d_main[s_run])][0]
        rec.extra["accepted_per_cycle_by_num_steps"] = {str(s): sims[s][i].accepted_per_cycle for s in sims}
        rec.extra["response_divergence"] = p.divergence
    per_start = []
    for p in profiled:                   # temperature 0: P(A >= i) of a start is 1 up to its run length, then 0
        for s, d in (tree[1] or [(s, None) for s in range(1, k_max + 1)]):
            runs = p.runs(s) if p.tree_runs is None else p.tree_runs[(s, d)][0]
            n = cycle_starts(p.continuation, max_new, oracle.eos_ids)
            per_start += per_start_rows(p.prompt.id, 0, [[float(i < x) for i in range(s)] for x in runs[:n]], s, d,
                                        prompt_len=len(p.prompt.input_ids))
    resolved, notes = workload
    report = {"schema_version": 1, "config": {**settings.flat(), **options.as_dict(), **r.as_dict(), **resolved},
              "by_num_steps": by_steps, "response_divergences": divergences,
              "numeric_divergences": numeric,
              **({"by_num_draft_tokens": by_draft_tokens} if grid else {}),
              "definitions": DEFINITIONS, "warnings": oracle.warnings + list(notes),
              "provenance": provenance(settings.decoding.seed)}
    add_context(report, per_start, [p.prompt for p in profiled])
    return ProfileResult(report=report, samples=samples, oracle=oracle, profiled=profiled, per_start=per_start)


def _profiled(oracle: Oracle, items: list[tuple[Prompt, list[int] | None]], options: ProfileOptions, need: int,
              pad: int, tree, given: bool, progress: bool) -> list:
    """The profile of each (prompt, given continuation or None): the part of a profile a launched run splits
    between its processes. A given continuation that departs from the target's argmax is profiled again on the
    target's greedy sequence from the divergence on (its `divergence` kept)."""
    from tqdm import tqdm

    from eagle_eval.profile import teacher_forced as prof

    spec, max_new, k_max = oracle.speculator, oracle.settings.workload.max_new_tokens, options.max_steps
    prompts = [p for p, _ in items]
    if given:
        conts = _extend(spec, prompts, [c[:need] for _, c in items], need, pad, options.batch_tokens, progress)
    else:
        with tqdm(total=len(prompts) * need, desc="generate", unit="tok", disable=not progress) as bar, \
                stage([p.id for p in prompts], "generate (the target's greedy continuations)"):
            conts = prof.greedy_continuations(spec, [p.input_ids for p in prompts], need, pad, options.batch_tokens,
                                              progress=bar.update)

    def run_profile(indices, desc):
        out = {}
        seqs = [prompts[i].input_ids + conts[i] for i in indices]
        for batch in tqdm(list(prof.batches(seqs, 0, options.batch_tokens)), desc=desc, unit="batch",
                          disable=not progress):
            part = [(prompts[indices[j]], conts[indices[j]]) for j in batch]
            with stage([p.id for p, _ in part], desc):
                for j, res in zip(batch, prof.profile_batch(spec, part, k_max, max_new, pad, *tree)):
                    out[indices[j]] = res
        return out

    profiled = run_profile(list(range(len(prompts))), "profile")
    bad = [i for i in range(len(prompts)) if profiled[i].divergence is not None]
    if given and bad:
        cut = [conts[i][: profiled[i].divergence["position"]] for i in bad]
        for i, c in zip(bad, _extend(spec, [prompts[i] for i in bad], cut, need, pad, options.batch_tokens, progress)):
            conts[i] = c
        for i, res in run_profile(bad, "re-profile").items():
            res.divergence = profiled[i].divergence
            profiled[i] = res
    return [profiled[i] for i in range(len(prompts))]


def _extend(spec, prompts: list[Prompt], conts: list[list[int]], need: int, pad: int,
            batch_tokens: int, progress: bool = False) -> list[list[int]]:
    """Extend continuations greedily to `need` tokens, in batches (responses stop at max_new_tokens
    or EOS; the loop's last verify looks num_steps tokens further)."""
    from eagle_eval.profile import teacher_forced as prof

    short = [i for i, c in enumerate(conts) if len(c) < need]
    out = [c[:need] for c in conts]
    if short:
        missing = max(need - len(conts[i]) for i in short)
        from tqdm import tqdm

        with tqdm(total=len(short) * missing, desc="extend", unit="tok", disable=not progress) as bar, \
                stage([prompts[i].id for i in short], "extend (the responses, greedily)"):
            more = prof.greedy_continuations(spec, [prompts[i].input_ids + conts[i] for i in short], missing, pad,
                                             batch_tokens, progress=bar.update)
        for i, m in zip(short, more):
            out[i] = (conts[i] + m)[:need]
    return out
