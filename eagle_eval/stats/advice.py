"""Ablation advice, decided like `diagnose` decides: recommend a setting only when the timing noise
cannot reverse it, else say undecided and name both (pure functions, no torch).

The speedup model (EAGLE3.md section 5) for a setting of k draft steps verifying n tokens (n = k + 1 for
a chain, num_draft_tokens for a tree) with accept length tau:

    S = tau / (k c + r),   c = T_draft_step / T_target(1 token),   r = T_verify(n tokens) / T_target(1 token)
      = tau * T_target / (k T_draft + T_verify(n)).

A block drafter (DFlash: `Setting.one_forward`) drafts its k tokens in one forward of a block of k + 1 rows, so a
cycle costs one draft forward of that block: S = tau * T_target / (T_block(k + 1) + T_verify(n)), T_block timed per
block length (`Timings.block_ms`; a length not timed, or costs given, takes T_draft: one forward whatever its rows).

Each T is measured repeatedly (profile/costs.py); its median is the estimate. The interval of S is a
paired bootstrap: every replicate resamples each timing's samples once (with replacement, a seeded
generator: the same samples give the same advice) and computes S for every setting from the same
resampled medians, so settings that share a cost share its noise. The best setting (highest S) is
recommended only when the 95% interval of S_best - S_runner_up, from the same replicates, excludes 0.

Impossible: a cycle costs at least one target step (its verify forward holds >= 1 token, so r >= 1),
hence S <= tau / (k c + 1) <= tau. A setting whose modelled S exceeds its own tau was timed with r < 1
(a verify of n tokens measured faster than one token): a measurement error. It is flagged and never
recommended. Only timing noise is in the interval: tau is the profile's exact count on its prompts.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

RECOMMENDED = "recommended"
UNDECIDED = "undecided"
NONE = "none"
LEVEL = 0.95
RESAMPLES = 2000


@dataclass(frozen=True)
class Timings:
    """Repeated timings in ms: a 1-token target forward, a draft step, verify forwards by size (a size not measured
    is taken as one target token, r = 1), and a block drafter's draft forward by block length (rows)."""
    target_ms: tuple[float, ...]
    draft_ms: tuple[float, ...]
    verify_ms: dict = field(default_factory=dict)        # n tokens -> tuple of samples
    block_ms: dict = field(default_factory=dict)         # a block drafter: n rows -> one draft forward's samples

    def __post_init__(self):
        for name, xs in (("target_ms", self.target_ms), ("draft_ms", self.draft_ms),
                         *((f"verify_ms[{n}]", xs) for n, xs in self.verify_ms.items()),
                         *((f"block_ms[{n}]", xs) for n, xs in self.block_ms.items())):
            if not xs or not all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in xs):
                raise ValueError(f"{name}: positive finite timings expected, got {list(xs)[:5]}")

    @classmethod
    def given(cls, cost_ratio: float) -> "Timings":
        """Costs given instead of measured (--cost-ratio c, r = 1): no timing noise."""
        return cls(target_ms=(1.0,), draft_ms=(cost_ratio,))

    def ratios(self, n: int) -> tuple[float, float]:
        """(c, r(n)) from the medians."""
        t = median(self.target_ms)
        return median(self.draft_ms) / t, (median(self.verify_ms[n]) / t if n in self.verify_ms else 1.0)

    def block_ratio(self, rows: int) -> float:
        """c of a block drafter's one draft forward over `rows` rows (the draft step's c where not timed)."""
        return median(self.block_ms.get(rows, self.draft_ms)) / median(self.target_ms)


@dataclass(frozen=True)
class Setting:
    name: str
    num_steps: int              # k
    verify_tokens: int          # n
    tau: float
    one_forward: bool = False   # a block drafter: the k drafts come from one forward of k + 1 rows


