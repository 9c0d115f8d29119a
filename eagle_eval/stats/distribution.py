"""The distribution check's statistics: do sampled tokens follow the distributions they claim to be drawn from?
Counts per cell -> a chi-square statistic, its p-value and a verdict. Pure functions on counts, no torch.

At every checked position t the vocab is split into RANK_CELLS by the token's rank under p_t (descending
probability, ties by id): rank 1, 2, 3, 4, 5-8, 9-16, 17 and beyond. With pi_t(c) = p_t(cell c) and x_t the token
the loop emitted,

    O_c = #{t : x_t in c},    E_c = sum_t pi_t(c),    C = sum_t (diag(pi_t) - pi_t pi_t^T).

Under H0 (each x_t ~ p_t given everything before it: the loop is plain sampling) O - E is a martingale whose
predictable covariance is C, so S = (O - E)' C^-1 (O - E), over every (merged) cell but the last, is asymptotically
chi-square with (cells - 1) degrees of freedom (martingale central limit theorem; with one p for all t it is
Pearson's X^2). Cells are merged in rank order until each expects at least MIN_EXPECTED tokens (the usual
validity condition). Rank cells are where a loop's mistakes land: a wrong residual or coin over- or
under-emits the drafted tokens, which are mostly the target's top ranks. A token with p_t(x_t) = 0 cannot be a
sample at all and decides alone, unless it lies at a filter's edge (rules/lossless.py `relaxed`), where
the loop's own forward may have rounded it inside: those are counted apart and do not decide.

The departure the settings imply. With pi-bar = E / n the mean cell probabilities, the sampled mass
m = 1 - pi-bar(rank 1) is how far the settings' p is from greedy decoding on average (the total variation
between p_t and the one-hot at its argmax, averaged; 0 at temperature 0). The departure the check must be able
to see is DEPARTURE_SHARE m = m / 2 in total variation on the (merged) cells: a loop halfway to greedy
(emitting (p + one-hot) / 2) departs by exactly that. Its least detectable form moves mass in proportion to
pi-bar from a set of cells G to the rest, with noncentrality n delta^2 / (pi-bar(G) (1 - pi-bar(G))) (Pearson;
the martingale statistic's is at least that), so the tokens detect every departure of total variation
    detectable_tv = sqrt(lam v / n),   v = max over G of pi-bar(G) (1 - pi-bar(G)) <= 1/4,
with probability POWER at ALPHA (lam: `noncentrality_for_power` at the cells' df).

Verdicts (never "lossless": a test cannot prove equality):
- differs: the rule is not plain sampling by construction (`not_plain`: SGLang's thresholds below 1, whatever
  the counts), a token outside the support, or S's p-value below ALPHA (the false-alarm rate);
- consistent: no difference at ALPHA, and the tokens are enough to detect, with probability POWER, both a
  medium deviation (Cohen's w = W_MEDIUM, i.e. noncentrality n w^2) and every departure of the size the settings
  imply (detectable_tv <= m / 2);
- undecided: fewer than two cells after merging, or too few tokens for that power.
Counts add up exactly over prompts and samples (`CellCounts.merge`); rates and verdicts come at report time.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field

RANK_CELLS = ((1, 1), (2, 2), (3, 3), (4, 4), (5, 8), (9, 16), (17, None))     # 1-based rank ranges
ALPHA = 1e-3
MIN_EXPECTED = 5.0
W_MEDIUM = 0.3          # Cohen's "medium" effect size w (Cohen 1988, ch. 7)
POWER = 0.8
DEPARTURE_SHARE = 0.5   # the departure to detect: this share of the sampled mass (a loop halfway to greedy)
DEFINITION = ("tokens grouped by their rank under the target's processed p at their position (cells rank 1, 2, 3, "
              "4, 5-8, 9-16, 17+, merged until each expects >= 5); S = (O - E)' C^-1 (O - E) with E and C the sums of "
              "each position's cell probabilities and multinomial covariances, chi-square with cells - 1 df under "
              f"'the loop is plain sampling from p'; differs when the rule is not plain sampling by construction, "
              f"p < {ALPHA:g} or a token has p = 0; undecided when too few tokens to detect, with power {POWER}, "
              f"Cohen's w = {W_MEDIUM} and every departure of total variation {DEPARTURE_SHARE:g} x the sampled mass "
              "m = 1 - mean p_t(rank 1) on the cells (detectable_tv = sqrt(lam v / n), v = max over cell sets G of "
              "pi(G) (1 - pi(G)))")


@dataclass
class CellCounts:
    observed: list[int] = field(default_factory=lambda: [0] * len(RANK_CELLS))
    expected: list[float] = field(default_factory=lambda: [0.0] * len(RANK_CELLS))
    covariance: list[list[float]] = field(default_factory=lambda: [[0.0] * len(RANK_CELLS) for _ in RANK_CELLS])
    tokens: int = 0
    outside_support: list[dict] = field(default_factory=list)    # {"position", "token", "at_filter_edge"}: p = 0
    not_plain: str | None = None       # why the rule is not plain sampling by construction (rules.not_plain_sampling)

    def add(self, cell: int, pi: list[float]) -> None:
        """One token in `cell` at a position whose cell probabilities are `pi` [K]."""
        self.observed[cell] += 1
        self.tokens += 1
        for i, a in enumerate(pi):
            self.expected[i] += a
            for j, b in enumerate(pi):
                self.covariance[i][j] += (a if i == j else 0.0) - a * b

    def merge(self, other: "CellCounts") -> "CellCounts":
        k = range(len(self.observed))
        return CellCounts([self.observed[i] + other.observed[i] for i in k],
                          [self.expected[i] + other.expected[i] for i in k],
                          [[self.covariance[i][j] + other.covariance[i][j] for j in k] for i in k],
                          self.tokens + other.tokens, self.outside_support + other.outside_support,
                          self.not_plain or other.not_plain)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "CellCounts":
        return cls(**d)


def merged_groups(expected: list[float], minimum: float = MIN_EXPECTED) -> list[list[int]]:
    """Consecutive cells grouped until each group expects >= minimum; a short tail joins the last group.

    >>> merged_groups([50.0, 20.0, 3.0, 1.0, 2.0, 0.5, 0.0])
    [[0], [1], [2, 3, 4, 5, 6]]
    >>> merged_groups([3.0, 1.0])
    [[0, 1]]
    """
    groups, current, total = [], [], 0.0
    for i, e in enumerate(expected):
        current.append(i)
        total += e
        if total >= minimum:
            groups.append(current)
            current, total = [], 0.0
    if current:
        if groups:
            groups[-1] += current
        else:
            groups.append(current)
    return groups


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """x with a x = b (Gaussian elimination, partial pivoting); None when a is singular to working precision."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    scale = max((abs(v) for row in a for v in row), default=0.0)
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) <= 1e-12 * max(scale, 1e-300):
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


