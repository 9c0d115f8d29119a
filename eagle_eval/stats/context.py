"""Acceptance by context length: the bucket of each verify cycle (or profile start), each bucket's counts per
prompt, its rates with intervals, and the before / past comparison at a training length (pure functions, no
torch, no model; every draft kind's records are the same counts, so nothing here knows the kind).

Context of a cycle: the 0-based position of its root in the sequence = the prompt's tokens plus the tokens
generated before the root. The first cycle's root is the token the prefill emitted (context = prompt_len); each
cycle's root follows the tokens the cycles before it emitted. A profile's start t (root = continuation token
t - 1) has context prompt_len + t - 1. A root at context >= L sits where no training sequence of L tokens reaches
(positions 0..L-1): past the training length.

Buckets are half-open [e_i, e_{i+1}) over increasing edges e_0 = 0 < e_1 < ... < e_k, the last one [e_k, inf).

Per bucket and per unit (a prompt; the unit of every interval, since the cycles of one prompt are not
independent) two kinds of counts:
- cycles: H[n], verify cycles that accepted exactly n drafts (integers; the loop's records);
- starts: the number of starts and sum over them of P(A >= i) (a profile's per-start rows; 0/1 when greedy).
Both reduce to (n, s_1..s_S): n cycles or starts, s_i = the count (or expected count) accepting >= i drafts. The
rates are ratios over the units: tau = (n + sum_i s_i) / n, u_i = s_i / n, a_i = s_i / s_{i-1} (s_0 = n), each with
the Student-t interval of stats/clustered.py (cluster delta method, prompts - 1 degrees of freedom).
"""

from __future__ import annotations

import bisect

from eagle_eval.stats.clustered import difference, t_interval

DECAYED, NOT_DECAYED, UNDECIDED = "decayed", "not decayed", "undecided"
DECAY_MARGIN = 0.1        # a drop in tau below this is immaterial (as diagnose's MARGIN)
MIN_PROMPTS = 2           # prompts each side needs before an interval means anything


def cycle_contexts(prompt_len: int, emitted_per_cycle: list[int]) -> list[int]:
    """The context of each verify cycle: prompt_len plus the tokens emitted before its root.

    >>> cycle_contexts(10, [3, 1, 2])
    [10, 13, 14]
    """
    out, k = [], prompt_len
    for e in emitted_per_cycle:
        out.append(k)
        k += e
    return out


def auto_edges(contexts: list[int]) -> list[int]:
    """0 and every power of two above the shortest context and at most the longest: no bucket is empty at
    either end.

    >>> auto_edges([20, 57, 100]), auto_edges([5]), auto_edges([])
    ([0, 32, 64], [0], [0])
    """
    if not contexts:
        return [0]
    lo, hi = min(contexts), max(contexts)
    edges, p = [0], 1
    while p <= hi:
        if p > lo:
            edges.append(p)
        p *= 2
    return edges


def resolve_edges(given: list[int] | None, contexts: list[int], train_context: int | None = None) -> list[int]:
    """The edges of the buckets: those given (0 put first when missing), or `auto_edges` of the contexts; the
    training length is an edge too, so that no bucket straddles it.

    >>> resolve_edges([512, 2048], []), resolve_edges(None, [20, 100], train_context=50)
    ([0, 512, 2048], [0, 32, 50, 64])
    """
    edges = list(given) if given is not None else auto_edges(contexts)
    if not edges or edges[0] != 0:
        edges = [0] + edges
    if train_context is not None and train_context > 0 and train_context not in edges:
        bisect.insort(edges, train_context)
    return edges


def bucket_of(edges: list[int], context: int) -> int:
    """Index of the bucket [e_i, e_{i+1}) holding `context` (the last bucket is open).

    >>> [bucket_of([0, 32, 64], c) for c in (0, 31, 32, 64, 10**6)]
    [0, 0, 1, 2, 2]
    """
    return bisect.bisect_right(edges, context) - 1


def label(low: int, high: int | None) -> str:
    """'[512, 2048)' or '[8192, inf)'."""
    return f"[{low}, {'inf' if high is None else high})"


def cycle_units(rows, edges: list[int], num_steps: int) -> list[dict[str, list[int]]]:
    """rows: (unit, prompt_len, accepted_per_cycle, emitted_per_cycle) -> per bucket {unit: H[n], n = 0..S}.

    >>> cycle_units([("p", 10, [2, 0, 1], [3, 1, 2])], [0, 13], 2)
    [{'p': [0, 0, 1]}, {'p': [1, 1, 0]}]
    """
    out: list[dict[str, list[int]]] = [{} for _ in edges]
    for unit, prompt_len, accepted, emitted in rows:
        for ctx, n in zip(cycle_contexts(prompt_len, emitted), accepted):
            if not 0 <= n <= num_steps:
                raise ValueError(f"accepted drafts {n} outside 0..{num_steps}")
            hist = out[bucket_of(edges, ctx)].setdefault(unit, [0] * (num_steps + 1))
            hist[n] += 1
    return out


