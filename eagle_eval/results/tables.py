"""Per-group views of a report dict: compact terminal/Markdown tables and the acceptance CSV (no torch).

Groups: `all` (the report's summary), `category:NAME` (report["by_category"]) and `turn:N`
(report["by_turn"]); each group holds `summary`, `per_position` and `histogram`, derived from counts.

CSV columns. The first ones are those of vllm-project/speculators' `acceptance.csv`
(scripts/evaluate/perf_utils.py: `acceptance_csv_columns` and `extract_spec_decode_metrics`, written by
scripts/evaluate/evaluate.py as `["subset"] + acceptance_csv_columns(spec)`): `subset`, `num_drafts`
(verify cycles), `num_draft_tokens` (drafted tokens: cycles * (num_draft_tokens - 1)),
`num_accepted_tokens` (accepted drafts), `acceptance_length` (= 1 + accepted / drafts = tau) and
`acceptance_at_pos_{i}` for i = 0..S-1, 0-based like vLLM's `position` label, = accepted_{i+1} / cycles
(the unconditional rate u_{i+1}). eagle-eval adds `group` (all / category:NAME / turn:N), `prompts`,
`cycles`, `accepted_drafts`, `conditional_acceptance_at_pos_{i}` (a_{i+1}) and `histogram_{n}`
(H[n], n = 0..S), so every rate of a row can be recomputed from the row's own counts.

Acceptance by context (results/context.py) adds one row per bucket, group `context:LOW-HIGH` (the bucket
[LOW, HIGH) of the cycle's root position; `server_context:...` for a server's per-step counts), with
`context_low`, `context_high`, `train_context_side` (before / past --train-context) and each rate's 95% interval
over prompts (`acceptance_length_low`/`_high`, `acceptance_at_pos_{i}_low`/`_high`, ...). A profile's bucket
rows hold `starts` (every start of its continuations) and the per-context expectation instead of cycle counts.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from eagle_eval.results.run_folder import write_atomic

BASE_COLUMNS = ("group", "subset", "prompts", "cycles", "accepted_drafts",
                "num_drafts", "num_draft_tokens", "num_accepted_tokens", "acceptance_length")
TEXT_COLUMNS = ("result", "group", "subset", "train_context_side")


def groups(report: dict) -> list[tuple[str, dict]]:
    """[(group name, {summary, per_position, histogram})], `all` first; a profile: one group per
    num_steps (`num_steps:S`)."""
    if "by_num_steps" in report and "summary" not in report:
        return [(f"num_steps:{s}", body) for s, body in sorted(report["by_num_steps"].items(), key=lambda kv: int(kv[0]))]
    out = [("all", report)]
    out += [(f"category:{k}", v) for k, v in report.get("by_category", {}).items()]
    out += [(f"turn:{k}", v) for k, v in report.get("by_turn", {}).items()]
    return out


def fmt(x, spec=".3f") -> str:
    return "-" if x is None else format(x, spec)


def layout(header: list[str], rows: list[list[str]], markdown: bool) -> list[str]:
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
        return lines + ["| " + " | ".join(r) + " |" for r in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    return [" " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
            for r in [header, *rows]]


def group_table(named: list[tuple[str, dict]], first: str, markdown: bool = False) -> list[str]:
    """Compact table: NAME, prompts, cycles, tau, u_1..u_S (u_i = P(>= i drafts accepted))."""
    steps = max((len(b["per_position"]) for _, b in named), default=0)
    header = [first, "prompts", "cycles", "tau"] + [f"u_{i}" for i in range(1, steps + 1)]
    rows = []
    for name, body in named:
        s, pp = body["summary"], body["per_position"]
        rates = [fmt(p["unconditional_rate"]) for p in pp] + ["-"] * (steps - len(pp))
        rows.append([name, str(s["prompts"]), str(s["cycles"]), fmt(s["accept_length"])] + rates)
    return layout(header, rows, markdown)


def render_groups(report: dict, markdown: bool = False) -> str:
    """By category (always) and by turn (when there is more than one) with the dataset and format used."""
    if "by_category" not in report:
        return ""
    cfg = report.get("config", {})
    src = cfg.get("dataset_source") or {}
    pf = cfg.get("prompt_format") or {}
    sha = cfg.get("template_sha256")
    lead = "- " if markdown else ""
    lines = [f"{lead}data        {src.get('path', '-')}  (format {cfg.get('dataset_format', '-')}, "
             f"{src.get('questions_used', '-')} of {src.get('questions_read', '-')} questions)",
             f"{lead}chat tmpl   {pf.get('chat_template', '-')}" + (f"  sha256 {sha[:16]}..." if sha else ""), ""]
    lines += group_table([("all", report)] + list(report["by_category"].items()), "category", markdown)
    if len(report.get("by_turn", {})) > 1:
        lines += [""] + group_table(list(report["by_turn"].items()), "turn", markdown)
    return "\n".join(lines)


def render_markdown(report: dict) -> str:
    """The run's table as Markdown: settings, summary, per-position rates, groups."""
    cfg, s = report["config"], report["summary"]
    where = f"target `{(cfg.get('target') or {}).get('path', '-')}`, draft `{(cfg.get('head') or {}).get('path', '-')}`"
    lines = [f"{where}, num_steps={cfg.get('num_steps')} topk={cfg.get('topk')} "
             f"num_draft_tokens={cfg.get('num_draft_tokens')}", ""]
    lines += layout(["prompts", "cycles", "emitted tokens", "tau", "mean accepted drafts", "spec_accept_length"],
                    [[str(s["prompts"]), str(s["cycles"]), str(s["emitted_tokens"]), fmt(s["accept_length"]),
                      fmt(s["mean_accepted_drafts"]), fmt(s["spec_accept_length"])]], True) + [""]
    rows = [[str(p["position"]), str(p["reached"]), str(p["accepted"]), fmt(p["conditional_rate"]),
             fmt(p["unconditional_rate"])] for p in report["per_position"]]
    lines += layout(["pos", "reached", "accepted", "a_i (cond.)", "u_i (uncond.)"], rows, True) + [""]
    lines.append("histogram H[n]: " + ", ".join(f"{n}: {h}" for n, h in enumerate(report["histogram"])))
    groups_md = render_groups(report, markdown=True)
    from eagle_eval.results.context import render, render_long_context

    context = render(report.get("by_context"), markdown=True)
    context += render_long_context(report.get("config") or {}) if context else []
    return "\n".join(lines + (["", groups_md] if groups_md else []) + context)


