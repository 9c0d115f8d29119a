"""server-check: a running SGLang or vLLM server against the oracle, prompt by prompt.

Contract: `run_server_check(settings, options)` decodes every prompt with the oracle, sends the
same token ids to the server at temperature 0 (one request at a time), and returns a report shaped
like `run`'s (config, summary, per_position, histogram, provenance) plus the server's settings,
per-request rows, divergences, the acceptance comparison, the hypothesis ranking when acceptance
disagrees, the SGLang log comparison, a verdict and its exit status. Requests are judged one by one
in `--mode exact` (the default: tokens and counts equal the oracle's) or `--mode tolerance` (a paired
interval of per-request differences), see `judge`:

| exit | verdict | meaning |
|---|---|---|
| 0 | agree | every request exact (or a near-tie), or the interval inside the tolerance; settings match |
| 1 | disagree | a request with other tokens or (exact mode) other counts, the interval outside the tolerance, a settings mismatch, the SGLang log outside tolerance |
| 2 | (error) | the server could not be reached or answered garbage (raised as ServerError) |
| 3 | incomplete / undecided | nothing disagrees, but a field the check needs is missing, or the interval straddles the tolerance |
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eagle_eval.errors import stage
from eagle_eval.servers.figures import (
    aggregate,
    compare_request,
    server_distribution,
)
from eagle_eval.registry import ENGINES
from eagle_eval.servers.engine import engine
from eagle_eval.servers.judge import judge_requests
from eagle_eval.servers.options import ServerCheckOptions
from eagle_eval.settings import Settings

EXIT_STATUS = {"agree": 0, "disagree": 1, "incomplete": 3, "undecided": 3}


@dataclass
class ServerCheckResult:
    report: dict
    exit_status: int


def divergence_from_oracle(oracle, prompt, server_ids: list[int] | None, oracle_ids: list[int]) -> dict | None:
    """First difference of the server's output from the oracle's, with the target's logit margin there."""
    from eagle_eval.loop.plain import first_divergence

    if server_ids is None or server_ids == oracle_ids:
        return None
    vocab = oracle.speculator.target.info.vocab_size
    pos = next((i for i, (a, b) in enumerate(zip(server_ids, oracle_ids)) if a != b), None)
    bad = next((i for i, t in enumerate(server_ids) if not 0 <= t < vocab), None)
    if bad is not None and (pos is None or bad <= pos):
        return {"position": bad, "server_token": server_ids[bad], "reason": "outside the target vocabulary",
                "oracle_token": oracle_ids[bad] if bad < len(oracle_ids) else None, "margin": None}
    d = first_divergence(oracle.speculator.target, prompt.input_ids, server_ids, oracle_ids)
    names = {"speculative_token": "server_token", "greedy_token": "oracle_token", "logit_greedy": "logit_oracle",
             "logit_speculative": "logit_server", "speculative_len": "server_len", "greedy_len": "oracle_len"}
    return {names.get(k, k): v for k, v in d.items()}


def _verdict(judged: dict | None, settings_rows, log) -> tuple[str, list[str]]:
    """The check's verdict: the per-request judgement, the server's settings and the SGLang log."""
    found = {"disagree": [], "undecided": [], "incomplete": []}
    if judged is not None and judged["verdict"] != "agree":
        found[judged["verdict"]] += judged["reasons"]
    for s in settings_rows:
        if s["ok"] is False:
            found["disagree"].append(f"server setting {s['setting']} = {s['server']}, oracle {s['oracle']}"
                                     + (f" ({s['note']})" if s["note"] else ""))
    if log is not None:
        if log["within_tolerance"] is False:
            found["disagree"].append(f"SGLang log: mean accept len {log['server_accept_length']:.3f} vs oracle tau "
                                     f"{log['oracle_accept_length']:.3f} (relative difference "
                                     f"{log['relative_difference']:.1%} > tolerance {log['tolerance']:.1%})")
        elif log["within_tolerance"] is None:
            found["incomplete"].append("SGLang log: " + "; ".join(log["notes"] or ["nothing to compare"]))
    for verdict in ("disagree", "undecided", "incomplete"):
        if found[verdict]:
            return verdict, [r for v in ("disagree", "undecided", "incomplete") for r in found[v]]
    return "agree", []


