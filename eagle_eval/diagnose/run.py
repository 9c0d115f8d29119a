"""`eagle-eval diagnose`: find train/serve mismatches before anyone benchmarks a server.

Contract: `diagnose(settings, options)` loads the target and head once, then
  1. collects the load-time findings (`sanity`, computed by `load_oracle`) and the draft vocab's
     coverage of the target's greedy tokens on the prompts;
  2. with a training dump, says which HF index each dumped block is (`dumps`);
  3. sweeps aux-layer candidates with the teacher-forced profile (`aux_sweep`), all on the same
     greedy continuations, and decides three ways (`decide`): mismatch, consistent or inconclusive;
  4. compares acceptance with the tokenizer's chat template, raw prompts and a --chat-template FILE;
  5. optionally fingerprints the aux features of the first prompt tokens.
Prompts: the first turns of the workload (cut to --limit when given), profiled in looks of 8, 16,
32, ... up to --prompt-budget; the sweep stops at the first look that decides.
Returns a `Diagnosis` (report dict + findings); exit status 1 when any finding is an error or undecided.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from eagle_eval.diagnose import decide
from eagle_eval.diagnose.options import DiagnoseOptions
from eagle_eval.errors import stage
from eagle_eval import parallel
from eagle_eval.findings import Finding, exit_status, info


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
    """The HF layers the draft config.json itself names (None: no ids in it); a block drafter's target_layer_ids
    + 1 (its report echo)."""
    from eagle_eval.heads.checks.sanity import config_aux_hf

    block = oracle.resolved.head.extra.get("block")
    if block is not None:
        return list(block["target_layer_ids"]["hf"])
    return config_aux_hf(json.loads((Path(oracle.resolved.head.path) / "config.json").read_text()))


def _known_layers(oracle, dump_hf) -> list[tuple[str, tuple]]:
    """Layer sets the sweep tries right after the configured one: a training dump's, the draft config's (and a block
    drafter's default: z-lab's build_target_layer_ids for its depth, + 1)."""
    config_hf = _config_hf(oracle)
    block = oracle.resolved.head.extra.get("block")
    own = []
    if block is not None:
        from eagle_eval.heads.dflash.config import default_target_layer_ids

        ids = default_target_layer_ids(oracle.speculator.target.num_layers, block["draft_layers"])
        own = [("z-lab default build_target_layer_ids(N, draft layers) + 1", tuple(i + 1 for i in ids))]
    return ([("training dump", dump_hf)] if dump_hf else []) + \
        ([("draft config.json ids", tuple(config_hf))] if config_hf is not None else []) + own


def _read_dump(oracle, dcfg: DiagnoseOptions):
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


class Rounds:
    """The workload's prompts and, for the first prompts profiled so far, their greedy continuations
    (max_new_tokens + num_steps tokens, not cut at EOS), shared by every candidate of a look."""

    def __init__(self, oracle, prompts, progress: bool = False):
        self.oracle, self.prompts, self.progress = oracle, prompts, progress
        self.conts: list[list[int]] = []

    def slice(self, lo: int, hi: int) -> tuple[list, list[list[int]]]:
        self.ensure(hi)
        return self.prompts[lo:hi], self.conts[lo:hi]

    def ensure(self, hi: int) -> None:
        from eagle_eval.profile.teacher_forced import greedy_continuations

        if hi <= len(self.conts):
            return
        from tqdm import tqdm

        tok, oracle = self.oracle.tokenizer, self.oracle
        pad = tok.pad_token_id if tok.pad_token_id is not None else (min(oracle.eos_ids) if oracle.eos_ids else 0)
        need = oracle.settings.workload.max_new_tokens + oracle.resolved.num_steps
        todo = self.prompts[len(self.conts):hi]
        group = parallel.current()                    # in a launched run: split, all-gathered
        with tqdm(total=len(todo) * need, desc="generate", unit="tok",
                  disable=not (self.progress and group.is_main)) as bar, \
                stage([p.id for p in todo], "generate (the target's greedy continuations)"):
            self.conts += group.map_shards(todo, lambda part: greedy_continuations(
                oracle.speculator, [p.input_ids for p in part], need, pad, 16384, progress=bar.update),
                weight=lambda p: len(p.input_ids))


def _sweep(oracle, rounds: Rounds, cands, progress: bool) -> tuple[list, decide.Sequence, list]:
    """Profile every candidate look by look until the verdict is decided or the prompts run out; also the
    configured candidate's (the first's) profiled samples."""
    from eagle_eval.diagnose import aux_sweep

    cycles: list[list] = [[] for _ in cands]
    configured: list = []

    def measure(lo: int, hi: int) -> list[list]:
        got = aux_sweep.measure(oracle, *rounds.slice(lo, hi), cands, progress)
        for c, (cyc, _, _) in enumerate(got):
            cycles[c] += cyc
        configured.extend(got[0][2])
        return [pos for _, pos, _ in got]

    seq = decide.sequential(decide.looks(decide.FIRST_LOOK, len(rounds.prompts)), measure, len(cands))
    return aux_sweep.sweep_rows(cands, cycles, seq), seq, configured


def _by_context(oracle, rounds: Rounds, samples: list, progress: bool) -> tuple[dict | None, list[Finding]]:
    """Acceptance by context of the configured wiring (results/context.py), from the sweep's profile of it or,
    without a sweep, a profile of the prompts generated so far when --train-context or --context-buckets asks
    for it; --train-context's verdict becomes a finding (decayed: error, undecided: undecided)."""
    from eagle_eval.commands.profile import profile_prompts
    from eagle_eval.findings import error, undecided
    from eagle_eval.results.context import from_records
    from eagle_eval.settings import ProfileOptions

    s = oracle.settings
    given, train = s.output.context_buckets, s.model.train_context
    steps = oracle.resolved.num_steps
    if not samples:
        if given is None and train is None:
            return None, []
        n = len(rounds.conts)
        samples = profile_prompts(oracle, rounds.prompts[:n], ProfileOptions(max_steps=steps), rounds.conts[:n],
                                  progress).samples
    section = from_records(samples, steps, None if given is None else list(given), train)
    found = section.get("train_context_finding")
    if not found:
        return section, []
    d = found["difference"]
    text = (f"past --train-context {train}, tau per cycle minus before it = "
            + ("-" if d["value"] is None else f"{d['value']:+.3f}")
            + ("" if d["low"] is None else f" [{d['low']:+.3f}, {d['high']:+.3f}]")
            + f" ({found['prompts_before']} prompts before, {found['prompts_past']} past): {found['reason']}")
    detail = {"train_context": train, "difference": d}
    if found["verdict"] == "decayed":
        return section, [error("context-decay", "acceptance decays past the training length: " + text, **detail)]
    if found["verdict"] == "undecided":
        return section, [undecided("context-decay-undecided", "cannot tell whether acceptance decays past the "
                                   "training length: " + text, **detail)]
    return section, [info("context-no-decay", "acceptance does not decay past the training length: " + text,
                          **detail)]


