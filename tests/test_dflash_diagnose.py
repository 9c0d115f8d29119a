"""`diagnose` and the training-length check with a block drafter (issue 40): a planted wrong target_layer_ids list
is found by the aux-layer sweep and named with the config line that fixes it; a block of another length than the
trained one is a finding (--num-steps, and a speculators folder that tells vLLM another K); acceptance past the
length the drafter was trained on is the context buckets' finding (results/context.py, every kind)."""

import json
import shutil

import pytest
from dflash_fixtures import NEW_TOKENS, PROMPT_LEN, dflash_config, dflash_pair, random_drafter

from eagle_eval import api
from eagle_eval.diagnose.options import DiagnoseOptions
from eagle_eval.diagnose.run import diagnose, render_diagnosis
from eagle_eval.settings import Settings


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("dflash_diagnose")
    out = dflash_pair(root, num_prompts=16)                  # enough prompts for the sweep to decide
    wrong = root / "wrong-ids"
    shutil.copytree(out["dflash"], wrong)
    cfg = json.loads((wrong / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [0, 2]      # trained on [1, 3]: every engine would tap HF [1, 3]
    (wrong / "config.json").write_text(json.dumps(cfg))
    out["wrong"] = wrong
    return out


def _settings(pair, draft="dflash", **kw):
    return Settings.of(target=str(pair["target"]), draft=str(pair[draft]), prompts=str(pair["prompts"]), dtype="fp32",
                       **{"max_new_tokens": 20, "num_steps": 3, **kw})


def test_a_planted_wrong_target_layer_list_is_found_and_the_fix_named(pair):
    """target_layer_ids [0, 2] on a drafter trained on [1, 3]: the sweep's "+1" candidate (HF [2, 4]) gains clearly,
    an error names it with the dflash_config line, and the recommended taps are HF [2, 4]."""
    found = diagnose(_settings(pair, "wrong"), DiagnoseOptions(template_check=False))
    (mismatch,) = [f for f in found.findings if f.code == "aux-layer-mismatch"]
    assert mismatch.severity == "error" and found.exit_status == 1
    assert '"dflash_config": {"target_layer_ids": [1, 3]}' in mismatch.message
    assert found.report["recommended_aux_layers"]["hf"] == [2, 4]
    assert found.report["configured_aux_layers"]["hf"] == [1, 3]
    labels = [r["label"] for r in found.report["sweep"]["rows"]]
    assert any("z-lab default" in label for label in labels)


def test_the_right_list_is_consistent(pair):
    found = diagnose(_settings(pair), DiagnoseOptions(template_check=False))
    codes = {f.code: f.severity for f in found.findings}
    assert "aux-layer-mismatch" not in codes and found.report["recommended_aux_layers"]["hf"] == [2, 4]
    assert codes.get("aux-layers-consistent") == "info" or codes.get("aux-layers-inconclusive") == "undecided"
    assert codes["vocab-coverage"] == "info"                       # the z-lab layout drafts the whole vocabulary


def test_a_planted_block_size_mismatch_is_a_finding_in_diagnose(pair):
    """--num-steps 5 on a block_size 4 drafter: vLLM K = 5 / SGLang num_draft_tokens 6 would be served silently."""
    found = diagnose(_settings(pair, num_steps=5), DiagnoseOptions(sweep=False, template_check=False))
    (f,) = [f for f in found.findings if f.code == "dflash-block-size"]
    assert f.detail["rows"] == 6 and f.detail["trained_block_size"] == 4 and f.severity == "warning"


def test_a_speculators_folder_that_tells_vllm_another_k_is_a_finding(pair, tmp_path):
    from eagle_eval.heads.dflash.io import save_dflash

    folder = save_dflash(random_drafter(dflash_config(layout="speculators"), own_lm_head=True), tmp_path / "spec")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3      # the writer's B - 1
    cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 7
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.warns(UserWarning):
        oracle = api.load_oracle(_settings(pair).with_(draft=str(folder)))
    (f,) = [f for f in oracle.resolved.sanity if f.code == "dflash-served-block"]
    assert f.detail == {"speculative_tokens": 7, "rows": 8, "trained_block_size": 4}


def test_acceptance_past_the_training_length_decays(pair):
    """The drafter was trained on sequences of PROMPT_LEN + NEW_TOKENS + 4 tokens; decoding 48 tokens past the
    8-token prompts with --train-context at that length, the context buckets' finding says decayed (exit 1)."""
    from eagle_eval.results.context import finding_status

    length = PROMPT_LEN + NEW_TOKENS + 4
    run = api.evaluate(_settings(pair, max_new_tokens=48, train_context=length), progress=False)
    finding = run.report["by_context"]["train_context_finding"]
    assert finding["verdict"] == "decayed", finding
    assert finding_status(run.report) == 1


@pytest.mark.parametrize("sweep", [True, False])
def test_diagnose_says_acceptance_decays_past_the_training_length(pair, sweep):
    """diagnose --train-context: the by-context section of the configured wiring (from the sweep's profile of it,
    or a profile of its own without a sweep) equals the loop's on the same prompts, and its verdict is a finding:
    decayed past the drafter's training length -> the error context-decay (exit 1)."""
    length = PROMPT_LEN + NEW_TOKENS + 4
    settings = _settings(pair, max_new_tokens=48, train_context=length)
    found = diagnose(settings, DiagnoseOptions(sweep=sweep, template_check=False))
    (f,) = [f for f in found.findings if f.code.startswith("context-")]
    assert (f.code, f.severity, found.exit_status) == ("context-decay", "error", 1), f
    section = found.report["by_context"]
    diagnosed = section["buckets"][0]["prompts"]               # every prompt has a cycle in the first bucket
    run = api.evaluate(settings.with_(limit=diagnosed), progress=False)
    assert section == run.report["by_context"]                 # the profile's cycles are the loop's
    assert section["train_context_finding"]["verdict"] == "decayed"
    assert "acceptance by context" in render_diagnosis(found.report)