def csv_rows(report: dict, result: str | None = None) -> list[dict]:
    """One row per group of one report (run, server-check) or per num_steps of a profile; other results
    (an ablation, a diagnosis) hold no acceptance table: a UserError says so."""
    from eagle_eval.errors import UserError

    if "summary" not in report and "by_num_steps" not in report:
        raise UserError(f"--csv: {result or 'the result'} holds no acceptance table (a run, profile or server-check "
                        "result is needed; `eagle-eval ablate` writes its own ablation.csv)")
    cfg = report["config"]
    rows = []
    for group, body in groups(report):
        if group.startswith("num_steps:"):           # a profile section: S drafts per chain, D - 1 per tree
            drafted_per_cycle = (body.get("num_draft_tokens") or int(group.split(":")[1]) + 1) - 1
        else:
            drafted_per_cycle = cfg["num_draft_tokens"] - 1
        s, pp = body["summary"], body["per_position"]
        row = {"result": result} if result is not None else {}
        row.update(group=group, subset=group.split(":", 1)[-1] if group.startswith("category:") else group,
                   prompts=s["prompts"], cycles=s["cycles"], accepted_drafts=s["accepted_drafts"],
                   num_drafts=s["cycles"], num_draft_tokens=s["cycles"] * drafted_per_cycle,
                   num_accepted_tokens=s["accepted_drafts"], acceptance_length=s["accept_length"])
        row.update({f"acceptance_at_pos_{i}": p["unconditional_rate"] for i, p in enumerate(pp)})
        row.update({f"conditional_acceptance_at_pos_{i}": p["conditional_rate"] for i, p in enumerate(pp)})
        row.update({f"histogram_{n}": h for n, h in enumerate(body["histogram"])})
        rows.append(row)
    return rows + _context_rows(report, result)


def _context_rows(report: dict, result: str | None) -> list[dict]:
    """The acceptance by context (results/context.py): one row per bucket, `context:LOW-HIGH` ([LOW, HIGH)),
    and `server_context:...` for a server's per-step counts."""
    from eagle_eval.results.context import csv_rows as context_csv_rows

    cfg = report["config"]
    drafted = cfg["num_draft_tokens"] - 1 if cfg.get("num_draft_tokens") else None
    rows = context_csv_rows(report.get("by_context"), "context", drafted)
    rows += context_csv_rows(report.get("server_by_context"), "server_context", drafted)
    return [{**({"result": result} if result is not None else {}), **r} for r in rows]


def _columns(rows: list[dict]) -> list[str]:
    steps = max(sum(k.startswith("acceptance_at_pos_") and k[-1].isdigit() for k in r) for r in rows)
    lead = ["result"] if any("result" in r for r in rows) else []
    columns = (lead + list(BASE_COLUMNS) + [f"acceptance_at_pos_{i}" for i in range(steps)]
               + [f"conditional_acceptance_at_pos_{i}" for i in range(steps)]
               + [f"histogram_{n}" for n in range(steps + 1)])
    if any("context_low" in r for r in rows):       # the context buckets: their bounds and every rate's interval
        from eagle_eval.results.context import CSV_COLUMNS
        columns += list(CSV_COLUMNS) + [f"{name}_{i}_{end}" for name in ("acceptance_at_pos",
                                                                          "conditional_acceptance_at_pos")
                                        for i in range(steps) for end in ("low", "high")]
    return columns


def write_csv(path: str | Path, results: list[tuple[str | None, dict]]) -> None:
    """results: [(label or None, report)]; the `result` column is written only when labels are given."""
    rows = [row for label, report in results for row in csv_rows(report, label)]
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=_columns(rows), restval="")
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(path, buf.getvalue())


def _value(key: str, text: str):
    if key in TEXT_COLUMNS:
        return text if text or key != "train_context_side" else None
    if text == "":
        return None
    return float(text) if any(c in text for c in ".en") else int(text)


def read_csv(path: str | Path) -> list[dict]:
    """Rows of an acceptance CSV with numbers parsed back (counts int, rates float, empty cell None)."""
    with open(path, newline="") as f:
        return [{k: _value(k, v) for k, v in row.items()} for row in csv.DictReader(f)]


def write_rows_csv(path: str | Path, rows: list[dict]) -> None:
    """One CSV row per dict (columns: every key, in first-seen order): the ablation table."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=columns)
    w.writeheader()
    w.writerows(rows)
    write_atomic(path, buf.getvalue())
