"""server-check: a running SGLang or vLLM server against the oracle, prompt by prompt.

Contract: `run_server_check(run_config, check_config)` decodes every prompt with the oracle, sends the
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

from dataclasses import asdict, dataclass
from pathlib import Path

from eagle_eval.config import ConfigError, RunConfig
from eagle_eval.servers.compare import (
    FIGURES,
    aggregate,
    compare_request,
    compare_sglang_log,
    compare_sglang_settings,
    compare_vllm_settings,
    parse_sglang_log,
    server_distribution,
)
from eagle_eval.servers.judge import MODES, judge_requests
from eagle_eval.servers.vllm import METRICS_SOURCES

EXIT_STATUS = {"agree": 0, "disagree": 1, "incomplete": 3, "undecided": 3}


@dataclass(frozen=True)
class ServerCheckConfig:
    backend: str
    url: str | None = None                   # None: only --sglang-log is compared
    mode: str = "exact"                      # exact | tolerance (see servers/judge.py)
    tolerance: float = 0.05                  # relative: the per-request interval (tolerance mode), the log
    tie_margin: float = 0.1                  # a divergence with a smaller target logit margin is numerics
    timeout: float = 300.0                   # seconds per HTTP request
    retries: int = 2                         # connection errors and 502/503/504 only
    served_model_name: str | None = None     # vLLM `model` field; None = the first of /v1/models
    metrics_settle: float = 0.2              # vLLM: seconds between /metrics reads until they agree
    vllm_metrics: str = "auto"               # vLLM: auto | per-request | counters (servers/vllm.py)
    sglang_log: str | None = None
    hypotheses: bool = True                  # rank wiring faults when acceptance disagrees
    output_dir: str | None = None            # writes server_check.json

    def __post_init__(self):
        if self.backend not in ("sglang", "vllm"):
            raise ConfigError(f"--backend must be sglang or vllm, got {self.backend!r}")
        if self.url is None and self.sglang_log is None:
            raise ConfigError("--url is required (or --sglang-log alone, to compare a log with the oracle)")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"--url must start with http:// or https://, got {self.url!r}")
        if self.sglang_log is not None and self.backend != "sglang":
            raise ConfigError("--sglang-log needs --backend sglang")
        if self.vllm_metrics not in METRICS_SOURCES:
            raise ConfigError(f"--vllm-metrics must be one of {', '.join(METRICS_SOURCES)}, got {self.vllm_metrics!r}")
        if self.vllm_metrics != "auto" and self.backend != "vllm":
            raise ConfigError("--vllm-metrics needs --backend vllm")
        if self.mode not in MODES:
            raise ConfigError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.tolerance < 0 or self.tie_margin < 0:
            raise ConfigError("--tolerance and --tie-margin must be >= 0")
        if self.timeout <= 0 or self.retries < 0 or self.metrics_settle < 0:
            raise ConfigError("--timeout must be > 0, --retries and --metrics-settle >= 0")


@dataclass
class ServerCheckResult:
    report: dict
    exit_status: int


def divergence_from_oracle(oracle, prompt, server_ids: list[int] | None, oracle_ids: list[int]) -> dict | None:
    """First difference of the server's output from the oracle's, with the target's logit margin there."""
    from eagle_eval.speculative.greedy import first_divergence

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


def _settings_rows(settings: dict | None, backend: str, resolved: dict, draft_path: str) -> list[dict]:
    if settings is None:
        return []
    if backend == "sglang":
        return compare_sglang_settings(settings, resolved, draft_path)
    return compare_vllm_settings(settings, resolved)


def _decode_and_ask(oracle, workload, client, config: RunConfig, check: ServerCheckConfig, progress: bool):
    """(prompts, oracle samples, per-request rows) in workload order: each prompt decoded by the
    oracle (in a launched run by whichever process takes its question, eagle_eval/parallel), then sent
    to the server by rank 0 as it arrives, one request at a time. Empty lists on the other ranks."""
    from eagle_eval.parallel import group as parallel
    from eagle_eval.parallel.turns import decode_questions
    from eagle_eval.workload.conversations import in_workload_order

    pairs, rows = [], {}
    num_steps = oracle.resolved["num_steps"]

    def ask(prompt, rec):
        # turn t > 1 is built from the ORACLE's earlier answers; the server gets the same token ids
        pairs.append((prompt, rec))
        if client is not None:
            reply = client.generate(prompt.input_ids, config.max_new_tokens)
            div = divergence_from_oracle(oracle, prompt, reply.output_ids, rec.output_ids)
            rows[prompt.id] = compare_request(check.backend, rec, reply, div, num_steps, check.tie_margin)

    decode_questions(parallel.current(), workload, lambda p: oracle.decode(p, check_lossless=False), {}, ask,
                     config.max_new_tokens, progress)
    samples = in_workload_order(workload, [rec for _, rec in pairs])
    prompt_of = {p.id: p for p, _ in pairs}
    return [prompt_of[s.id] for s in samples], samples, [rows[s.id] for s in samples if s.id in rows]


