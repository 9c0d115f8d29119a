"""Saved results: load report.json files, check them against their own counts, render and compare them.

Contract: nothing here loads a model or torch. `load_result` refuses a report whose rates do not follow
from its histograms (or whose groups do not add up to the whole), so what `eagle-eval report` prints is
what the run printed, recomputed from the same counts.

Comparison rule (two results A and B; every verify cycle is treated as an independent trial):
- tau of a group: a cycle's accepted drafts n have mean m = tau - 1 and sample variance
  v = sum_n H[n] (n - m)^2 / (C - 1) over the group's C cycles, so SE(tau) = sqrt(v / C). The
  difference tau_B - tau_A gets the normal 95% interval diff +- 1.96 sqrt(SE_A^2 + SE_B^2) and is
  flagged (*) when that interval excludes 0.
- per position i: a two-proportion z-test with the pooled proportion, on the conditional rate
  a_i = accepted_i / reached_i and on the unconditional rate u_i = accepted_i / cycles; flagged (*)
  when |z| > 1.96 (two-sided 5%).
Caveats: cycles of one prompt are correlated (a hard prompt lowers all its cycles), so the true noise
is larger than this rule assumes: a flag says "look here", not "proven". With many groups and positions,
about 1 comparison in 20 is flagged by chance even when nothing differs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from eagle_eval.errors import UserError
from eagle_eval.results.acceptance import AcceptanceCounts
from eagle_eval.results.tables import fmt, groups, layout

Z95 = 1.959963984540054


class ResultFileError(UserError, ValueError):
    """A results file (report.json, samples) that is missing, not JSON, or not what eagle-eval writes."""


@dataclass(frozen=True)
class Result:
    label: str          # as given on the command line
    path: str           # the report.json read
    report: dict


def load_result(path: str | Path) -> Result:
    """A report.json, or a run folder holding one, checked against its counts."""
    file = Path(path) / "report.json" if Path(path).is_dir() else Path(path)
    if not file.is_file():
        raise ResultFileError(f"{file}: no such report file")
    try:
        report = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ResultFileError(f"{file}: not valid JSON ({exc})") from exc
    check_counts(report, file)
    return Result(label=str(path), path=str(file), report=report)


def _counts(body: dict, path, group: str) -> AcceptanceCounts:
    try:
        counts = AcceptanceCounts(len(body["histogram"]) - 1, [int(h) for h in body["histogram"]])
        same = (body["per_position"] == counts.per_position()
                and body["summary"]["cycles"] == counts.cycles
                and body["summary"]["accepted_drafts"] == counts.accepted_drafts
                and body["summary"]["accept_length"] == counts.tau)
    except (KeyError, TypeError, ValueError) as exc:
        raise ResultFileError(f"{path}: group {group}: malformed ({type(exc).__name__}: {exc})") from exc
    if not same:
        raise ResultFileError(f"{path}: group {group}: 'summary'/'per_position' do not follow from its 'histogram'")
    return counts


def check_counts(report: dict, path) -> None:
    if not isinstance(report, dict):
        raise ResultFileError(f"{path}: not an eagle-eval report (a JSON object is expected)")
    for key in ("config", "summary", "per_position", "histogram"):
        if key not in report:
            raise ResultFileError(f"{path}: key '{key}' is missing (not an eagle-eval report.json?)")
    whole = _counts(report, path, "all")
    for key in ("by_category", "by_turn"):
        parts = [_counts(body, path, f"{key}[{name!r}]") for name, body in report.get(key, {}).items()]
        total = [sum(h) for h in zip(*(p.histogram for p in parts))]
        if parts and total != whole.histogram:
            raise ResultFileError(f"{path}: the '{key}' histograms add up to {total}, not to the whole {whole.histogram}")


def tau_se(histogram: list[int]) -> float | None:
    """Standard error of tau from the per-cycle histogram.

    >>> round(tau_se([1, 1, 1, 1]), 4)    # n = 0, 1, 2, 3: sd 1.291, over sqrt(4)
    0.6455
    """
    c = sum(histogram)
    if c < 2:
        return None
    mean = sum(n * h for n, h in enumerate(histogram)) / c
    var = sum(h * (n - mean) ** 2 for n, h in enumerate(histogram)) / (c - 1)
    return math.sqrt(var / c)


def two_proportion_z(x1: int, n1: int, x2: int, n2: int) -> float | None:
    """z of (x2/n2 - x1/n1) with the pooled proportion; 0 when both are 0 or both 1.

    >>> round(two_proportion_z(60, 100, 40, 100), 3)
    -2.828
    """
    if not n1 or not n2:
        return None
    p = (x1 + x2) / (n1 + n2)
    se = math.sqrt(p * (1 - p) * (1 / n1 + 1 / n2))
    return 0.0 if se == 0 else (x2 / n2 - x1 / n1) / se


def compare_group(a: dict, b: dict) -> dict:
    """Differences B - A of one group: tau with its 95% interval, and a_i, u_i per position with z."""
    ta, tb = a["summary"]["accept_length"], b["summary"]["accept_length"]
    sa, sb = tau_se(a["histogram"]), tau_se(b["histogram"])
    out = {"tau_a": ta, "tau_b": tb, "tau_diff": None, "tau_ci95": None, "tau_flag": False, "positions": []}
    if ta is not None and tb is not None:
        out["tau_diff"] = tb - ta
        if sa is not None and sb is not None:
            half = Z95 * math.hypot(sa, sb)
            out["tau_ci95"] = [tb - ta - half, tb - ta + half]
            out["tau_flag"] = not out["tau_ci95"][0] <= 0 <= out["tau_ci95"][1]
    ca, cb = a["summary"]["cycles"], b["summary"]["cycles"]
    for pa, pb in zip(a["per_position"], b["per_position"]):
        z_cond = two_proportion_z(pa["accepted"], pa["reached"], pb["accepted"], pb["reached"])
        z_unc = two_proportion_z(pa["accepted"], ca, pb["accepted"], cb)
        out["positions"].append({
            "position": pa["position"], "a_a": pa["conditional_rate"], "a_b": pb["conditional_rate"],
            "z_conditional": z_cond, "u_a": pa["unconditional_rate"], "u_b": pb["unconditional_rate"],
            "z_unconditional": z_unc, "flag_conditional": z_cond is not None and abs(z_cond) > Z95,
            "flag_unconditional": z_unc is not None and abs(z_unc) > Z95})
    return out


def compare(a: dict, b: dict) -> dict[str, dict]:
    """compare_group over the groups both reports have (all, category:NAME, turn:N)."""
    gb = dict(groups(b))
    return {name: compare_group(body, gb[name]) for name, body in groups(a) if name in gb}


def _d(x, flag=False, spec="+.3f") -> str:
    return "-" if x is None else format(x, spec) + ("*" if flag else "")


def _sub(x, y):
    return None if x is None or y is None else y - x


def render_comparison(a: Result, b: Result, markdown: bool = False) -> str:
    diffs = compare(a.report, b.report)
    lines = [f"differences B - A   (A = {a.label}, B = {b.label}; * = beyond sampling noise, see below)", ""]
    rows = [[g, fmt(d["tau_a"]), fmt(d["tau_b"]), _d(d["tau_diff"], d["tau_flag"]),
             "-" if d["tau_ci95"] is None else f"[{d['tau_ci95'][0]:+.3f}, {d['tau_ci95'][1]:+.3f}]"]
            for g, d in diffs.items()]
    lines += layout(["group", "tau A", "tau B", "diff", "95% interval"], rows, markdown) + [""]
    rows = [[str(p["position"]), fmt(p["a_a"]), fmt(p["a_b"]), _d(_sub(p["a_a"], p["a_b"]), p["flag_conditional"]),
             _d(p["z_conditional"], spec="+.2f"), fmt(p["u_a"]), fmt(p["u_b"]),
             _d(_sub(p["u_a"], p["u_b"]), p["flag_unconditional"]), _d(p["z_unconditional"], spec="+.2f")]
            for p in diffs["all"]["positions"]]
    lines += layout(["pos", "a_i A", "a_i B", "diff", "z", "u_i A", "u_i B", "diff", "z"], rows, markdown)
    steps = max(len(d["positions"]) for d in diffs.values())
    rows = [[g] + [_d(_sub(p["u_a"], p["u_b"]), p["flag_unconditional"]) for p in d["positions"]]
            for g, d in diffs.items() if g != "all"]
    if rows:
        lines += [""] + layout(["group"] + [f"diff u_{i}" for i in range(1, steps + 1)], rows, markdown)
    lines += ["", "rule: tau flagged when its normal 95% interval (SE from each per-cycle histogram) excludes 0; "
              "a rate flagged when |z| > 1.96 (two-proportion z-test, pooled). Cycles are treated as "
              "independent, which understates the noise; expect ~1 flag in 20 by chance."]
    return "\n".join(lines)


def render_results(results: list[Result], markdown: bool = False) -> str:
    """Each result's table as the run printed it (or Markdown), then B - A when there are two."""
    from eagle_eval.results.report import render_table
    from eagle_eval.results.tables import render_markdown

    render = render_markdown if markdown else render_table
    if len(results) == 1:
        return render(results[0].report)
    parts = [f"{'## ' if markdown else '== '}{r.label}\n\n{render(r.report)}" for r in results]
    if len(results) == 2:
        parts.append(render_comparison(results[0], results[1], markdown))
    return "\n\n".join(parts)
