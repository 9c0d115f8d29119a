"""Chat-template check: acceptance with the configured prompt format, the tokenizer's chat template and
raw prompts, judged three ways like the aux sweep.

Contract: `template_check(oracle)` renders the same questions with each format (`variants`: the oracle
through `with_`, only the prompt format changed), profiles each one on its own greedy continuations (the
prompts differ, so the pairing is per prompt, not per position) in the looks `decide.sequential` plans over
the oracle's questions, and returns
(rows, findings): chat-template-mismatch (warning: the prompts themselves change, so evidence, not
proof), chat-template-consistent (info), chat-template-inconclusive (warning, never "ok"), or
chat-template-not-applicable (info) when the prompts do not depend on the template.
"""

from __future__ import annotations

from eagle_eval.diagnose import decide
from eagle_eval.findings import Finding, info, warning


def variants(oracle) -> list[tuple[str, object]]:
    """(label, oracle) for the configured prompt format, the tokenizer's template and raw prompts."""
    def label(w):
        if w.no_chat_template:
            return "raw prompts (--no-chat-template)"
        return f"--chat-template {w.chat_template}" if w.chat_template else "the tokenizer's chat template"

    options = [oracle, oracle.with_(no_chat_template=False, chat_template=None),
               oracle.with_(no_chat_template=True, chat_template=None, enable_thinking=None)]
    out, seen = [], set()
    for v in options:
        w = v.settings.workload
        if (w.no_chat_template, w.chat_template) not in seen:
            seen.add((w.no_chat_template, w.chat_template))
            out.append((label(w) + (" (configured)" if v is oracle else ""), v))
    return out


def _render(oracle) -> list[tuple[str, object, list | None, str | None]]:
    from eagle_eval.settings import ConfigError
    from eagle_eval.workload.conversations import load_workload
    from eagle_eval.workload.data import DataError

    from eagle_eval.workload.templates import ThinkingIgnored

    out = []
    for label, variant in variants(oracle):
        try:
            try:
                prompts = load_workload(variant.settings.workload, oracle.tokenizer).first_prompts
            except ThinkingIgnored:                    # another format than the configured one may not read the switch
                if variant is oracle:
                    raise
                variant = variant.with_(enable_thinking=None)
                label += " (enable_thinking not read: not passed)"
                prompts = load_workload(variant.settings.workload, oracle.tokenizer).first_prompts
            out.append((label, variant, prompts, None))
        except (DataError, ConfigError) as exc:        # e.g. messages rows and no template at all
            out.append((label, variant, None, f"{type(exc).__name__}: {exc}"))
    return out


def template_check(oracle) -> tuple[list[dict], list[Finding]]:
    """Rows (rows[0] = the configured format) and one finding."""
    from eagle_eval.commands.profile import profile_prompts
    from eagle_eval.diagnose.aux_sweep import prompt_counts, sample_positions
    from eagle_eval.errors import within
    from eagle_eval.settings import ProfileOptions

    rendered = _render(oracle)
    base_ids = [p.input_ids for p in rendered[0][2]]
    if all(r[2] is None or [p.input_ids for p in r[2]] == base_ids for r in rendered):
        return [], [info("chat-template-not-applicable", "the prompts do not depend on the chat template "
                                                         "(pre-tokenized or plain-text rows): check skipped")]
    valid = [(label, variant, prompts) for label, variant, prompts, err in rendered if prompts is not None]
    if len(valid) < 2:
        return ([{"variant": label, "error": err} for label, _, prompts, err in rendered if prompts is None],
                [info("chat-template-not-applicable", "no other prompt format renders these questions: check skipped")])
    cycles: list[list] = [[] for _ in valid]
    steps = oracle.resolved.num_steps

    def measure(lo: int, hi: int) -> list[list]:
        out = []
        for i, (label, variant, prompts) in enumerate(valid):
            with within(f"chat-template check, {label}"):
                res = profile_prompts(variant, prompts[lo:hi], ProfileOptions(max_steps=steps))
            cycles[i] += prompt_counts([s.accepted_per_cycle for s in res.samples])
            out.append(sample_positions(res.samples, steps))
        return out

    n = min(len(p) for _, _, p in valid)
    seq = decide.sequential(decide.looks(decide.FIRST_LOOK, n), measure, len(valid))
    rows = [_row(label, cycles[i], seq.counts[i], None if i == 0 else seq.bounds[i - 1], prompts)
            for i, (label, _, prompts) in enumerate(valid)]
    rows += [{"variant": label, "error": err} for label, _, prompts, err in rendered if prompts is None]
    return rows, [_finding(rows, seq)]


def _row(label: str, cycles, positions, bound, prompts) -> dict:
    tau, se = decide.tau_se_clustered(cycles)
    tau_pos, se_pos = decide.tau_se_clustered(positions)
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
