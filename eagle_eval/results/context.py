"""Acceptance by context length in a report: the `by_context` section of a run, a profile, a server-check (both
sides), built from the records every draft kind writes, its terminal lines and its CSV rows (no torch).

Contract: every section is derived at report time from counts already saved, so a saved folder can be
re-bucketed without a model (`rebucket`, what `eagle-eval report --context-buckets ... --train-context N` runs):
- a run or a server-check's oracle: samples.jsonl's `prompt_len`, `accepted_per_cycle`, `emitted_per_cycle`
  (`from_records`), the counts of each verify cycle in the bucket of its root's position;
- a profile: per_start.jsonl's rows at the profile's num_steps (`from_starts`), P(A >= i) of every start (exact;
  0/1 when greedy) in the bucket of the start's root; the mean over the starts is the per-context expectation;
- a server-check's server: each request's per-step counts, where the server gives them (`from_requests`).
`ablation_csv_rows` lays an ablation's variants' sections out as ablation.csv's bucket rows.
The bucket math and the finding are stats/context.py's; the unit of every interval is the prompt (`unit_of`:
a question's turns and its long-context lengths are one unit).
"""

from __future__ import annotations

import re
from pathlib import Path

from eagle_eval.errors import UserError
from eagle_eval.stats.context import (DECAY_MARGIN, DECAYED, NOT_DECAYED, at_least, bucket_of, cycle_contexts,
                                      cycle_units, decay, figures, label, resolve_edges, start_units)

INTERVAL = ("95% Student-t interval of the ratio over prompts, prompts - 1 degrees of freedom (cluster delta "
            "method: the prompt is the unit, the cycles of one prompt are not independent; stats/clustered.py)")
DEFINITIONS = {
    "context": "the 0-based position of the cycle's root in the sequence = prompt tokens + tokens generated before "
               "the root (a profile's start t: prompt_len + t - 1); buckets are [low, high); context_sum: the sum of "
               "the bucket's contexts (over its cycles or starts: their mean is where a plot draws the bucket)",
    "cycles": "verify cycles whose root is in the bucket: tau = mean accepted + 1, u_i = P(>= i accepted), "
              "a_i = P(i accepted | i - 1 accepted)",
    "starts": "every start of the profile's continuations whose root is in the bucket: tau = 1 + mean over the "
              "starts of sum_i P(A >= i) (the per-context expectation; exact), u_i = mean P(A >= i)",
    "past": "a bucket lies past the training length L when its low edge >= L (L is always an edge): its roots sit at "
            "positions no training sequence of L tokens reaches",
    "finding": f"tau past L - tau before L over the cycles (or starts), prompts as units: decayed when its 95% "
               f"interval lies below 0 and the drop is >= {DECAY_MARGIN:g}; not decayed when the interval's lower end "
               f"is above -{DECAY_MARGIN:g}; else undecided",
}
# `run` / `profile` / `report` exit status of the finding (errors.ExitCode: 1 a finding that fails, 3 undecided)
FINDING_STATUS = {DECAYED: 1, NOT_DECAYED: 0}


def unit_of(sample_id: str) -> str:
    """The prompt a sample id belongs to: a question's turns and its long-context lengths are one unit.

    >>> unit_of("81/turn2"), unit_of("81/ctx4096"), unit_of("writing-01")
    ('81', '81', 'writing-01')
    """
    return re.sub(r"(/ctx\d+)?(/turn\d+)?$", "", sample_id)


def _context_sums(contexts: list[int], edges: list[int]) -> list[int]:
    """Sum of the contexts in each bucket (with the bucket's count, their mean: where a plot draws it)."""
    sums = [0] * len(edges)
    for c in contexts:
        sums[bucket_of(edges, c)] += c
    return sums


def _buckets(per_bucket: list[dict], edges: list[int], train_context: int | None, kind: str,
             num_steps: int, context_sums: list[int]) -> list[dict]:
    out = []
    for i, units in enumerate(per_bucket):
        low, high = edges[i], edges[i + 1] if i + 1 < len(edges) else None
        body = {"context": label(low, high), "low": low, "high": high,
                "side": None if train_context is None else ("past" if low >= train_context else "before"),
                "prompts": len(units), "context_sum": context_sums[i]}
        if kind == "cycles":
            hist = [sum(h[n] for h in units.values()) for n in range(num_steps + 1)]
            body.update(cycles=sum(hist), histogram=hist, accepted_at_least=at_least(hist)[1],
                        **figures([at_least(h) for h in units.values()], num_steps))
        else:
            body.update(starts=sum(n for n, _ in units.values()),
                        p_accept_at_least_sum=[sum(s[i] for _, s in units.values()) for i in range(num_steps)],
                        **figures(list(units.values()), num_steps))
        out.append(body)
    return out


