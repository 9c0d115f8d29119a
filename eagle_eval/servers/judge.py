"""How server-check judges the per-request rows (pure functions, no torch).

Contract: two modes, named in every report.

- **exact** (the default): a faithful engine in fp32 reproduces the oracle request by request, so each
  request is classified, never averaged away:

  | agreement | meaning | fails the check |
  |---|---|---|
  | `exact` | same output tokens and the same counts (verify steps, accepted drafts, histogram / per position, and the accepted drafts of every verify step in order, where the server reports them) | no |
  | `near_tie` | the outputs part at a token whose target logit margin is under `--tie-margin`: numerics | no |
  | `counts_differ` | same tokens, other counts (or the same totals in another order of verify steps): the server drafted differently (wiring) | yes |
  | `tokens_differ` | other tokens at a clear margin: not greedy, or verification is wrong | yes |
  | `unknown` | the server did not report the tokens or the counts | incomplete |

- **tolerance**, for servers that cannot be exact (bf16 kernels): the per-request relative differences
  of the acceptance figure, `r_i = (server_i - oracle_i) / oracle_i`, are judged by a 95% interval of
  their mean (normal, prompts independent): inside `[-tol, +tol]` agrees; wholly outside disagrees;
  straddling a bound is **undecided** (more prompts would decide), never "agree".
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054
AGREEMENTS = ("exact", "near_tie", "counts_differ", "tokens_differ", "unknown")
MODES = ("exact", "tolerance")


def _padded(seq, n: int) -> list[int]:
    return list(seq) + [0] * (n - len(seq))


def first_differing_cycle(oracle: list[int], server: list[int]) -> dict | None:
    """The first verify step (0-based) whose accepted drafts differ; None when the sequences are equal.

    A sequence that ends first has None there.

    >>> first_differing_cycle([3, 1, 2], [3, 2, 1]), first_differing_cycle([3, 1], [3, 1, 0])
    ({'cycle': 1, 'oracle': 1, 'server': 2}, {'cycle': 2, 'oracle': None, 'server': 0})
    >>> first_differing_cycle([3, 1], [3, 1]) is None
    True
    """
    for i in range(max(len(oracle), len(server))):
        a = oracle[i] if i < len(oracle) else None
        b = server[i] if i < len(server) else None
        if a != b:
            return {"cycle": i, "oracle": a, "server": b}
    return None


def counts_equal(oracle: dict, server: dict, num_steps: int) -> bool | None:
    """Whether the server's reported counts equal the oracle's (None: the server reported none).

    Each side: {"verify_count", "accepted_drafts", "histogram", "accepted_per_position"} and optionally
    "accepted_per_cycle" (the accepted drafts of each verify step, in order); a count the server does
    not report (None or absent) is not compared. The per-cycle sequence is the strongest: equal totals
    in another order are a difference.

    >>> o = {"verify_count": 4, "accepted_drafts": 7, "histogram": [0, 1, 2, 1], "accepted_per_position": [4, 2, 1]}
    >>> counts_equal(o, {**o, "histogram": [0, 1, 2, 1, 0]}, 3), counts_equal(o, {**o, "accepted_drafts": 6}, 3)
    (True, False)
    >>> o["accepted_per_cycle"] = [1, 2, 2, 3]
    >>> counts_equal(o, {**o, "accepted_per_cycle": [2, 1, 2, 3]}, 3), counts_equal(o, {**o}, 3)
    (False, True)
    """
    checks = []
    if server.get("accepted_per_cycle") is not None:
        checks.append(first_differing_cycle(oracle["accepted_per_cycle"], server["accepted_per_cycle"]) is None)
    if server.get("verify_count") is not None:
        checks.append(server["verify_count"] == oracle["verify_count"])
    if server.get("accepted_drafts") is not None:
        checks.append(server["accepted_drafts"] == oracle["accepted_drafts"])
    for key, n in (("histogram", num_steps + 1), ("accepted_per_position", num_steps)):
        if server.get(key) is not None:
            m = max(len(server[key]), len(oracle[key]), n)
            checks.append(_padded(server[key], m) == _padded(oracle[key], m))
    return all(checks) if checks else None


def agreement(row: dict) -> str:
    """One request's class (see the table in the module docstring)."""
    if row["tokens"] == "mismatch":
        return "tokens_differ"
    if row["tokens"] == "near_tie":
        return "near_tie"
    if row["tokens"] == "unknown" or row.get("counts_equal") is None:
        return "unknown"
    return "exact" if row["counts_equal"] else "counts_differ"


def paired_interval(differences: list[float]) -> tuple[float, float, float] | None:
    """(mean, low, high): the 95% interval of the mean of per-request differences (None if n < 2).

    >>> [round(x, 4) for x in paired_interval([0.0, 0.1, -0.1, 0.0])]
    [0.0, -0.08, 0.08]
    """
    n = len(differences)
    if n < 2:
        return None
    mean = sum(differences) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1))
    half = Z95 * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def judge_interval(interval: tuple[float, float, float] | None, tolerance: float) -> str:
    """'agree' (the interval inside +-tolerance), 'disagree' (wholly outside) or 'undecided'.

    >>> judge_interval((0.01, -0.01, 0.03), 0.05), judge_interval((-0.08, -0.1, -0.06), 0.05)
    ('agree', 'disagree')
    >>> judge_interval((-0.047, -0.067, -0.027), 0.05), judge_interval(None, 0.05)
    ('undecided', 'undecided')
    """
    if interval is None:
        return "undecided"
    _, low, high = interval
    if -tolerance <= low and high <= tolerance:
        return "agree"
    if low > tolerance or high < -tolerance:
        return "disagree"
    return "undecided"


