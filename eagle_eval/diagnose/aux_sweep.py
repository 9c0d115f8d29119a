"""Aux-layer sweep: acceptance for the configured taps and for the taps real wiring bugs produce.

Contract: `candidates` lists the layer sets to try (the configured one first, then the draft
config's ids when --aux-layers overrides them, a training dump's layers, every id +1 and -1 (the ids
read in the other convention), the embedding output HF[0] in place of the lowest, and the engine
defaults HF[2], HF[N//2], HF[N-3] and those +-1). `measure` profiles each one on one round of
prompts with the target already loaded (`oracle.with_` changes only the aux layers), all on the same greedy
continuations, and returns per prompt both the loop's (emitted, cycles) and the teacher-forced
acceptance at every position (`decide.position_counts`). The decision (`decide.sequential` over
the position counts) is made by the caller; `sweep_rows` and `sweep_findings` turn it into the
ranked table (cycle tau kept beside tau_pos) and one finding: aux-layer-mismatch (error),
aux-layers-consistent (info) or aux-layers-inconclusive (undecided: exit 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle_eval.diagnose import decide
from eagle_eval.findings import Finding, error, info, undecided, warning


@dataclass(frozen=True)
class Candidate:
    label: str
    hf: tuple[int, ...]
    changes: tuple | None = None  # a head kind's variant (heads/kind.py HeadKind.variants): settings (name, value)


def variant_candidates(configured: tuple[int, ...], variants) -> list[Candidate]:
    """The configured wiring, then a head kind's own variants ((name, description, settings changes)), in order."""
    return [Candidate("configured", configured, ())] + [Candidate(f"{name} ({description})", configured,
                                                              tuple(changes.items()))
                                                    for name, description, changes in variants]


def _shift(hf, d):
    return tuple(i + d for i in hf)


def candidates(configured: tuple[int, ...], num_layers: int, extra: list[tuple[str, tuple]] = ()) -> list[Candidate]:
    """Valid (in range, distinct, same count), de-duplicated, configured first. Index N (the last
    layer's output before the final norm, boundary id N) is in range only when the configured set
    taps it (a boundary-convention head): elsewhere no engine feeds it (heads/checks/sanity.py aux-final-prenorm).

    >>> [c.hf for c in candidates((2, 4, 5), 8)]
    [(2, 4, 5), (3, 5, 6), (1, 3, 4), (0, 4, 5)]
    >>> candidates((2, 4, 5), 8)[0].label
    'configured = engine default HF[2], HF[N//2], HF[N-3]'
    >>> [c.hf for c in candidates((2, 4, 8), 8)][:3]
    [(2, 4, 8), (1, 3, 7), (0, 4, 8)]
    """
    from eagle_eval.models.capture import default_hf_layers

    k = len(configured)
    default = tuple(default_hf_layers(num_layers))
    raw = [("configured", configured), *extra,
           ("every id +1 (other convention)", _shift(configured, 1)),
           ("every id -1 (other convention)", _shift(configured, -1)),
           ("embedding output HF[0] for the lowest", (0,) + tuple(sorted(configured))[1:]),
           ("engine default HF[2], HF[N//2], HF[N-3]", default),
           ("engine default +1", _shift(default, 1)),
           ("engine default -1", _shift(default, -1))]
    labels: dict[tuple, list[str]] = {}          # insertion order = first appearance
    top = num_layers if num_layers in configured else num_layers - 1
    for label, hf in raw:
        hf = tuple(sorted(int(i) for i in hf))
        if len(hf) == k and len(set(hf)) == k and all(0 <= i <= top for i in hf):
            labels.setdefault(hf, []).append(label)
    return [Candidate(" = ".join(names), hf) for hf, names in labels.items()]


def prompt_counts(accepted_per_prompt: list[list[int]]) -> list[tuple[int, int]]:
    """(emitted = sum(accepted + 1), cycles) per prompt.

    >>> prompt_counts([[2, 0, 1], [3]])
    [(6, 3), (4, 1)]
    """
    return [(sum(a) + len(a), len(a)) for a in accepted_per_prompt]


