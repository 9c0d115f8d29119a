"""`profile` at temperature > 0: the exact expectation of every start and the acceptance along sampled
continuations, every num_steps (and tree size) from one teacher-forced pass per batch.

Contract: `profile_prompts_sampled(oracle, prompts, options, continuations)` is what `profile_prompts` runs
when the oracle's decoding samples: the continuations (sampled from the target with each prompt's
generator, `samples_per_prompt` of them; or the given responses taken as they are, extended by sampling
past their end), the pass of speculative/profile_sampled.py per batch, the cycles along each continuation
per num_steps, and the report (results/expectation.py: which quantity each figure is, with intervals).
`ProfileResult.per_start` holds the per_start.jsonl rows.
"""

from __future__ import annotations

from eagle_eval.settings import ConfigError


def check_rule(oracle) -> None:
    """Refuse what the chosen rule cannot verify, naming the rule: trees need sglang or eagle (vLLM drafts
    chains); sampled drafts are chains; sglang-rs needs the head's draft vocab to be the target's (SGLang
    refuses a reduced vocab in rejection-sampling mode)."""
    from eagle_eval.speculative.expected import PROBABILISTIC_RULES, TREE_RULES

    dec, r = oracle.settings.decoding, oracle.resolved
    if r.topk > 1 and dec.accept_rule not in TREE_RULES:
        raise ConfigError(f"--accept-rule {dec.accept_rule} verifies chains only (vLLM has no draft trees; sampled "
                          f"drafts are chains): use --topk 1, or --accept-rule sglang or eagle for --topk {r.topk}")
    if dec.accept_rule == "sglang-rs" and r.vocab_map.draft_vocab_size != r.vocab_map.vocab_size:
        raise ConfigError(f"--accept-rule sglang-rs: the head {r.head.path or '(in memory)'} has a reduced draft vocab "
                          f"({r.vocab_map.draft_vocab_size} < {r.vocab_map.vocab_size}); SGLang's rejection sampling "
                          "needs the draft vocab to equal the target's (use --accept-rule vllm-probabilistic)")
    if dec.accept_rule in PROBABILISTIC_RULES and r.topk > 1:
        raise ConfigError(f"--accept-rule {dec.accept_rule} samples drafts along a chain: use --topk 1")


def _sequences(oracle, prompts, continuations, need: int, pad: int, batch_tokens: int) -> list[tuple]:
    """(prompt, sample, continuation of `need` tokens) per sequence: sampled, or the given ones as they are
    (extended by sampling where shorter: the loop's last verify looks max_steps tokens past the answer)."""
    from eagle_eval.speculative.profile_sampled import sampled_continuations

    spec, dec = oracle.speculator, oracle.settings.decoding
    if continuations is not None:
        given = [c[:need] for c in continuations]
        short = [i for i, c in enumerate(given) if len(c) < need]
        out = list(given)
        for length in sorted({need - len(given[i]) for i in short}):
            rows = [i for i in short if need - len(given[i]) == length]
            more = sampled_continuations(spec, [prompts[i] for i in rows], [0] * len(rows), length, pad, batch_tokens,
                                         dec, prefixes=[given[i] for i in rows])
            for i, c in zip(rows, more):
                out[i] = c
        return [(p, 0, c) for p, c in zip(prompts, out)]
    samples = dec.samples_per_prompt
    rows = [(p, s) for p in prompts for s in range(samples)]
    conts = sampled_continuations(spec, [p for p, _ in rows], [s for _, s in rows], need, pad, batch_tokens, dec)
    return [(p, s, c) for (p, s), c in zip(rows, conts)]


