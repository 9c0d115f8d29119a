"""`eagle-eval diagnose`: find train/serve mismatches before anyone benchmarks a server (issue 5).

Contract: `diagnose(run_config, diagnose_config)` loads the target and head once, then
  1. collects the load-time findings (`sanity`, computed by `load_oracle`) and the draft vocab's
     coverage of the target's greedy tokens on the prompts;
  2. with a training dump, says which HF index each dumped block is (`dumps`);
  3. sweeps aux-layer candidates with the teacher-forced profile (`aux_sweep`), all on the same
     greedy continuations, and decides three ways (`decide`): mismatch, consistent or inconclusive;
  4. compares acceptance with the tokenizer's chat template, raw prompts and a --chat-template FILE;
  5. optionally fingerprints the aux features of the first prompt tokens.
Prompts: the first turns of the workload (cut to --limit when given), profiled in looks of 8, 16,
32, ... up to --prompt-budget; the sweep stops at the first look that decides (issue 14).
Returns a `Diagnosis` (report dict + findings); exit status 1 when any finding is an error or undecided.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from eagle_eval.diagnose import decide
from eagle_eval.parallel import group as parallel
from eagle_eval.parallel.settings import settings_digests
from eagle_eval.results.findings import Finding, exit_status, info


@dataclass(frozen=True)
class DiagnoseConfig:
    train_dump: str | None = None
    fingerprint: bool = False
    sweep: bool = True
    template_check: bool = True
    prompt_budget: int = 64             # the most questions profiled (looks at 8, 16, 32, ... up to it)
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


def _config_hf(oracle) -> list[int] | None:
    """The HF layers the draft config.json itself names (None: no ids in it)."""
    from eagle_eval.models.checks.sanity import config_aux_hf

    return config_aux_hf(json.loads((Path(oracle.resolved["head"]["path"]) / "config.json").read_text()))


def _known_layers(oracle, dump_hf) -> list[tuple[str, tuple]]:
    """Layer sets the sweep tries right after the configured one: a training dump's, the draft config's."""
    config_hf = _config_hf(oracle)
    return ([("training dump", dump_hf)] if dump_hf else []) + \
        ([("draft config.json ids", tuple(config_hf))] if config_hf is not None else [])


def _read_dump(oracle, dcfg: DiagnoseConfig):
    """The training dump matched to HF indices (None without --train-dump); read first, so bad input fails fast."""
    from eagle_eval.diagnose import dumps

    if not dcfg.train_dump:
        return None
    target = oracle.speculator.target
    return dumps.match_dump(target, dumps.read_dump(dcfg.train_dump, target.info.hidden_size))


def _dump_section(match, configured, num_aux: int, report: dict, sweep: bool) -> tuple[list[Finding], tuple | None]:
    """Findings of a dump and its layers when every block matched one HF index confidently."""
    from eagle_eval.diagnose import dumps

    report["dump"] = {"file": match.dump.file, "format": match.dump.format, "tokens": match.tokens,
                      "notes": match.notes,
                      "hidden_state": match.hidden_state.as_dict() if match.hidden_state else None}
    report["dump_blocks"] = [b.as_dict() for b in match.blocks]
    confident = match.confident and len(match.hf) == num_aux
    return dumps.dump_findings(match, configured, num_aux, sweep), (tuple(sorted(match.hf)) if confident else None)


def profile_settings(run, prompts_file: str):
    """Profile settings of `run` over an input_ids prompts file (no dataset, filter or shuffle left)."""
    from eagle_eval.config import ProfileConfig

    run = replace(run, prompts=prompts_file, limit=None, dataset=None, dataset_format=None, categories=None,
                  shuffle_seed=None)
    return ProfileConfig(run=run, max_steps=run.num_steps)


class Rounds:
    """The workload's prompts and, for each slice profiled so far, their greedy continuations and the
    profile settings over that slice (input_ids rows + a responses file, so every candidate shares them)."""

    def __init__(self, oracle, run, prompts, tmp: Path):
        self.oracle, self.run, self.prompts, self.tmp = oracle, run, prompts, tmp
        self.conts: list[list[int]] = []

    def pcfg(self, lo: int, hi: int):
        from eagle_eval.diagnose.template_check import write_prompts

        self.ensure(hi)
        part, conts = self.prompts[lo:hi], self.conts[lo:hi]
        responses = self.tmp / f"responses-{lo}.jsonl"
        responses.write_text("".join(json.dumps({"id": p.id, "output_ids": c}) + "\n" for p, c in zip(part, conts)))
        return replace(profile_settings(self.run, write_prompts(self.tmp / f"prompts-{lo}.jsonl", part)),
                       responses=str(responses))

    def ensure(self, hi: int) -> None:
        """Greedy continuations (max_new_tokens + num_steps, not cut at EOS) for the first `hi` prompts."""
        from eagle_eval.speculative.profile import greedy_continuations

        if hi <= len(self.conts):
            return
        tok, oracle = self.oracle.tokenizer, self.oracle
        pad = tok.pad_token_id if tok.pad_token_id is not None else (min(oracle.eos_ids) if oracle.eos_ids else 0)
        need = self.run.max_new_tokens + self.run.num_steps
        self.conts += parallel.current().map_shards(      # in a launched run: split, all-gathered
            self.prompts[len(self.conts):hi], lambda part: greedy_continuations(
                oracle.speculator, [p.input_ids for p in part], need, pad, 16384), weight=lambda p: len(p.input_ids))


def _sweep(oracle, rounds: Rounds, cands, progress: bool) -> tuple[list, decide.Sequence]:
    """Profile every candidate look by look until the verdict is decided or the prompts run out."""
    from eagle_eval.diagnose import aux_sweep

    cycles: list[list] = [[] for _ in cands]

    def measure(lo: int, hi: int) -> list[list]:
        got = aux_sweep.measure(oracle, rounds.pcfg(lo, hi), cands, progress)
        for c, (cyc, _) in enumerate(got):
            cycles[c] += cyc
        return [pos for _, pos in got]

    seq = decide.sequential(decide.looks(decide.FIRST_LOOK, len(rounds.prompts)), measure, len(cands))
    return aux_sweep.sweep_rows(cands, cycles, seq), seq


def _sweep_report(rows, seq: decide.Sequence, run, budget: int) -> dict:
    return {"num_steps": run.num_steps, "max_new_tokens": run.max_new_tokens, "prompts": seq.prompts,
            "prompt_budget": budget, "planned_looks": seq.planned, "looks": seq.looks, "verdict": seq.verdict,
            "decided_on": seq.prompts if seq.verdict != decide.INCONCLUSIVE else None,
            "alpha": decide.ALPHA, "level_per_bound": seq.level, "margin": decide.MARGIN,
            "rule": decide.rule_text(), "rows": [r.as_dict() for r in rows]}


def diagnose(run, dcfg: DiagnoseConfig, progress: bool = False, oracle=None) -> Diagnosis:
    """Every check of issue 5 on one loaded target + head (see the module docstring); --output-dir is
    owned by this run (results/run_folder.py); `oracle`: one already loaded for `run` (tests reuse it)."""
    from eagle_eval.results.run_folder import open_run_folder

    inputs = {**run.input_paths(), "train_dump": dcfg.train_dump}
    settings = {**run.as_dict(), **dcfg.__dict__}
    group = parallel.current()             # in a launched run: the profiles are split, rank 0 writes
    group.check_same("settings", settings_digests("diagnose", settings, inputs))
    folder = group.on_main(lambda: open_run_folder(dcfg.output_dir, "diagnose", settings, inputs,
                                                   overwrite=run.overwrite) if dcfg.output_dir else None)
    try:
        return _diagnose(run, dcfg, folder, progress and group.is_main, oracle)
    finally:
        if folder is not None:
            folder.close()


def _diagnose(run, dcfg: DiagnoseConfig, folder, progress: bool, oracle) -> Diagnosis:
    from eagle_eval import api
    from eagle_eval.diagnose import aux_sweep
    from eagle_eval.diagnose.fingerprint import fingerprint
    from eagle_eval.diagnose.template_check import template_check
    from eagle_eval.models.checks import sanity
    from eagle_eval.results.report import provenance

    budget = min(run.limit, dcfg.prompt_budget) if run.limit is not None else dcfg.prompt_budget
    run = replace(run, output_dir=None, resume=False, check_lossless=False, limit=budget)
    oracle = oracle or api.load_oracle(run)
    head, num_layers = oracle.speculator.head, oracle.speculator.target.num_layers
    configured = tuple(oracle.speculator.aux_hf)
    findings = [Finding.from_dict(f) for f in oracle.resolved.get("sanity", [])]
    report: dict = {"schema_version": 2, "configured_aux_layers": _layers(configured)}
    match = _read_dump(oracle, dcfg)
    prompts = api.checked_workload(run, oracle).first_prompts
    dump_hf, recommended = None, list(configured)
    if match is not None:
        more, dump_hf = _dump_section(match, configured, head.config.num_aux, report, dcfg.sweep)
        findings += more
    with tempfile.TemporaryDirectory(prefix="eagle-eval-diagnose-") as tmpdir:
        rounds = Rounds(oracle, run, prompts, Path(tmpdir))
        cands = aux_sweep.candidates(configured, num_layers, _known_layers(oracle, dump_hf))
        if dcfg.sweep and len(cands) > 1:
            rows, seq = _sweep(oracle, rounds, cands, progress)
            report["sweep"] = _sweep_report(rows, seq, run, budget)
            more, recommended = aux_sweep.sweep_findings(rows, seq, dcfg.prompt_budget)
            findings += more
        elif dcfg.sweep:
            findings.append(info("aux-sweep-not-applicable", "no alternative layer set fits this target"))
        rounds.ensure(min(decide.FIRST_LOOK, len(prompts)))
        findings.append(sanity.coverage_finding(head.t2d, [c[:run.max_new_tokens] for c in rounds.conts]))
        if dcfg.template_check:
            pcfg = profile_settings(run, "")            # each variant sets its own prompts file
            report["template_check"], more = template_check(oracle, run, pcfg, Path(tmpdir))
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
        lines += _render_sweep(report["sweep"])
    for r in report.get("template_check") or []:
        gain = (f", gain {r['delta_vs_configured']:+.3f} [{r['delta_lower']:+.3f}, {r['delta_upper']:+.3f}]"
                if "delta_vs_configured" in r else "")
        lines.append(f"prompt format {r['variant']}: " + (f"tau {r['tau']:.3f}, tau_pos {r['tau_pos']:.3f}{gain}"
                                                          if "tau" in r else r["error"]))
    if report.get("template_check"):
        lines.append("")
    if report.get("fingerprint"):
        from eagle_eval.diagnose.fingerprint import render_fingerprint
        lines += [render_fingerprint(report["fingerprint"]), ""]
    lines.append("findings")
    lines.append(render_findings([Finding.from_dict(f) for f in report["findings"]]))
    return "\n".join(lines)


MARKS = {"better": "*", "open": "?", "bounded": "", "configured": ""}


def _render_sweep(sw: dict) -> list[str]:
    looks = ", ".join(str(k["prompts"]) for k in sw["looks"])
    lines = [f"aux-layer sweep (profile, num_steps {sw['num_steps']}, max_new_tokens {sw['max_new_tokens']}; "
             f"looks at {looks} of planned {sw['planned_looks']} prompts)",
             "tau = mean accepted+1 per cycle (the loop); tau_pos = mean min(run, S)+1 over every position (decides)",
             f"{'rank':>4}  {'HF':<12} {'SGLang ids':<12} {'tau':>6} {'tau_pos':>7} {'gain':>7}  "
             f"{'interval':<19}   candidate"]
    for r in sw["rows"]:
        gain = "" if r["status"] == "configured" else f"{r['delta_vs_configured']:+.3f}"
        interval = "" if r["status"] == "configured" else f"[{r['delta_lower']:+.3f}, {r['delta_upper']:+.3f}]"
        lines.append(f"{r['rank']:>4}  {str(r['hf']):<12} {str(r['sglang']):<12} {r['tau']:>6.3f} {r['tau_pos']:>7.3f} "
                     f"{gain:>7}  {interval:<19} {MARKS[r['status']]:>1} {r['label']}")
    lines.append(f"(* = clearly better, ? = undecided; {sw['rule']})")
    decided = (f"decided on {sw['decided_on']} prompts" if sw["decided_on"] is not None
               else f"not decided within {sw['prompts']} prompts")
    lines += [f"verdict: {sw['verdict']}, {decided}", ""]
    return lines
