"""The real trained target: SmolLM2-135M-Instruct (fetched from the package registry, converted once and
cached by scripts/fetch_smollm2.py) with the project's EAGLE-3 head for it, checkpoints/smollm2-eagle3.

On a few bundled prompts: the loop is lossless against plain greedy; tau is within a stated band of
the README's figure; the deployment's embedding-output "fix" is found by diagnose (exit 1, the trained
layers named); the training accuracy's prediction is set beside the measured rates.
Deselect with `-m "not smollm2"`; skipped (with the reason) when the registry cannot be reached.
"""

import pytest
from smollm2_target import smollm2_target_or_skip

from eagle_eval import api
from eagle_eval.settings import LoopOptions, REPO_ROOT, ProfileOptions, Settings
from eagle_eval.diagnose.options import DiagnoseOptions
from eagle_eval.diagnose.run import diagnose

pytestmark = [pytest.mark.smollm2, pytest.mark.slow]

HEAD = REPO_ROOT / "checkpoints" / "smollm2-eagle3"
TRAINED_HF = [2, 15, 27]               # the engine defaults for N = 30, what the head was trained on
# README "A real trained target": profile, the first 8 bundled prompts, 32 new tokens, num_steps 5
COMMITTED_TAU = 1.518
TAU_BAND = 0.05                        # fp32 on another CPU can flip a near-tie argmax, little more


@pytest.fixture(scope="module")
def target():
    return smollm2_target_or_skip()


def _run(target, **kw):
    return Settings.of(target=str(target), draft=str(HEAD), num_steps=5, dtype="fp32", **kw)


@pytest.fixture(scope="module")
def oracle(target):
    return api.load_oracle(_run(target))


def test_lossless_and_the_training_prediction(target):
    report = api.evaluate(_run(target, limit=2, max_new_tokens=24), LoopOptions(check_lossless=True), progress=False).report
    assert report["summary"]["lossless"] is True and report["summary"]["lossless_checked"] == 2
    pred = report["training_prediction"]
    assert "training_metrics.json" in pred["source"] and pred["positions_predicted"] == 5
    assert 1 < pred["predicted_accept_length"] < 5
    measured = [p["unconditional_rate"] for p in report["per_position"]]
    assert [r["measured_unconditional_rate"] for r in pred["per_position"]] == measured


def test_tau_is_the_committed_figure(target, oracle):
    res = api.profile(_run(target, limit=8, max_new_tokens=32), ProfileOptions(max_steps=5), progress=False,
                      oracle=oracle)
    tau = res.report["by_num_steps"]["5"]["summary"]["accept_length"]
    assert abs(tau - COMMITTED_TAU) <= TAU_BAND, f"tau {tau:.3f}, committed {COMMITTED_TAU} +- {TAU_BAND}"


def test_diagnose_names_the_trained_layers_behind_the_embedding_fix(target):
    """The list shifted one slot with -1 in front (SGLang ids [-1, 1, 14] for [1, 14, 26])."""
    run = _run(target, aux_layers=(-1, 1, 14), aux_convention="sglang", max_new_tokens=32)
    result = diagnose(run, DiagnoseOptions(prompt_budget=8, template_check=False))
    codes = [f.code for f in result.findings]
    assert result.exit_status == 1 and "aux-layer-mismatch" in codes
    assert result.report["recommended_aux_layers"]["hf"] == TRAINED_HF