def profile_prompts_sampled(oracle, prompts, options, continuations=None, progress: bool = False,
                            workload: tuple[dict, list] = ({}, [])):
    from tqdm import tqdm

    from eagle_eval.commands.profiled import ProfileResult, record_of, tree_shapes
    from eagle_eval.results.expectation import QUANTITIES, cycle_starts, per_start_rows, summarize_expected
    from eagle_eval.results.report import DEFINITIONS, provenance, summarize
    from eagle_eval.speculative import profile as prof
    from eagle_eval.speculative.expected import PROBABILISTIC_RULES
    from eagle_eval.speculative.profile_sampled import profile_batch_rollouts, profile_batch_sampled
    from eagle_eval.speculative.sampling import FILTER_ORDER

    check_rule(oracle)
    settings, r, k_max = oracle.settings, oracle.resolved, options.max_steps
    dec, max_new, topk, spec, tok = settings.decoding, settings.workload.max_new_tokens, r.topk, oracle.speculator, \
        oracle.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else (min(oracle.eos_ids) if oracle.eos_ids else 0)
    seqs = _sequences(oracle, prompts, continuations, max_new + k_max, pad, options.batch_tokens)
    d_main, grid = tree_shapes(r, options)
    shapes = sorted(set(d_main.items()) | set(grid)) if topk > 1 else None
    sampled_drafts = dec.accept_rule in PROBABILISTIC_RULES
    profiled = [None] * len(seqs)
    batches = list(prof._batches([p.input_ids + c for p, _, c in seqs], 0, options.batch_tokens))
    for batch in tqdm(batches, desc="profile", unit="batch", disable=not progress):
        items = [(seqs[j][0], seqs[j][2]) for j in batch]
        if sampled_drafts:
            got = profile_batch_rollouts(spec, items, [(seqs[j][0].id, seqs[j][1]) for j in batch], k_max, max_new,
                                         pad, dec, options.rollouts)
        else:
            got = profile_batch_sampled(spec, items, k_max, max_new, pad, dec, topk, shapes,
                                        floor=options.expectation_floor)
        for j, res in zip(batch, got):
            profiled[j] = res

    def at_least(p, s, d=None):
        """P(A >= i) per start that can begin a cycle, i = 1..s."""
        n = cycle_starts(p.continuation, max_new, oracle.eos_ids)
        values = p.expected.chain if p.expected.trees is None else p.expected.trees[(s, d or d_main[s])]
        return values[:n, :s].tolist()

    def simulate(p, s, d=None):
        if p.tree_runs is None:
            return prof.simulate_cycles(p.run_lengths, p.continuation, s, max_new, oracle.eos_ids)
        runs, off = p.tree_runs[(s, d or d_main[s])]
        return prof.simulate_cycles(runs, p.continuation, s, max_new, oracle.eos_ids, off)

    def figures(s, d=None):
        """(by_num_steps section, records) for num_steps s (tree size d)."""
        units, recs = [], []
        for (prompt, sample, _), p in zip(seqs, profiled):
            unit = {"id": prompt.id, "category": prompt.category, "at_least": at_least(p, s, d)}
            if sampled_drafts:
                n = len(unit["at_least"])
                unit["variance"] = p.expected.variance[:n, :s].tolist()
            else:
                rec = record_of(p, simulate(p, s, d))
                rec.extra["sample"] = sample
                recs.append(rec)
                unit["accepted"] = rec.accepted_per_cycle
            units.append(unit)
        section = summarize(recs, s) if recs else {}
        section["expected"] = summarize_expected(units, s)
        if topk > 1:
            section["num_draft_tokens"] = d or d_main[s]
        return section, recs

    by_steps, samples, s_run, cycles = {}, [], min(r.num_steps, k_max), {}
    for s in range(1, k_max + 1):
        by_steps[str(s)], recs = figures(s)
        cycles[str(s)] = [rec.accepted_per_cycle for rec in recs]
        if s == s_run:
            samples = recs
    by_draft_tokens = {}
    for s, d in grid:
        by_draft_tokens.setdefault(str(d), {})[str(s)] = figures(s, d)[0]
    per_start, cuts = [], []
    for (prompt, sample, _), p in zip(seqs, profiled):
        n = cycle_starts(p.continuation, max_new, oracle.eos_ids)
        cut = p.expected.cut[:n].tolist() if p.expected.cut is not None else None
        cuts += [c for c in cut or [] if c > 0]
        for s, d in (shapes or [(s, None) for s in range(1, k_max + 1)]):
            var = p.expected.variance[:n].tolist() if sampled_drafts else None
            per_start += per_start_rows(prompt.id, sample, at_least(p, s, d), s, d, var, cut)
    for i, (rec, p) in enumerate(zip(samples, profiled)):
        rec.extra["run_lengths"] = p.run_lengths if p.tree_runs is None else p.tree_runs[(s_run, d_main[s_run])][0]
        rec.extra["accepted_per_cycle_by_num_steps"] = {s: c[i] for s, c in cycles.items()}
    resolved, notes = workload
    sampling = {**{k: getattr(dec, k) for k in ("temperature", "top_k", "top_p", "min_p", "accept_rule",
                                                 "accept_threshold_single", "accept_threshold_acc", "seed")},
                "filter_order": FILTER_ORDER[dec.accept_rule],
                "samples_per_prompt": 1 if continuations is not None else dec.samples_per_prompt,
                "continuations": ("given (--responses), taken as they are; extended by sampling past their end"
                                  if continuations is not None else
                                  "sampled from the target with these settings, seeded per (prompt, sample)"),
                "rollouts": options.rollouts if sampled_drafts else None,
                "expectation_floor": {"floor": options.expectation_floor, "chains_cut": len(cuts),
                                      "largest_cut": max(cuts, default=0.0),
                                      "definition": "a chain whose P(A >= i) fell below the floor was not followed "
                                                    "further off the continuation: its deeper P(A >= j) are 0, each "
                                                    "too low by less than `largest_cut` (per_start rows: `cut`)"}
                if not sampled_drafts and topk == 1 else None,
                "quantities": {**QUANTITIES,
                               "by_num_steps.summary": "realized along the sampled trajectories (one-hot rules): "
                                                       "the same counts as the greedy profile's, on these texts"}}
    if dec.accept_rule == "sglang" and (dec.accept_threshold_single < 1 or dec.accept_threshold_acc < 1):
        notes = list(notes) + ["SGLang thresholds below 1 are not lossless: the server's text is not sampled from "
                               "the target, so the figures along the target's sampled trajectories are not what "
                               "that server reports (the per-context expectation is exact)"]
    report = {"schema_version": 1, "config": {**settings.flat(), **options.as_dict(), **r.as_dict(), **resolved},
              "sampling": sampling, "by_num_steps": by_steps, "response_divergences": [], "numeric_divergences": [],
              **({"by_num_draft_tokens": by_draft_tokens} if grid else {}),
              "definitions": DEFINITIONS, "warnings": oracle.warnings + list(notes),
              "provenance": provenance(settings.decoding.seed)}
    return ProfileResult(report=report, samples=samples, oracle=oracle, profiled=profiled, per_start=per_start)
