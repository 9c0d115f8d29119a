"""The three-way rule of diagnose, on simulated per-prompt counts: the sequential looks keep
each error rate within the stated alpha (Bonferroni over looks and candidates), and decide real effects."""

import random

import pytest

from eagle_eval.diagnose import decide

PLANNED = decide.looks(8, 32)                        # [8, 16, 32]: three looks


def _prompts(rng: random.Random, gains: list[float], n: int = 32) -> list[list[tuple[int, int]]]:
    """Per candidate (0 = configured), n prompts of position counts: prompts differ in length and in
    acceptance (a shared per-prompt level), each candidate adds its gain and per-prompt noise."""
    rows = [[] for _ in gains]
    for _ in range(n):
        positions = rng.randint(20, 64)
        level = rng.uniform(1.5, 4.5)                # tau_pos of this prompt for the configured set
        for c, gain in enumerate(gains):
            noise = 0.0 if c == 0 else rng.gauss(0, 0.35)
            rows[c].append((round(positions * max(1.0, level + gain + noise)), positions))
    return rows


def _run(rows):
    return decide.sequential(PLANNED, lambda lo, hi: [r[lo:hi] for r in rows], len(rows))


@pytest.mark.parametrize("gains", [[0.0, 0.0, 0.0, 0.0, 0.0], [0.0, -0.3, 0.0, -1.0]])
def test_false_mismatch_rate_within_alpha(gains):
    """The configured set truly as good as every alternative: mismatch in at most alpha of the runs."""
    rng = random.Random(1)
    reps = 400
    false = sum(_run(_prompts(rng, gains)).verdict == decide.MISMATCH for _ in range(reps))
    # alpha = 0.05 of 400 is 20; the binomial 99.9% bound above it is 36
    assert false <= 36, false


def test_false_consistent_rate_within_alpha():
    """An alternative truly better by the margin: called consistent in at most alpha of the runs."""
    rng = random.Random(2)
    reps = 400
    false = sum(_run(_prompts(rng, [0.0, decide.MARGIN, -0.5])).verdict == decide.CONSISTENT for _ in range(reps))
    assert false <= 36, false


def test_clear_effects_decided_and_looks_stop_early():
    rng = random.Random(3)
    big = _run(_prompts(rng, [0.0, 1.0, -0.5]))
    assert big.verdict == decide.MISMATCH and big.winner == 1 and big.prompts == 8 and len(big.looks) == 1
    worse = _run(_prompts(rng, [0.0, -1.0, -0.8]))
    assert worse.verdict == decide.CONSISTENT and worse.prompts == 8
    moderate = [_run(_prompts(rng, [0.0, 0.4, -0.5])) for _ in range(20)]
    assert all(s.verdict == decide.MISMATCH and s.winner == 1 for s in moderate)
    assert any(s.prompts > 8 for s in moderate)          # some needed a second look


def test_a_gain_on_the_margin_stays_inconclusive_and_says_how_many_prompts():
    rng = random.Random(4)
    seq = _run(_prompts(rng, [0.0, 0.12, -0.5]))
    assert seq.verdict == decide.INCONCLUSIVE and seq.prompts == 32 and len(seq.looks) == 3
    assert decide.undecided_by(seq.bounds) == [0]
    need = decide.prompts_to_decide(seq.bounds[0], seq.prompts, seq.level)
    assert need is None or need > 32


def test_one_prompt_or_no_spread_information_never_decides():
    one = decide.sequential([1], lambda lo, hi: [[(30, 10)], [(50, 10)]], 2)
    assert one.verdict == decide.INCONCLUSIVE
    assert decide.bounds([(0.5, float("nan"))], 8, 0.01)[0].lower == float("-inf")


def test_t_quantiles_match_tables():
    # Student t tables: t_{0.975, 7} = 2.365, t_{0.995, 30} = 2.750, t_{0.9995, 3} = 12.924
    assert decide.t_quantile(0.975, 7) == pytest.approx(2.3646, abs=1e-4)
    assert decide.t_quantile(0.995, 30) == pytest.approx(2.7500, abs=1e-4)
    assert decide.t_quantile(0.9995, 3) == pytest.approx(12.924, abs=1e-3)