def _finding(per_bucket: list[dict], edges: list[int], train_context: int | None, kind: str) -> dict | None:
    """stats/context.py `decay` over the prompts' totals before and past the training length."""
    if train_context is None:
        return None
    totals: dict[str, list[float]] = {}
    for i, units in enumerate(per_bucket):
        past = edges[i] >= train_context
        for unit, counts in units.items():
            n, s = at_least(counts) if kind == "cycles" else counts
            t = totals.setdefault(unit, [0.0, 0, 0.0, 0])
            t[2 if past else 0] += n + sum(s)
            t[3 if past else 1] += n
    found = decay([tuple(t) for t in totals.values()])
    what = "cycles" if kind == "cycles" else "starts"
    return {"train_context": train_context, "figure": "tau (accepted + 1 per cycle)" if kind == "cycles" else
            "expected tokens per step (1 + sum_i P(A >= i) per start)", "units": what, **found}


def _section(per_bucket, edges, given, train_context, kind: str, num_steps: int, extra: dict,
             contexts: list[int]) -> dict:
    return {"kind": kind, "num_steps": num_steps, "edges": edges, "edges_given": given if given is not None else
            "auto", "train_context": train_context, **extra, "interval": INTERVAL,
            "buckets": _buckets(per_bucket, edges, train_context, kind, num_steps, _context_sums(contexts, edges)),
            "train_context_finding": _finding(per_bucket, edges, train_context, kind)}


def from_cycles(rows: list[tuple], num_steps: int, given=None, train_context=None, extra: dict | None = None) -> dict:
    """rows: (sample id, prompt_len, accepted_per_cycle, emitted_per_cycle) -> the `by_context` section."""
    rows = [(unit_of(i), p, a, e) for i, p, a, e in rows]
    steps = max([num_steps] + [n for _, _, a, _ in rows for n in a])
    contexts = [c for _, p, a, e in rows for c in cycle_contexts(p, e)[:len(a)]]
    edges = resolve_edges(given, contexts, train_context)
    return _section(cycle_units(rows, edges, steps), edges, given, train_context, "cycles", steps, extra or {},
                    contexts)


def from_records(samples, num_steps: int, given=None, train_context=None) -> dict:
    """A run's (or a server-check's oracle's) records -> the `by_context` section."""
    return from_cycles([(s.id, s.prompt_len, s.accepted_per_cycle, s.emitted_per_cycle) for s in samples],
                       num_steps, given, train_context)


def from_starts(rows: list[dict], prompt_lens: dict[str, int], num_steps: int, num_draft_tokens: int | None = None,
                given=None, train_context=None) -> dict:
    """A profile's per_start rows at num_steps (and the tree's num_draft_tokens) -> the `by_context` section;
    a row's prompt length is its own `prompt_len`, else prompt_lens[prompt_id]."""
    picked = []
    for r in rows:
        if r["num_steps"] != num_steps or r.get("num_draft_tokens") != num_draft_tokens:
            continue
        prompt_len = r.get("prompt_len", prompt_lens.get(r["prompt_id"]))
        if prompt_len is None:
            raise UserError(f"per_start row of prompt {r['prompt_id']!r}: no prompt_len (nor a samples.jsonl row "
                            "of that prompt giving it): this profile cannot be bucketed by context")
        picked.append((unit_of(r["prompt_id"]), prompt_len + r["start"] - 1, r["p_accept_at_least"]))
    edges = resolve_edges(given, [c for _, c, _ in picked], train_context)
    extra = {"num_draft_tokens": num_draft_tokens} if num_draft_tokens is not None else {}
    return _section(start_units(picked, edges, num_steps), edges, given, train_context, "starts", num_steps, extra,
                    [c for _, c, _ in picked])


def request_rows(requests: list[dict], side: str) -> list[tuple]:
    """(id, prompt_len, accepted_per_cycle, emitted = accepted + 1) of a server-check's requests that give
    `side`'s per-step counts: the server's reported ones, or the oracle's (at temperature > 0, the drafts
    re-made along the server's answer). The cut of the last cycle moves no root, so accepted + 1 places
    every root."""
    out = []
    for r in requests:
        if side == "server":
            steps = (r.get("server") or {}).get("accepted_per_cycle")
        else:
            steps = (r.get("oracle") or {}).get("accepted_per_cycle")
            if steps is None:
                steps = (r.get("redrafted") or {}).get("redrafted")
        if steps and r.get("prompt_len") is not None:
            out.append((r["id"], r["prompt_len"], list(steps), [n + 1 for n in steps]))
    return out


