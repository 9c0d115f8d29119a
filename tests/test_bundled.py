"""The bundled default: the pair in checkpoints/, the prompts in data/, and `eagle-eval run` on them."""

import json

import pytest
from click.testing import CliRunner

from eagle_eval import api
from eagle_eval.cli import main
from eagle_eval.settings import BUNDLED_DRAFT, BUNDLED_PROMPTS, BUNDLED_TARGET, REPO_ROOT, ProfileOptions, Settings


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """`eagle-eval run --check-lossless` with no other argument, as the README says."""
    out = tmp_path_factory.mktemp("bundled")
    res = CliRunner().invoke(main, ["run", "--check-lossless", "--output-dir", str(out)])
    assert res.exit_code == 0, res.output
    assert "accept length tau" in res.output and "aux layers  HF [2, 4, 5]" in res.output
    return out


def test_bundled_files():
    for folder in (BUNDLED_TARGET, BUNDLED_DRAFT, REPO_ROOT / "checkpoints" / "draft-alt"):
        size = sum(f.stat().st_size for f in folder.iterdir())
        assert size <= 25 * 2**20, (folder, size)
    cfg = json.loads((BUNDLED_DRAFT / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] < cfg["vocab_size"]
    assert json.loads((BUNDLED_TARGET / "config.json").read_text())["num_hidden_layers"] >= 8
    rows = [json.loads(line) for line in BUNDLED_PROMPTS.read_text().splitlines() if line.strip()]
    assert len(rows) >= 24 and len({r["category"] for r in rows}) >= 3


def test_bundled_run_is_a_meaningful_example(run_dir):
    report = json.loads((run_dir / "report.json").read_text())
    s = report["summary"]
    assert s["lossless"] is True and s["lossless_checked"] == s["prompts"] >= 24
    assert s["accept_length"] >= 2.0
    a = [p["conditional_rate"] for p in report["per_position"]]
    assert a[0] > a[-1] and a[-1] < 0.95              # acceptance falls by position; not always right
    assert report["config"]["vocab_map"]["d2t"] == "checkpoint" and not report["config"]["vocab_map"]["d2t_identity"]


def test_the_main_job_quoted_in_the_docs_is_this_run(run_dir):
    """The README's and docs/run.md's figures of the main job come from benchmarks/results/cpu_bundled_default.json
    (benchmarks/tables.py): its tau, losslessness and rates are what `eagle-eval run --check-lossless` gives."""
    quoted = json.loads((REPO_ROOT / "benchmarks" / "results" / "cpu_bundled_default.json").read_text())
    report = json.loads((run_dir / "report.json").read_text())
    s = report["summary"]
    assert round(s["accept_length"], 3) == quoted["accept_length"]
    assert s["prompts"] == quoted["prompts"] and s["lossless"] is True and s["lossless_checked"] == quoted["lossless_prompts"]
    assert [round(p["conditional_rate"], 3) for p in report["per_position"]] == quoted["conditional_rates"]
    assert [round(p["unconditional_rate"], 3) for p in report["per_position"]] == quoted["unconditional_rates"]


def test_bundled_target_output_is_varied_text(run_dir):
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    outputs = [tuple(r["output_ids"]) for r in rows]
    assert len(set(outputs)) == len(outputs)          # different prompts, different continuations
    for out in outputs:                               # no loop with a period shorter than 16 tokens
        tail = out[-32:]
        for period in range(1, 16):
            assert any(tail[i] != tail[i + period] for i in range(len(tail) - period)), (out, period)


@pytest.mark.slow
def test_bundled_profile_equals_loop():
    run = Settings.of(max_new_tokens=32)
    prof = api.profile(run, ProfileOptions(max_steps=8), progress=False)
    for s in (1, 2, 3, 5, 8):
        loop = api.evaluate(Settings.of(max_new_tokens=32, num_steps=s), progress=False)
        section = prof.report["by_num_steps"][str(s)]
        for a, b in zip(loop.samples, prof.samples):
            assert a.accepted_per_cycle == b.extra["accepted_per_cycle_by_num_steps"][str(s)], (s, a.id)
        assert section["per_position"] == loop.report["per_position"]
        assert section["histogram"] == loop.report["histogram"]


def test_alt_head_collapses_with_the_deployment_bug_layers_and_diagnose_names_its_own(tmp_path):
    """draft-alt was trained on SGLang ids [0, 3, 6]. Fed [-1, 0, 3] (the list shifted one slot with the
    embedding in front, the deployment story) it loses most of its acceptance, and diagnose
    (its first look, 8 prompts) calls the mismatch and recommends the trained layers."""
    alt = str(REPO_ROOT / "checkpoints" / "draft-alt")
    own = api.evaluate(Settings.of(draft=alt, limit=8), progress=False).report
    wrong = api.evaluate(Settings.of(draft=alt, limit=8, aux_layers=(-1, 0, 3)), progress=False).report
    assert own["config"]["aux_layers"]["sglang"] == [0, 3, 6]
    assert wrong["config"]["aux_layers"]["hf"] == [0, 1, 4]
    tau_own, tau_wrong = own["summary"]["accept_length"], wrong["summary"]["accept_length"]
    assert tau_own >= 4.0 and tau_wrong <= tau_own - 1.5, (tau_own, tau_wrong)
    res = CliRunner().invoke(main, ["diagnose", "--draft", alt, "--aux-layers", "-1,0,3", "--no-template-check",
                                    "--output-dir", str(tmp_path)])
    assert res.exit_code == 1, res.output
    diag = json.loads((tmp_path / "diagnosis.json").read_text())
    assert diag["configured_aux_layers"]["sglang"] == [-1, 0, 3]
    assert diag["recommended_aux_layers"]["sglang"] == [0, 3, 6]
    assert any(f["severity"] == "error" and "mismatch" in f["code"] for f in diag["findings"]), diag["findings"]


def _diagnose_cli(tmp_path, *args):
    res = CliRunner().invoke(main, ["diagnose", "--no-template-check", "--output-dir", str(tmp_path), *args])
    return res, json.loads((tmp_path / "diagnosis.json").read_text())


def test_diagnose_decides_a_moderate_mismatch_within_the_default_budget(tmp_path):
    """The bundled draft (trained on SGLang ids [1, 3, 4]) fed [-1, 2, 3]: the lowest tap at the embedding
    output, the others one layer low. The loop's tau falls by about 0.5; 8 prompts do not decide it (the
    old max(0.1, 3 SE) rule called it ok there), so diagnose takes more prompts from the workload and
    reaches the mismatch within its default budget, naming the trained layers."""
    res, diag = _diagnose_cli(tmp_path, "--aux-layers", "-1,2,3")
    assert res.exit_code == 1, res.output
    sweep = diag["sweep"]
    assert sweep["looks"][0] == {"prompts": 8, "verdict": "inconclusive"}
    assert sweep["verdict"] == "mismatch" and 8 < sweep["decided_on"] <= 32
    assert diag["recommended_aux_layers"]["sglang"] == [1, 3, 4]
    top, conf = sweep["rows"][0], next(r for r in sweep["rows"] if r["status"] == "configured")
    assert top["hf"] == [2, 4, 5] and top["status"] == "better" and top["delta_lower"] > 0
    assert 0.3 <= top["tau"] - conf["tau"] <= 0.8, (top["tau"], conf["tau"])       # a moderate effect
    found = next(f for f in diag["findings"] if f["code"] == "aux-layer-mismatch")
    assert f"decided on {sweep['decided_on']} prompt(s)" in found["message"] and "[1, 3, 4]" in found["message"]


def test_diagnose_tiny_budget_is_inconclusive_never_ok(tmp_path):
    res, diag = _diagnose_cli(tmp_path, "--aux-layers", "-1,2,3", "--prompt-budget", "2")
    assert res.exit_code == 3, res.output            # undecided (docs/exit-codes.md), never 0
    codes = {f["code"]: f for f in diag["findings"]}
    assert "aux-layers-consistent" not in codes and "aux-layer-mismatch" not in codes
    found = codes["aux-layers-inconclusive"]
    assert found["severity"] == "undecided" and "--prompt-budget" in found["message"]
    assert diag["sweep"]["verdict"] == "inconclusive" and diag["sweep"]["decided_on"] is None
    assert "UNDECIDED aux-layers-inconclusive" in res.output
    assert diag["recommended_aux_layers"] == diag["configured_aux_layers"]     # nothing recommended blindly


def test_diagnose_correct_head_is_consistent_over_shuffles():
    """Both bundled heads on their own layers, the workload shuffled 3 ways each: consistent every time.
    The stated false-mismatch rate is alpha = 0.05 per run; 6 runs exceed 1 false alarm with p = 0.033."""
    from eagle_eval.diagnose import decide
    from eagle_eval.diagnose.options import DiagnoseOptions
    from eagle_eval.diagnose.run import diagnose

    verdicts = []
    for draft in (BUNDLED_DRAFT, REPO_ROOT / "checkpoints" / "draft-alt"):
        run = Settings.of(draft=str(draft), max_new_tokens=32)
        oracle = api.load_oracle(run)
        for seed in range(3):
            res = diagnose(run.with_(shuffle_seed=seed), DiagnoseOptions(template_check=False), oracle=oracle)
            verdicts.append((res.report["sweep"]["verdict"], res.exit_status))
    assert decide.ALPHA == 0.05
    assert sum(v == "mismatch" for v, _ in verdicts) <= 1, verdicts
    assert verdicts == [("consistent", 0)] * 6, verdicts
