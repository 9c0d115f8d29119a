"""Reports: counts -> report.json (versioned schema, provenance) and the terminal table.

Contract: every figure is derived here from the integer counts in the sample records, and carries
its definition (docs/eagle3.md section 5). Nothing here touches a model.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from eagle_eval.stats.acceptance import AcceptanceCounts, predicted_by_train_acc
from eagle_eval.records import SampleRecord
from eagle_eval.results.tables import render_groups

SCHEMA_VERSION = 1

DEFINITIONS = {
    "accept_length": "tau: mean over verify cycles of (accepted drafts + 1); bonus counted "
                     "(SGLang log 'accept len', vLLM 'mean acceptance length', EAGLE tau)",
    "mean_accepted_drafts": "mean over verify cycles of accepted drafts; bonus not counted (= tau - 1)",
    "spec_accept_length": "per request completion_tokens / verify cycles, averaged over requests "
                          "(SGLang meta_info.spec_accept_length; counts the prefill token)",
    "conditional_rate": "a_i = P(draft i accepted | drafts 1..i-1 accepted) = accepted_i / reached_i "
                        "(EAGLE n-alpha)",
    "unconditional_rate": "u_i = P(>= i drafts accepted) = accepted_i / cycles (vLLM per-position rate)",
    "histogram": "H[n] = verify cycles that accepted exactly n drafts, n = 0..num_steps",
    "identity": "tau = 1 + sum_i u_i and u_i = prod_{j<=i} a_j",
    "trees": "with topk > 1, position i is tree depth i: u_i = P(accepted depth >= i), a_i = "
             "P(depth >= i | depth >= i-1); off_top1_chain_share = cycles whose accepted path left the draft's "
             "top-1 chain (what the tree buys over a chain of the same num_steps) / cycles",
}


def summarize(samples: list[SampleRecord], num_steps: int) -> dict:
    """summary + per_position + histogram from the samples' counts."""
    counts = AcceptanceCounts(num_steps, [0] * (num_steps + 1))
    for s in samples:
        counts = counts.merge(AcceptanceCounts.from_accepted(s.accepted_per_cycle, num_steps))
    per_request = [s.spec_accept_length for s in samples if s.spec_accept_length is not None]
    checked = [s.lossless for s in samples if s.lossless is not None]
    off = [f for s in samples for f in s.extra.get("off_top1_per_cycle", [])]
    tree = ({"off_top1_chain_cycles": sum(off), "off_top1_chain_share": sum(off) / len(off) if off else None}
            if any("off_top1_per_cycle" in s.extra for s in samples) else {})
    distribution = _distribution_check(samples)
    differs = distribution.get("distribution_check", {}).get("verdict") == "differs"      # temperature > 0
    return {
        "summary": {
            **tree,
            **distribution,
            "prompts": len(samples),
            "cycles": counts.cycles,
            "accepted_drafts": counts.accepted_drafts,
            "emitted_tokens": sum(len(s.output_ids) for s in samples),
            "accept_length": counts.tau,
            "mean_accepted_drafts": counts.mean_accepted_drafts,
            "spec_accept_length": sum(per_request) / len(per_request) if per_request else None,
            # False if any checked prompt diverged (or the sampled output differs); True only when every prompt
            # was checked against plain greedy (never at temperature > 0: a test cannot prove equality)
            "lossless": False if not all(checked) or differs else
            (True if samples and len(checked) == len(samples) else None),
            "lossless_checked": len(checked),
        },
        "per_position": counts.per_position(),
        "histogram": counts.histogram,
    }


def _distribution_check(samples: list[SampleRecord]) -> dict:
    """Temperature > 0 with --check-lossless: the distribution check over every checked sample's pooled counts
    (stats/distribution.py); {} when none was checked."""
    rows = [s.extra["distribution_check"] for s in samples if "distribution_check" in s.extra]
    if not rows:
        return {}
    from eagle_eval.stats.distribution import CellCounts, judge

    pooled = CellCounts()
    for row in rows:
        pooled = pooled.merge(CellCounts.from_dict(row))
    return {"distribution_check": {**judge(pooled), "samples_checked": len(rows)}}


