"""`profile` at temperature > 0: the exact expectation of every start and the acceptance along sampled
continuations, every num_steps (and tree size) from one teacher-forced pass per batch.

Contract: `profile_prompts_sampled(oracle, prompts, options, continuations)` is what `profile_prompts` runs
when the oracle's decoding samples: the continuations (sampled from the target with each prompt's
generator, `samples_per_prompt` of them; or the given responses taken as they are, extended by sampling
past their end), the pass of profile/sampled.py per batch, the cycles along each continuation
per num_steps (only where the rule's realized acceptance is the prefix match along a sample of p,
`expected.realized_along_samples`: not for sampled drafts, not under SGLang's thresholds below 1), and the
report (results/expectation.py: which quantity each figure is, with intervals).
`ProfileResult.per_start` holds the per_start.jsonl rows.
"""

from __future__ import annotations

from eagle_eval.errors import stage


def _sequences(oracle, prompts, continuations, need: int, pad: int, batch_tokens: int,
               samples: int = 1) -> list[tuple]:
    """(prompt, sample, continuation of `need` tokens) per sequence: sampled, or the given ones as they are
    (extended by sampling where shorter: the loop's last verify looks max_steps tokens past the answer)."""
    from eagle_eval.profile.sampled import sampled_continuations

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
    rows = [(p, s) for p in prompts for s in range(samples)]
    conts = sampled_continuations(spec, [p for p, _ in rows], [s for _, s in rows], need, pad, batch_tokens, dec)
    return [(p, s, c) for (p, s), c in zip(rows, conts)]


