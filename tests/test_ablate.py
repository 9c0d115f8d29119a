"""`eagle-eval ablate`: variants, the speedup model over profile counts, outputs."""

import csv
import json

import pytest
from click.testing import CliRunner
from fixtures import make_target, train_head, write_prompts

from eagle_eval.commands.ablate import Costs, best_num_steps, parse_variant, variant_rows
from eagle_eval.cli import main
from eagle_eval.settings import ConfigError


def test_parse_variant():
    assert parse_variant("aux_layers=0,3,6") == ("aux_layers=0,3,6", {"aux_layers": (0, 3, 6)})
    assert parse_variant("dtype=bf16;max-new-tokens=32")[1] == {"dtype": "bf16", "max_new_tokens": 32}
    assert parse_variant("no_chat_template=true")[1] == {"no_chat_template": True}
    for bad, match in [("aux_layers", "FIELD=VALUE"), ("target=/x", "not an ablation axis"),
                       ("colour=red", "not an ablation axis"), ("max_new_tokens=lots", "integer")]:
        with pytest.raises(ConfigError, match=match):
            parse_variant(bad)


def test_variant_rows_by_hand():
    section = lambda cycles, acc: {"summary": {"accept_length": 1 + sum(acc) / cycles, "cycles": cycles,
                                               "accepted_drafts": sum(acc)},
                                   "per_position": [{"unconditional_rate": a / cycles, "conditional_rate": None}
                                                    for a in acc]}
    report = {"by_num_steps": {"1": section(10, [8]), "2": section(10, [8, 4])}}
    costs = Costs(cost_ratio=0.5, verify_ratio={2: 1.0, 3: 1.5}, source="given")   # by verify tokens
    rows = variant_rows("base", report["by_num_steps"], costs, Costs(0.1, {}, "server"))
    assert rows[0]["speedup_model"] == pytest.approx(1.8 / (0.5 + 1.0))
    assert rows[1]["speedup_model"] == pytest.approx(2.2 / (1.0 + 1.5))
    assert rows[1]["speedup_server"] == pytest.approx(2.2 / (0.2 + 1.0))
    assert best_num_steps(rows) == 1 and best_num_steps(rows, "speedup_server") == 2


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("abl")
    target = make_target(root / "t", seed=3)
    prompts = write_prompts(root / "p.jsonl", n=4, seed=1)
    return target, train_head(target, root / "h", prompts, steps=40), prompts


def test_ablate_cli_outputs(pair, tmp_path):
    target, head, prompts = pair
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["ablate", "--target", str(target), "--draft", str(head), "--prompts", str(prompts),
                                    "--max-steps", "4", "--max-new-tokens", "16", "--vary", "aux_layers=2,4,6",
                                    "--cost-ratio", "0.05", "--train-context", "16", "--output-dir", str(out)])
    assert res.exit_code == 0, res.output          # the finding of each variant is said, the advice decides the exit
    result = json.loads((out / "ablation.json").read_text())
    assert [v["variant"] for v in result["variants"]] == ["base", "aux_layers=2,4,6"]
    for v in result["variants"]:                   # its profile's starts by context, at the base num_steps (5 -> 4)
        ctx = v["by_context"]
        assert ctx["kind"] == "starts" and ctx["num_steps"] == 4 and ctx["train_context"] == 16
        assert ctx["train_context_finding"]["verdict"] in ("decayed", "not decayed", "undecided")
    assert res.output.count("  by context: expected tokens per step past 16 - before = ") == 2
    assert result["variants"][1]["aux_layers"]["sglang"] == [2, 4, 6]
    assert result["costs"]["cost_ratio"] == 0.05
    table = list(csv.DictReader(open(out / "ablation.csv")))
    rows = [r for r in table if not r["group"]]                # then each variant's acceptance by context
    assert len(rows) == 8 and {r["variant"] for r in rows} == {"base", "aux_layers=2,4,6"}
    assert [(r["variant"], r["group"]) for r in table[8:]] == [
        (v["variant"], f"context:{b['low']}-{'inf' if b['high'] is None else b['high']}")
        for v in result["variants"] for b in v["by_context"]["buckets"]]
    base = [r for r in rows if r["variant"] == "base"]
    best = max(base, key=lambda r: float(r["speedup_model"]))["num_steps"]
    assert int(best) == result["variants"][0]["best_num_steps"]
    assert f"best num_steps for base: {best}" in res.output
    # tau of each S equals the profile's, and the modelled speedup follows from its u_i
    for r in base:
        k = int(r["num_steps"])
        u = [float(r[f"u_{i}"]) for i in range(1, k + 1)]
        assert float(r["speedup_model"]) == pytest.approx((1 + sum(u)) / (k * 0.05 + 1.0))
        assert float(r["tau"]) == pytest.approx(1 + sum(u))
    png = out / "ablation.png"
    if png.exists():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "pip install" in result["warnings"][0]