def gammaincc(a: float, x: float) -> float:
    """The regularized upper incomplete gamma Q(a, x) (series below a + 1, continued fraction above).

    >>> round(gammaincc(1.0, 2.0), 12) == round(math.exp(-2.0), 12)
    True
    """
    if x <= 0:
        return 1.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-16:
            n += 1
            term *= x / n
            total += term
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b, c, d = x + 1 - a, 1 / tiny, 1 / (x + 1 - a)
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-16:
            break
    return math.exp(log_front) * h


def chi2_sf(x: float, df: int) -> float:
    """P(chi-square(df) > x).

    >>> round(chi2_sf(3.841458820694124, 1), 6), round(chi2_sf(9.487729036781154, 4), 6)
    (0.05, 0.05)
    """
    return gammaincc(df / 2, x / 2)


def _bisect(f, lo: float, hi: float) -> float:
    """The root of an increasing f on [lo, hi] (f(lo) < 0 < f(hi))."""
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


def chi2_isf(alpha: float, df: int) -> float:
    """The x with P(chi-square(df) > x) = alpha."""
    return _bisect(lambda x: alpha - chi2_sf(x, df), 0.0, 1e4)


def ncx2_sf(x: float, df: int, lam: float) -> float:
    """P(noncentral chi-square(df, lam) > x), as the Poisson(lam / 2) mixture of central chi-squares.

    >>> round(ncx2_sf(3.841458820694124, 1, 0.0), 6), round(ncx2_sf(3.841458820694124, 1, 7.848879), 3)
    (0.05, 0.8)
    """
    if lam <= 0:
        return chi2_sf(x, df)
    half, total = lam / 2, 0.0
    for j in range(int(half + 12 * math.sqrt(half) + 30)):
        total += math.exp(-half + j * math.log(half) - math.lgamma(j + 1)) * chi2_sf(x, df + 2 * j)
    return min(1.0, total)


