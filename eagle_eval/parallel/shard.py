"""Deterministic work order and balanced splits by weight (no torch, no processes).

Contract: `heaviest_first(weights)` is the order a dynamic queue hands items out in (the longest
first, so the last items to finish are the short ones: Graham's LPT rule); `split_balanced(weights,
parts)` is the static split of LPT: each item, heaviest first, goes to the part with the least weight
so far. Ties go to the lower index and the lower part, so every process computes the same split.
"""

from __future__ import annotations


def heaviest_first(weights: list[float]) -> list[int]:
    """Indices by weight, heaviest first; equal weights keep their order.

    >>> heaviest_first([3, 9, 3, 1, 9])
    [1, 4, 0, 2, 3]
    """
    return sorted(range(len(weights)), key=lambda i: (-weights[i], i))


def split_balanced(weights: list[float], parts: int) -> list[list[int]]:
    """`parts` lists of indices (each ascending) whose weight sums are close: LPT, each total within
    the heaviest item of the others.

    >>> split_balanced([5, 1, 4, 2, 3], 2)
    [[0, 1, 3], [2, 4]]
    >>> split_balanced([7], 3)
    [[0], [], []]
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    loads, out = [0.0] * parts, [[] for _ in range(parts)]
    for i in heaviest_first(weights):
        part = min(range(parts), key=lambda p: (loads[p], p))
        loads[part] += weights[i]
        out[part].append(i)
    return [sorted(p) for p in out]