def _sweep_report(rows, seq: decide.Sequence, oracle, budget: int) -> dict:
    return {"num_steps": oracle.resolved.num_steps, "max_new_tokens": oracle.settings.workload.max_new_tokens,
            "prompts": seq.prompts,
            "prompt_budget": budget, "planned_looks": seq.planned, "looks": seq.looks, "verdict": seq.verdict,
            "decided_on": seq.prompts if seq.verdict != decide.INCONCLUSIVE else None,
            "alpha": decide.ALPHA, "level_per_bound": seq.level, "margin": decide.MARGIN,
            "rule": decide.rule_text(), "rows": [r.as_dict() for r in rows]}


def diagnose(settings, dcfg: DiagnoseOptions = DiagnoseOptions(), progress: bool = False, oracle=None) -> Diagnosis:
    """Every check on one loaded target + head (see the module docstring); --output-dir is
    owned by this run (results/run_folder.py); `oracle`: one already loaded for `settings` (tests reuse it)."""
    from eagle_eval.commands.effect import refuse_no_effect
    from eagle_eval.commands.folder import open_folder

    if settings.decoding.greedy:            # (temperature > 0 is refused below: diagnose decodes greedily)
        refuse_no_effect([settings.decoding])
    folder = open_folder("diagnose", settings, dcfg)
    try:
        return _diagnose(settings, dcfg, folder, progress and parallel.current().is_main, oracle)
    finally:
        if folder is not None:
            folder.close()