def from_requests(requests: list[dict], side: str, num_steps: int, given=None, train_context=None) -> dict | None:
    """A server-check's requests -> `side`'s section (None when no request gives per-step counts)."""
    rows = request_rows(requests, side)
    if not rows:
        return None
    return from_cycles(rows, num_steps, given, train_context, {"requests": len(rows), "of_requests": len(requests)})


# -- re-bucketing a saved result ------------------------------------------------------------------------------

def rebucket(kind: str, report: dict, path: str, given=None, train_context=None) -> dict:
    """The saved result's report with its context sections made again from the files beside it (a run:
    samples.jsonl; a profile: per_start.jsonl and samples.jsonl; a server-check: its own requests rows)."""
    from eagle_eval.records import SampleRecord, read_jsonl

    folder = Path(path).parent
    cfg = report.get("config") or {}
    report = {**report, "config": {**cfg, "context_buckets": given, "train_context": train_context}}
    if kind == "run":
        samples = [SampleRecord.from_json(r) for r in read_jsonl(_beside(folder, "samples.jsonl", kind))]
        report["by_context"] = from_records(samples, cfg["num_steps"], given, train_context)
    elif kind == "profile":
        rows = read_jsonl(_beside(folder, "per_start.jsonl", kind))
        lens = ({r["id"]: r["prompt_len"] for r in read_jsonl(folder / "samples.jsonl")}
                if (folder / "samples.jsonl").is_file() else {})
        report["by_context"] = profile_section(report, rows, lens, given, train_context)
    elif kind == "server_check":
        steps = cfg["num_steps"]
        report["by_context"] = from_requests(report.get("requests") or [], "oracle", steps, given, train_context)
        report["server_by_context"] = from_requests(report.get("requests") or [], "server", steps, given,
                                                    train_context)
        if report["by_context"] is None:
            raise UserError(f"{path}: no request row carries the oracle's per-step counts and prompt length "
                            "(a server-check from before context buckets, or one without --url): nothing to re-bucket")
    else:
        raise UserError(f"{path}: {kind.replace('_', '-')} results hold no records to bucket by context (runs, "
                        "profiles and server-checks do)")
    return report


def _beside(folder: Path, name: str, kind: str) -> Path:
    if not (folder / name).is_file():
        raise UserError(f"{folder / name}: missing; re-bucketing a {kind.replace('_', '-')} by context reads it "
                        "(give the output folder the command wrote, with its files)")
    return folder / name


def profile_section(report: dict, per_start: list[dict], prompt_lens: dict[str, int], given=None,
                    train_context=None) -> dict | None:
    """A profile's section at the num_steps of its samples (the run's num_steps, at most --max-steps; a tree:
    that section's num_draft_tokens); None without per-start rows."""
    if not per_start:
        return None
    cfg = report["config"]
    s = min(cfg["num_steps"], cfg["max_steps"])
    d = report["by_num_steps"].get(str(s), {}).get("num_draft_tokens") if cfg.get("topk", 1) > 1 else None
    return from_starts(per_start, prompt_lens, s, d, given, train_context)


# -- what a person reads --------------------------------------------------------------------------------------

def _f(x, spec=".3f") -> str:
    return "-" if x is None else format(x, spec)


def _iv(fig: dict) -> str:
    if fig.get("value") is None:
        return "-"
    if fig.get("low") is None:
        return _f(fig["value"])
    return f"{fig['value']:.3f} [{fig['low']:.3f}, {fig['high']:.3f}]"