def test_ablate_measures_costs_when_not_given(pair, tmp_path):
    from eagle_eval import api
    from eagle_eval.settings import AblateOptions, ProfileOptions, Settings

    target, head, prompts = pair
    run = Settings.of(target=str(target), draft=str(head), prompts=str(prompts), max_new_tokens=8)
    result = api.ablate(run, AblateOptions(max_steps=2), progress=False)
    times = result["costs"]["times_ms"]
    assert times["target_1_token"] > 0 and times["draft_step"] > 0 and set(times["verify"]) == {"2", "3"}
    assert result["costs"]["cost_ratio"] == pytest.approx(times["draft_step"] / times["target_1_token"])


def test_profile_cli(pair, tmp_path):
    target, head, prompts = pair
    res = CliRunner().invoke(main, ["profile", "--target", str(target), "--draft", str(head), "--prompts",
                                    str(prompts), "--max-steps", "3", "--max-new-tokens", "12",
                                    "--output-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert sorted(json.loads((tmp_path / "profile.json").read_text())["by_num_steps"]) == ["1", "2", "3"]
    bad = CliRunner().invoke(main, ["profile", "--target", str(target), "--draft", str(head),
                                    "--prompts", str(prompts), "--max-steps", "0"])
    assert bad.exit_code == 2 and "--max-steps must be >= 1" in bad.output


def test_ablate_tree_grid(pair, tmp_path):
    """One profile per topk serves every (S, D) of the grid; rows respect D <= K + (S-1) K^2 + 1."""
    from eagle_eval import api
    from eagle_eval.settings import AblateOptions, ProfileOptions, Settings

    target, head, prompts = pair
    run = Settings.of(target=str(target), draft=str(head), prompts=str(prompts), max_new_tokens=12)
    result = api.ablate(run, AblateOptions(max_steps=3, cost_ratio=0.05, topk_grid=(1, 2), draft_tokens_grid=(4, 8)),
                        progress=False)
    shapes = {(r["topk"], r["num_draft_tokens"], r["num_steps"]) for r in result["rows"]}
    assert {(1, 2, 1), (1, 3, 2), (1, 4, 3)} <= shapes                       # chains verify S + 1
    assert (2, 4, 2) in shapes and (2, 8, 2) not in shapes and (2, 8, 3) in shapes   # pool(2, 2) = 6
    for r in result["rows"]:
        u = sum(r[f"u_{i}"] for i in range(1, r["num_steps"] + 1))
        assert r["speedup_model"] == pytest.approx((1 + u) / (r["num_steps"] * 0.05 + 1.0))
    # each tree row equals a direct profile of that (K, D)
    direct = api.profile(Settings.of(**{**run.flat(), "aux_layers": None, "topk": 2, "num_draft_tokens": 4}),
                         ProfileOptions(max_steps=3), progress=False)
    row = next(r for r in result["rows"] if (r["topk"], r["num_draft_tokens"], r["num_steps"]) == (2, 4, 3))
    assert row["tau"] == direct.report["by_num_steps"]["3"]["summary"]["accept_length"]
    best = max(result["rows"], key=lambda r: r["speedup_model"])
    assert result["best"]["speedup_model"] == best["speedup_model"]