def _diagnose(settings, dcfg: DiagnoseOptions, folder, progress: bool, oracle) -> Diagnosis:
    from eagle_eval.diagnose import aux_sweep
    from eagle_eval.diagnose.feature_prints import fingerprint
    from eagle_eval.diagnose.template_check import template_check
    from eagle_eval.heads.checks import sanity
    from eagle_eval.heads.kind import kind
    from eagle_eval.oracle import checked_workload, load_oracle
    from eagle_eval.results.report import provenance

    if not settings.decoding.greedy:
        from eagle_eval.settings import ConfigError
        raise ConfigError(f"--temperature {settings.decoding.temperature}: diagnose compares wirings on the target's "
                          "greedy continuations (temperature 0); run it without --temperature")
    limit = settings.workload.limit
    budget = min(limit, dcfg.prompt_budget) if limit is not None else dcfg.prompt_budget
    run = settings.with_(output_dir=None, resume=False, overwrite=False, limit=budget)
    oracle = load_oracle(run, like=oracle)
    head, num_layers = oracle.speculator.head, oracle.speculator.target.num_layers
    configured = tuple(oracle.speculator.aux_hf)
    findings = list(oracle.resolved.sanity)
    report: dict = {"schema_version": 2, "configured_aux_layers": _layers(configured)}
    match = _read_dump(oracle, dcfg)
    prompts = checked_workload(oracle).first_prompts
    dump_hf, recommended = None, list(configured)
    if match is not None:
        more, dump_hf = _dump_section(match, configured, head.config.num_aux, report, dcfg.sweep)
        findings += more
    rounds = Rounds(oracle, prompts, progress)
    variants = kind(oracle.resolved.head.kind).variants       # a kind's own wiring faults (an MTP layer's conventions)
    cands = (aux_sweep.variant_candidates(configured, variants(run, oracle.resolved)) if variants else
             aux_sweep.candidates(configured, num_layers, _known_layers(oracle, dump_hf)))
    configured_samples: list = []
    if dcfg.sweep and len(cands) > 1:
        rows, seq, configured_samples = _sweep(oracle, rounds, cands, progress)
        report["sweep"] = _sweep_report(rows, seq, oracle, budget)
        if variants:
            findings += aux_sweep.variant_findings(rows, seq, dcfg.prompt_budget, oracle.resolved.head.kind)
        else:
            lines = aux_sweep.block_config_lines if "block" in oracle.resolved.head.extra else aux_sweep.config_lines
            more, recommended = aux_sweep.sweep_findings(rows, seq, dcfg.prompt_budget, lines)
            findings += more
    elif dcfg.sweep:
        findings.append(info("aux-sweep-not-applicable", "no alternative layer set fits this target"))
    rounds.ensure(min(decide.FIRST_LOOK, len(prompts)))
    max_new = oracle.settings.workload.max_new_tokens
    findings.append(sanity.coverage_finding(head.t2d, [c[:max_new] for c in rounds.conts]))
    if dcfg.template_check:
        report["template_check"], more = template_check(oracle)
        findings += more
    by_context, more = _by_context(oracle, rounds, configured_samples, progress)
    findings += more
    if by_context is not None:
        report["by_context"] = by_context
    if dump_hf is not None:
        recommended = list(dump_hf)             # the dump says what the head was trained on
    if dcfg.fingerprint:
        with stage([prompts[0].id], "feature fingerprint"):
            report["fingerprint"] = fingerprint(oracle, prompts[0])
    report.update({"findings": [f.as_dict() for f in findings], "recommended_aux_layers": _layers(recommended),
                   "exit_status": exit_status(findings), "config": {**run.flat(), **dcfg.as_dict()},
                   "resolved": oracle.resolved.as_dict(), "provenance": provenance(run.decoding.seed)})
    if folder is not None:
        folder.write_json("diagnosis.json", report)
        folder.finish()
    return Diagnosis(report=report, findings=findings)


def render_diagnosis(report: dict) -> str:
    from eagle_eval.findings import render_findings

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
    if report.get("by_context"):
        from eagle_eval.results.context import render
        lines += render(report["by_context"]) + [""]
    if report.get("fingerprint"):
        from eagle_eval.diagnose.feature_prints import render_fingerprint
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
