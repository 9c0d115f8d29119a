"""`eagle-eval diagnose`: find train/serve mismatches before anyone benchmarks a server (issue 5).

Contract: `diagnose(run_config, diagnose_config)` loads the target and head once, then
  1. collects the load-time findings (`sanity`, computed by `load_oracle`) and the draft vocab's
     coverage of the target's greedy tokens on the prompts;
  2. with a training dump, says which HF index each dumped block is (`dumps`);
  3. sweeps aux-layer candidates with the teacher-forced profile (`aux_sweep`), all on the same
     greedy continuations, and reports a mismatch when an alternative clearly beats the configured set;
  4. compares acceptance with the tokenizer's chat template, raw prompts and a --chat-template FILE;
  5. optionally fingerprints the aux features of the first prompt tokens.
The prompt budget is --limit, else `DiagnoseConfig.prompt_budget` questions (first turns only).
Returns a `Diagnosis` (report dict + findings); exit status 1 when any finding is an error.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from eagle_eval.results.findings import Finding, error, exit_status, info, warning


@dataclass(frozen=True)
class DiagnoseConfig:
    train_dump: str | None = None
    fingerprint: bool = False
    sweep: bool = True
    template_check: bool = True
    prompt_budget: int = 8              # questions profiled when --limit is not given
    output_dir: str | None = None

    def __post_init__(self):
        from eagle_eval.config import ConfigError
        if self.prompt_budget < 1:
            raise ConfigError(f"--prompt-budget must be >= 1, got {self.prompt_budget}")


@dataclass
class Diagnosis:
    report: dict
    findings: list[Finding]

    @property
    def exit_status(self) -> int:
        return exit_status(self.findings)


def _layers(hf) -> dict:
    hf = [int(i) for i in hf]
    return {"hf": hf, "sglang": [i - 1 for i in hf], "vllm": hf}


def _write_prompts(path: Path, prompts) -> str:
    path.write_text("".join(json.dumps({"id": p.id, "category": p.category, "input_ids": p.input_ids}) + "\n"
                            for p in prompts))
    return str(path)


def _continuations(oracle, prompts, need: int) -> list[list[int]]:
    from eagle_eval.spec.profile import greedy_continuations

    tok = oracle.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else (min(oracle.eos_ids) if oracle.eos_ids else 0)
    return greedy_continuations(oracle.speculator, [p.input_ids for p in prompts], need, pad, 16384)


def _config_hf(oracle) -> list[int] | None:
    """The HF layers the draft config.json itself names (None: no ids in it)."""
    from eagle_eval.models.sanity import config_aux_hf

    return config_aux_hf(json.loads((Path(oracle.resolved["head"]["path"]) / "config.json").read_text()))


def sweep_findings(rows, configured: tuple[int, ...]) -> tuple[list[Finding], list[int]]:
    """(findings, recommended HF layers) from ranked sweep rows."""
    from eagle_eval.diagnose.aux_sweep import config_lines

    base = next(r for r in rows if r.candidate.hf == configured)
    best = rows[0]
    out = []
    if best.tau < 1.05:
        out.append(warning("acceptance-near-zero", f"every candidate layer set accepts almost nothing (best tau "
                                                   f"{best.tau:.3f}): look at lm_head, embeddings and d2t first"))
    winner = next((r for r in rows if r.clearly_better), None)
    if winner is None:
        out.append(info("aux-layers-ok", f"configured HF {list(configured)} ranks {base.rank} of {len(rows)} (tau "
                                         f"{base.tau:.3f}); no alternative beats it by more than max(0.1, 3 SE)"))
        return out, list(configured)
    lines = config_lines(list(winner.candidate.hf))
    out.append(error("aux-layer-mismatch",
                     f"HF {list(winner.candidate.hf)} ({winner.candidate.label}) gives tau {winner.tau:.3f} vs "
                     f"{base.tau:.3f} for the configured HF {list(configured)} (+{winner.delta:.3f}, SE "
                     f"{winner.delta_se:.3f}): in the draft config.json set SGLang {lines['sglang']}; vLLM "
                     f"{lines['vllm']}", config_lines=lines))
    return out, list(winner.candidate.hf)


def _template_variants(run) -> list[tuple[str, object]]:
    """(label, RunConfig) for the configured prompt format, the tokenizer's template and raw prompts."""
    def label(cfg):
        if cfg.no_chat_template:
            return "raw prompts (--no-chat-template)"
        return f"--chat-template {cfg.chat_template}" if cfg.chat_template else "the tokenizer's chat template"

    variants = [run, replace(run, no_chat_template=False, chat_template=None),
                replace(run, no_chat_template=True, chat_template=None, enable_thinking=None)]
    out, seen = [], set()
    for v in variants:
        if (v.no_chat_template, v.chat_template) not in seen:
            seen.add((v.no_chat_template, v.chat_template))
            out.append((label(v) + (" (configured)" if v is run else ""), v))
    return out


