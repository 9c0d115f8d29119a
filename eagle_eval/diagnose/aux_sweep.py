"""Aux-layer sweep: acceptance for the configured taps and for the taps real wiring bugs produce (issue 5, item 2).

Contract: `candidates` lists the layer sets to try (the configured one first, then the draft
config's ids when --aux-layers overrides them, a training dump's layers, every id +1 and -1 (the ids
read in the other convention), the embedding output HF[0] in place of the lowest, and the engine
defaults HF[2], HF[N//2], HF[N-3] and those +-1). `run_sweep` profiles each one with the target
already loaded (only `Speculator.aux_hf` changes) on the same greedy continuations. The statistics
are pure functions over per-prompt counts: tau is a ratio estimator (emitted / cycles); its standard
error and the SE of a paired difference between two candidates come from the delta method with
prompts as clusters. An alternative "clearly" beats the configured set when its tau is higher by more
than max(0.1, 3 SE of the paired difference).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

CLEAR_MIN_DELTA = 0.1
CLEAR_SE = 3.0


@dataclass(frozen=True)
class Candidate:
    label: str
    hf: tuple[int, ...]


def _shift(hf, d):
    return tuple(i + d for i in hf)


def candidates(configured: tuple[int, ...], num_layers: int, extra: list[tuple[str, tuple]] = ()) -> list[Candidate]:
    """Valid (in range, distinct, same count), de-duplicated, configured first.

    >>> [c.hf for c in candidates((2, 4, 5), 8)]
    [(2, 4, 5), (3, 5, 6), (1, 3, 4), (0, 4, 5)]
    >>> candidates((2, 4, 5), 8)[0].label
    'configured = engine default HF[2], HF[N//2], HF[N-3]'
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
    for label, hf in raw:
        hf = tuple(sorted(int(i) for i in hf))
        if len(hf) == k and len(set(hf)) == k and all(0 <= i < num_layers for i in hf):
            labels.setdefault(hf, []).append(label)
    return [Candidate(" = ".join(names), hf) for hf, names in labels.items()]


def prompt_counts(accepted_per_prompt: list[list[int]]) -> list[tuple[int, int]]:
    """(emitted = sum(accepted + 1), cycles) per prompt.

    >>> prompt_counts([[2, 0, 1], [3]])
    [(6, 3), (4, 1)]
    """
    return [(sum(a) + len(a), len(a)) for a in accepted_per_prompt]


def tau_se(counts: list[tuple[int, int]]) -> tuple[float, float]:
    """tau = sum(emitted) / sum(cycles) and its cluster (per-prompt) delta-method SE.

    >>> tau, se = tau_se([(6, 3), (4, 1)]); round(tau, 3), round(se, 3)
    (2.5, 0.75)
    """
    total_e, total_c = sum(e for e, _ in counts), sum(c for _, c in counts)
    if total_c == 0:
        return float("nan"), float("nan")
    tau = total_e / total_c
    n = len(counts)
    if n < 2:
        return tau, float("nan")
    resid = sum((e - tau * c) ** 2 for e, c in counts)
    return tau, math.sqrt(n / (n - 1) * resid) / total_c


def paired_delta(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> tuple[float, float]:
    """tau(a) - tau(b) over the same prompts, and its SE (per-prompt linearised differences).

    >>> d, se = paired_delta([(6, 3), (4, 1)], [(3, 3), (1, 1)]); round(d, 3), round(se, 3)
    (1.5, 0.75)
    """
    ta, _ = tau_se(a)
    tb, _ = tau_se(b)
    ca, cb = sum(c for _, c in a), sum(c for _, c in b)
    n = len(a)
    if n < 2 or not ca or not cb:
        return ta - tb, float("nan")
    resid = [(ea - ta * xa) / ca - (eb - tb * xb) / cb for (ea, xa), (eb, xb) in zip(a, b)]
    return ta - tb, math.sqrt(n / (n - 1) * sum(r * r for r in resid))


def clearly_better(delta: float, se: float) -> bool:
    """delta > max(0.1, 3 se); a NaN se (one prompt) counts as 0.

    >>> clearly_better(0.5, 0.1), clearly_better(0.25, 0.1), clearly_better(0.05, 0.001)
    (True, False, False)
    """
    threshold = max(CLEAR_MIN_DELTA, CLEAR_SE * (se if se == se else 0.0))
    return delta > threshold


@dataclass
class SweepRow:
    candidate: Candidate
    counts: list[tuple[int, int]]
    tau: float
    se: float
    delta: float = 0.0               # vs the configured candidate
    delta_se: float = 0.0
    clearly_better: bool = False
    rank: int = 0

    def as_dict(self) -> dict:
        hf = list(self.candidate.hf)
        return {"rank": self.rank, "label": self.candidate.label, "hf": hf, "sglang": [i - 1 for i in hf],
                "vllm": hf, "tau": self.tau, "se": self.se, "cycles": sum(c for _, c in self.counts),
                "delta_vs_configured": self.delta, "delta_se": self.delta_se,
                "clearly_better": self.clearly_better}


def rank_rows(rows: list[SweepRow]) -> list[SweepRow]:
    """Fill delta vs rows[0] (the configured set) and rank by tau, ties in candidate order."""
    base = rows[0]
    for r in rows[1:]:
        r.delta, r.delta_se = paired_delta(r.counts, base.counts)
        r.clearly_better = clearly_better(r.delta, r.delta_se)
    ranked = sorted(rows, key=lambda r: (-round(r.tau, 9), rows.index(r)))
    for i, r in enumerate(ranked, 1):
        r.rank = i
    return ranked


def run_sweep(oracle, pcfg, cands: list[Candidate], progress: bool = False) -> list[SweepRow]:
    """Profile every candidate with `oracle`'s loaded target and head; rows ranked best first."""
    from eagle_eval import api
    from eagle_eval.models.capture import AuxLayers

    rows = []
    n = oracle.speculator.target.num_layers
    for cand in cands:
        aux = AuxLayers(hf=cand.hf, num_layers=n, source=f"diagnose sweep: {cand.label}")
        swept = replace(oracle, speculator=replace(oracle.speculator, aux_hf=cand.hf),
                        resolved={**oracle.resolved, "aux_layers": aux.as_dict()})
        run = replace(pcfg.run, aux_layers=cand.hf, aux_convention="hf")
        res = api.profile(replace(pcfg, run=run), progress=progress, oracle=swept)
        counts = prompt_counts([s.accepted_per_cycle for s in res.samples])
        tau, se = tau_se(counts)
        rows.append(SweepRow(cand, counts, tau, se))
    return rank_rows(rows)


def config_lines(hf: list[int]) -> dict:
    """The draft config.json lines that make SGLang and vLLM feed HF[hf]."""
    sg = [i - 1 for i in hf]
    return {"sglang": f'"eagle_config": {{"eagle_aux_hidden_state_layer_ids": {sg}}}',
            "vllm": f'"eagle_aux_hidden_state_layer_ids": {list(hf)}',
            "eagle_eval": f"--aux-layers {','.join(map(str, sg))} (SGLang ids) or --aux-layers "
                          f"{','.join(map(str, hf))} --aux-convention hf"}