def relative_differences(rows: list[dict]) -> list[float]:
    """r_i = (server - oracle) / oracle over the requests whose figures can be compared."""
    return [(r["server"]["figure"] - r["oracle"]["figure"]) / r["oracle"]["figure"] for r in rows
            if r["comparable"] and r["server"]["figure"] is not None and r["oracle"]["figure"]]


def judge_requests(rows: list[dict], mode: str, tolerance: float) -> dict:
    """The per-request judgement of one server-check: counts by agreement class, and the verdict of the
    mode ('agree', 'disagree', 'undecided' or 'incomplete') with its reasons."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    by_class = {a: [r["id"] for r in rows if agreement(r) == a] for a in AGREEMENTS}
    out = {"mode": mode, "requests": len(rows), **{a: len(ids) for a, ids in by_class.items()},
           "ids": {a: ids for a, ids in by_class.items() if ids and a != "exact"}}
    reasons = []
    if by_class["tokens_differ"]:
        reasons.append(f"{len(by_class['tokens_differ'])} request(s) differ from the oracle's greedy output at a "
                       f"clear margin (first: {by_class['tokens_differ'][0]})")
    if mode == "exact":
        out["rule"] = ("every request's tokens and counts equal the oracle's; near-ties (margin under "
                       "--tie-margin) are numerics")
        if by_class["counts_differ"]:
            first = next(r for r in rows if agreement(r) == "counts_differ")
            reasons.append(f"{len(by_class['counts_differ'])} request(s) have the oracle's tokens but other counts "
                           f"(exact {len(by_class['exact'])}/{len(rows)}; first: {first['id']}: "
                           f"{describe_counts(first)})")
        verdict = "disagree" if reasons else "incomplete" if by_class["unknown"] else "agree"
        if verdict == "incomplete":
            why = sorted({n for r in rows if agreement(r) == "unknown" for n in r["notes"]})
            reasons.append(f"{len(by_class['unknown'])} request(s) without the tokens or counts to compare"
                           + (": " + "; ".join(why) if why else ""))
    else:
        diffs = relative_differences(rows)
        interval = paired_interval(diffs)
        out["rule"] = ("the 95% interval of the mean per-request relative difference of the acceptance "
                       f"figure lies inside +-{tolerance:.1%}")
        out["interval"] = ({"mean": interval[0], "low": interval[1], "high": interval[2], "requests": len(diffs)}
                           if interval else None)
        judged = judge_interval(interval, tolerance)
        if judged == "disagree":
            reasons.append(f"per-request acceptance differs: mean relative difference {interval[0]:+.1%}, 95% "
                           f"interval [{interval[1]:+.1%}, {interval[2]:+.1%}] lies outside +-{tolerance:.1%}")
        if by_class["tokens_differ"] or judged == "disagree":
            verdict = "disagree"
        elif not diffs:
            verdict = "incomplete"
            reasons.append("no request has an acceptance figure on both sides")
        else:
            verdict = judged
            if judged == "undecided":
                reasons.append(_undecided_reason(interval, len(diffs), tolerance))
    out.update(verdict=verdict, reasons=reasons)
    return out


def _undecided_reason(interval, n: int, tolerance: float) -> str:
    if interval is None:
        return f"undecided: {n} comparable request(s), at least 2 are needed for an interval"
    mean, low, high = interval
    return (f"undecided: mean per-request relative difference {mean:+.1%}, 95% interval [{low:+.1%}, {high:+.1%}] "
            f"over {n} requests straddles +-{tolerance:.1%}: more prompts (--limit) would decide, or --mode exact "
            "if the server runs fp32")


def describe_counts(row: dict) -> str:
    """'verify steps 20 vs 17, accepted drafts 44 vs 51, ...' (server vs oracle) for the counts that differ."""
    o, s = row["oracle"], row["server"]
    parts = []
    if s.get("accepted_per_cycle") is not None:
        d = first_differing_cycle(o["accepted_per_cycle"], s["accepted_per_cycle"])
        if d is not None:
            parts.append(f"accepted drafts per verify step first differ at step {d['cycle']} (0-based; "
                         f"{len(s['accepted_per_cycle'])} steps on the server, {len(o['accepted_per_cycle'])} in "
                         f"the oracle): {_step(d['server'])} (server) vs {_step(d['oracle'])} (oracle)")
    for key, name in (("verify_count", "verify steps"), ("accepted_drafts", "accepted drafts"),
                      ("accepted_per_position", "accepted per position"), ("histogram", "histogram")):
        a, b = s.get(key), o[key]
        if isinstance(a, list):
            n = max(len(a), len(b))
            a, b = _padded(a, n), _padded(b, n)
        if a is not None and a != b:
            parts.append(f"{name} {a} (server) vs {b} (oracle)")
    return ", ".join(parts) or "counts differ"


def _step(accepted: int | None) -> str:
    return "no such step" if accepted is None else str(accepted)


def relative_difference(server: float | None, oracle: float | None) -> float | None:
    if server is None or oracle is None or oracle == 0:
        return None
    return abs(server - oracle) / abs(oracle)
