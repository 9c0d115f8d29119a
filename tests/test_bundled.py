"""The bundled default: the pair in checkpoints/, the prompts in data/, and `eagle-eval run` on them."""

import json

import pytest
from click.testing import CliRunner

from eagle_eval import api
from eagle_eval.cli import main
from eagle_eval.config import BUNDLED_DRAFT, BUNDLED_PROMPTS, BUNDLED_TARGET, REPO_ROOT, ProfileConfig, RunConfig


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
    run = RunConfig(max_new_tokens=32)
    prof = api.profile(ProfileConfig(run=run, max_steps=8), progress=False)
    for s in (1, 2, 3, 5, 8):
        loop = api.evaluate(RunConfig(max_new_tokens=32, num_steps=s), progress=False)
        section = prof.report["by_num_steps"][str(s)]
        for a, b in zip(loop.samples, prof.samples):
            assert a.accepted_per_cycle == b.extra["accepted_per_cycle_by_num_steps"][str(s)], (s, a.id)
        assert section["per_position"] == loop.report["per_position"]
        assert section["histogram"] == loop.report["histogram"]


def test_alt_head_collapses_with_the_deployment_bug_layers_and_diagnose_names_its_own(tmp_path):
    """draft-alt was trained on SGLang ids [0, 3, 6]. Fed [-1, 0, 3] (the list shifted one slot with the
    embedding in front, the deployment story of issue 5) it loses most of its acceptance, and diagnose
    (its default 8-prompt budget) calls the mismatch and recommends the trained layers."""
    alt = str(REPO_ROOT / "checkpoints" / "draft-alt")
    own = api.evaluate(RunConfig(draft=alt, limit=8), progress=False).report
    wrong = api.evaluate(RunConfig(draft=alt, limit=8, aux_layers=(-1, 0, 3)), progress=False).report
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