@dataclass
class SweepRow:
    candidate: Candidate
    index: int                             # position in the candidate list (0 = configured)
    cycles: list[tuple[int, int]]          # per prompt: (emitted, cycles) of the simulated loop
    positions: list[tuple[int, int]]       # per prompt: decide.position_counts
    bound: decide.Bound | None = None      # gain over the configured set (None: the configured row)
    rank: int = 0

    @property
    def tau(self) -> float:
        return decide.tau_se_clustered(self.cycles)[0]

    @property
    def tau_pos(self) -> float:
        return decide.tau_se_clustered(self.positions)[0]

    @property
    def status(self) -> str:
        if self.bound is None:
            return "configured"
        return "better" if self.bound.better else "bounded" if self.bound.bounded else "open"

    def as_dict(self) -> dict:
        hf = list(self.candidate.hf)
        tau, se = decide.tau_se_clustered(self.cycles)
        tau_pos, se_pos = decide.tau_se_clustered(self.positions)
        b = self.bound or decide.Bound(0.0, 0.0, 0.0, 0.0)
        return {"rank": self.rank, "label": self.candidate.label, "hf": hf, "sglang": [i - 1 for i in hf],
                "vllm": hf, "tau": tau, "se": se, "cycles": sum(c for _, c in self.cycles),
                "tau_pos": tau_pos, "se_pos": se_pos, "positions": sum(c for _, c in self.positions),
                "delta_vs_configured": b.delta, "delta_se": b.se, "delta_lower": b.lower, "delta_upper": b.upper,
                "status": self.status, "clearly_better": self.status == "better",
                **({"changes": dict(self.candidate.changes)} if self.candidate.changes is not None else {})}


def measure(oracle, prompts, continuations, cands: list[Candidate], progress: bool = False) -> list[tuple[list, list, list]]:
    """Per candidate: (cycle counts, position counts, the profiled samples) per prompt, each candidate profiled through
    `oracle.with_` (the loaded target and head are shared) on the same prompts and greedy continuations."""
    from eagle_eval.commands.profile import profile_prompts
    from eagle_eval.errors import within
    from eagle_eval.settings import ProfileOptions

    out = []
    n, steps = oracle.speculator.target.num_layers, oracle.resolved.num_steps
    for cand in cands:
        swept = (oracle.with_(**dict(cand.changes)) if cand.changes is not None else
                 oracle.with_(aux_layers=cand.hf, aux_convention="boundary" if n in cand.hf else "hf"))
        with within(cand.label if cand.changes is not None else f"aux-layer sweep, HF {list(cand.hf)}"):
            res = profile_prompts(swept, prompts, ProfileOptions(max_steps=steps), continuations, progress)
        out.append((prompt_counts([s.accepted_per_cycle for s in res.samples]), sample_positions(res.samples, steps),
                    res.samples))
    return out


def sample_positions(samples, num_steps: int) -> list[tuple[int, int]]:
    """Position counts of profiled samples: every root a cycle could start from (output length - 1)."""
    return [decide.position_counts(s.extra["run_lengths"], num_steps, max(len(s.output_ids) - 1, 0))
            for s in samples]


def sweep_rows(cands: list[Candidate], cycles: list[list], seq: decide.Sequence) -> list[SweepRow]:
    """Rows ranked by tau_pos (the decision's statistic), ties in candidate order; rows[i].bound from seq."""
    rows = [SweepRow(c, i, cycles[i], seq.counts[i], None if i == 0 else seq.bounds[i - 1])
            for i, c in enumerate(cands)]
    ranked = sorted(rows, key=lambda r: (-round(r.tau_pos, 9), r.index))
    for i, r in enumerate(ranked, 1):
        r.rank = i
    return ranked


def sweep_findings(rows: list[SweepRow], seq: decide.Sequence, budget: int,
                   lines_of=None) -> tuple[list[Finding], list[int]]:
    """(findings, recommended HF layers): one verdict finding, plus a warning when nothing is accepted.
    lines_of: HF layers -> the config lines that make the engines tap them (`config_lines`, a block drafter's
    `block_config_lines`)."""
    base = next(r for r in rows if r.bound is None)
    configured = list(base.candidate.hf)
    out = []
    if max(r.tau_pos for r in rows) < 1.05:
        out.append(warning("acceptance-near-zero", f"every candidate layer set accepts almost nothing (best tau_pos "
                                                   f"{max(r.tau_pos for r in rows):.3f}): look at lm_head, embeddings "
                                                   "and d2t first"))
    on = f"decided on {seq.prompts} prompt(s) (look {len(seq.looks)} of {len(seq.planned)})"
    if seq.verdict == decide.MISMATCH:
        win = next(r for r in rows if r.index == seq.winner)
        b, lines = win.bound, (lines_of or config_lines)(list(win.candidate.hf))
        out.append(error("aux-layer-mismatch",
                         f"HF {list(win.candidate.hf)} ({win.candidate.label}) gains {b.delta:+.3f} tau_pos "
                         f"[{b.lower:+.3f}, {b.upper:+.3f}] over the configured HF {configured} (cycle tau "
                         f"{win.tau:.3f} vs {base.tau:.3f}), {on}: in the draft config.json set SGLang "
                         f"{lines['sglang']}; vLLM {lines['vllm']}", config_lines=lines, prompts=seq.prompts))
        return out, list(win.candidate.hf)
    if seq.verdict == decide.CONSISTENT:
        top = max((r for r in rows if r.bound is not None), key=lambda r: r.bound.upper, default=None)
        worst = f"; the largest upper bound is {top.bound.upper:+.3f} (HF {list(top.candidate.hf)})" if top else ""
        out.append(info("aux-layers-consistent",
                        f"configured HF {configured} is consistent: no alternative gains {decide.MARGIN} tau_pos "
                        f"or more{worst}, {on}", prompts=seq.prompts))
        return out, configured
    out.append(undecided("aux-layers-inconclusive", _inconclusive_message(rows, seq, budget), prompts=seq.prompts))
    return out, configured