def start_units(rows, edges: list[int], num_steps: int) -> list[dict[str, tuple[int, list[float]]]]:
    """rows: (unit, context, [P(A >= i), i = 1..>= S]) per start -> per bucket {unit: (starts, [sum P(A >= i)])}.

    >>> start_units([("p", 3, [1.0, 0.5]), ("p", 9, [0.5, 0.0]), ("p", 4, [1.0, 1.0])], [0, 8], 2)
    [{'p': (2, [2.0, 1.5])}, {'p': (1, [0.5, 0.0])}]
    """
    out: list[dict] = [{} for _ in edges]
    for unit, ctx, probs in rows:
        starts, sums = out[bucket_of(edges, ctx)].get(unit, (0, [0.0] * num_steps))
        out[bucket_of(edges, ctx)][unit] = (starts + 1, [a + float(b) for a, b in zip(sums, probs[:num_steps])])
    return out


def at_least(histogram: list[int]) -> tuple[int, list[int]]:
    """(cycles, s_i = cycles accepting >= i drafts, i = 1..S) of a histogram.

    >>> at_least([1, 1, 2])
    (4, [3, 2])
    """
    return sum(histogram), [sum(histogram[i:]) for i in range(1, len(histogram))]


def figures(units: list[tuple[float, list[float]]], steps: int | None = None) -> dict:
    """tau, u_i and a_i over units (n, [s_1..s_S]), each {value, low, high, units} (Student-t over the units);
    `steps` positions (default: the longest s).

    >>> f = figures([(2, [1, 0]), (2, [2, 1])])
    >>> f["accept_length"]["value"], [p["unconditional_rate"]["value"] for p in f["per_position"]]
    (2.0, [0.75, 0.25])
    """
    steps = max((len(s) for _, s in units), default=0) if steps is None else steps
    units = [(n, list(s)[:steps] + [0] * (steps - len(s))) for n, s in units]
    per_position = []
    for i in range(steps):
        reached = [(n if i == 0 else s[i - 1]) for n, s in units]
        per_position.append({"position": i + 1,
                             "unconditional_rate": t_interval([(s[i], n) for n, s in units]),
                             "conditional_rate": t_interval([(s[i], r) for (_, s), r in zip(units, reached)])})
    return {"accept_length": t_interval([(n + sum(s), n) for n, s in units]), "per_position": per_position}


def decay(units: list[tuple[float, float, float, float]], margin: float = DECAY_MARGIN) -> dict:
    """Acceptance past the training length against before it. units: per prompt (tokens per step summed before,
    cycles before, the same past): tau = (accepted + 1) summed over cycles / cycles on each side.
    decayed: the 95% interval of tau_past - tau_before lies below 0 and the drop is at least `margin`;
    not decayed: the interval's lower end is above -margin (any drop is smaller than the margin);
    undecided: neither, or fewer than MIN_PROMPTS prompts on a side.

    >>> decay([(6, 2, 2, 2), (6, 2, 2, 2)])["verdict"]     # two prompts each side, no spread: decided
    'decayed'
    >>> decay([(6, 2, 0, 0), (6, 2, 2, 2)])["verdict"]     # one prompt past the length: too few
    'undecided'
    """
    before = [u for u in units if u[1]]
    past = [u for u in units if u[3]]
    d = difference(units)
    out = {"difference": d, "margin": margin, "prompts_before": len(before), "prompts_past": len(past),
           "cycles_before": sum(u[1] for u in units), "cycles_past": sum(u[3] for u in units)}
    if len(before) < MIN_PROMPTS or len(past) < MIN_PROMPTS:
        return {**out, "verdict": UNDECIDED,
                "reason": f"too few prompts on a side: {len(before)} before, {len(past)} past the length "
                          f"(at least {MIN_PROMPTS} each are needed for an interval)"}
    if d["low"] is None:
        return {**out, "verdict": UNDECIDED, "reason": "no interval (too few prompts count)"}
    if d["high"] < 0 and d["value"] <= -margin:
        return {**out, "verdict": DECAYED, "reason": f"the 95% interval of the difference lies below 0 and the drop "
                                                     f"is at least {margin:g}"}
    if d["low"] > -margin:
        return {**out, "verdict": NOT_DECAYED, "reason": f"the 95% interval's lower end is above -{margin:g}: any "
                                                         f"drop is smaller than {margin:g}"}
    return {**out, "verdict": UNDECIDED, "reason": f"the 95% interval reaches both a drop of {margin:g} or more and "
                                                   f"{'no drop' if d['high'] >= 0 else f'a drop below {margin:g}'}; "
                                                   "more prompts past the length would decide"}
