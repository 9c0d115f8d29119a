"""Ratio estimators over clusters (prompts) and their intervals: pure functions, no torch, no model.

Contract: a figure such as tau or u_i is a ratio of sums, R = sum_j y_j / sum_j n_j, over independent units j
(the prompts: the cycles of one prompt are not independent of each other, a hard prompt lowers all of them).
Its standard error is the cluster-robust delta-method one,
    SE(R) = sqrt(J / (J - 1) * sum_j (y_j - R n_j)^2) / sum_j n_j,
and the difference of two such ratios over the same units (a unit may count on one side, the other, or both)
linearises each unit as z_j = (y2_j - R2 n2_j) / N2 - (y1_j - R1 n1_j) / N1, so
    SE(R2 - R1) = sqrt(J / (J - 1) * sum_j z_j^2).
`ratio_interval` gives the normal 95% interval (results/expectation.py); `t_interval` and `difference` the
Student-t one with J - 1 degrees of freedom, wider with few prompts (what the context buckets use).
"""

from __future__ import annotations

import functools
import math

Z95 = 1.959964


def ratio_se(units: list[tuple[float, float]]) -> tuple[float | None, float | None]:
    """(R, SE(R)) of units (y_j, n_j); R None without any count, SE None with fewer than two units.

    >>> r, se = ratio_se([(6, 3), (4, 1)]); round(r, 3), round(se, 3)
    (2.5, 0.75)
    """
    total_y, total_n = sum(y for y, _ in units), sum(n for _, n in units)
    if total_n == 0:
        return None, None
    r = total_y / total_n
    if len(units) < 2:
        return r, None
    resid = sum((y - r * n) ** 2 for y, n in units)
    return r, math.sqrt(len(units) / (len(units) - 1) * resid) / total_n


def ratio_interval(units: list[tuple[float, float]], quantile: float = Z95) -> dict:
    """units: (sum of values, count) per independent unit -> {value, low, high, units} (low/high None with
    fewer than two units or no count); the interval is value +- quantile * SE (normal 95% by default).

    >>> r = ratio_interval([(3.0, 2), (5.0, 2), (4.0, 2)])
    >>> r["value"], round(r["high"] - r["value"], 4)
    (2.0, 0.5658)
    """
    r, se = ratio_se(units)
    if se is None:
        return {"value": r, "low": None, "high": None, "units": len(units)}
    return {"value": r, "low": r - quantile * se, "high": r + quantile * se, "units": len(units)}


def t_interval(units: list[tuple[float, float]], level: float = 0.95) -> dict:
    """`ratio_interval` with Student's t quantile at J - 1 degrees of freedom (J units that count).

    >>> r = t_interval([(3.0, 2), (5.0, 2), (4.0, 2)])
    >>> round(r["high"] - r["value"], 3)               # t(0.975, 2) = 4.303 times SE 0.289
    1.242
    """
    units = [(y, n) for y, n in units if n]
    if len(units) < 2:
        return ratio_interval(units)
    return ratio_interval(units, t_quantile(0.5 + level / 2, len(units) - 1))


def difference(units: list[tuple[float, float, float, float]], level: float = 0.95) -> dict:
    """R2 - R1 of units (y1, n1, y2, n2) and its Student-t interval (J - 1 degrees of freedom, J the units that
    count on either side): {value, low, high, se, units}; low/high None when a side has no count or fewer than
    two units count.

    >>> d = difference([(1, 1, 0, 1), (1, 1, 1, 1), (1, 1, 0, 1)])   # R1 = 1, R2 = 1/3
    >>> round(d["value"], 4), round(d["se"], 4)
    (-0.6667, 0.3333)
    """
    units = [u for u in units if u[1] or u[3]]
    n1, n2 = sum(u[1] for u in units), sum(u[3] for u in units)
    if not n1 or not n2:
        return {"value": None, "low": None, "high": None, "se": None, "units": len(units)}
    r1, r2 = sum(u[0] for u in units) / n1, sum(u[2] for u in units) / n2
    if len(units) < 2:
        return {"value": r2 - r1, "low": None, "high": None, "se": None, "units": len(units)}
    z = [(y2 - r2 * m2) / n2 - (y1 - r1 * m1) / n1 for y1, m1, y2, m2 in units]
    se = math.sqrt(len(units) / (len(units) - 1) * sum(x * x for x in z))
    q = t_quantile(0.5 + level / 2, len(units) - 1)
    return {"value": r2 - r1, "low": r2 - r1 - q * se, "high": r2 - r1 + q * se, "se": se, "units": len(units)}


def _t_sf(x: float, df: int) -> float:
    """P(T > x) for Student's t with df degrees of freedom, x >= 0. With t = sqrt(df) tan(theta) the
    density becomes c cos(theta)^(df-1) on [0, pi/2): smooth, so Simpson's rule is accurate to ~1e-12."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(math.pi)
    steps = 2000                                                          # even
    h = math.atan(x / math.sqrt(df)) / steps
    dens = [math.cos(i * h) ** (df - 1) for i in range(steps + 1)]
    integral = math.exp(log_c) * h / 3 * (dens[0] + dens[-1] + 4 * sum(dens[1:-1:2]) + 2 * sum(dens[2:-1:2]))
    return 0.5 - integral


@functools.lru_cache(maxsize=None)
def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t (p >= 0.5), by bisection.

    >>> round(t_quantile(0.975, 7), 3), round(t_quantile(0.995, 30), 3)
    (2.365, 2.75)
    """
    lo, hi = 0.0, 1.0
    while _t_sf(hi, df) > 1 - p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_sf(mid, df) > 1 - p else (lo, mid)
    return (lo + hi) / 2
