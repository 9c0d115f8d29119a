"""Three-way decisions for diagnose's comparisons: mismatch, consistent or inconclusive.

Contract (pure functions, no torch):
  * `position_counts` turns one prompt's teacher-forced run lengths into (sum of min(r_k, S) + 1,
    positions): acceptance at EVERY position k of the greedy continuation a cycle could start from,
    not only at the cycle starts. Its ratio over prompts is the position-averaged tau ("tau_pos").
  * `tau_se_clustered` and `paired_delta` are ratio estimators over such per-prompt counts (or the loop's
    (emitted, cycles)), with cluster (per-prompt) delta-method standard errors.
  * `looks` plans the sequential looks (first look, then doubling, up to the budget) BEFORE any data.
  * `verdict` judges alternatives against the configured one with one-sided Student-t bounds on the
    paired difference (ratio estimator, prompts as clusters, n_prompts - 1 degrees of freedom):
      mismatch      some alternative's gain has its lower bound above 0 AND its estimate >= margin;
      consistent    every alternative's gain has its upper bound below the margin;
      inconclusive  neither.
    Each bound is taken at level alpha / (looks * alternatives) (Bonferroni over the planned looks
    and the candidates), so over the whole sequential run P(mismatch | the configured set is truly
    at least as good as every alternative) <= alpha, and P(consistent | some alternative is truly
    better by >= margin) <= alpha.
  * `sequential` runs the looks: it asks for the counts of the next prompts of every candidate,
    judges, and stops at the first decided look (the planned number of looks fixes the level).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from eagle_eval.stats.clustered import t_quantile

ALPHA = 0.05            # family-wise error rate of each kind (false mismatch, false consistent)
MARGIN = 0.1            # a gain in tau below this is immaterial
FIRST_LOOK = 8          # prompts at the first look; then doubling up to the budget

MISMATCH, CONSISTENT, INCONCLUSIVE = "mismatch", "consistent", "inconclusive"


def position_counts(run_lengths: list[int], num_steps: int, positions: int) -> tuple[int, int]:
    """(sum over the first `positions` starts of min(r_k, S) + 1, positions).

    >>> position_counts([2, 0, 5, 1, 0, 0], 3, 4)
    (10, 4)
    """
    return sum(min(r, num_steps) + 1 for r in run_lengths[:positions]), positions


def tau_se_clustered(counts: list[tuple[int, int]]) -> tuple[float, float]:
    """tau = sum(emitted) / sum(cycles) and its cluster (per-prompt) delta-method SE (not the independent-cycles
    SE of results/comparison.py `tau_se_cycles`).

    >>> tau, se = tau_se_clustered([(6, 3), (4, 1)]); round(tau, 3), round(se, 3)
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
    ta, _ = tau_se_clustered(a)
    tb, _ = tau_se_clustered(b)
    ca, cb = sum(c for _, c in a), sum(c for _, c in b)
    n = len(a)
    if n < 2 or not ca or not cb:
        return ta - tb, float("nan")
    resid = [(ea - ta * xa) / ca - (eb - tb * xb) / cb for (ea, xa), (eb, xb) in zip(a, b)]
    return ta - tb, math.sqrt(n / (n - 1) * sum(r * r for r in resid))


def looks(first: int, budget: int) -> list[int]:
    """Prompt counts at each planned look: `first`, doubling, the budget last.

    >>> looks(8, 32), looks(8, 20), looks(8, 5), looks(8, 8)
    ([8, 16, 32], [8, 16, 20], [5], [8])
    """
    out = [min(first, budget)]
    while out[-1] < budget:
        out.append(min(2 * out[-1], budget))
    return out


def alpha_per_bound(alpha: float, num_looks: int, alternatives: int) -> float:
    """Bonferroni: the one-sided level of each bound.

    >>> alpha_per_bound(0.05, 3, 8)
    0.0020833333333333333
    """
    return alpha / (max(num_looks, 1) * max(alternatives, 1))


@dataclass(frozen=True)
class Bound:
    """One alternative's paired gain over the configured set and its one-sided bounds."""
    delta: float
    se: float
    lower: float
    upper: float

    @property
    def better(self) -> bool:
        return self.lower > 0 and self.delta >= MARGIN

    @property
    def bounded(self) -> bool:
        return self.upper < MARGIN


def bounds(deltas: list[tuple[float, float]], n_prompts: int, level: float) -> list[Bound]:
    """(delta, se) pairs -> bounds at one-sided `level`; fewer than 2 prompts or a NaN se: unbounded.

    >>> b = bounds([(0.5, 0.1), (-0.4, 0.05)], 8, 0.0025)[0]; round(b.lower, 3), round(b.upper, 3)
    (0.097, 0.903)
    """
    q = t_quantile(1 - level, n_prompts - 1) if n_prompts >= 2 else math.inf
    out = []
    for d, se in deltas:
        half = q * se if se == se and q < math.inf else math.inf
        out.append(Bound(d, se, d - half, d + half))
    return out