def template_check(oracle, run, pcfg, tmp: Path) -> tuple[list[dict], list[Finding]]:
    """Profile the prompts of `run` rendered with each chat-template choice (with the profile settings
    of `pcfg`); rows[0] is the configured one."""
    from eagle_eval import api
    from eagle_eval.config import ConfigError
    from eagle_eval.diagnose.aux_sweep import clearly_better, paired_delta, prompt_counts, tau_se
    from eagle_eval.workload.conversations import load_workload
    from eagle_eval.workload.data import DataError

    rendered = []
    for label, cfg in _template_variants(run):
        try:
            prompts = load_workload(cfg, oracle.tokenizer).first_prompts
        except (DataError, ConfigError) as exc:        # e.g. messages rows and no template at all
            rendered.append((label, None, f"{type(exc).__name__}: {exc}"))
            continue
        rendered.append((label, prompts, None))
    base_ids = [p.input_ids for p in rendered[0][1]]
    if all(r[1] is None or [p.input_ids for p in r[1]] == base_ids for r in rendered):
        return [], [info("chat-template", "the prompts do not depend on the chat template (pre-tokenized or "
                                          "plain-text rows): template check not applicable")]
    rows, base_counts = [], None
    for i, (label, prompts, err) in enumerate(rendered):
        if prompts is None:
            rows.append({"variant": label, "error": err})
            continue
        file = _write_prompts(tmp / f"template{i}.jsonl", prompts)
        res = api.profile(replace(pcfg, run=replace(pcfg.run, prompts=file, limit=None)), progress=False,
                          oracle=oracle)
        counts = prompt_counts([s.accepted_per_cycle for s in res.samples])
        tau, se = tau_se(counts)
        row = {"variant": label, "tau": tau, "se": se, "prompt_tokens": sum(len(p.input_ids) for p in prompts)}
        if base_counts is None:
            base_counts = counts
        else:
            row["delta_vs_configured"], row["delta_se"] = paired_delta(counts, base_counts)
            row["clearly_better"] = clearly_better(row["delta_vs_configured"], row["delta_se"])
        rows.append(row)
    better = [r for r in rows if r.get("clearly_better")]
    if better:
        b = max(better, key=lambda r: r["tau"])
        return rows, [warning("chat-template-mismatch",
                              f"{b['variant']} gives tau {b['tau']:.3f} vs {rows[0]['tau']:.3f} with "
                              f"{rows[0]['variant']}: "
                              "the head was probably trained on prompts rendered that way")]
    return rows, [info("chat-template", f"{rows[0]['variant']} (tau {rows[0]['tau']:.3f}) is not clearly beaten by "
                                        "another prompt format")]