class _Profile:
    """One T > 0 profile under way: the sequences (prompt, sample, continuation), their Profiled (one pass per
    batch), and what the report makes of them."""

    def __init__(self, oracle, options, seqs, pad: int):
        from eagle_eval.commands.profile_result import tree_shapes
        from eagle_eval.profile.expected import realized_along_samples
        from eagle_eval.rules.base import rule

        self.oracle, self.options, self.seqs, self.pad = oracle, options, seqs, pad
        self.max_new, self.topk = oracle.settings.workload.max_new_tokens, oracle.resolved.topk
        self.d_main, self.grid = tree_shapes(oracle.resolved, options)
        self.shapes = sorted(set(self.d_main.items()) | set(self.grid)) if self.topk > 1 else None
        self.sampled_drafts = rule(oracle.settings.decoding.accept_rule).sampled_drafts
        self.realized = realized_along_samples(oracle.settings.decoding)    # the cycles along the texts count
        self.profiled = [None] * len(seqs)

    def run(self, progress: bool) -> None:
        from tqdm import tqdm

        from eagle_eval.profile import teacher_forced as prof

        opts = self.options
        # rollouts multiply the drafting rows: the batch budget is shared among them
        budget = max(1, opts.batch_tokens // opts.rollouts) if self.sampled_drafts and opts.rollouts else \
            opts.batch_tokens
        batches = list(prof.batches([p.input_ids + c for p, _, c in self.seqs], 0, budget))
        for batch in tqdm(batches, desc="profile", unit="batch", disable=not progress):
            with stage(list(dict.fromkeys(self.seqs[j][0].id for j in batch)), "profile"):
                self._profile_batch(batch)

    def _profile_batch(self, batch: list[int]) -> None:
        """The pass of profile/sampled.py over the sequences `batch` (indices into self.seqs)."""
        from eagle_eval.profile.sampled import (profile_batch_rollouts, profile_batch_sampled,
                                                            profile_batch_weighted)

        spec, dec, k_max, opts = self.oracle.speculator, self.oracle.settings.decoding, self.options.max_steps, \
            self.options
        items = [(self.seqs[j][0], self.seqs[j][2]) for j in batch]
        if self.sampled_drafts and not opts.rollouts:
            got = profile_batch_weighted(spec, items, k_max, self.max_new, self.pad, dec)
        elif self.sampled_drafts:
            keys = [(self.seqs[j][0].id, self.seqs[j][1]) for j in batch]
            got = profile_batch_rollouts(spec, items, keys, k_max, self.max_new, self.pad, dec, opts.rollouts)
        else:
            got = profile_batch_sampled(spec, items, k_max, self.max_new, self.pad, dec, self.topk, self.shapes,
                                        floor=opts.expectation_floor)
        for j, res in zip(batch, got):
            self.profiled[j] = res

    def starts(self, p) -> int:
        from eagle_eval.results.expectation import cycle_starts
        return cycle_starts(p.continuation, self.max_new, self.oracle.eos_ids)

    def at_least(self, p, s: int, d: int | None = None) -> list[list[float]]:
        """P(A >= i), i = 1..s, of every start that can begin a cycle."""
        values = p.expected.chain if p.expected.trees is None else p.expected.trees[(s, d or self.d_main[s])]
        return values[: self.starts(p), :s].tolist()

    def simulate(self, p, s: int, d: int | None = None):
        from eagle_eval.profile import teacher_forced as prof

        eos = self.oracle.eos_ids
        if p.tree_runs is None:
            return prof.simulate_cycles(p.run_lengths, p.continuation, s, self.max_new, eos)
        runs, off = p.tree_runs[(s, d or self.d_main[s])]
        return prof.simulate_cycles(runs, p.continuation, s, self.max_new, eos, off)

    def figures(self, s: int, d: int | None = None) -> tuple[dict, list]:
        """(by_num_steps section, records) for num_steps s (tree size d): the realized counts and `expected`, the
        three figures of results/expectation.py, where the prefix match along the texts is the rule's realized
        acceptance (`self.realized`); else `expected` holds the per-context figure alone."""
        from eagle_eval.commands.profile_result import record_of
        from eagle_eval.results.expectation import summarize_expected
        from eagle_eval.results.report import summarize

        units, recs = [], []
        for (prompt, sample, _), p in zip(self.seqs, self.profiled):
            unit = {"id": prompt.id, "category": prompt.category, "at_least": self.at_least(p, s, d)}
            if p.expected.variance is not None:
                unit["variance"] = p.expected.variance[: len(unit["at_least"]), :s].tolist()
            if self.realized:
                rec = record_of(p, self.simulate(p, s, d))
                rec.extra["sample"] = sample
                recs.append(rec)
                unit["accepted"] = rec.accepted_per_cycle
            units.append(unit)
        section = summarize(recs, s) if recs else {}
        section["expected"] = summarize_expected(units, s)
        if self.topk > 1:
            section["num_draft_tokens"] = d or self.d_main[s]
        return section, recs

    def per_start(self) -> tuple[list[dict], list[float]]:
        """(the per_start.jsonl rows, the P(A >= i) of every chain cut at the floor)."""
        from eagle_eval.results.expectation import per_start_rows

        rows, cuts = [], []
        for (prompt, sample, _), p in zip(self.seqs, self.profiled):
            n = self.starts(p)
            cut = p.expected.cut[:n].tolist() if p.expected.cut is not None else None
            cuts += [c for c in cut or [] if c > 0]
            var = p.expected.variance[:n].tolist() if p.expected.variance is not None else None
            for s, d in (self.shapes or [(s, None) for s in range(1, self.options.max_steps + 1)]):
                rows += per_start_rows(prompt.id, sample, self.at_least(p, s, d), s, d, var, cut,
                                       prompt_len=len(prompt.input_ids))
        return rows, cuts

    def sampling(self, given: bool, cuts: list[float]) -> dict:
        """The report's `sampling` section: the settings, the filter order, what each figure is."""
        from eagle_eval.results.expectation import QUANTITIES
        from eagle_eval.rules.base import rule

        dec, opts = self.oracle.settings.decoding, self.options
        floor = {"floor": opts.expectation_floor, "starts_cut": len(cuts), "largest_cut": max(cuts, default=0.0),
                 "definition": ("a chain whose P(A >= i) fell below the floor was not followed further off the "
                                "continuation: its deeper P(A >= j) are 0, each too low by less than `largest_cut` "
                                "(per_start rows: `cut`)" if self.topk == 1 else
                                "a tree node off the continuation whose reach probability (largest over the tree "
                                "shapes) fell below the floor was not expanded: its descendants' reach is 0, and each "
                                "P(A >= d) of that start is too low by at most the start's summed cut reach, "
                                "`largest_cut` at most (per_start rows: `cut`)")}
        return {**{k: getattr(dec, k) for k in ("temperature", "top_k", "top_p", "min_p", "accept_rule",
                                                 "accept_threshold_single", "accept_threshold_acc", "seed")},
                "filter_order": rule(dec.accept_rule).filter_order,
                "samples_per_prompt": 1 if given else opts.samples_per_prompt,
                "continuations": ("given (--responses), taken as they are; extended by sampling past their end"
                                  if given else "sampled from the target with these settings, seeded per (prompt, "
                                                "sample)"),
                "rollouts": opts.rollouts if self.sampled_drafts else None,
                "draft_estimator": None if not self.sampled_drafts else (
                    f"{opts.rollouts} rollouts per start: paths drawn from min(p, q) / sum min(p, q), the mean of "
                    "the product of the overlaps; exact at i = 1, unbiased deeper, its variance per start in "
                    "per_start rows (`variance`)" if opts.rollouts else
                    "importance-weighted along the sampled continuation: prod_{i<k} min(1, q_i / p_i) at the "
                    "continuation's tokens times sum min(p_k, q_k); exact at i = 1, unbiased deeper (one draw per "
                    "start, no extra target forward); its noise is inside the interval over prompts"),
                "expectation_floor": None if self.sampled_drafts else floor,
                "quantities": {**QUANTITIES,
                               "by_num_steps.summary": "realized along the sampled trajectories (one-hot rules whose "
                                                       "output is plain sampling from p): the same counts as the "
                                                       "greedy profile's, on these texts"}}


def _profile_shards(oracle, prompts, options, continuations, pad: int, progress: bool) -> _Profile:
    """The sequences and their pass, the prompts split between the processes of a launched run (each prompt's
    samples stay together; every draw is seeded per (prompt, sample), so the split changes no figure)."""
    from eagle_eval import parallel

    need = oracle.settings.workload.max_new_tokens + options.max_steps
    group = parallel.current()

    def part(items):
        conts = None if continuations is None else [c for _, c in items]
        with stage([p.id for p, _ in items], "sample continuations"):
            seqs = _sequences(oracle, [p for p, _ in items], conts, need, pad, options.batch_tokens,
                              options.samples_per_prompt)
        run = _Profile(oracle, options, seqs, pad)
        run.run(progress and group.is_main)
        per = len(run.seqs) // max(1, len(items))          # _sequences: each prompt's samples side by side
        pairs = list(zip(run.seqs, run.profiled))
        return [pairs[i * per:(i + 1) * per] for i in range(len(items))]

    items = list(zip(prompts, continuations if continuations is not None else [None] * len(prompts)))
    done = group.map_shards(items, part, weight=lambda item: (len(item[0].input_ids) + need)
                            * (1 if continuations is not None else options.samples_per_prompt))
    pairs = [pair for rows in done for pair in rows]
    run = _Profile(oracle, options, [seq for seq, _ in pairs], pad)
    run.profiled = [prof for _, prof in pairs]
    return run


def profile_prompts_sampled(oracle, prompts, options, continuations=None, progress: bool = False,
                            workload: tuple[dict, list] = ({}, [])):
    """`profile_prompts` at temperature > 0 (module docstring) -> ProfileResult with `per_start`."""
    from eagle_eval.commands.profile_result import ProfileResult
    from eagle_eval.results.report import DEFINITIONS, provenance

    from eagle_eval.settings import ConfigError
    from eagle_eval.rules.base import rule

    settings, r, k_max = oracle.settings, oracle.resolved, options.max_steps
    dec, tok = settings.decoding, oracle.tokenizer
    if getattr(oracle.speculator.draft_state, "run_lengths", None) is not None:     # drafts that depend on num_steps
        raise ConfigError(f"profile at --temperature {dec.temperature:g} with a {r.head.kind} draft: the expectation "
                          "per start is not implemented for drafts made by one forward per cycle (block drafters, "
                          "P-EAGLE's parallel drafting); `eagle-eval run` runs the loop at this temperature (every rule), and profile runs at "
                          "--temperature 0")
    if continuations is not None and rule(dec.accept_rule).sampled_drafts and not options.rollouts:
        raise ConfigError(f"--responses with --accept-rule {dec.accept_rule}: the default estimate (--rollouts 0) "
                          "weights each start by the continuation after it, which must be sampled from the target "
                          "at these settings; given responses need --rollouts M (M >= 1 draft paths per start, "
                          "e.g. 8)")
    pad = tok.pad_token_id if tok.pad_token_id is not None else (min(oracle.eos_ids) if oracle.eos_ids else 0)
    run = _profile_shards(oracle, prompts, options, continuations, pad, progress)
    by_steps, samples, s_run, cycles = {}, [], min(r.num_steps, k_max), {}
    for s in range(1, k_max + 1):
        by_steps[str(s)], recs = run.figures(s)
        cycles[str(s)] = [rec.accepted_per_cycle for rec in recs]
        if s == s_run:
            samples = recs
    by_draft_tokens = {}
    for s, d in run.grid:
        by_draft_tokens.setdefault(str(d), {})[str(s)] = run.figures(s, d)[0]
    per_start, cuts = run.per_start()
    for i, (rec, p) in enumerate(zip(samples, run.profiled)):
        rec.extra["run_lengths"] = p.run_lengths if p.tree_runs is None else p.tree_runs[(s_run, run.d_main[s_run])][0]
        rec.extra["accepted_per_cycle_by_num_steps"] = {s: c[i] for s, c in cycles.items()}
    resolved, notes = workload
    if not run.sampled_drafts and not run.realized:
        notes = list(notes) + ["SGLang thresholds below 1 are not lossless: the server's text is not sampled from "
                               "the target, so no acceptance along the target's sampled texts is this rule's; only "
                               "the per-context expectation is reported (exact per context under the thresholds, "
                               "over contexts sampled from the target, not from that server)"]
    report = {"schema_version": 1, "config": {**settings.flat(), **options.as_dict(), **r.as_dict(), **resolved},
              "sampling": run.sampling(continuations is not None, cuts), "by_num_steps": by_steps,
              "response_divergences": [], "numeric_divergences": [],
              **({"by_num_draft_tokens": by_draft_tokens} if run.grid else {}),
              "definitions": DEFINITIONS, "warnings": oracle.warnings + list(notes),
              "provenance": provenance(settings.decoding.seed)}
    from eagle_eval.commands.profile_result import add_context
    add_context(report, per_start, [seq[0] for seq in run.seqs])
    return ProfileResult(report=report, samples=samples, oracle=oracle, profiled=run.profiled, per_start=per_start)