def render(section: dict | None, title: str = "acceptance by context", markdown: bool = False) -> list[str]:
    """The section as lines (a Markdown table with `markdown`): per bucket prompts, cycles (or starts), tau with
    its interval, u_i; then the training-length finding."""
    if not section:
        return []
    n_key = "cycles" if section["kind"] == "cycles" else "starts"
    steps = max((len(b["per_position"]) for b in section["buckets"]), default=0)
    header = ["context", "side", "prompts", n_key, "tau [95% interval]"] + [f"u_{i}" for i in range(1, steps + 1)]
    rows = [[b["context"], b["side"] or "", str(b["prompts"]), f"{b[n_key]:g}", _iv(b["accept_length"])]
            + [_f(p["unconditional_rate"]["value"]) for p in b["per_position"]] for b in section["buckets"]]
    buckets = "auto (powers of two)" if section["edges_given"] == "auto" else "given"
    lines = ["", f"{title}  ({n_key}; context = the root's position: prompt + tokens generated before it; "
                 f"buckets {buckets})"]
    if markdown:
        lines += ["", "| " + " | ".join(header) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * (len(header) - 2))
                  + "|"] + ["| " + " | ".join(r) + " |" for r in rows] + [""]
    else:
        widths = [max(len(c) for c in col) for col in zip(header, *rows)]
        lines += [" " + "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                  for r in [header, *rows]]
    lines.append(f"[a, b]: {INTERVAL}")
    found = section.get("train_context_finding")
    if found:
        d = found["difference"]
        diff = ("-" if d["value"] is None else f"{d['value']:+.3f}" + (
            "" if d["low"] is None else f" [{d['low']:+.3f}, {d['high']:+.3f}]"))
        lines.append(f"train context {found['train_context']}: {found['figure']} past - before = {diff} "
                     f"({found['prompts_before']} prompts / {found['cycles_before']:g} {found['units']} before, "
                     f"{found['prompts_past']} / {found['cycles_past']:g} past): {found['verdict'].upper()} "
                     f"({found['reason']})")
    return lines


def render_long_context(config: dict) -> list[str]:
    """The long-context workload's provenance, when the prompts were built by --long-context."""
    lc = config.get("long_context_workload")
    if not lc:
        return []
    toks, cap = lc["prompt_tokens"], lc["max_prompt_tokens"]
    return [f"long context  at least {', '.join(map(str, lc['lengths']))} tokens per prompt from the "
            f"{lc['pool']['texts']} texts of {lc['pool']['path']} in a seeded order; prompts "
            f"{toks['min']}..{toks['max']} tokens" + ("" if cap is None else
                                                     f", {lc['truncated']} truncated from the left to {cap}")]


def finding_status(report: dict) -> int:
    """The exit status the training-length findings of a report imply (0 without one): decayed 1, undecided 3."""
    status = 0
    for key in ("by_context", "server_by_context"):
        found = (report.get(key) or {}).get("train_context_finding")
        if found:
            s = FINDING_STATUS.get(found["verdict"], 3)
            status = 1 if 1 in (status, s) else max(status, s)
    return status


# -- CSV ------------------------------------------------------------------------------------------------------

CSV_COLUMNS = ("context_low", "context_high", "train_context_side", "starts", "acceptance_length_low",
               "acceptance_length_high")


def csv_rows(section: dict | None, prefix: str = "context", drafted_per_cycle: int | None = None) -> list[dict]:
    """One row per bucket with the acceptance CSV's columns (results/tables.py) and each rate's interval
    (`..._low`, `..._high`); a profile's rows hold `starts` and the expectation, no histogram."""
    if not section:
        return []
    rows = []
    for b in section["buckets"]:
        row = {"group": f"{prefix}:{b['low']}-{'inf' if b['high'] is None else b['high']}", "prompts": b["prompts"],
               "context_low": b["low"], "context_high": b["high"], "train_context_side": b["side"],
               "acceptance_length": b["accept_length"]["value"], "acceptance_length_low": b["accept_length"]["low"],
               "acceptance_length_high": b["accept_length"]["high"]}
        row["subset"] = row["group"]
        if section["kind"] == "cycles":
            accepted = sum(n * h for n, h in enumerate(b["histogram"]))
            row.update(cycles=b["cycles"], accepted_drafts=accepted, num_drafts=b["cycles"],
                       num_accepted_tokens=accepted,
                       num_draft_tokens=None if drafted_per_cycle is None else b["cycles"] * drafted_per_cycle)
            row.update({f"histogram_{n}": h for n, h in enumerate(b["histogram"])})
        else:
            row["starts"] = b["starts"]
        for i, p in enumerate(b["per_position"]):
            for name, key in (("acceptance_at_pos", "unconditional_rate"),
                              ("conditional_acceptance_at_pos", "conditional_rate")):
                row[f"{name}_{i}"] = p[key]["value"]
                row[f"{name}_{i}_low"] = p[key]["low"]
                row[f"{name}_{i}_high"] = p[key]["high"]
        rows.append(row)
    return rows


def ablation_csv_rows(result: dict) -> list[dict]:
    """ablation.csv's rows after the num_steps rows: each variant's acceptance by context (its `by_context`), one row
    per bucket (`csv_rows`: group `context:LOW-HIGH`, the bucket's bounds, starts, the expected
    accept length and u_i / a_i with their intervals), led by the variant and the num_steps it was taken at."""
    out = []
    for v in result["variants"]:
        ctx = v.get("by_context")
        if not ctx:
            continue
        lead = {"variant": v["variant"], "num_steps": ctx["num_steps"], "topk": v["topk"],
                "num_draft_tokens": ctx.get("num_draft_tokens") or ctx["num_steps"] + 1,
                "temperature": v["temperature"]}
        out += [{**lead, **row} for row in csv_rows(ctx, "context")]
    return out
