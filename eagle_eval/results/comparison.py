"""Saved results: render and compare them (reading and checking them: results/saved.py).

Contract: nothing here loads a model or torch. `load_result` reads any command's results
(`saved.read_result`: refused when its numbers do not follow from its counts or its schema version is
unknown), so what `eagle-eval report` prints is what the command printed, recomputed from the same
counts, with the load-time findings it printed and the exit status they imply (`results_status`).
Only like is compared with like: two acceptance results (run, server-check: the oracle's loop), two
profiles (per num_steps), or a run with a profile's section at the run's num_steps (the profile
reproduces the loop exactly); settings that differ are named; other pairs say why they are not compared.

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

import math

from eagle_eval.findings import Finding, render_findings
from eagle_eval.results.saved import Result, ResultFileError, check_counts, read_result, worst  # noqa: F401
from eagle_eval.results.tables import fmt, groups, layout

Z95 = 1.959963984540054


def load_result(path) -> Result:
    """Any command's results file or output folder, checked (results/saved.py)."""
    return read_result(path)


def results_status(results: list[Result]) -> int:
    """The exit status a re-render of these results implies: the worst of theirs (errors.py table)."""
    return worst(*(r.status for r in results))


def tau_se_cycles(histogram: list[int]) -> float | None:
    """Standard error of tau from the per-cycle histogram, cycles taken as independent draws (not the
    per-prompt clustered SE of diagnose/decide.py `tau_se_clustered`).

    >>> round(tau_se_cycles([1, 1, 1, 1]), 4)    # n = 0, 1, 2, 3: sd 1.291, over sqrt(4)
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
    sa, sb = tau_se_cycles(a["histogram"]), tau_se_cycles(b["histogram"])
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
    return render_bodies(a.label, a.report, b.label, b.report, markdown)


def render_bodies(label_a: str, body_a: dict, label_b: str, body_b: dict, markdown: bool = False) -> str:
    """B - A of two acceptance bodies (a run's report, a profile section): per group and per position."""
    diffs = compare(body_a, body_b)
    lines = [f"differences B - A   (A = {label_a}, B = {label_b}; * = beyond sampling noise, see below)", ""]
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
    lines += ["", RULE]
    return "\n".join(lines)


RULE = ("rule: tau flagged when its normal 95% interval (SE from each per-cycle histogram) excludes 0; "
        "a rate flagged when |z| > 1.96 (two-proportion z-test, pooled). Cycles are treated as "
        "independent, which understates the noise; expect ~1 flag in 20 by chance.")
ACCEPTANCE_KINDS = ("run", "server_check")        # the oracle's loop over a workload: summary, histogram
SETTINGS = ("num_steps", "topk", "num_draft_tokens", "max_new_tokens", "dtype", "aux_layers", "target", "head",
            "prompts", "dataset", "categories", "limit")


def _setting(cfg: dict, key: str):
    value = cfg.get(key)
    if isinstance(value, dict):                        # resolved: target / head / aux_layers carry more
        value = value.get("path", value.get("hf"))
    return value


def setting_differences(a: dict, b: dict) -> list[str]:
    """The settings two results were made with that differ, in words (A -> B)."""
    ca, cb = a.get("config") or {}, b.get("config") or {}
    return [f"{k} {_setting(ca, k)!r} -> {_setting(cb, k)!r}" for k in SETTINGS if _setting(ca, k) != _setting(cb, k)]


def _profile_table(a: Result, b: Result, markdown: bool) -> str:
    sa, sb = a.report["by_num_steps"], b.report["by_num_steps"]
    common = sorted(set(sa) & set(sb), key=int)
    rows = []
    for s in common:
        d = compare_group(sa[s], sb[s])
        rows.append([s, fmt(d["tau_a"]), fmt(d["tau_b"]), _d(d["tau_diff"], d["tau_flag"]),
                     "-" if d["tau_ci95"] is None else f"[{d['tau_ci95'][0]:+.3f}, {d['tau_ci95'][1]:+.3f}]"])
    lines = [f"differences B - A per num_steps   (A = {a.label}, B = {b.label}; * = beyond sampling noise)", ""]
    return "\n".join(lines + layout(["num_steps", "tau A", "tau B", "diff", "95% interval"], rows, markdown)
                     + ["", RULE])


def _profile_section(run: Result, profile: Result) -> tuple[str | None, dict | None]:
    """(why not, the profile's section) for comparing a run with a profile at the run's num_steps."""
    rc, pc = run.report["config"], profile.report["config"]
    s = str(rc.get("num_steps"))
    if s not in profile.report["by_num_steps"]:
        return f"the profile has no num_steps {s} (it covers {', '.join(profile.report['by_num_steps'])})", None
    for key in ("topk", "num_draft_tokens", "max_new_tokens"):
        section_value = profile.report["by_num_steps"][s].get(key, pc.get(key)) if key == "num_draft_tokens" \
            else pc.get(key)
        if key == "num_draft_tokens" and pc.get("topk", 1) == 1:
            continue
        if rc.get(key) != section_value:
            return f"their {key} differ ({rc.get(key)} vs {section_value})", None
    return None, profile.report["by_num_steps"][s]


def comparison(a: Result, b: Result, markdown: bool = False) -> str:
    """B - A when the two are alike (module docstring), else the reason they are not compared."""
    kinds = {a.kind, b.kind}
    if kinds <= set(ACCEPTANCE_KINDS):
        text = render_comparison(a, b, markdown)
    elif kinds == {"profile"}:
        text = _profile_table(a, b, markdown)
    elif len(kinds) == 2 and "profile" in kinds and kinds - {"profile"} <= set(ACCEPTANCE_KINDS):
        run, prof = (a, b) if b.kind == "profile" else (b, a)
        why, section = _profile_section(run, prof)
        if why:
            return f"not compared: {run.label} ({run.kind}) and {prof.label} (profile): {why}"
        s = run.report["config"]["num_steps"]
        bodies = [(run.label, run.report), (f"{prof.label} at num_steps {s}", section)]
        if run is b:
            bodies.reverse()
        text = render_bodies(*bodies[0], *bodies[1], markdown)
    else:
        return (f"not compared: {a.label} is {_a(a.kind)} result and {b.label} {_a(b.kind)} one; eagle-eval "
                "compares two acceptance results (run, server-check), two profiles, or a run with a profile")
    notes = setting_differences(a.report, b.report)
    return text + (f"\nsettings differ (A -> B): {'; '.join(notes)}" if notes else "")


def _a(kind: str) -> str:
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind.replace('_', '-')}"


