"""What a new user reads first says what the tool does, and runs from any folder: the top-level help names the
sampling loop beside the greedy one; `plan --bundled-config NAME` plans a published config shipped with
eagle-eval (the README's plan example, once tied to the repository root). The README's examples themselves
run from an empty folder in tests/test_readme.py."""

import json

from click.testing import CliRunner

from eagle_eval.cli import main
from eagle_eval.settings import BUNDLED, BUNDLED_PLAN_CONFIGS


def test_the_top_level_help_names_sampling_and_every_exit_status():
    text = " ".join(CliRunner().invoke(main, ["--help"]).output.split())
    assert "reference greedy loop" not in text
    assert "greedy (equal to plain greedy decoding) or sampling under each engine's accept rule" in text
    assert "0 ok, 1 a check failed, 2 bad input, 3 undecided, 70 internal error, 130 interrupted" in text


def test_plan_bundled_config_runs_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert BUNDLED_PLAN_CONFIGS == tuple(sorted(p.name for p in (BUNDLED / "data" / "plan").iterdir() if p.is_dir()))
    res = CliRunner().invoke(main, ["plan", "--bundled-config", "deepseek-v3", "--gpus", "8", "--gpu-memory", "141GB",
                                    "--json", "plan.json"])
    assert res.exit_code == 0, res.output
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["fits"] is True and plan["target"]["path"] == str(BUNDLED / "data" / "plan" / "deepseek-v3")


def test_plan_takes_a_target_or_a_bundled_config_not_both_nor_neither():
    both = CliRunner().invoke(main, ["plan", "--bundled-config", "kimi-k2.5", "--target", "x", "--gpus", "1"])
    assert both.exit_code == 2 and both.stderr.strip() == \
        "eagle-eval: error: --target and --bundled-config exclude each other: give one"
    neither = CliRunner().invoke(main, ["plan", "--gpus", "1"])
    assert neither.exit_code == 2 and "--target is required" in neither.stderr and "--bundled-config (deepseek-v3, " \
        "kimi-k2.5)" in neither.stderr
    unknown = CliRunner().invoke(main, ["plan", "--bundled-config", "llama-3"])
    assert unknown.exit_code == 2 and "'llama-3' is not one of 'deepseek-v3', 'kimi-k2.5'" in unknown.stderr