def variant_findings(rows: list[SweepRow], seq: decide.Sequence, budget: int, kind: str) -> list[Finding]:
    """One verdict finding of a head kind's variant sweep: {kind}-wiring-mismatch (error: the head was trained for
    another wiring than the configured one), {kind}-wiring-consistent (info) or {kind}-wiring-inconclusive."""
    base = next(r for r in rows if r.bound is None)
    on = f"decided on {seq.prompts} prompt(s) (look {len(seq.looks)} of {len(seq.planned)})"
    out = []
    if max(r.tau_pos for r in rows) < 1.05:
        out.append(warning("acceptance-near-zero", f"every wiring accepts almost nothing (best tau_pos "
                                                   f"{max(r.tau_pos for r in rows):.3f}): look at the weights first"))
    if seq.verdict == decide.MISMATCH:
        win = next(r for r in rows if r.index == seq.winner)
        b = win.bound
        out.append(error(f"{kind}-wiring-mismatch",
                         f"{win.candidate.label} gains {b.delta:+.3f} tau_pos [{b.lower:+.3f}, {b.upper:+.3f}] over "
                         f"the configured wiring (cycle tau {win.tau:.3f} vs {base.tau:.3f}), {on}: the {kind} layer "
                         "was trained for that wiring, not for the one configured (docs/mtp.md: what each engine runs)",
                         variant=dict(win.candidate.changes), prompts=seq.prompts))
    elif seq.verdict == decide.CONSISTENT:
        out.append(info(f"{kind}-wiring-consistent", f"the configured wiring is consistent: no variant gains "
                                                     f"{decide.MARGIN} tau_pos or more, {on}", prompts=seq.prompts))
    else:
        out.append(undecided(f"{kind}-wiring-inconclusive", _inconclusive_message(rows, seq, budget),
                             prompts=seq.prompts))
    return out


def _inconclusive_message(rows: list[SweepRow], seq: decide.Sequence, budget: int) -> str:
    open_rows = sorted((r for r in rows if r.status == "open"), key=lambda r: -r.bound.delta)
    r = open_rows[0]
    b = r.bound
    need = decide.prompts_to_decide(b, seq.prompts, seq.level)
    more = (f"about {need} prompts would decide it if the gain and spread held" if need
            else "its gain sits on the margin: more prompts may not decide it")
    remedy = ("raise --prompt-budget" if seq.prompts >= budget else
              "the workload has no more questions: give more (--prompts, --dataset) or raise --limit")
    which = r.candidate.label if r.candidate.changes is not None else f"HF {list(r.candidate.hf)} ({r.candidate.label})"
    return (f"could not tell on {seq.prompts} prompt(s) (--prompt-budget {budget}): {which} gains {b.delta:+.3f} tau_pos [{b.lower:+.3f}, {b.upper:+.3f}], neither clearly "
            f"better (lower bound > 0, gain >= {decide.MARGIN}) nor bounded below {decide.MARGIN}; {more} ({remedy})"
            + (f"; {len(open_rows) - 1} other candidate(s) also open" if len(open_rows) > 1 else ""))


def config_lines(hf: list[int]) -> dict:
    """The draft config.json lines that make SGLang and vLLM feed HF[hf]."""
    sg = [i - 1 for i in hf]
    return {"sglang": f'"eagle_config": {{"eagle_aux_hidden_state_layer_ids": {sg}}}',
            "vllm": f'"eagle_aux_hidden_state_layer_ids": {list(hf)}',
            "eagle_eval": f"--aux-layers {','.join(map(str, sg))} (SGLang ids) or --aux-layers "
                          f"{','.join(map(str, hf))} --aux-convention hf"}


def block_config_lines(hf: list[int]) -> dict:
    """A block drafter's config.json lines that make SGLang and vLLM feed HF[hf]: target_layer_ids = hf - 1 (both
    engines add 1; vLLM only without an eagle_aux_hidden_state_layer_ids key, which wins)."""
    ids = [i - 1 for i in hf]
    line = f'"dflash_config": {{"target_layer_ids": {ids}}}'
    return {"sglang": line, "vllm": line + " (and no eagle_aux_hidden_state_layer_ids key)",
            "eagle_eval": f"--aux-layers {','.join(map(str, hf))} --aux-convention hf"}
