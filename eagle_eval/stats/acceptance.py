"""Acceptance math: pure functions over integer counts (no torch, no model).

Definitions (docs/eagle3.md section 5), for a chain of num_steps S over C cycles:
- H[n]: cycles that accepted exactly n drafts, n = 0..S.
- reached_i = #cycles that accepted >= i-1 drafts (draft position i was checked), i = 1..S.
- accepted_i = #cycles that accepted >= i drafts.
- conditional a_i = accepted_i / reached_i (EAGLE "n-alpha"), unconditional u_i = accepted_i / C
  (vLLM per-position rate), so u_i = prod_{j<=i} a_j.
- tau (accept length, bonus counted) = mean over cycles of (accepted + 1) = 1 + sum_i u_i.

>>> c = AcceptanceCounts.from_accepted([0, 2, 3, 1], num_steps=3)
>>> c.histogram, c.reached, c.accepted
([1, 1, 1, 1], [4, 3, 2], [3, 2, 1])
>>> c.tau
2.5
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AcceptanceCounts:
    num_steps: int
    histogram: list[int]            # [S+1]

    @classmethod
    def from_accepted(cls, accepted_per_cycle, num_steps: int) -> "AcceptanceCounts":
        hist = [0] * (num_steps + 1)
        for n in accepted_per_cycle:
            if not 0 <= n <= num_steps:
                raise ValueError(f"accepted drafts {n} outside 0..{num_steps}")
            hist[n] += 1
        return cls(num_steps, hist)

    def merge(self, other: "AcceptanceCounts") -> "AcceptanceCounts":
        if other.num_steps != self.num_steps:
            raise ValueError("cannot merge counts of different num_steps")
        return AcceptanceCounts(self.num_steps, [a + b for a, b in zip(self.histogram, other.histogram)])

    @property
    def cycles(self) -> int:
        return sum(self.histogram)

    @property
    def accepted_drafts(self) -> int:
        return sum(n * h for n, h in enumerate(self.histogram))

    @property
    def accepted(self) -> list[int]:
        """accepted_i for i = 1..S: cycles with >= i accepted drafts."""
        return [sum(self.histogram[i:]) for i in range(1, self.num_steps + 1)]

    @property
    def reached(self) -> list[int]:
        """reached_i for i = 1..S: cycles with >= i-1 accepted drafts."""
        return [sum(self.histogram[i - 1:]) for i in range(1, self.num_steps + 1)]

    @property
    def tau(self) -> float | None:
        c = self.cycles
        return (c + self.accepted_drafts) / c if c else None

    @property
    def mean_accepted_drafts(self) -> float | None:
        c = self.cycles
        return self.accepted_drafts / c if c else None

    def per_position(self) -> list[dict]:
        c = self.cycles
        return [{"position": i + 1, "reached": r, "accepted": a,
                 "conditional_rate": a / r if r else None,
                 "unconditional_rate": a / c if c else None}
                for i, (r, a) in enumerate(zip(self.reached, self.accepted))]


def speedup(unconditional_rates, cost_ratio: float, verify_ratio: float = 1.0, one_forward: bool = False) -> float:
    """Modelled speedup over plain decoding for num_steps k = len(rates) (docs/eagle3.md section 5):
    S(k) = (1 + sum_{i<=k} u_i) / (k c + r(k)), c = T_draft_step / T_target_step,
    r(k) = T_verify(k+1 tokens) / T_target(1 token).
    A block drafter (`one_forward`) drafts the k tokens in ONE forward of k + 1 rows: S(k) = (1 + sum u_i) / (c + r(k)),
    c = T_draft(block of k + 1 rows) / T_target_step, the caller's c for that block.

    >>> round(speedup([0.8, 0.6], cost_ratio=0.1, verify_ratio=1.0), 4)
    2.0
    >>> round(speedup([0.8, 0.6], cost_ratio=0.1, verify_ratio=1.0, one_forward=True), 4)
    2.1818
    """
    k = len(unconditional_rates)
    return (1.0 + sum(unconditional_rates)) / ((1 if one_forward else k) * cost_ratio + verify_ratio)


def predicted_by_train_acc(train_acc, num_steps: int) -> dict:
    """What a head's training accuracy predicts for a chain of num_steps: u_i = prod_{j<=i} acc_j and
    tau = 1 + sum_{i<=S} u_i (SpecForge's simulated_acc_len + 1), over the positions training covered.

    Positions past the training depth k are not predicted (None): a head is rarely tested there.
    >>> p = predicted_by_train_acc([0.8, 0.5], 3)
    >>> [round(u, 2) if u is not None else None for u in p["unconditional_rate"]], round(p["accept_length"], 2)
    ([0.8, 0.4, None], 2.2)
    >>> p["positions"]
    2
    """
    k = min(len(train_acc), num_steps)
    u, prod = [], 1.0
    for a in train_acc[:k]:
        prod *= a
        u.append(prod)
    return {"conditional_rate": list(train_acc[:k]) + [None] * (num_steps - k),
            "unconditional_rate": u + [None] * (num_steps - k),
            "accept_length": 1.0 + sum(u), "positions": k}