@functools.lru_cache(maxsize=None)
def noncentrality_for_power(df: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """lam with P(ncx2(df, lam) > chi2_isf(alpha, df)) = power."""
    crit = chi2_isf(alpha, df)
    return _bisect(lambda lam: ncx2_sf(crit, df, lam) - power, 0.0, 1e4)


def detectable_w(tokens: int, df: int, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """Cohen's w that `tokens` detect with probability `power` at `alpha`: sqrt(lam / n), the noncentrality lam of
    a deviation w being n w^2."""
    if tokens <= 0 or df < 1:
        return None
    return math.sqrt(noncentrality_for_power(df, alpha, power) / tokens)


def detectable_tv(tokens: int, cell_probs: list[float], df: int, alpha: float = ALPHA,
                  power: float = POWER) -> float | None:
    """The total variation on these cells (mean probabilities `cell_probs`) that `tokens` detect with
    probability `power` at `alpha` in its least detectable form: sqrt(lam v / n), v = max over cell sets G of
    pi(G) (1 - pi(G)) (module docstring).

    >>> round(detectable_tv(400, [0.5, 0.5], 1), 4) == round((noncentrality_for_power(1) * 0.25 / 400) ** 0.5, 4)
    True
    """
    if tokens <= 0 or df < 1:
        return None
    k = len(cell_probs)
    v = max(g * (1 - g) for g in (sum(p for i, p in enumerate(cell_probs) if mask >> i & 1)
                                  for mask in range(1 << (k - 1))))      # each split once (the last cell stays out)
    return math.sqrt(noncentrality_for_power(df, alpha, power) * v / tokens)


def judge(counts: CellCounts, alpha: float = ALPHA) -> dict:
    """The verdict of `counts` (module docstring) with its statistic, p-value and detectable effects."""
    edge = [o for o in counts.outside_support if o.get("at_filter_edge")]
    decisive = [o for o in counts.outside_support if not o.get("at_filter_edge")]
    mass = 1 - counts.expected[0] / counts.tokens if counts.tokens else None
    out = {"verdict": "undecided", "tokens": counts.tokens, "alpha": alpha, "statistic": None, "df": 0,
           "p_value": None, "detectable_w": None, "sampled_mass": mass,
           "departure_to_detect": None if mass is None else DEPARTURE_SHARE * mass, "detectable_tv": None,
           "not_plain": counts.not_plain, "outside_support": len(decisive),
           "outside_support_first": decisive[:5], "at_filter_edge": len(edge), "at_filter_edge_first": edge[:5],
           "cells": [], "definition": DEFINITION}
    groups = merged_groups(counts.expected)
    observed = [sum(counts.observed[i] for i in g) for g in groups]
    expected = [sum(counts.expected[i] for i in g) for g in groups]
    out["cells"] = [{"ranks": _ranks(g), "observed": o, "expected": e} for g, o, e in zip(groups, observed, expected)]
    if decisive:
        out["verdict"] = "differs"
    if counts.not_plain:                # decided by the rule itself: no count can make it plain sampling
        out.update(verdict="differs", reason=counts.not_plain)
    if len(groups) < 2:
        out.setdefault("reason", "fewer than two cells expect 5 tokens")
        return out
    cov = [[sum(counts.covariance[i][j] for i in gi for j in gj) for gj in groups[:-1]] for gi in groups[:-1]]
    diff = [o - e for o, e in zip(observed[:-1], expected[:-1])]
    x = _solve(cov, diff)
    if x is None:
        out.setdefault("reason", "the cells' covariance is singular (the tokens' cells are fixed by p)")
        return out
    df = len(groups) - 1
    stat = sum(d * v for d, v in zip(diff, x))
    tv = detectable_tv(counts.tokens, [e / counts.tokens for e in expected], df, alpha)
    out.update(statistic=stat, df=df, p_value=chi2_sf(stat, df), detectable_w=detectable_w(counts.tokens, df, alpha),
               detectable_tv=tv)
    if out["p_value"] < alpha:
        out["verdict"] = "differs"
    elif out["verdict"] != "differs":
        short = []
        if out["detectable_w"] > W_MEDIUM:
            short.append(f"Cohen's w >= {out['detectable_w']:.3f} (a medium deviation, w = {W_MEDIUM}, needs more)")
        if tv > out["departure_to_detect"]:
            short.append(f"departures of total variation >= {tv:.3g} on the cells, and the settings imply "
                         f"{out['departure_to_detect']:.3g} ({DEPARTURE_SHARE:g} x the sampled mass {mass:.3g}: a "
                         f"loop halfway to greedy; {_tokens_for(tv, out['departure_to_detect'], counts.tokens)})")
        out["verdict"] = "undecided" if short else "consistent"
        if short:
            out["reason"] = f"{counts.tokens} tokens detect with power {POWER} only " + "; and only ".join(short)
    return out


def _tokens_for(tv: float, target: float, tokens: int) -> str:
    """How many tokens bring detectable_tv down to `target` (it falls as 1 / sqrt(n), the cells kept)."""
    if target <= 0:
        return "p is one-hot: no number of tokens can see it"
    return f"about {math.ceil(tokens * (tv / target) ** 2):,} tokens would see it"


def _ranks(group: list[int]) -> str:
    lo, hi = RANK_CELLS[group[0]][0], RANK_CELLS[group[-1]][1]
    return f"{lo}+" if hi is None else (f"{lo}" if lo == hi else f"{lo}-{hi}")