def group_summaries(samples: list[SampleRecord], num_steps: int) -> dict:
    """by_category and by_turn: `summarize` over each subset of the samples (keys are strings)."""
    out = {}
    for name, key in (("by_category", lambda s: s.category), ("by_turn", lambda s: str(s.turn))):
        subsets: dict[str, list[SampleRecord]] = {}
        for s in samples:
            subsets.setdefault(key(s), []).append(s)
        out[name] = {k: summarize(v, num_steps) for k, v in sorted(subsets.items(), key=lambda kv: _order(kv[0]))}
    return out


def _order(key: str):
    """Turns numerically, categories by name."""
    return (0, int(key), "") if key.isdigit() else (1, 0, key)


def provenance(seed: int) -> dict:
    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "accelerate", "safetensors", "datasets"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = None
    from importlib.metadata import PackageNotFoundError, version
    try:
        versions["eagle_eval"] = version("eagle-eval")
    except PackageNotFoundError:
        versions["eagle_eval"] = None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                                text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({platform.machine()})"
    dist = torch.distributed
    processes = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return {"git_commit": commit, "versions": versions, "device": device,
            "cuda_devices": torch.cuda.device_count(), "processes": processes, "seed": seed,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": sys.argv}


def training_prediction(train_acc: dict, body: dict, num_steps: int) -> dict:
    """The training accuracy's prediction beside the measured rates, per position and for tau.

    Chains only: a tree's per-depth rates are not a product of per-step accuracies.
    """
    pred = predicted_by_train_acc(train_acc["acc"], num_steps)
    rows = [{"position": p["position"], "train_acc": pred["conditional_rate"][i],
             "measured_conditional_rate": p["conditional_rate"],
             "predicted_unconditional_rate": pred["unconditional_rate"][i],
             "measured_unconditional_rate": p["unconditional_rate"]} for i, p in enumerate(body["per_position"])]
    k = pred["positions"]
    measured_k = 1 + sum(r["measured_unconditional_rate"] or 0 for r in rows[:k])
    return {"source": train_acc["source"], "acc": train_acc["acc"], "positions_predicted": k,
            "predicted_accept_length": pred["accept_length"], "measured_accept_length_same_positions": measured_k,
            "measured_accept_length": body["summary"]["accept_length"], "per_position": rows,
            "definition": "predicted u_i = prod_{j<=i} acc_j, predicted tau = 1 + sum_{i<=k} u_i over the "
                          f"k = {k} positions that training covered (of num_steps {num_steps}); measured figures "
                          "are this run's (measured tau over the same positions = 1 + sum_{i<=k} measured u_i)"}


def build_report(config: dict, resolved, workload: dict, samples: list[SampleRecord], warnings: list[str],
                 seed: int, sample_prompt=None) -> dict:
    """report.json of a run: config = the flat settings, what the oracle resolved (`resolved.as_dict()`) and
    what the workload resolved; the figures from the samples' counts."""
    from eagle_eval.results.context import from_records

    body = summarize(samples, resolved.num_steps)
    if resolved.train_acc and resolved.topk == 1:
        body["training_prediction"] = training_prediction(resolved.train_acc, body, resolved.num_steps)
    body["by_context"] = from_records(samples, resolved.num_steps, config.get("context_buckets"),
                                      config.get("train_context"))
    return {
        "schema_version": SCHEMA_VERSION,
        "config": {**config, **resolved.as_dict(), **workload},
        **body,
        **group_summaries(samples, resolved.num_steps),
        "definitions": DEFINITIONS,
        "warnings": list(warnings),
        "sample_prompt": sample_prompt.text if sample_prompt is not None else None,
        "provenance": provenance(seed),
    }


def write_report(path: Path, report: dict) -> None:
    """Write atomically: a crash never leaves half a report (results/run_folder.py)."""
    from eagle_eval.results.run_folder import write_json_atomic
    write_json_atomic(path, report)


def _fmt(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


def render_training_prediction(pred: dict | None) -> list[str]:
    """The training accuracy's prediction against this run, per position (empty without one)."""
    if not pred:
        return []
    lines = ["", f"training accuracy vs measured  ({pred['source']})",
             " pos   train acc_i  measured a_i   predicted u_i  measured u_i"]
    for r in pred["per_position"]:
        lines.append(f"{r['position']:>4}   {_fmt(r['train_acc']):>11}  {_fmt(r['measured_conditional_rate']):>12}"
                     f"   {_fmt(r['predicted_unconditional_rate']):>13}  {_fmt(r['measured_unconditional_rate']):>12}")
    k = pred["positions_predicted"]
    lines.append(f"accept length predicted by training 1 + sum_(i<={k}) prod acc_j = "
                 f"{_fmt(pred['predicted_accept_length'])}, measured over the same {k} positions "
                 f"{_fmt(pred['measured_accept_length_same_positions'])} (tau {_fmt(pred['measured_accept_length'])})")
    return lines


def render_engine_taps(aux: dict) -> list[str]:
    """One line per engine: what it taps for this head's config, marked where it differs from `aux['hf']`."""
    out = []
    for t in (aux.get("engines") or {}).values():
        same = t["hf"] == aux["hf"]
        out.append(f"  {t['name']:<24} taps HF {t['hf'] if t['hf'] is not None else '(none valid)'}"
                   f"{'' if same else '  <- DIFFERS'}  ({t['reads']})")
    return out


def _eagle_params(cfg: dict) -> str:
    """The --eagle-* conversion, when those flags were given (shown on the terminal, not only in report.json)."""
    e = cfg.get("eagle_params")
    if not e:
        return ""
    return (f"\n            from EAGLE's depth={e['depth']} top_k={e['top_k']} total_token={e['total_token']} "
            f"({e['conversion']})")


def _boundary(aux: dict, num_layers: int) -> str:
    """' = boundary ids [...]', and what index N means when it is tapped."""
    if "boundary" not in aux:
        return ""
    note = (f" (HF index {num_layers} here = output of layer {num_layers - 1} BEFORE the final norm, "
            f"not output_hidden_states[{num_layers}])" if aux.get("final_prenorm") else "")
    return f"  = boundary ids {aux['boundary']}{note}"


def _mtp_lines(mtp: dict) -> list[str]:
    """An MTP layer's convention as run, and what each engine would do (heads/mtp/conventions.py)."""
    def words(c: dict) -> str:
        where = {"pre": "before", "post": "after"}
        return (f"input {where[c['input']]} the final norm, position-0 mask {'on' if c['mask_position0'] else 'off'}, "
                f"chain {where[c['chain']]} the output norm, {c['fusion_order']}, {c['layers']}")
    c = mtp["convention"]
    lines = [f"mtp         {mtp['family']}: {mtp['layers']} MTP layer(s) ({mtp['block']}); runs {c['engine']}'s "
             f"convention: {words(c)}"]
    for engine, e in mtp["engines"].items():
        lines.append(f"  {engine:<13} " + (f"refuses: {e['refuses']}" if e["refuses"] else words(e)))
    if mtp.get("weights"):
        lines.append(f"  {'weights':<13} {mtp['weights']}")
    return lines


def _variant_lines(head: dict) -> list[str]:
    """The head's variant settings and its config-key audit (an MTP layer: its conventions), as report lines."""
    v, keys = head.get("variant"), head.get("keys")
    if head.get("mtp"):
        return _mtp_lines(head["mtp"])
    if not v:
        return []
    if "block" in head:
        lines = _block_lines(head["block"])
    else:
        flags = ", ".join(f"{k}={v[k]}" for k in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"))
        scaling = (v["rope_scaling"] or {}).get("rope_type", (v["rope_scaling"] or {}).get("type", "none"))
        lines = [f"head        {flags}; rope {v['rope']} theta {v['rope_theta']:g} scaling {scaling}"]
    if keys:
        lines.append(f"head keys   {len(keys['consumed'])} consumed, {len(keys['harmless'])} ignored as harmless, "
                     f"{len(keys['engine_math'])} engine-math (allowed), unknown {keys['unknown'] or 'none'}")
    return lines


def _block_lines(block: dict) -> list[str]:
    """A block drafter's trained block, what the engines must be told to serve it, and the block this run drafts."""
    served = block["served"]
    return [f"block       {block['variant']}: trained block_size {block['block_size']} (vLLM num_speculative_tokens "
            f"{block['vllm_num_speculative_tokens']}, SGLang --speculative-num-draft-tokens "
            f"{block['sglang_num_draft_tokens']}); mask token {block['mask_token_id']}; target_layer_ids "
            f"{block['target_layer_ids']['zlab_target_layer_ids']}",
            f"            this run drafts blocks of {served['rows']} rows (num_steps {served['num_steps']})"
            + ("" if served["matches_trained_block"] else ": NOT the trained block")] + (
        [f"            context keys: {conv['context_k_norm']} (--dflash-convention {conv['name']})"]
        if (conv := block.get("convention")) else [])


def _text_decoder(target: dict) -> str:
    """' in model.language_model.model.layers (deepseek_v3)' for a multimodal wrapper; '' for a causal LM."""
    text = target.get("text_architecture")
    return f" in {target.get('decoder')} ({text})" if text else ""


def _decoding_lines(decoding: dict | None) -> list[str]:
    """The decode policy: the rule, its filter order, what the drafts are, the seed (temperature > 0)."""
    if not decoding or decoding.get("rule") == "greedy":
        return []
    t = decoding["thresholds"]
    return [f"decoding    temperature {decoding['temperature']:g} top_k {decoding['top_k']} "
            f"top_p {decoding['top_p']:g} min_p {decoding['min_p']:g}; rule {decoding['rule']}"
            + (f" (thresholds single {t['single']:g}, acc {t['acc']:g})" if t else "") + f"; seed {decoding['seed']}",
            f"            filter order {decoding['filter_order']}",
            f"            drafts {decoding['drafts']}; {decoding['output']}"]


def _lossless_line(s: dict) -> str:
    """Temperature 0: equality with plain greedy decoding; above: the distribution check's verdict."""
    d = s.get("distribution_check")
    if d is None:
        return (f"lossless vs plain greedy                             "
                f"{'not checked' if s['lossless'] is None and not s['lossless_checked'] else s['lossless']}"
                f" ({s['lossless_checked']} checked)")
    stat = (f"S = {d['statistic']:.2f}, df {d['df']}, p = {d['p_value']:.3g}" if d["statistic"] is not None
            else d.get("reason", "no statistic"))
    why = d.get("reason") if d["statistic"] is not None and d["verdict"] != "consistent" else None
    return (f"distribution vs plain sampling (rank cells)          {d['verdict']} ({stat}; {d['tokens']} tokens, "
            f"alpha {d['alpha']:g}" + (f", {d['outside_support']} outside the support" if d["outside_support"] else "")
            + (f", {d['at_filter_edge']} at a filter's edge (not decisive)" if d.get("at_filter_edge") else "")
            + ")" + (f"\n    {why}" if why else ""))


def render_table(report: dict) -> str:
    cfg, s = report["config"], report["summary"]
    aux = cfg["aux_layers"]
    lines = [
        f"target  {cfg['target']['path']}  ({cfg['target']['architecture']}, {cfg['target']['num_layers']} layers"
        f"{_text_decoder(cfg['target'])}, {cfg['dtype']}, {', '.join(cfg['target']['devices'])})",
        *([f"quant   {cfg['target']['quantization']['summary']}"] if cfg['target'].get('quantization') else []),
        f"draft   {cfg['head']['path']}  ({cfg['head']['dialect']} layout)",
        f"aux layers  HF {aux['hf']}  = SGLang ids {aux['sglang']}  = vLLM ids {aux['vllm']}"
        f"{_boundary(aux, cfg['target']['num_layers'])}  [{aux['source']}]",
        *render_engine_taps(aux),
        *_variant_lines(cfg["head"]),
        f"embedding   {cfg['embedding']}",
        f"vocab map   draft {cfg['vocab_map']['draft_vocab_size']} / target {cfg['vocab_map']['vocab_size']}, "
        f"d2t {cfg['vocab_map']['d2t']}{' (identity)' if cfg['vocab_map']['d2t_identity'] else ''}",
        f"speculative num_steps={cfg['num_steps']} topk={cfg['topk']} num_draft_tokens={cfg['num_draft_tokens']}"
        f"  max_new_tokens={cfg['max_new_tokens']}" + _eagle_params(cfg),
        *_decoding_lines(cfg.get("decoding")),
        "",
        f"prompts {s['prompts']}  cycles {s['cycles']}  emitted tokens {s['emitted_tokens']}",
        f"accept length tau (mean accepted+1 per cycle)        {_fmt(s['accept_length'])}",
        f"mean accepted drafts per cycle (tau - 1)             {_fmt(s['mean_accepted_drafts'])}",
        f"SGLang spec_accept_length (completion/verify, mean)  {_fmt(s['spec_accept_length'])}",
        *([f"cycles accepting off the top-1 chain (tree gain)      {s['off_top1_chain_cycles']}"
           f" ({_fmt(s['off_top1_chain_share'])})"] if "off_top1_chain_cycles" in s else []),
        _lossless_line(s),
        "",
        " pos   reached  accepted   a_i (cond.)   u_i (uncond.)",
    ]
    for p in report["per_position"]:
        lines.append(f" {p['position']:>3}  {p['reached']:>8}  {p['accepted']:>8}   {_fmt(p['conditional_rate']):>11}"
                     f"   {_fmt(p['unconditional_rate']):>13}")
    lines += render_training_prediction(report.get("training_prediction"))
    lines.append("")
    lines.append("histogram H[n] (cycles accepting exactly n drafts): " +
                 "  ".join(f"{n}:{h}" for n, h in enumerate(report["histogram"])))
    groups = render_groups(report)
    if groups:
        lines += ["", groups]
    lines += render_context(report)
    for w in report.get("warnings", []):
        lines.append(f"WARNING: {w}")
    return "\n".join(lines)


def render_context(report: dict, markdown: bool = False) -> list[str]:
    """Acceptance by context (results/context.py) and the long-context workload it was measured on, if any."""
    from eagle_eval.results.context import render, render_long_context

    lines = render(report.get("by_context"), markdown=markdown)
    return lines + render_long_context(report.get("config") or {}) if lines else lines


def render_steps_table(profile_report: dict) -> str:
    """One line per num_steps from a profile: tau and the per-position unconditional rates (temperature > 0:
    results/expectation.py `render_sampled_steps`)."""
    if "sampling" in profile_report:
        from eagle_eval.results.expectation import render_sampled_steps
        return "\n".join([render_sampled_steps(profile_report), *render_context(profile_report)])
    sections = sorted(profile_report["by_num_steps"].items(), key=lambda kv: int(kv[0]))
    k = int(sections[-1][0])
    aux = profile_report["config"]["aux_layers"]
    lines = [f"aux layers HF {aux['hf']} = SGLang ids {aux['sglang']} = vLLM ids {aux['vllm']}"
             f"{_boundary(aux, profile_report['config']['target']['num_layers'])}; "
             f"embedding {profile_report['config']['embedding']}",
             " S    cycles    tau    " + "  ".join(f"u_{i:<3}" for i in range(1, k + 1))]
    trained = "training_prediction" in sections[0][1]
    if trained:
        lines[-1] += "   train-acc tau (same positions)"
    for s, sec in sections:
        u = [p["unconditional_rate"] for p in sec["per_position"]]
        pred = sec.get("training_prediction")
        lines.append(f"{s:>2}  {sec['summary']['cycles']:>8}  {_fmt(sec['summary']['accept_length'])}  "
                     + "  ".join(_fmt(x) for x in u) + " " * 7 * (k - len(u))
                     + (f"   {_fmt(pred['predicted_accept_length'])} ({_fmt(pred['measured_accept_length_same_positions'])}"
                        f" measured over {pred['positions_predicted']})" if pred else ""))
    lines.append("tau = mean (accepted + 1) per cycle; u_i = P(>= i drafts accepted)")
    if trained:
        lines.append(f"train-acc tau = 1 + sum_(i<=k) prod_(j<=i) acc_j over the positions training covered "
                     f"(acc from {sections[0][1]['training_prediction']['source']})")
    numeric = profile_report.get("numeric_divergences", [])
    if numeric:
        lines.append(f"note: {len(numeric)} generated continuation(s) differ from the teacher-forced argmax "
                     f"(rounding at near-ties; smallest margin {min(d['margin'] for d in numeric):.4f})")
    for d in profile_report.get("response_divergences", []):
        lines.append(f"WARNING: response {d['id']} departs from the target's argmax at position "
                     f"{d['position']} (margin {d['margin']:.3f}); profiled the greedy sequence from there")
    return "\n".join(lines + render_context(profile_report))


def render_ablation(result: dict) -> str:
    costs = result["costs"]
    server = bool(costs.get("server_ms"))
    block = result.get("block")
    lines = [f"cost ratio c = {costs['cost_ratio']:.4f} ({costs['source']}); {result['speedup_model']}"]
    if block:                                  # a block drafter (commands/ablate.py): its block per row
        by_rows = costs.get("block_ratio") or {}
        lines.append(f"block drafter ({block['variant']}): trained block_size {block['trained_block_size']} (vLLM "
                     f"num_speculative_tokens {block['vllm_num_speculative_tokens']}, SGLang "
                     f"--speculative-num-draft-tokens {block['sglang_num_draft_tokens']}); row S drafts one block of "
                     "S + 1 rows, and a cycle costs one draft forward of it: S = tau / (c(S + 1) + r)"
                     + (": c(rows) " + ", ".join(f"{n}: {c:.4f}" for n, c in by_rows.items()) if by_rows else ""))
    lines.append(f"{'variant':<32} {'S':>2} {'K':>2} {'D':>3} {'tau':>6} {'speedup':>8}"
                 + (f" {'server':>7}" if server else ""))
    for r in result["rows"]:
        other = "*" if r.get("matches_trained_block") is False else ""
        lines.append(f"{r['variant'][:32]:<32} {r['num_steps']:>2} {r['topk']:>2} {r['num_draft_tokens']:>3} "
                     f"{_fmt(r['tau']):>6} {r['speedup_model']:>8.3f}" +
                     (f" {r['speedup_server']:>7.3f}" if "speedup_server" in r else "") + other)
    if block and block["num_steps_other_than_trained"]:
        lines.append(f"* a block of another length than the trained {block['trained_block_size']} (num_steps "
                     f"{', '.join(map(str, block['num_steps_other_than_trained']))}): finding dflash-block-size, each "
                     "variant's sanity in ablation.json; no engine refuses it, and its drafts differ from the trained "
                     "block's")
    for v in result["variants"]:
        extra = (f", {v['best_num_steps_server']} with server step times" if v.get("best_num_steps_server") else "")
        lines.append(f"best num_steps for {v['variant']}: {v['best_num_steps']} (modelled speedup "
                     f"{v['best_speedup_model']:.3f}){extra}")
        if v.get("advice"):                    # stats/advice.py: decided from repeated timings
            lines.append(f"  advice: {v['advice']['message']}")
        found = (v.get("by_context") or {}).get("train_context_finding")
        if found:                              # results/context.py: --train-context
            d = found["difference"]
            lines.append(f"  by context: expected tokens per step past {found['train_context']} - before = "
                         f"{_fmt(d['value'], '+.3f')}" + ("" if d["low"] is None else
                                                          f" [{d['low']:+.3f}, {d['high']:+.3f}]")
                         + f": {found['verdict']}")
    sampled = sorted({r["rates"] for r in result["rows"] if r.get("temperature")})
    if sampled:
        lines.append(f"rows at temperature > 0: tau and speedup from the expectation ({', '.join(sampled)}; "
                     "docs/sampling.md), tau_sampled in ablation.csv is the accept length realized along the samples")
    advice = result.get("advice")
    if advice:
        lines.append(f"overall: {advice['message']}")
        lines += [f"WARNING: {w}" for w in advice.get("impossible", [])]
        lines.append(f"({advice['rule']})")
    else:
        b = result["best"]
        lines.append(f"best overall: {b['variant']} num_steps={b['num_steps']} topk={b['topk']} "
                     f"num_draft_tokens={b['num_draft_tokens']} (modelled speedup {b['speedup_model']:.3f})")
    lines += [f"WARNING: {w}" for w in result.get("warnings", [])]
    return "\n".join(lines)
