"""servers/judge.py: exact mode fails on per-request disagreements the aggregate hides; tolerance mode
judges a paired interval and says "undecided" when it straddles the tolerance."""

import random

from eagle_eval.servers.figures import aggregate
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


def _per_cycle_row(server_cycles, oracle_cycles=(3, 0, 2, 5, 1)):
    """compare_request on one vLLM request whose server reports its accepted drafts per verify step."""
    from eagle_eval.stats.acceptance import AcceptanceCounts
    from eagle_eval.records import SampleRecord
    from eagle_eval.servers.figures import compare_request
    from eagle_eval.servers.http import ServerReply

    emitted = [n + 1 for n in oracle_cycles]
    rec = SampleRecord(id="p0", category="x", prompt_len=4, output_ids=list(range(sum(emitted))),
                       accepted_per_cycle=list(oracle_cycles), emitted_per_cycle=emitted,
                       verify_count=len(oracle_cycles))
    c = AcceptanceCounts.from_accepted(server_cycles, 5)
    reply = ServerReply(output_ids=rec.output_ids, completion_tokens=len(rec.output_ids), verify_count=c.cycles,
                        accepted_drafts=c.accepted_drafts, histogram=c.histogram, accepted_per_position=c.accepted,
                        accepted_per_cycle=list(server_cycles), source="per-request metrics (detailed)")
    return compare_request("vllm", rec, reply, None, 5, 0.1)


def test_same_totals_in_another_order_of_verify_steps_is_not_exact():
    same = _per_cycle_row([3, 0, 2, 5, 1])
    assert same["counts_equal"] is True and same["first_differing_cycle"] is None and agreement(same) == "exact"
    swapped = _per_cycle_row([3, 2, 0, 5, 1])       # every total, the histogram and per position unchanged
    assert swapped["server"]["accepted_per_position"] == swapped["oracle"]["accepted_per_position"]
    assert swapped["figure_difference"] == 0
    assert swapped["first_differing_cycle"] == {"cycle": 1, "oracle": 0, "server": 2}
    assert agreement(swapped) == "counts_differ"
    judged = judge_requests([same, swapped], "exact", 0.05)
    assert judged["verdict"] == "disagree" and judged["exact"] == 1 and judged["counts_differ"] == 1
    assert "first differ at step 1 (0-based; 5 steps on the server, 5 in the oracle): 2 (server) vs 0 (oracle)" \
        in judged["reasons"][0]
    agg = aggregate("vllm", [same, swapped], 0.05)
    assert agg["per_request"]["per_cycle_compared"] == 2 and agg["per_request"]["per_cycle_equal"] == 1
    assert agg["sources"] == {"per-request metrics (detailed)": 2}


def test_a_server_with_an_extra_verify_step_names_it():
    row = _per_cycle_row([3, 0, 2, 5, 0, 1])
    assert row["first_differing_cycle"] == {"cycle": 4, "oracle": 1, "server": 0}
    longer = _per_cycle_row([3, 0, 2, 5, 1, 0])
    assert longer["first_differing_cycle"] == {"cycle": 5, "oracle": None, "server": 0}
    assert "0 (server) vs no such step (oracle)" in judge_requests([longer], "exact", 0.05)["reasons"][0]


def test_without_the_sequence_only_totals_are_judged():
    """What counter deltas and summary-level metrics can tell: the swapped order is invisible to them."""
    from eagle_eval.servers.judge import counts_equal

    row = _per_cycle_row([3, 2, 0, 5, 1])
    assert counts_equal(row["oracle"], {**row["server"], "accepted_per_cycle": None}, 5) is True
    assert counts_equal(row["oracle"], row["server"], 5) is False