def _read_dump(oracle, dcfg: DiagnoseConfig):
    """The training dump matched to HF indices (None without --train-dump); read first, so bad input fails fast."""
    from eagle_eval.diagnose import dumps

    if not dcfg.train_dump:
        return None
    target = oracle.speculator.target
    return dumps.match_dump(target, dumps.read_dump(dcfg.train_dump, target.info.hidden_size))


def _dump_section(match, configured, num_aux: int, report: dict) -> tuple[list[Finding], tuple | None]:
    """Findings of a dump and its layers when every block matched one HF index confidently."""
    from eagle_eval.diagnose import dumps

    report["dump"] = {"file": match.dump.file, "format": match.dump.format, "tokens": match.tokens,
                      "notes": match.notes,
                      "hidden_state": match.hidden_state.as_dict() if match.hidden_state else None}
    report["dump_blocks"] = [b.as_dict() for b in match.blocks]
    confident = match.confident and len(match.hf) == num_aux
    return dumps.dump_findings(match, configured, num_aux), (tuple(sorted(match.hf)) if confident else None)


def _profile_config(run, prompts, conts, tmp: Path):
    """Profile settings over the rendered prompts (input_ids rows) and their shared greedy continuations."""
    from eagle_eval.config import ProfileConfig

    responses = tmp / "responses.jsonl"
    responses.write_text("".join(json.dumps({"id": p.id, "output_ids": c}) + "\n" for p, c in zip(prompts, conts)))
    prof_run = replace(run, prompts=_write_prompts(tmp / "prompts.jsonl", prompts), limit=None, dataset=None,
                       dataset_format=None, categories=None, shuffle_seed=None)
    return ProfileConfig(run=prof_run, max_steps=run.num_steps, responses=str(responses))


def diagnose(run, dcfg: DiagnoseConfig, progress: bool = False) -> Diagnosis:
    """Every check of issue 5 on one loaded target + head (see the module docstring); --output-dir is
    owned by this run (results/run_folder.py)."""
    from eagle_eval.results.run_folder import open_output

    inputs = {**run.input_paths(), "train_dump": dcfg.train_dump}
    with open_output(dcfg.output_dir, "diagnose", {**run.as_dict(), **dcfg.__dict__}, inputs,
                     overwrite=run.overwrite) as folder:
        return _diagnose(run, dcfg, folder, progress)


def _diagnose(run, dcfg: DiagnoseConfig, folder, progress: bool) -> Diagnosis:
    from eagle_eval import api
    from eagle_eval.diagnose import aux_sweep
    from eagle_eval.diagnose.fingerprint import fingerprint
    from eagle_eval.models import sanity
    from eagle_eval.results.report import provenance

    run = replace(run, output_dir=None, resume=False, check_lossless=False,
                  limit=run.limit if run.limit is not None else dcfg.prompt_budget)
    oracle = api.load_oracle(run)
    head, num_layers = oracle.speculator.head, oracle.speculator.target.num_layers
    configured = tuple(oracle.speculator.aux_hf)
    findings = [Finding.from_dict(f) for f in oracle.resolved.get("sanity", [])]
    report: dict = {"schema_version": 1, "configured_aux_layers": _layers(configured)}
    match = _read_dump(oracle, dcfg)
    prompts = api.checked_workload(run, oracle).first_prompts
    conts = _continuations(oracle, prompts, run.max_new_tokens + run.num_steps)
    findings.append(sanity.coverage_finding(head.t2d, [c[:run.max_new_tokens] for c in conts]))
    extra, dump_hf, recommended = [], None, list(configured)
    config_hf = _config_hf(oracle)
    if config_hf is not None:
        extra.append(("draft config.json ids", tuple(config_hf)))
    if match is not None:
        more, dump_hf = _dump_section(match, configured, head.config.num_aux, report)
        findings += more
        extra[:0] = [("training dump", dump_hf)] if dump_hf else []
    with tempfile.TemporaryDirectory(prefix="eagle-eval-diagnose-") as tmpdir:
        pcfg = _profile_config(run, prompts, conts, Path(tmpdir))
        if dcfg.sweep:
            rows = aux_sweep.run_sweep(oracle, pcfg, aux_sweep.candidates(configured, num_layers, extra), progress)
            report["sweep"] = {"num_steps": run.num_steps, "prompts": len(prompts),
                               "max_new_tokens": run.max_new_tokens,
                               "clearly_better": "tau higher than the configured set's by > max(0.1, 3 SE of the "
                                                 "paired difference, prompts as clusters)",
                               "rows": [r.as_dict() for r in rows]}
            more, recommended = sweep_findings(rows, configured)
            findings += more
        if dcfg.template_check:
            report["template_check"], more = template_check(oracle, run, replace(pcfg, responses=None), Path(tmpdir))
            findings += more
    if dump_hf is not None:
        recommended = list(dump_hf)             # the dump says what the head was trained on
    if dcfg.fingerprint:
        report["fingerprint"] = fingerprint(oracle, prompts[0])
    report.update({"findings": [f.as_dict() for f in findings], "recommended_aux_layers": _layers(recommended),
                   "exit_status": exit_status(findings), "config": {**run.as_dict(), **dcfg.__dict__},
                   "resolved": oracle.resolved, "provenance": provenance(run.seed)})
    if folder is not None:
        folder.write_json("diagnosis.json", report)
        folder.finish()
    return Diagnosis(report=report, findings=findings)