def _decode_and_ask(oracle, workload, client, check: ServerCheckOptions, progress: bool):
    """(prompts, oracle samples, per-request rows) in workload order: each prompt decoded by the oracle (in a
    launched run by whichever process takes its question, eagle_eval/parallel), then sent to the server by
    rank 0 as it arrives, one request at a time. Empty lists on the other ranks."""
    from eagle_eval import parallel
    from eagle_eval.workload.conversations import in_workload_order, run_turns

    pairs, rows = [], {}
    num_steps, max_new = oracle.resolved.num_steps, oracle.settings.workload.max_new_tokens

    def ask(prompt, rec):
        # turn t > 1 is built from the ORACLE's earlier answers; the server gets the same token ids
        pairs.append((prompt, rec))
        if client is not None:
            with stage([prompt.id], "request to the server"):
                reply = client.generate(prompt.input_ids, max_new)
            with stage([prompt.id], "comparison with the oracle"):
                div = divergence_from_oracle(oracle, prompt, reply.output_ids, rec.output_ids)
                rows[prompt.id] = compare_request(check.backend, rec, reply, div, num_steps, check.tie_margin)

    group = parallel.current()
    if group.world == 1:
        from tqdm import tqdm

        def decode(prompt):
            rec = oracle.decode(prompt, check_lossless=False)
            ask(prompt, rec)
            return rec
        for _ in tqdm(run_turns(workload, decode), total=workload.num_prompts, desc="prompts", unit="prompt",
                      disable=not progress):
            pass
    else:
        from eagle_eval.parallel.turns import decode_questions
        decode_questions(group, workload, lambda p: oracle.decode(p, check_lossless=False), {}, ask, max_new,
                         progress)
    samples = in_workload_order(workload, [rec for _, rec in pairs])
    prompt_of = {p.id: p for p, _ in pairs}
    return [prompt_of[s.id] for s in samples], samples, [rows[s.id] for s in samples if s.id in rows]