@dataclass(frozen=True)
class Estimate:
    setting: Setting
    speedup: float              # from the medians
    low: float                  # the 95% bootstrap interval
    high: float
    cost_ratio: float
    verify_ratio: float

    @property
    def impossible(self) -> bool:
        """S > tau: only a verify timed faster than one target token (r < 1) gives it."""
        return self.speedup > self.setting.tau * (1 + 1e-9)

    def why_impossible(self) -> str:
        s = self.setting
        return (f"{s.name}: modelled speedup {self.speedup:.3f} exceeds its accept length {s.tau:.3f}, impossible "
                f"since a cycle costs at least one target step; r = T_verify({s.verify_tokens}) / T_target(1) was "
                f"measured {self.verify_ratio:.3f} < 1 - {'c' if s.one_forward else 'k c'}: timing noise, not "
                "recommended")


@dataclass(frozen=True)
class Advice:
    verdict: str                               # recommended | undecided | none
    best: Estimate | None
    runner_up: Estimate | None
    difference: tuple[float, float] | None     # 95% interval of S_best - S_runner_up
    estimates: tuple[Estimate, ...]            # every setting, impossible ones included
    level: float = LEVEL

    @property
    def impossible(self) -> list[Estimate]:
        return [e for e in self.estimates if e.impossible]

    def message(self) -> str:
        if self.verdict == NONE:
            return "no setting to recommend: every modelled speedup is impossible (timing noise)"
        b = self.best
        lead = f"{b.setting.name} (modelled speedup {b.speedup:.3f} [{b.low:.3f}, {b.high:.3f}])"
        if self.runner_up is None:
            return f"recommended: {lead}, the only setting"
        r, (lo, hi) = self.runner_up, self.difference
        versus = (f"{r.setting.name} ({r.speedup:.3f} [{r.low:.3f}, {r.high:.3f}]); difference "
                  f"{b.speedup - r.speedup:+.3f}, {self.level:.0%} interval [{lo:+.3f}, {hi:+.3f}]")
        if self.verdict == RECOMMENDED:
            return f"recommended: {lead} over the runner-up {versus}"
        return f"undecided between {lead} and {versus}, which includes 0: time more repetitions"

    def as_dict(self) -> dict:
        def est(e):
            return None if e is None else {"setting": e.setting.name, "num_steps": e.setting.num_steps,
                                           "verify_tokens": e.setting.verify_tokens, "tau": e.setting.tau,
                                           "speedup": e.speedup, "interval": [e.low, e.high],
                                           "cost_ratio": e.cost_ratio, "verify_ratio": e.verify_ratio,
                                           "impossible": e.impossible}
        return {"verdict": self.verdict, "best": est(self.best), "runner_up": est(self.runner_up),
                "difference_interval": list(self.difference) if self.difference else None, "level": self.level,
                "message": self.message(), "impossible": [e.why_impossible() for e in self.impossible],
                "rule": "recommended when the paired-bootstrap interval of S_best - S_runner_up (timing noise "
                        "only) excludes 0; a setting with S > tau is a measurement error, never recommended"}


def median(xs) -> float:
    """The middle value (the mean of the two middle ones for an even count).

    >>> median([3, 1, 2]), median([4, 1, 2, 3])
    (2, 2.5)
    """
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


def median_interval(xs, level: float = LEVEL) -> tuple[float, float]:
    """Distribution-free interval for the median: order statistics x_(j), x_(n+1-j) with j the largest
    index whose binomial(n, 1/2) tail keeps the coverage >= level (the whole range when n is too small).

    >>> median_interval([5, 1, 4, 2, 3])
    (1, 5)
    >>> median_interval(list(range(1, 21)))          # n = 20: x_(6), x_(15)
    (6, 15)
    """
    s, n = sorted(xs), len(xs)
    j, tail = 0, 0.0
    while True:                  # P(median < x_(j+1)) = P(Binomial(n, 1/2) <= j)
        nxt = tail + math.comb(n, j) / 2 ** n
        if 2 * nxt > 1 - level or j + 1 > n // 2:
            break
        tail, j = nxt, j + 1
    return s[max(j - 1, 0)] if j else s[0], s[n - j] if j else s[-1]


def relative_width(xs, level: float = LEVEL) -> float:
    """Half the median interval's width over the median: how narrow a timing is (the stopping rule)."""
    lo, hi = median_interval(xs, level)
    return (hi - lo) / 2 / median(xs)