def render_diagnosis(report: dict) -> str:
    from eagle_eval.results.findings import render_findings

    cfg, aux, rec = report["resolved"], report["configured_aux_layers"], report["recommended_aux_layers"]
    lines = [f"target {cfg['target']['path']} ({cfg['target']['num_layers']} layers), draft {cfg['head']['path']} "
             f"({cfg['head']['dialect']} layout)",
             f"configured aux layers  HF {aux['hf']} = SGLang ids {aux['sglang']} = vLLM ids {aux['vllm']}",
             f"recommended            HF {rec['hf']} = SGLang ids {rec['sglang']} = vLLM ids {rec['vllm']}", ""]
    if report.get("dump_blocks"):
        lines.append("training dump: " + report["dump"]["file"])
        lines += [f"  block {b['block']} -> HF[{b['hf_index']}]  cos {b['cosine']:.4f}  "
                  f"norm ratio {b['norm_ratio']:.3f}"
                  for b in report["dump_blocks"]]
        lines.append("")
    if report.get("sweep"):
        sw = report["sweep"]
        lines.append(f"aux-layer sweep (profile, {sw['prompts']} prompts, num_steps {sw['num_steps']}, "
                     f"max_new_tokens {sw['max_new_tokens']}; tau = mean accepted+1 per cycle)")
        lines.append(f"{'rank':>4}  {'HF':<14} {'SGLang ids':<14} {'tau':>6} {'SE':>6} {'vs conf.':>9}  candidate")
        for r in sw["rows"]:
            mark = " *" if r["clearly_better"] else ""
            lines.append(f"{r['rank']:>4}  {str(r['hf']):<14} {str(r['sglang']):<14} {r['tau']:>6.3f} {r['se']:>6.3f} "
                         f"{r['delta_vs_configured']:>+9.3f}  {r['label']}{mark}")
        lines.append("(* = clearly better than the configured set: " + sw["clearly_better"] + ")")
        lines.append("")
    for r in report.get("template_check") or []:
        lines.append(f"prompt format {r['variant']}: " + (f"tau {r['tau']:.3f}" if "tau" in r else r["error"]))
    if report.get("template_check"):
        lines.append("")
    if report.get("fingerprint"):
        from eagle_eval.diagnose.fingerprint import render_fingerprint
        lines += [render_fingerprint(report["fingerprint"]), ""]
    lines.append("findings")
    lines.append(render_findings([Finding.from_dict(f) for f in report["findings"]]))
    return "\n".join(lines)