def verdict(found: list[Bound]) -> tuple[str, int | None]:
    """(verdict, index of the best clearly better alternative or None).

    >>> verdict([Bound(0.5, 0.1, 0.1, 0.9), Bound(0.8, 0.1, 0.3, 1.2)])
    ('mismatch', 1)
    >>> verdict([Bound(-0.5, 0.1, -0.9, 0.05)]), verdict([Bound(0.05, 0.1, -0.3, 0.4)]), verdict([])
    (('consistent', None), ('inconclusive', None), ('consistent', None))
    """
    better = [i for i, b in enumerate(found) if b.better]
    if better:
        return MISMATCH, max(better, key=lambda i: found[i].delta)
    if all(b.bounded for b in found):
        return CONSISTENT, None
    return INCONCLUSIVE, None


def undecided_by(found: list[Bound]) -> list[int]:
    """Indices of the alternatives that keep the verdict open (neither clearly better nor bounded)."""
    return [i for i, b in enumerate(found) if not b.better and not b.bounded]


def rule_text(alpha: float = ALPHA) -> str:
    return (f"paired per-position gain in tau_pos, prompts as clusters, one-sided Student-t bounds at "
            f"alpha {alpha} split by Bonferroni over the planned looks and the alternatives; mismatch: an "
            f"alternative's lower bound > 0 and gain >= {MARGIN}; consistent: every upper bound < {MARGIN}")


def prompts_to_decide(b: Bound, n: int, level: float) -> int | None:
    """Prompts at which `b` would be decided if its gain and per-prompt spread held (SE ~ 1/sqrt(n),
    the t quantile at the larger sample); None when the gain sits on the margin or n < 2.

    >>> prompts_to_decide(Bound(0.05, 0.02, 0, 0), 8, 0.005), prompts_to_decide(Bound(0.3, 0.2, 0, 0), 4, 0.005)
    (13, 16)
    """
    need = b.delta if b.delta >= MARGIN else MARGIN - b.delta
    if n < 2 or not b.se == b.se or need <= 1e-9:
        return None

    def decided(m: int) -> bool:
        return t_quantile(1 - level, m - 1) * b.se * math.sqrt(n / m) < need

    hi = n
    while not decided(hi):
        if hi > 10**6:
            return None
        hi *= 2
    lo = max(hi // 2, n)
    while lo < hi:                                    # smallest m in [lo, hi] that decides
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if not decided(mid) else (lo, mid)
    return hi


@dataclass
class Sequence:
    """What `sequential` saw: per candidate (0 = configured) the per-prompt counts, every look taken."""
    planned: list[int]
    level: float
    counts: list[list[tuple[int, int]]]
    looks: list[dict] = field(default_factory=list)
    bounds: list[Bound] = field(default_factory=list)        # alternatives 1.., at the last look
    verdict: str = INCONCLUSIVE
    winner: int | None = None                                # index into the candidates (>= 1)

    @property
    def prompts(self) -> int:
        return len(self.counts[0])


def sequential(planned: list[int], measure: Callable[[int, int], list[list[tuple[int, int]]]],
               num_candidates: int, alpha: float = ALPHA) -> Sequence:
    """measure(lo, hi) -> per candidate the counts of prompts lo..hi-1; stop at the first decided look.

    >>> rows = [[(3, 1)] * 16, [(3, 1), (4, 1)] * 8]            # the alternative gains 0.5 on odd prompts
    >>> seq = sequential([4, 8, 16], lambda lo, hi: [r[lo:hi] for r in rows], 2)
    >>> seq.verdict, seq.winner, [look["prompts"] for look in seq.looks]
    ('mismatch', 1, [4, 8])
    """
    seq = Sequence(planned, alpha_per_bound(alpha, len(planned), num_candidates - 1),
                   [[] for _ in range(num_candidates)])
    lo = 0
    for n in planned:
        for c, more in enumerate(measure(lo, n)):
            seq.counts[c] += more
        lo = n
        got = seq.prompts
        seq.bounds = bounds([paired_delta(seq.counts[c], seq.counts[0]) for c in range(1, num_candidates)],
                            got, seq.level)
        v, w = verdict(seq.bounds)
        seq.verdict, seq.winner = v, (None if w is None else w + 1)
        seq.looks.append({"prompts": got, "verdict": v})
        if v != INCONCLUSIVE:
            break
    return seq
