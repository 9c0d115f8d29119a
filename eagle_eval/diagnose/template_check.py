"""Chat-template check: acceptance with the configured prompt format, the tokenizer's chat template and
raw prompts (issue 5, item 5), judged three ways like the aux sweep (issue 14).

Contract: `template_check(oracle, run, pcfg, tmp)` renders the same questions with each
format (`variants`), profiles each one on its own greedy continuations (the prompts differ, so the
pairing is per prompt, not per position) in the looks `decide.sequential` plans over the questions of `run`, and returns
(rows, findings): chat-template-mismatch (warning: the prompts themselves change, so evidence, not
proof), chat-template-consistent (info), chat-template-inconclusive (warning, never "ok"), or
chat-template-not-applicable (info) when the prompts do not depend on the template.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from eagle_eval.diagnose import decide
from eagle_eval.results.findings import Finding, info, warning


def variants(run) -> list[tuple[str, object]]:
    """(label, RunConfig) for the configured prompt format, the tokenizer's template and raw prompts."""
    def label(cfg):
        if cfg.no_chat_template:
            return "raw prompts (--no-chat-template)"
        return f"--chat-template {cfg.chat_template}" if cfg.chat_template else "the tokenizer's chat template"

    options = [run, replace(run, no_chat_template=False, chat_template=None),
               replace(run, no_chat_template=True, chat_template=None, enable_thinking=None)]
    out, seen = [], set()
    for v in options:
        if (v.no_chat_template, v.chat_template) not in seen:
            seen.add((v.no_chat_template, v.chat_template))
            out.append((label(v) + (" (configured)" if v is run else ""), v))
    return out


def write_prompts(path: Path, prompts) -> str:
    path.write_text("".join(json.dumps({"id": p.id, "category": p.category, "input_ids": p.input_ids}) + "\n"
                            for p in prompts))
    return str(path)


def _render(oracle, run) -> list[tuple[str, list | None, str | None]]:
    from eagle_eval.config import ConfigError
    from eagle_eval.workload.conversations import load_workload
    from eagle_eval.workload.data import DataError

    out = []
    for label, cfg in variants(run):
        try:
            out.append((label, load_workload(cfg, oracle.tokenizer).first_prompts, None))
        except (DataError, ConfigError) as exc:        # e.g. messages rows and no template at all
            out.append((label, None, f"{type(exc).__name__}: {exc}"))
    return out


def template_check(oracle, run, pcfg, tmp: Path) -> tuple[list[dict], list[Finding]]:
    """Rows (rows[0] = the configured format) and one finding; `pcfg` gives the profile settings."""
    from eagle_eval import api
    from eagle_eval.diagnose.aux_sweep import prompt_counts, sample_positions

    rendered = _render(oracle, run)
    base_ids = [p.input_ids for p in rendered[0][1]]
    if all(r[1] is None or [p.input_ids for p in r[1]] == base_ids for r in rendered):
        return [], [info("chat-template-not-applicable", "the prompts do not depend on the chat template "
                                                         "(pre-tokenized or plain-text rows): check skipped")]
    valid = [(label, prompts) for label, prompts, err in rendered if prompts is not None]
    if len(valid) < 2:
        return ([{"variant": label, "error": err} for label, prompts, err in rendered if prompts is None],
                [info("chat-template-not-applicable", "no other prompt format renders these questions: check skipped")])
    cycles: list[list] = [[] for _ in valid]

    def measure(lo: int, hi: int) -> list[list]:
        out = []
        for i, (_, prompts) in enumerate(valid):
            file = write_prompts(tmp / f"template{i}-{lo}.jsonl", prompts[lo:hi])
            res = api.profile(replace(pcfg, run=replace(pcfg.run, prompts=file, limit=None)), progress=False,
                              oracle=oracle)
            cycles[i] += prompt_counts([s.accepted_per_cycle for s in res.samples])
            out.append(sample_positions(res.samples, pcfg.run.num_steps))
        return out

    n = min(len(p) for _, p in valid)
    seq = decide.sequential(decide.looks(decide.FIRST_LOOK, n), measure, len(valid))
    rows = [_row(label, cycles[i], seq.counts[i], None if i == 0 else seq.bounds[i - 1], prompts)
            for i, (label, prompts) in enumerate(valid)]
    rows += [{"variant": label, "error": err} for label, prompts, err in rendered if prompts is None]
    return rows, [_finding(rows, seq)]


def _row(label: str, cycles, positions, bound, prompts) -> dict:
    tau, se = decide.tau_se(cycles)
    tau_pos, se_pos = decide.tau_se(positions)
    row = {"variant": label, "tau": tau, "se": se, "tau_pos": tau_pos, "se_pos": se_pos,
           "prompt_tokens": sum(len(p.input_ids) for p in prompts[:len(positions)])}
    if bound is not None:
        row.update(delta_vs_configured=bound.delta, delta_se=bound.se, delta_lower=bound.lower,
                   delta_upper=bound.upper, clearly_better=bound.better,
                   status="better" if bound.better else "bounded" if bound.bounded else "open")
    return row


def _finding(rows: list[dict], seq: decide.Sequence) -> Finding:
    conf, on = rows[0], f"on {seq.prompts} prompt(s) (look {len(seq.looks)} of {len(seq.planned)})"
    if seq.verdict == decide.MISMATCH:
        b = rows[seq.winner]
        return warning("chat-template-mismatch",
                       f"{b['variant']} gains {b['delta_vs_configured']:+.3f} tau_pos [{b['delta_lower']:+.3f}, "
                       f"{b['delta_upper']:+.3f}] over {conf['variant']} (cycle tau {b['tau']:.3f} vs "
                       f"{conf['tau']:.3f}), decided {on}: the head was probably trained on prompts rendered that way")
    if seq.verdict == decide.CONSISTENT:
        return info("chat-template-consistent", f"{conf['variant']} (tau {conf['tau']:.3f}) is consistent: no other "
                                                f"prompt format gains {decide.MARGIN} tau_pos or more, decided {on}")
    b = max((r for r in rows[1:] if r.get("status") == "open"), key=lambda r: r["delta_vs_configured"])
    bound = seq.bounds[rows.index(b) - 1]
    need = decide.prompts_to_decide(bound, seq.prompts, seq.level)
    return warning("chat-template-inconclusive",
                   f"could not tell {on}: {b['variant']} gains {b['delta_vs_configured']:+.3f} tau_pos "
                   f"[{b['delta_lower']:+.3f}, {b['delta_upper']:+.3f}] over {conf['variant']}, neither clearly "
                   f"better nor bounded below {decide.MARGIN}; "
                   + (f"about {need} prompts would decide it (raise --prompt-budget)" if need
                      else "its gain sits on the margin: more prompts may not decide it"))
