"""What is wrong with an MTP deployment, found: diagnose sweeps the MTP conventions (heads/mtp/wire.py `variants`:
the other engines' whole conventions and each single choice flipped) and says which one the layer was trained for;
server-check names the convention a server runs. The servers here are STAND-INS (tests/fake_servers.py: an oracle
behind SGLang's or vLLM's wire format, its convention planted), so these tests show that a planted convention error
is caught and named, not that SGLang agrees with eagle-eval (SGLang is never run here; the real vLLM is, in
tests/test_real_vllm_mtp.py)."""

from __future__ import annotations

import pytest
from fake_servers import Engine, serve
from mtp_fixtures import make_mtp_target, read_prompts, train_mtp, write_prompts

from eagle_eval import api
from eagle_eval.diagnose.options import DiagnoseOptions
from eagle_eval.diagnose.run import diagnose
from eagle_eval.servers.check import render_server_check, run_server_check
from eagle_eval.servers.options import ServerCheckOptions
from eagle_eval.settings import Settings

NEW = 16


def settings(folder, prompts, **kw):
    return Settings.of(target=str(folder), draft="mtp", prompts=str(prompts), dtype="fp32", max_new_tokens=NEW,
                       **{"num_steps": 3, **kw})


@pytest.fixture(scope="module")
def chain_post_glm(tmp_path_factory):
    """A GLM target whose MTP layer was trained handing the next step its output AFTER the output norm (SGLang's
    chaining), while vLLM hands GLM's the output before it: served by vLLM, a planted convention error."""
    root = tmp_path_factory.mktemp("mtp-planted")
    prompts = write_prompts(root / "prompts.jsonl", n=16, seed=9)
    folder = make_mtp_target(root / "glm", "glm4_moe", seed=4)
    train_mtp(folder, read_prompts(prompts), steps=40, num_steps=3, planted={"chain": "post"})
    return folder, prompts


def sweep_verdict(result):
    return [f for f in result.findings if f.code.startswith("mtp-wiring")]


def test_diagnose_names_the_chaining_the_layer_was_trained_for(chain_post_glm):
    """Chaining shows only from the second draft step on, so the sweep drafts 5 steps (the profile gives them all)."""
    folder, prompts = chain_post_glm
    result = diagnose(settings(folder, prompts, num_steps=5), DiagnoseOptions(prompt_budget=16, template_check=False))
    (verdict,) = sweep_verdict(result)
    assert verdict.code == "mtp-wiring-mismatch" and verdict.severity == "error", verdict.message
    assert list(verdict.detail["variant"]["mtp_planted"]) == ["chain=post"]
    assert "handed to the next step" in verdict.message
    rows = result.report["sweep"]["rows"]
    assert list(rows[0]["changes"]["mtp_planted"]) == ["chain=post"] and rows[0]["status"] == "better"
    assert next(r for r in rows if r["label"].startswith("mtp_hidden_first"))["tau_pos"] < 1.1   # order: nothing left
    assert result.exit_status == 1


def test_diagnose_names_the_input_the_layer_was_trained_for(chain_post_glm):
    """The layer trained on the target's state AFTER its final norm, run on the state before it (a planted wiring
    error, vLLM's MiMo input on a GLM layer): the finding names the input, through vLLM's whole GLM convention."""
    folder, prompts = chain_post_glm
    result = diagnose(settings(folder, prompts, mtp_planted=("input=pre",)),
                      DiagnoseOptions(prompt_budget=16, template_check=False))
    (verdict,) = sweep_verdict(result)
    assert verdict.code == "mtp-wiring-mismatch", verdict.message
    won = verdict.detail["variant"]
    assert won.get("mtp_convention") in ("vllm", "sglang") or "input=post" in won["mtp_planted"], won


def test_diagnose_finds_nothing_when_the_convention_is_the_trained_one(mtp_targets):
    folder, prompts = mtp_targets("glm4_moe")          # trained under vLLM's convention, checked under it
    result = diagnose(settings(folder, prompts), DiagnoseOptions(prompt_budget=8, template_check=False))
    (verdict,) = sweep_verdict(result)
    assert verdict.code != "mtp-wiring-mismatch", verdict.message


@pytest.mark.parametrize("backend", ["sglang", "vllm"])
def test_a_stand_in_running_another_convention_is_caught_and_named(chain_post_glm, backend):
    """The check runs vLLM's GLM convention (chain before the norm); the stand-in runs the layer with position-0
    masking off (SGLang's GLM masks nothing): every token equal, acceptance not, and the hypothesis that reproduces
    the server request by request is the masking flip."""
    folder, prompts = chain_post_glm
    run = settings(folder, prompts, limit=6)
    server = api.load_oracle(run.with_(mtp_planted=("mask_position0=false",)))
    with serve(Engine(server, backend, per_request="detailed" if backend == "vllm" else None)) as url:
        result = run_server_check(run, ServerCheckOptions(backend=backend, url=url, metrics_settle=0, retries=0))
    r = result.report
    assert result.exit_status == 1 and r["verdict"] == "disagree", render_server_check(r)
    assert r["tokens"]["equal"] == 6 and r["judgement"]["counts_differ"] > 0
    assert r["hypotheses"]["explanation"] == "mtp_mask_position0_false", r["hypotheses"]["ranking"][:3]
    if backend == "sglang":
        algo = next(s for s in r["server"]["settings_check"] if s["setting"] == "speculative_algorithm")
        assert algo["ok"] is True and algo["server"] == "NEXTN"


def test_a_stand_in_running_the_same_convention_agrees(chain_post_glm):
    folder, prompts = chain_post_glm
    run = settings(folder, prompts, limit=4, mtp_convention="sglang")
    with serve(Engine(api.load_oracle(run), "sglang")) as url:
        result = run_server_check(run, ServerCheckOptions(backend="sglang", url=url, metrics_settle=0, retries=0))
    assert result.exit_status == 0 and result.report["verdict"] == "agree", render_server_check(result.report)
