"""Acceptance at temperature > 0 from a profile: each figure named by the quantity it is, with its interval.

Contract: pure functions over plain lists (no torch, no model). A profile at temperature > 0 gives, per
(prompt, sample) sequence:
- `at_least[k]`: the exact P(A >= i), i = 1..S, of start t = k + 1 (profile/sampled.py);
- the cycles a speculative decode would run along that sequence: the root index of each and its accepted
  drafts (the prefix match; one-hot rules only).
Three figures come out, and they differ (docs/sampling.md):
- `per_context`: the expectation per context averaged over every start of the continuations (each start
  a context where the loop could verify, `cycle_starts`), E_t[1 + E[A | t]];
- `along_trajectories`: the per-step conditional expectation along the sampled trajectories, the mean
  over the cycles the decode visits of E[1 + A | that cycle's context]: the same target as the mean
  accept length a server reports, with lower variance (the coin of each cycle integrated out);
- `sampled`: the accept length realized along the sampled trajectories (what a server run of the same
  texts would report: mean over cycles of accepted + 1).
Intervals are 95% normal intervals of a ratio estimator with the prompt as the unit (delta method,
cluster-robust): samples of one prompt and the cycles of one sequence are not independent of each other.
"""

from __future__ import annotations

import math

from eagle_eval.stats.clustered import Z95, ratio_interval  # noqa: F401  (ratio_interval: api)

QUANTITIES = {
    "per_context": "expectation per context, averaged over every start of the continuations: "
                   "mean over starts t of 1 + sum_i P(A >= i | context t), exact for each context",
    "along_trajectories": "per-step conditional expectation along the sampled trajectories: mean over the "
                          "verify cycles the decode visits of 1 + sum_i P(A >= i | that cycle's context)",
    "sampled": "realized along the sampled trajectories (what a server reports for these texts): mean over "
               "verify cycles of accepted drafts + 1, the accepted drafts being the prefix match of the drafts "
               "on the text (one-hot rules)",
    "interval": "95% normal interval of the ratio estimator, the prompt as the unit (delta method; samples of "
                "one prompt and cycles of one sequence are not independent)",
    "estimator_sd": "sampled drafts: the Monte-Carlo standard deviation of the figure for these contexts (from "
                    "each start's estimate variance), beside the interval over prompts",
}


def cycle_starts(continuation: list[int], max_new_tokens: int, eos_ids: set[int]) -> int:
    """How many starts t = 1, 2, .. can begin a verify cycle: t < max_new_tokens and none of the first t
    continuation tokens is an EOS (the loop stops at EOS or once max_new_tokens are out).

    >>> cycle_starts([5, 6, 2, 7], 10, {2}), cycle_starts([5, 6, 7, 8], 3, {2})
    (2, 2)
    """
    n = 0
    for t in range(1, max_new_tokens):
        if continuation[t - 1] in eos_ids:
            break
        n = t
    return n


def cycle_roots(accepted_per_cycle: list[int]) -> list[int]:
    """Root index k (start t = k + 1) of each verify cycle: the first root is the first token, each cycle
    emits its accepted drafts and one more.

    >>> cycle_roots([2, 0, 1])
    [0, 3, 4]
    """
    roots, k = [], 0
    for n in accepted_per_cycle:
        roots.append(k)
        k += n + 1
    return roots


def per_start_rows(prompt_id: str, sample: int, at_least: list[list[float]], num_steps: int,
                   num_draft_tokens: int | None = None, variance: list[list[float]] | None = None,
                   cut: list[float] | None = None, prompt_len: int | None = None) -> list[dict]:
    """The per_start.jsonl rows of one sequence for one num_steps (and tree size): at_least[k] = P(A >= i),
    i = 1..>= num_steps, of start t = k + 1; cut[k] > 0: the P(A >= i) below the floor where its chain was cut
    (the P(A >= j) after it are 0, each too low by less than that); prompt_len: the prompt's tokens (start t's
    root sits at position prompt_len + t - 1: results/context.py buckets it)."""
    rows = []
    for k, probs in enumerate(at_least):
        p = [float(x) for x in probs[:num_steps]]
        row = {"prompt_id": prompt_id, "sample": sample, "start": k + 1, "num_steps": num_steps}
        if prompt_len is not None:
            row["prompt_len"] = prompt_len
        if num_draft_tokens is not None:
            row["num_draft_tokens"] = num_draft_tokens
        row.update(expected_tokens_per_step=1.0 + sum(p), p_accept_at_least=p)
        if variance is not None:
            row["variance"] = [float(x) for x in variance[k][:num_steps]]
        if cut is not None and cut[k] > 0:
            row["cut"] = float(cut[k])
        rows.append(row)
    return rows


