"""`eagle-eval report`: saved results re-rendered without a model (same numbers as the run), the
acceptance CSV (speculators' columns, round trip), the PNG, and the comparison of two results."""

import json
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from eagle_eval import oracle as oracle_module
from eagle_eval.cli import main
from eagle_eval.results.comparison import compare, load_result
from eagle_eval.records import SampleRecord
from eagle_eval.results.report import group_summaries, summarize
from eagle_eval.results.tables import csv_rows, read_csv
from eagle_eval.loop.draft import DraftState
from eagle_eval.loop.plain import plain_greedy

DATA = Path(__file__).parent / "data"
KEYS = ("summary", "per_position", "histogram", "by_category", "by_turn")


def _partly_right_drafts(mp, every: int) -> None:
    """Drafts = the target's greedy continuation, except that draft j of a cycle is wrong whenever
    (verified length + j) % every == 0: varied acceptance from a random tiny pair."""
    current = {}
    real_decode = oracle_module.speculative_decode

    def decode(spec, prompt_ids, num_steps, max_new_tokens, *args, **kwargs):
        current["seq"] = prompt_ids + plain_greedy(spec.target, prompt_ids, max_new_tokens + num_steps + 1, set())
        return real_decode(spec, prompt_ids, num_steps, max_new_tokens, *args, **kwargs)

    def propose(self, s):
        nxt = current["seq"][self.real_len + 1: self.real_len + 1 + s]
        return torch.tensor([(t + 1) % 96 if (self.real_len + j) % every == 0 else t for j, t in enumerate(nxt)])

    mp.setattr(oracle_module, "speculative_decode", decode)
    mp.setattr(DraftState, "propose_chain", propose)


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    """Two saved MT-Bench runs of the tiny pair on the same prompts, made by `eagle-eval run` as a user would:
    drafts wrong 1 time in 5 (A) or 1 in 2 (B). Each is (folder, report, what `run` printed on stdout)."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, every in (("a", 5), ("b", 2)):
        with pytest.MonkeyPatch.context() as mp:
            _partly_right_drafts(mp, every)
            res = CliRunner().invoke(main, ["run", "--target", str(tiny["target"]), "--draft", str(tiny["head"]),
                                            "--num-steps", "3", "--max-new-tokens", "16", "--dataset",
                                            str(DATA / "mt_bench_question.jsonl"), "--output-dir", str(root / name)])
        assert res.exit_code == 0, res.output
        report = json.loads((root / name / "report.json").read_text())
        out[name] = (root / name, report, res.stdout)
    return out


def test_report_reproduces_the_run_exactly(runs):
    """`report` prints what `run` printed when it ran (its table and load-time checks), byte for byte: the
    expectation is the run's own output, not a rendering of the saved report."""
    folder, report, printed = runs["a"]
    result = CliRunner().invoke(main, ["report", str(folder / "report.json")])
    assert result.exit_code == 0, result.output
    ran = printed[:printed.index(f"\nwrote {folder}/report.json")]     # `run` also says which files it wrote
    assert result.stdout == ran
    saved = load_result(folder).report                                 # a run folder works too
    for key in KEYS:
        assert saved[key] == report[key]
    assert "category" in result.output and "turn" in result.output      # the group tables are there
    md = CliRunner().invoke(main, ["report", str(folder), "--markdown"])
    assert md.exit_code == 0 and "| category | prompts | cycles | tau | u_1 | u_2 | u_3 |" in md.output


def test_the_saved_summary_is_the_records_counted_by_hand(runs):
    """tau and the per-position rates of report.json recomputed here from samples.jsonl's own rows, with
    nothing of eagle_eval: emitted tokens over verify steps, and accepted-at-least-i over cycles."""
    folder, report, _ = runs["a"]
    rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    cycles = [a for row in rows for a in row["accepted_per_cycle"]]
    assert sum(row["verify_count"] for row in rows) == len(cycles) == report["summary"]["cycles"]
    assert report["summary"]["accept_length"] == pytest.approx(sum(a + 1 for a in cycles) / len(cycles), abs=1e-12)
    by_hand = [sum(a >= i for a in cycles) / len(cycles) for i in (1, 2, 3)]
    assert [p["unconditional_rate"] for p in report["per_position"]] == pytest.approx(by_hand, abs=1e-12)
    assert report["histogram"] == [sum(a == n for a in cycles) for n in range(4)]


