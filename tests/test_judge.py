"""servers/judge.py: exact mode fails on per-request disagreements the aggregate hides; tolerance mode
judges a paired interval and says "undecided" when it straddles the tolerance."""

import random

from eagle_eval.servers.compare import aggregate
from eagle_eval.servers.judge import agreement, judge_requests


def _row(i, oracle_verify, server_verify, tokens="equal", accepted=None):
    """A vLLM-style row: figure = 1 + accepted / verify; counts as a server would report them."""
    def side(verify, acc):
        return {"output_tokens": verify + acc, "verify_count": verify, "accepted_drafts": acc,
                "histogram": None, "accepted_per_position": None, "figure": 1 + acc / verify}
    acc = accepted if accepted is not None else 2 * oracle_verify
    o, s = side(oracle_verify, acc), side(server_verify, acc + oracle_verify - server_verify)
    comparable = tokens == "equal"
    return {"id": f"p{i}", "tokens": tokens, "comparable": comparable, "notes": [], "oracle": o, "server": s,
            "counts_equal": (o["verify_count"] == s["verify_count"]) if comparable else None,
            "figure_difference": s["figure"] - o["figure"]}


def _shifted_rows(n=32, seed=0):
    """Every request drafts a little worse than the oracle: about -4.7% in the aggregate (the issue's case)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        verify = rng.randint(16, 28)
        rows.append(_row(i, verify, verify + rng.choice([1, 1, 1, 1, 2])))
    return rows


def test_exact_mode_fails_what_the_aggregate_tolerance_would_pass():
    rows = _shifted_rows()
    agg = aggregate("vllm", rows, 0.05)
    assert agg["within_tolerance"] is True and 0.045 < agg["relative_difference"] < 0.05
    judged = judge_requests(rows, "exact", 0.05)
    assert judged["verdict"] == "disagree" and judged["exact"] == 0 and judged["counts_differ"] == 32
    assert "exact 0/32" in judged["reasons"][0] and "verify steps" in judged["reasons"][0]


def test_tolerance_mode_is_undecided_when_the_interval_straddles():
    judged = judge_requests(_shifted_rows(), "tolerance", 0.05)
    iv = judged["interval"]
    assert iv["low"] < -0.05 < iv["high"] < 0
    assert judged["verdict"] == "undecided" and "more prompts" in judged["reasons"][0]
    assert judge_requests(_shifted_rows(), "tolerance", 0.10)["verdict"] == "agree"
    assert judge_requests(_shifted_rows(), "tolerance", 0.03)["verdict"] == "disagree"


def test_near_ties_pass_and_clear_token_differences_fail():
    rows = [_row(0, 20, 20), _row(1, 20, 20, tokens="near_tie"), _row(2, 20, 20)]
    assert [agreement(r) for r in rows] == ["exact", "near_tie", "exact"]
    assert judge_requests(rows, "exact", 0.05)["verdict"] == "agree"
    rows.append(_row(3, 20, 20, tokens="mismatch"))
    for mode in ("exact", "tolerance"):
        judged = judge_requests(rows, mode, 0.05)
        assert judged["verdict"] == "disagree" and judged["tokens_differ"] == 1