def _render_run_like(report: dict, markdown: bool) -> str:
    from eagle_eval.results.report import render_table
    from eagle_eval.results.tables import render_markdown
    return render_markdown(report) if markdown else render_table(report)


def _render_server_check(report: dict, markdown: bool) -> str:
    lines = [_render_run_like(report, markdown), "", f"server-check {report['server']['backend']} "
             f"{report['server'].get('url') or '(log only)'}: verdict {report['verdict'].upper()}"]
    return "\n".join(lines + [f"  - {r}" for r in report.get("reasons", [])])


def _render_diagnosis(report: dict, markdown: bool) -> str:
    cfg, aux, rec = report.get("resolved") or {}, report["configured_aux_layers"], report["recommended_aux_layers"]
    lines = [f"diagnosis of {(cfg.get('head') or {}).get('path', '-')} on {(cfg.get('target') or {}).get('path', '-')}",
             f"configured aux layers  HF {aux['hf']} = SGLang ids {aux['sglang']} = vLLM ids {aux['vllm']}",
             f"recommended            HF {rec['hf']} = SGLang ids {rec['sglang']} = vLLM ids {rec['vllm']}", "",
             "findings", render_findings([Finding.from_dict(f) for f in report["findings"]])]
    return "\n".join(lines)


def _renderers():
    from eagle_eval.results.report import render_ablation, render_steps_table
    return {"run": _render_run_like, "server_check": _render_server_check,
            "profile": lambda r, md: render_steps_table(r), "ablation": lambda r, md: render_ablation(r),
            "diagnosis": _render_diagnosis}


def render_result(result: Result, markdown: bool = False, renderers: dict | None = None) -> str:
    """One result as its command printed it, its load-time findings, and the exit status they imply.
    renderers: {kind: fn(report) -> str} from the wings that own a kind (diagnose, servers) to use instead
    of the plain ones here (results cannot import them)."""
    own = (renderers or {}).get(result.kind)
    text = own(result.report) if own is not None else _renderers()[result.kind](result.report, markdown)
    if markdown and result.kind != "run":
        text = f"```\n{text}\n```"
    if result.kind != "diagnosis" and result.findings:
        text += "\n\nload-time checks\n" + render_findings(result.findings, only_problems=True)
    if result.status:
        from eagle_eval.findings import decide
        why = decide(result.findings).message("load-time check") if result.kind != "diagnosis" else ""
        text += f"\n\nexit status {result.status}" + (f": {why}" if why else f" (as `eagle-eval "
                                                       f"{result.kind.replace('_', '-')}` gave it)")
    return text


def render_results(results: list[Result], markdown: bool = False, renderers: dict | None = None) -> str:
    """Each result as its command printed it (or Markdown), then B - A when there are two alike."""
    if len(results) == 1:
        return render_result(results[0], markdown, renderers)
    parts = [f"{'## ' if markdown else '== '}{r.label}\n\n{render_result(r, markdown, renderers)}" for r in results]
    if len(results) == 2:
        parts.append(comparison(results[0], results[1], markdown))
    return "\n\n".join(parts)