def test_acceptance_csv_round_trips_with_speculators_columns(runs):
    folder, report, _ = runs["a"]
    rows = read_csv(folder / "acceptance.csv")
    expected = csv_rows(report)
    assert rows == [{k: row.get(k) for k in rows[0]} for row in expected]
    groups = [r["group"] for r in rows]
    assert groups[:5] == ["all", "category:math", "category:writing", "turn:1", "turn:2"]
    buckets = report["by_context"]["buckets"]                  # then one row per context bucket
    assert groups[5:] == [f"context:{b['low']}-{b['high'] or 'inf'}" for b in buckets] and buckets
    by_group = {r["group"]: r for r in rows}
    for group, body in (("all", report), ("turn:2", report["by_turn"]["2"])):
        row, s = by_group[group], body["summary"]
        assert row["acceptance_length"] == s["accept_length"] and row["num_drafts"] == s["cycles"]
        assert row["num_draft_tokens"] == 3 * s["cycles"] and row["num_accepted_tokens"] == s["accepted_drafts"]
        assert [row[f"acceptance_at_pos_{i}"] for i in range(3)] == \
            [p["unconditional_rate"] for p in body["per_position"]]
        assert [row[f"histogram_{n}"] for n in range(4)] == body["histogram"]


def test_two_results_csv_and_comparison(runs, tmp_path):
    a, b = runs["a"][0], runs["b"][0]
    result = CliRunner().invoke(main, ["report", str(a), str(b), "--csv", str(tmp_path / "both.csv")])
    assert result.exit_code == 0, result.output
    assert "differences B - A" in result.output and "rule: tau flagged" in result.output
    rows = [r for r in read_csv(tmp_path / "both.csv") if not r["group"].startswith("context:")]
    assert [r["result"] for r in rows] == [str(a)] * 5 + [str(b)] * 5


def test_plot_is_a_png(runs, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "acc.png"
    result = CliRunner().invoke(main, ["report", str(runs["a"][0]), str(runs["b"][0]), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how_to_install(runs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)                 # import matplotlib -> ImportError
    result = CliRunner().invoke(main, ["report", str(runs["a"][0]), "--plot", str(tmp_path / "x.png")])
    assert result.exit_code == 2
    assert result.stderr == "eagle-eval: error: --plot needs matplotlib: pip install 'eagle-eval[plot]'\n"


def test_tampered_or_foreign_report_is_refused(runs, tmp_path):
    report = json.loads((runs["a"][0] / "report.json").read_text())
    report["by_category"]["math"]["histogram"][0] += 1
    (tmp_path / "bad.json").write_text(json.dumps(report))
    (tmp_path / "notjson.json").write_text("{")
    for name, match in (("bad.json", "bad.json: group by_category['math']: 'summary'/'per_position' do not follow"),
                        ("notjson.json", "notjson.json: not valid JSON"),
                        ("missing.json", "missing.json: no such report file")):
        result = CliRunner().invoke(main, ["report", str(tmp_path / name)])
        assert result.exit_code == 2 and match in result.stderr and result.stderr.count("\n") == 1


def _synthetic(accepted: list[int], category: str = "c") -> dict:
    samples = [SampleRecord(id=str(i), category=category, prompt_len=4, output_ids=[5] * (n + 1),
                            accepted_per_cycle=[n], emitted_per_cycle=[n + 1], verify_count=1)
               for i, n in enumerate(accepted)]
    return {"config": {"num_draft_tokens": 4}, **summarize(samples, 3), **group_summaries(samples, 3)}


def test_comparison_flags_only_differences_beyond_noise():
    a = _synthetic([0] * 50 + [3] * 50)
    same = compare(a, _synthetic([0] * 50 + [3] * 50))
    assert not same["all"]["tau_flag"] and not any(p["flag_unconditional"] for p in same["all"]["positions"])
    close = compare(a, _synthetic([0] * 48 + [3] * 52))                 # 2 cycles of 100: noise
    assert not close["all"]["tau_flag"]
    far = compare(a, _synthetic([0] * 10 + [3] * 90))
    assert far["all"]["tau_flag"] and far["all"]["tau_diff"] == pytest.approx(1.2)
    assert all(p["flag_unconditional"] for p in far["all"]["positions"])
    assert all(p["flag_conditional"] for p in far["all"]["positions"][:1])    # a_1 differs; a_2, a_3 = 1 in both
    assert not any(p["flag_conditional"] for p in far["all"]["positions"][1:])