def summarize_expected(seqs: list[dict], num_steps: int) -> dict:
    """The three figures (module docstring) for one num_steps, overall and by category.

    seqs: one dict per (prompt, sample) sequence: id, category, at_least [[P(A >= i)] per start] (only the
    starts that can begin a cycle), optional variance (same shape), optional accepted (the cycles' accepted
    drafts along the sequence; absent for the sampled-draft rules)."""
    out = _figures(seqs, num_steps)
    cats = sorted({s["category"] for s in seqs})
    if len(cats) > 1:
        out["by_category"] = {c: _figures([s for s in seqs if s["category"] == c], num_steps) for c in cats}
    return out


def _column_sums(rows, s: int) -> list[float]:
    """[sum over rows of row[i] for i < s]."""
    out = [0.0] * s
    for row in rows:
        for i in range(s):
            out[i] += row[i]
    return out


def _figures(seqs: list[dict], s: int) -> dict:
    by_prompt: dict[str, list[dict]] = {}
    for q in seqs:
        by_prompt.setdefault(q["id"], []).append(q)
    # per prompt (the unit): column sums of P(A >= i) over its starts, and the count of starts
    units = [(_column_sums((p for q in g for p in q["at_least"]), s), sum(len(q["at_least"]) for q in g))
             for g in by_prompt.values()]
    out = {"per_context": {
        "starts": sum(n for _, n in units),
        "expected_tokens_per_step": ratio_interval([(n + sum(c), n) for c, n in units]),
        "per_position": [{"position": i + 1, "p_accept_at_least": ratio_interval([(c[i], n) for c, n in units])}
                         for i in range(s)]}}
    if any("variance" in q for q in seqs):
        n = out["per_context"]["starts"]
        var = _column_sums((v for q in seqs for v in q.get("variance", [])), s)
        out["per_context"]["estimator_sd"] = {
            "expected_tokens_per_step": None if n == 0 else _sd_of_sum(seqs, s) / n,
            "per_position": [None if n == 0 else math.sqrt(max(v, 0.0)) / n for v in var]}
    if all("accepted" in q for q in seqs):
        out.update(_along(list(by_prompt.values()), s))
    return out


def _sd_of_sum(seqs: list[dict], s: int) -> float:
    """sd of sum_t sum_i P_hat(A >= i | t), the estimates of one start correlated across i: bounded by
    summing the per-position sds within a start (Cauchy-Schwarz), independent across starts."""
    total = 0.0
    for q in seqs:
        for v in q.get("variance", []):
            total += sum(math.sqrt(max(x, 0.0)) for x in v[:s]) ** 2
    return math.sqrt(total)


def _along(groups: list[list[dict]], s: int) -> dict:
    """Conditional expectation and realized acceptance over the cycles along the sequences (per prompt:
    column sums over its cycles of P(A >= i | the cycle's context) and of 1[accepted >= i], cycles)."""
    units = []
    for g in groups:
        expected, realized, cycles = [0.0] * s, [0.0] * s, 0
        for q in g:
            for root, acc in zip(cycle_roots(q["accepted"]), q["accepted"]):
                p = q["at_least"][root]
                for i in range(s):
                    expected[i] += p[i]
                for i in range(min(acc, s)):
                    realized[i] += 1.0
                cycles += 1
        units.append((expected, realized, cycles))
    return {
        "along_trajectories": {
            "cycles": sum(n for *_, n in units),
            "expected_tokens_per_step": ratio_interval([(n + sum(e), n) for e, _, n in units]),
            "per_position": [{"position": i + 1, "p_accept_at_least": ratio_interval([(e[i], n) for e, _, n in units])}
                             for i in range(s)]},
        "sampled": {
            "cycles": sum(n for *_, n in units),
            "accept_length": ratio_interval([(n + sum(r), n) for _, r, n in units]),
            "per_position": [{"position": i + 1, "unconditional_rate": ratio_interval([(r[i], n) for _, r, n in units])}
                             for i in range(s)]},
    }