def _log_comparison(backend: str, path: Path, start: int, samples, resolved, tolerance: float) -> dict:
    from eagle_eval.results.report import summarize

    with open(path, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    tau = summarize(samples, resolved.num_steps)["summary"]["accept_length"]
    log = engine(backend).compare_log(text, tau, resolved.num_draft_tokens, tolerance)
    log.update(file=str(path), read_from_byte=start)
    return log


def _warnings(oracle, workload, server_notes, rows, divergences, tie_margin: float) -> list[str]:
    out = list(oracle.warnings) + list(workload.warnings) + server_notes
    out += sorted({n for r in rows for n in r["notes"]})
    out += [f"{d['id']}: near-tie divergence at position {d['position']} (target logit margin {d['margin']:.4g} "
            f"< --tie-margin {tie_margin:g}): left out of the acceptance comparison"
            for d in divergences if d["kind"] == "near_tie"]
    return out


def _any_disagreement(rows: list[dict], mode: str) -> bool:
    """Whether some request the hypotheses can use (tokens equal) is not reproduced by the oracle."""
    return any(r["comparable"] and (r["counts_equal"] is False if mode == "exact"
                                    else (r.get("figure_difference") or 0) != 0) for r in rows)


def run_server_check(settings: Settings, check: ServerCheckOptions, oracle=None,
                     progress: bool = False) -> ServerCheckResult:
    """The check below, with --output-dir owned by this run (results/run_folder.py). In a launched run the
    oracle's decodes are split between the processes; rank 0 alone talks to the server and writes the folder,
    and every rank returns its result. `oracle`: an already loaded `Oracle` for `settings` (saves reloading the
    target in test suites)."""
    from eagle_eval.commands.effect import refuse_no_effect
    from eagle_eval.commands.folder import open_folder
    from eagle_eval import parallel

    refuse_no_effect([settings.decoding], check)       # --rollouts: sampled drafts at temperature > 0 only
    group = parallel.current()
    folder = open_folder("server-check", settings, check)
    try:
        result = _run_server_check(settings, check, oracle, progress and group.is_main, folder, group)
        return group.broadcast(result)
    finally:
        if folder is not None:
            folder.close()


def _say(line: str) -> None:
    """A heartbeat line on stderr, below the progress bar."""
    import sys

    from tqdm import tqdm

    tqdm.write(f"eagle-eval: {line}", file=sys.stderr)


def _server(check: ServerCheckOptions, progress: bool):
    """(client, its settings, a note, the SGLang log and where this check's lines start), on rank 0."""
    from eagle_eval.servers.http import Http

    log_path = Path(check.sglang_log) if check.sglang_log else None
    if log_path is not None and not log_path.is_file():
        raise FileNotFoundError(f"--sglang-log {log_path}: no such file")
    # with --url, only the lines the server appends while this check runs describe its workload
    log_start = log_path.stat().st_size if log_path is not None and check.url else 0
    eng = engine(check.backend)
    client = eng.make_client(Http(check.url, check.timeout, check.retries, check.retry_budget,
                                  _say if progress else None), check) if check.url else None
    # before loading the target: a wrong --url fails in seconds
    server_settings, note = client.settings() if client is not None else (None, None)
    return client, server_settings, note, log_path, log_start


def _run_server_check(settings: Settings, check: ServerCheckOptions, oracle, progress: bool,
                      folder, group) -> ServerCheckResult | None:
    """Compare the server at check.url (and/or check.sglang_log) with the oracle for the settings' prompts."""
    import torch

    from eagle_eval.commands.folder import agree_on_loaded
    from eagle_eval.oracle import checked_workload, load_oracle
    from eagle_eval.results.report import DEFINITIONS, build_report
    from eagle_eval.servers.hypotheses import match_hypotheses

    torch.manual_seed(settings.decoding.seed)
    backend, eng = check.backend, engine(check.backend)
    client, server_settings, note, log_path, log_start = group.on_main(lambda: _server(check, progress)) or (None,) * 5
    oracle = load_oracle(settings, like=oracle)
    workload = checked_workload(oracle)      # the same prompts and turns as `run`
    resolved = oracle.resolved
    agree_on_loaded(oracle, workload.first_prompts)
    if not settings.decoding.greedy:
        return _sampled_check(oracle, workload, client, server_settings, note, check, progress, group)
    prompts, samples, rows = _decode_and_ask(oracle, workload, client, check, progress)
    if not group.is_main:
        return None                                  # rank 0's result is broadcast
    acceptance = aggregate(backend, rows, check.tolerance) if client is not None else None
    judged = judge_requests(rows, check.mode, check.tolerance) if client is not None else None
    hypotheses = None
    if judged is not None and check.hypotheses and _any_disagreement(rows, check.mode):
        server_steps = (eng.server_num_steps(server_settings or {}) if eng.server_num_steps
                        else (server_settings or {}).get(eng.num_steps_setting))
        hypotheses = match_hypotheses(oracle, prompts, rows, backend, server_steps, check.mode, check.tolerance)
    log = _log_comparison(backend, log_path, log_start, samples, resolved, check.tolerance) if log_path else None
    settings_rows = (eng.compare_settings(server_settings, resolved, settings.model.draft)
                     if server_settings is not None else [])
    verdict, reasons = _verdict(judged, settings_rows, log)
    divergences = [{"id": r["id"], "kind": r["tokens"], **r["divergence"]} for r in rows if r["divergence"]]
    warnings = _warnings(oracle, workload, [note] if note else [], rows, divergences, check.tie_margin)
    report = build_report({**settings.flat(), **check.as_dict()}, resolved, workload.resolved, samples, warnings,
                          settings.decoding.seed, sample_prompt=workload.sample_prompt)
    counts = {k: sum(1 for r in rows if r["tokens"] == k) for k in ("equal", "near_tie", "mismatch", "unknown")}
    report.update({
        "kind": "server_check",
        "definitions": {**DEFINITIONS, **{f"server_{e.name}": f"{e.figure}: {e.figure_definition}"
                                          for e in ENGINES.records()}},
        "server_check": check.as_dict(),
        "server": {"backend": backend, "url": check.url, "settings": server_settings,
                   "settings_check": settings_rows},
        "tokens": {"requests": len(rows), **counts, "tie_margin": check.tie_margin},
        "judgement": judged,
        "acceptance": acceptance,
        "distribution": server_distribution(backend, rows, resolved.num_steps) if rows else None,
        "divergences": divergences, "requests": rows, "hypotheses": hypotheses, "sglang_log": log,
        "verdict": verdict, "reasons": reasons, "exit_status": EXIT_STATUS[verdict],
        "server_by_context": server_by_context(report, rows),
    })
    if folder is not None:
        folder.write_json("server_check.json", report)
        folder.finish()
    return ServerCheckResult(report=report, exit_status=EXIT_STATUS[verdict])


def _sampled_check(oracle, workload, client, server_settings, note, check: ServerCheckOptions, progress: bool,
                   group) -> ServerCheckResult | None:
    """server-check at temperature > 0 (servers/sampled.py): the answers' distribution against the target's, and
    each request's per-step counts against the drafts re-made along its own answer (one-hot rules). Rank 0 only:
    the oracle decodes nothing, so there is nothing to split."""
    from eagle_eval.results.report import DEFINITIONS, build_report
    from eagle_eval.servers.sampled import (ask_sampled, exact_per_request, expectation_check, expected_along,
                                            judge_sampled, plausibility)
    from eagle_eval.rules.base import rule

    if client is None and group.is_main:
        from eagle_eval.settings import ConfigError
        raise ConfigError("--temperature > 0 needs --url (the SGLang log alone says nothing about sampled answers)")
    if not group.is_main:
        return None
    settings, resolved, decoding = oracle.settings, oracle.resolved, oracle.settings.decoding
    prompts, records, rows = ask_sampled(oracle, workload, client, check, progress)
    plaus = plausibility(oracle, [(p.input_ids, r["output_ids"]) for p, r in zip(prompts, rows)])
    exact = exact_per_request(decoding)
    expectation = None
    stepped = [i for i, r in enumerate(rows) if r["server"]["accepted_per_cycle"] and r["output_ids"]]
    if stepped and resolved.topk == 1:             # per-step counts give the cycle roots along each answer
        got = expected_along(oracle, [prompts[i] for i in stepped], [rows[i]["output_ids"] for i in stepped],
                             rollouts=check.rollouts)
        expectation = expectation_check([rows[i] for i in stepped], got, resolved.num_steps, check.tolerance)
    verdict, reasons = judge_sampled(rows, plaus, exact, expectation)
    settings_rows = (engine(check.backend).compare_settings(server_settings, resolved, settings.model.draft)
                     if server_settings is not None else [])
    for row in settings_rows:
        if row["ok"] is False:
            verdict = "disagree"
            reasons.append(f"server setting {row['setting']} = {row['server']}, oracle {row['oracle']}")
    report = build_report({**settings.flat(), **check.as_dict()}, resolved, workload.resolved, records,
                          list(oracle.warnings) + list(workload.warnings) + ([note] if note else []),
                          settings.decoding.seed, sample_prompt=workload.sample_prompt)
    server_tau = [r["server"]["figure"] for r in rows if r["server"]["figure"] is not None]
    report.update({
        "kind": "server_check", "definitions": {**DEFINITIONS, "sampled": (
            "at temperature > 0: summary/per_position are the counts re-drafted along the server's own answers "
            "(the per-step counts a faithful server must report under a one-hot rule); plausibility: the answers' "
            "tokens against the target's p at these settings")},
        "server_check": check.as_dict(),
        "server": {"backend": check.backend, "url": check.url, "settings": server_settings,
                   "settings_check": settings_rows},
        "sampling": {"temperature": decoding.temperature, "top_k": decoding.top_k, "top_p": decoding.top_p,
                     "min_p": decoding.min_p, "rule": decoding.accept_rule, "filter_order": rule(decoding.accept_rule).filter_order,
                     "per_request_seed": "sha256 of (--seed, prompt id), 31 bits (servers/sampled.py request_seed)",
                     "exact_per_request": exact},
        "plausibility": plaus, "expectation": expectation, "tokens": {"requests": len(rows)}, "judgement": None,
        "acceptance": {
            "server_mean_accept_length": sum(server_tau) / len(server_tau) if server_tau else None,
            "redrafted_accept_length": report["summary"]["accept_length"] if exact else None},
        "distribution": None, "divergences": [], "requests": rows, "hypotheses": None, "sglang_log": None,
        "verdict": verdict, "reasons": reasons, "exit_status": EXIT_STATUS[verdict],
        "server_by_context": server_by_context(report, rows)})
    return ServerCheckResult(report=report, exit_status=EXIT_STATUS[verdict])


def server_by_context(report: dict, rows: list[dict]) -> dict | None:
    """The server's acceptance by context from its per-step counts, where it gives them, in the oracle's
    buckets (results/context.py; None when no request gives per-step counts)."""
    from eagle_eval.results.context import from_requests

    cfg = report["config"]
    return from_requests(rows, "server", cfg["num_steps"], cfg.get("context_buckets"), cfg.get("train_context"))


def _f(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


def _settings_lines(srv: dict) -> list[str]:
    """One line per setting the server reports, against the oracle's."""
    lines = []
    for s in srv["settings_check"]:
        state = {True: "ok", False: "MISMATCH", None: "-"}[s["ok"]]
        lines.append(f"  {s['setting']:<34} server {str(s['server']):<12} oracle {str(s['oracle']):<12} {state}"
                     + (f"  ({s['note']})" if s.get("note") else ""))
    return lines


def _verdict_lines(report: dict) -> list[str]:
    """The warnings, the verdict and its reasons: how every summary ends."""
    return ([f"WARNING: {w}" for w in report["warnings"]] + [f"verdict: {report['verdict'].upper()}"]
            + [f"  - {r}" for r in report["reasons"]])


def render_server_check(report: dict) -> str:
    """The terminal summary of a server_check report."""
    if report.get("sampling"):
        return _render_sampled(report)
    srv, tok, acc = report["server"], report["tokens"], report["acceptance"]
    lines = [f"server-check  {srv['backend']}  {srv['url'] or '(log only)'}"]
    lines += _settings_lines(srv)
    if srv["url"]:
        lines.append(f"tokens      {tok['requests']} requests: {tok['equal']} equal, {tok['near_tie']} near-tie, "
                     f"{tok['mismatch']} diverged, {tok['unknown']} not reported")
    s = report["summary"]
    lines.append(f"oracle      tau {_f(s['accept_length'])} over {s['cycles']} cycles of {s['prompts']} prompts "
                 "(the reference; mean accepted + 1 per cycle)")
    j = report.get("judgement")
    if j:
        lines.append(f"judged      {j['mode']} mode: {j['rule']}")
        lines.append(f"  exact {j['exact']}/{j['requests']}  near-tie {j['near_tie']}  same tokens other counts "
                     f"{j['counts_differ']}  other tokens {j['tokens_differ']}  not comparable {j['unknown']}")
        per_cycle = (acc or {}).get("per_request", {})
        if per_cycle.get("per_cycle_compared"):
            lines.append(f"  accepted drafts compared verify step by verify step on {per_cycle['per_cycle_compared']} "
                         f"requests: {per_cycle['per_cycle_equal']} equal")
        if j.get("interval"):
            iv = j["interval"]
            lines.append(f"  per-request relative difference {iv['mean']:+.2%}, 95% interval [{iv['low']:+.2%}, "
                         f"{iv['high']:+.2%}] over {iv['requests']} requests")
    for d in report["divergences"]:
        lines.append(f"  {d['id']}: position {d['position']}: server {d.get('server_token', '-')}, oracle "
                     f"{d.get('oracle_token', '-')}, target logit margin {_f(d.get('margin'))} ({d['kind']})")
    if acc is not None:
        verdict = {True: "within tolerance", False: "OUTSIDE tolerance", None: "not compared"}
        lines += [f"acceptance  {acc['figure']}: {acc['definition']}",
                  f"  oracle {_f(acc['oracle'])}  server {_f(acc['server'])}  relative difference "
                  f"{_f(acc['relative_difference'], '.1%')}  (tolerance {acc['tolerance']:.1%}, "
                  f"{acc['requests_compared']} requests): {verdict[acc['within_tolerance']]}"]
        if acc["sources"]:
            lines.append("  server counts from " + ", ".join(f"{src} ({n}/{acc['requests']} requests)"
                                                             for src, n in acc["sources"].items()))
        lines.append(f"  {'id':<12} {'oracle':>8} {'server':>8} {'verify o/s':>11}")
        for r in report["requests"]:
            lines.append(f"  {r['id']:<12} {_f(r['oracle']['figure']):>8} {_f(r['server']['figure']):>8} "
                         f"{r['oracle']['verify_count']:>5}/{str(r['server']['verify_count']):<5}"
                         + ("" if r["comparable"] else "  (left out)"))
    hyp = report["hypotheses"]
    if hyp:
        lines.append(f"hypotheses  ({hyp['mode']} mode: one explains the server with {hyp['rule']})")
        for h in hyp["ranking"]:
            mark = "  <- explains the server" if h["name"] in hyp["tied"] else ""
            lines.append(f"  {h['name']:<24} exact {h['exact_requests']}/{hyp['requests']}  aggregate "
                         f"{_f(h['aggregate'])}  mean|diff| {_f(h['mean_abs_difference'])}{mark}")
            lines.append(f"      {h['description']}")
        if hyp["explanation"] is None:
            lines.append(f"  no hypothesis explains the server; nearest: {', '.join(hyp['nearest'])}")
    log = report["sglang_log"]
    if log:
        lines.append(f"sglang log  {log['lines']} decode lines, mean accept len {_f(log['server_accept_length'])} "
                     f"vs oracle tau {_f(log['oracle_accept_length'])}")
    return "\n".join(lines + _context_lines(report) + _verdict_lines(report))


def _context_lines(report: dict) -> list[str]:
    """Acceptance by context of the oracle and, from its per-step counts, of the server (results/context.py)."""
    from eagle_eval.results.context import render

    return (render(report.get("by_context"), "oracle acceptance by context")
            + render(report.get("server_by_context"), "server acceptance by context (its per-step counts)"))


def _render_sampled(report: dict) -> str:
    """The terminal summary of a check at temperature > 0."""
    srv, smp, pl, acc = report["server"], report["sampling"], report["plausibility"], report["acceptance"]
    lines = [f"server-check  {srv['backend']}  {srv['url']}  at temperature {smp['temperature']:g} (top-k "
             f"{smp['top_k'] or 'off'}, top-p {smp['top_p']:g}, min-p {smp['min_p']:g}; rule {smp['rule']}: "
             f"{smp['filter_order']})"]
    lines += _settings_lines(srv)
    lines.append(f"samples     the server's tokens against the target's p: {pl['verdict'].upper()} ({pl['message']}); "
                 f"mean log p {_f(pl['mean_log_p'])} per token, samples of the target average "
                 f"{_f(pl['mean_log_p_of_samples'])}")
    if smp["exact_per_request"]:
        compared = [r for r in report["requests"] if r.get("redrafted", {}).get("equal") is not None]
        equal = sum(1 for r in compared if r["redrafted"]["equal"])
        lines.append(f"per request the accepted drafts against the drafts re-made along each answer: {equal}/"
                     f"{len(compared)} requests equal ({len(report['requests'])} sent)")
    lines.append(f"acceptance  server mean accept length {_f(acc['server_mean_accept_length'])}; re-drafted along "
                 f"its answers {_f(acc['redrafted_accept_length'])}")
    exp = report.get("expectation")
    if exp:
        lines.append(f"expected    {exp['verdict'].upper()}: {exp.get('message')}")
        if exp.get("per_position"):
            lines.append("  per position P(A >= i): " + "  ".join(
                f"{q['position']}: {q['server_rate']:.3f} vs {q['expected_rate']:.3f}" for q in exp["per_position"])
                + "  (server vs expected)")
    return "\n".join(lines + _context_lines(report) + _verdict_lines(report))

