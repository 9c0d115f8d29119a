"""The metric identities on hand-computed counts."""

import pytest

from eagle_eval.stats.acceptance import AcceptanceCounts, speedup
from eagle_eval.loop.policy import greedy_accept
from eagle_eval.records import SampleRecord
from eagle_eval.results.report import summarize


def test_greedy_accept_stops_at_first_mismatch():
    assert greedy_accept([5, 7, 9], [5, 7, 9, 1]) == 3
    assert greedy_accept([5, 7, 9], [5, 8, 9, 1]) == 1
    assert greedy_accept([5, 7, 9], [4, 7, 9, 1]) == 0


def test_counts_by_hand():
    # cycles accepting 0, 2, 3, 1, 3 drafts with S = 3
    c = AcceptanceCounts.from_accepted([0, 2, 3, 1, 3], num_steps=3)
    assert c.histogram == [1, 1, 1, 2]
    assert c.cycles == 5 and c.accepted_drafts == 9
    assert c.reached == [5, 4, 3]        # position i checked when >= i-1 accepted
    assert c.accepted == [4, 3, 2]       # >= i accepted
    pp = c.per_position()
    assert [p["conditional_rate"] for p in pp] == [4 / 5, 3 / 4, 2 / 3]
    assert [p["unconditional_rate"] for p in pp] == [4 / 5, 3 / 5, 2 / 5]
    assert c.tau == pytest.approx(14 / 5)
    # tau = 1 + sum u_i, exactly in integers: cycles + accepted drafts = cycles + sum accepted_i
    assert c.cycles + c.accepted_drafts == c.cycles + sum(c.accepted)
    # u_i = prod_{j<=i} a_j
    prod = 1.0
    for p in pp:
        prod *= p["conditional_rate"]
        assert p["unconditional_rate"] == pytest.approx(prod)


def test_counts_reject_impossible_values():
    with pytest.raises(ValueError):
        AcceptanceCounts.from_accepted([4], num_steps=3)


def test_summary_from_samples_by_hand():
    a = SampleRecord("a", "x", 5, [1, 2, 3, 4, 5, 6], [2, 0, 1], [3, 1, 2], 3)
    b = SampleRecord("b", "y", 4, [7, 8, 9], [1, 0], [2, 1], 2)
    body = summarize([a, b], num_steps=2)
    s = body["summary"]
    assert s["cycles"] == 5 and s["accepted_drafts"] == 4 and s["emitted_tokens"] == 9
    assert s["accept_length"] == pytest.approx(9 / 5)
    assert s["spec_accept_length"] == pytest.approx((6 / 3 + 3 / 2) / 2)
    assert body["histogram"] == [2, 2, 1]
    assert [p["reached"] for p in body["per_position"]] == [5, 3]
    assert [p["accepted"] for p in body["per_position"]] == [3, 1]
    assert s["accept_length"] == pytest.approx(1 + sum(p["unconditional_rate"] for p in body["per_position"]))
    assert s["lossless"] is None


def test_speedup_model_by_hand():
    # k = 2, u = (0.5, 0.25), c = 0.1, r = 1.2: (1 + 0.75) / (0.2 + 1.2)
    assert speedup([0.5, 0.25], cost_ratio=0.1, verify_ratio=1.2) == pytest.approx(1.75 / 1.4)