def _speedup(s: Setting, t: float, d: float, v: dict, b: dict) -> float:
    draft = b.get(s.num_steps + 1, d) if s.one_forward else s.num_steps * d
    return s.tau * t / (draft + v.get(s.verify_tokens, t))


def _percentile(sorted_xs: list[float], q: float) -> float:
    i = min(len(sorted_xs) - 1, max(0, int(round(q * (len(sorted_xs) - 1)))))
    return sorted_xs[i]


def _replicates(timings: Timings, resamples: int, seed: int):
    """(T_target, T_draft, {n: T_verify}, {rows: T_block}) medians of each bootstrap replicate, the same for every
    setting."""
    rng = random.Random(seed)

    def med(xs):
        return median(rng.choices(xs, k=len(xs))) if len(xs) > 1 else xs[0]

    for _ in range(resamples):
        yield (med(timings.target_ms), med(timings.draft_ms), {n: med(xs) for n, xs in timings.verify_ms.items()},
               {n: med(xs) for n, xs in timings.block_ms.items()})


def advise(settings: list[Setting], timings: Timings, level: float = LEVEL, resamples: int = RESAMPLES,
           seed: int = 0) -> Advice:
    """The estimate of every setting and the decision (module docstring).

    >>> t = Timings(target_ms=(10.0, 10.1, 9.9), draft_ms=(1.0, 1.0, 1.0))
    >>> a = advise([Setting("S=1", 1, 2, 1.6), Setting("S=3", 3, 4, 2.5)], t)
    >>> a.verdict, a.best.setting.name, round(a.best.speedup, 3)
    ('recommended', 'S=3', 1.923)
    """
    if not settings:
        raise ValueError("advise needs at least one setting")
    t0, d0 = median(timings.target_ms), median(timings.draft_ms)
    v0 = {n: median(xs) for n, xs in timings.verify_ms.items()}
    b0 = {n: median(xs) for n, xs in timings.block_ms.items()}
    draws = [[_speedup(s, t, d, v, b) for s in settings] for t, d, v, b in _replicates(timings, resamples, seed)]
    tail = (1 - level) / 2
    estimates = []
    for i, s in enumerate(settings):
        col = sorted(row[i] for row in draws)
        c = (b0.get(s.num_steps + 1, d0) if s.one_forward else d0) / t0
        r = v0.get(s.verify_tokens, t0) / t0
        estimates.append(Estimate(s, _speedup(s, t0, d0, v0, b0), _percentile(col, tail), _percentile(col, 1 - tail),
                                  c, r))
    ranked = sorted((i for i, e in enumerate(estimates) if not e.impossible), key=lambda i: -estimates[i].speedup)
    if not ranked:
        return Advice(NONE, None, None, None, tuple(estimates), level)
    best = estimates[ranked[0]]
    if len(ranked) == 1:
        return Advice(RECOMMENDED, best, None, None, tuple(estimates), level)
    second = estimates[ranked[1]]
    diffs = sorted(row[ranked[0]] - row[ranked[1]] for row in draws)
    interval = (_percentile(diffs, tail), _percentile(diffs, 1 - tail))
    verdict = RECOMMENDED if interval[0] > 0 and best.speedup > second.speedup else UNDECIDED
    return Advice(verdict, best, second, interval, tuple(estimates), level)


def settings_from_rows(rows: list[dict]) -> list[Setting]:
    """ablate's rows -> settings: verify tokens = the row's num_draft_tokens (k + 1 for a chain); a row with
    `block_rows` is a block drafter's (one draft forward per cycle)."""
    return [Setting(f"{r['variant']} num_steps={r['num_steps']}"
                    + (f" topk={r['topk']} D={r['num_draft_tokens']}" if r.get("topk", 1) > 1 else ""),
                    int(r["num_steps"]), int(r["num_draft_tokens"]), float(r["tau"]),
                    r.get("block_rows") is not None) for r in rows
            if r.get("tau") is not None]