def section_rates(section: dict) -> dict:
    """tau and u_i of one by_num_steps section for the speedup model, and which quantity they are: at
    temperature > 0 the conditional expectation along the trajectories (lower variance than the realized
    rates, the same target), else the per-context expectation (sampled drafts); greedy: the counts."""
    exp = section.get("expected")
    if exp is None:
        u = [p["unconditional_rate"] or 0.0 for p in section["per_position"]]
        return {"tau": section["summary"]["accept_length"], "u": u,
                "a": [p["conditional_rate"] for p in section["per_position"]], "source": "counts (greedy)"}
    key = "along_trajectories" if "along_trajectories" in exp else "per_context"
    fig = exp[key]
    u = [p["p_accept_at_least"]["value"] or 0.0 for p in fig["per_position"]]
    a = [u[0] if u else None] + [(u[i] / u[i - 1]) if u[i - 1] else None for i in range(1, len(u))]
    return {"tau": fig["expected_tokens_per_step"]["value"], "u": u, "a": a, "source": key}


def _iv(fig: dict | None) -> str:
    if not fig or fig.get("value") is None:
        return "-"
    if fig.get("low") is None:
        return f"{fig['value']:.3f}"
    return f"{fig['value']:.3f} [{fig['low']:.3f}, {fig['high']:.3f}]"


def render_sampled_steps(report: dict) -> str:
    """The profile at temperature > 0, one line per num_steps: each figure named, with its 95% interval."""
    smp = report["sampling"]
    sections = sorted(report["by_num_steps"].items(), key=lambda kv: int(kv[0]))
    along = "along_trajectories" in sections[0][1]["expected"]
    lines = [f"sampling: temperature {smp['temperature']:g}, top_k {smp['top_k']}, top_p {smp['top_p']:g}, "
             f"min_p {smp['min_p']:g}, accept rule {smp['accept_rule']} ({smp['filter_order']}), seed {smp['seed']}",
             f"continuations: {smp['continuations']}"]
    head = f" S  {'per-context E[tokens/step]':>30}"
    if along:
        head += f"  {'cond. E along trajectories':>30}  {'sampled accept length':>30}"
    lines.append(head)
    for s, sec in sections:
        e = sec["expected"]
        line = f"{s:>2}  {_iv(e['per_context']['expected_tokens_per_step']):>30}"
        if along:
            line += (f"  {_iv(e['along_trajectories']['expected_tokens_per_step']):>30}"
                     f"  {_iv(e['sampled']['accept_length']):>30}")
        lines.append(line)
    last = sections[-1][1]["expected"]
    key = "along_trajectories" if along else "per_context"
    lines.append(f"P(A >= i) at S = {sections[-1][0]} ({key.replace('_', ' ')}): " + "  ".join(
        f"{p['position']}:{_iv(p['p_accept_at_least'])}" for p in last[key]["per_position"]))
    if smp.get("draft_estimator"):
        lines.append(f"sampled drafts, per-context P(A >= i) estimated (not exact past i = 1): {smp['draft_estimator']}")
    sd = last["per_context"].get("estimator_sd")
    if sd:
        lines.append(f"sampled drafts ({smp['rollouts']} rollouts per start): Monte-Carlo sd of the per-context figure "
                     f"{sd['expected_tokens_per_step']:.4f} (exact at i = 1)")
    lines += [f"per-context: {QUANTITIES['per_context']}"]
    if along:
        lines += [f"along trajectories: {QUANTITIES['along_trajectories']}", f"sampled: {QUANTITIES['sampled']}"]
    lines.append(f"[a, b]: {QUANTITIES['interval']}")
    lines += [f"WARNING: {w}" for w in report.get("warnings", [])]
    return "\n".join(lines)