def _log_comparison(path: Path, start: int, samples, resolved: dict, tolerance: float) -> dict:
    from eagle_eval.results.report import summarize

    with open(path, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    tau = summarize(samples, resolved["num_steps"])["summary"]["accept_length"]
    log = compare_sglang_log(parse_sglang_log(text), tau, resolved["num_draft_tokens"], tolerance)
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


def run_server_check(config: RunConfig, check: ServerCheckConfig, oracle=None,
                     progress: bool = False) -> ServerCheckResult:
    """The check below, with --output-dir owned by this run (results/run_folder.py). In a
    launched run the oracle's decodes are split between the processes; rank 0 alone talks to the server
    and writes the folder, and every rank returns its result."""
    from eagle_eval.parallel import group as parallel
    from eagle_eval.parallel.settings import settings_digests
    from eagle_eval.results.run_folder import open_run_folder

    settings = {**config.as_dict(), **asdict(check)}
    group = parallel.current()
    group.check_same("settings", settings_digests("server-check", settings, config.input_paths()))
    folder = group.on_main(lambda: open_run_folder(check.output_dir, "server-check", settings, config.input_paths(),
                                                   overwrite=config.overwrite) if check.output_dir else None)
    try:
        result = _run_server_check(config, check, oracle, progress and group.is_main, folder, group)
        return group.broadcast(result)
    finally:
        if folder is not None:
            folder.close()


def _server(check: ServerCheckConfig):
    """(client, its settings, a note, the SGLang log and where this check's lines start) on rank 0."""
    from eagle_eval.servers.clients import make_client

    log_path = Path(check.sglang_log) if check.sglang_log else None
    if log_path is not None and not log_path.is_file():
        raise FileNotFoundError(f"--sglang-log {log_path}: no such file")
    # with --url, only the lines the server appends while this check runs describe its workload
    log_start = log_path.stat().st_size if log_path is not None and check.url else 0
    client = (make_client(check.backend, check.url, check.timeout, check.retries, check.served_model_name,
                          check.metrics_settle, check.vllm_metrics) if check.url else None)
    # before loading the target: a wrong --url fails in seconds
    settings, note = client.settings() if client is not None else (None, None)
    return client, settings, note, log_path, log_start


def _run_server_check(config: RunConfig, check: ServerCheckConfig, oracle, progress: bool,
                      folder, group) -> ServerCheckResult | None:
    """Compare the server at check.url (and/or check.sglang_log) with the oracle for config's prompts.

    `oracle`: an already loaded `api.Oracle` for `config` (saves reloading the target in test suites).
    """
    import torch

    from eagle_eval.api import checked_workload, load_oracle
    from eagle_eval.parallel.settings import loaded_digests
    from eagle_eval.results.report import DEFINITIONS, build_report
    from eagle_eval.results.resume import workload_digests
    from eagle_eval.servers.hypotheses import match_hypotheses

    torch.manual_seed(config.seed)
    backend = check.backend
    client, settings, note, log_path, log_start = group.on_main(lambda: _server(check)) or (None,) * 5
    oracle = oracle or load_oracle(config)
    workload = checked_workload(config, oracle)      # the same prompts and turns as `run`
    resolved = oracle.resolved
    group.check_same("loaded target, head and prompts", loaded_digests(
        resolved, workload_digests(workload.first_prompts), config.input_paths()))
    prompts, samples, rows = _decode_and_ask(oracle, workload, client, config, check, progress)
    if not group.is_main:
        return None                                  # rank 0's result is broadcast
    acceptance = aggregate(backend, rows, check.tolerance) if client is not None else None
    judged = judge_requests(rows, check.mode, check.tolerance) if client is not None else None
    hypotheses = None
    if judged is not None and check.hypotheses and _any_disagreement(rows, check.mode):
        server_steps = (settings or {}).get("speculative_num_steps" if backend == "sglang"
                                            else "num_speculative_tokens")
        hypotheses = match_hypotheses(oracle, prompts, rows, backend, server_steps, check.mode, check.tolerance)
    log = _log_comparison(log_path, log_start, samples, resolved, check.tolerance) if log_path else None
    settings_rows = _settings_rows(settings, backend, resolved, config.draft)
    verdict, reasons = _verdict(judged, settings_rows, log)
    divergences = [{"id": r["id"], "kind": r["tokens"], **r["divergence"]} for r in rows if r["divergence"]]
    warnings = _warnings(oracle, workload, [note] if note else [], rows, divergences, check.tie_margin)
    report = build_report(config, {**resolved, **workload.resolved}, samples, warnings,
                          sample_prompt=workload.sample_prompt)
    counts = {k: sum(1 for r in rows if r["tokens"] == k) for k in ("equal", "near_tie", "mismatch", "unknown")}
    report.update({
        "kind": "server_check",
        "definitions": {**DEFINITIONS, **{f"server_{b}": f"{n}: {d}" for b, (n, d) in FIGURES.items()}},
        "server_check": asdict(check),
        "server": {"backend": backend, "url": check.url, "settings": settings, "settings_check": settings_rows},
        "tokens": {"requests": len(rows), **counts, "tie_margin": check.tie_margin},
        "judgement": judged,
        "acceptance": acceptance,
        "distribution": server_distribution(backend, rows, resolved["num_steps"]) if rows else None,
        "divergences": divergences, "requests": rows, "hypotheses": hypotheses, "sglang_log": log,
        "verdict": verdict, "reasons": reasons, "exit_status": EXIT_STATUS[verdict],
    })
    if folder is not None:
        folder.write_json("server_check.json", report)
        folder.finish()
    return ServerCheckResult(report=report, exit_status=EXIT_STATUS[verdict])


def _f(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


def render_server_check(report: dict) -> str:
    """The terminal summary of a server_check report."""
    srv, tok, acc = report["server"], report["tokens"], report["acceptance"]
    lines = [f"server-check  {srv['backend']}  {srv['url'] or '(log only)'}"]
    for s in srv["settings_check"]:
        state = {True: "ok", False: "MISMATCH", None: "-"}[s["ok"]]
        lines.append(f"  {s['setting']:<34} server {str(s['server']):<12} oracle {str(s['oracle']):<12} {state}"
                     + (f"  ({s['note']})" if s["note"] else ""))
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
    for w in report["warnings"]:
        lines.append(f"WARNING: {w}")
    lines.append(f"verdict: {report['verdict'].upper()}")
    lines += [f"  - {r}" for r in report["reasons"]]
    return "\n".join(lines)
