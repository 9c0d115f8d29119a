"""MTP layers through the fast paths and the commands: the teacher-forced profile equals the loop for every num_steps,
the batched loop equals the reference loop, trees (SGLang's NEXTN drafts EAGLE's tree) equal plain greedy decoding and
the tree profile, and the report echoes the conventions of vLLM, SGLang and transformers."""

from __future__ import annotations

import pytest
from mtp_fixtures import read_prompts

from eagle_eval import api
from eagle_eval.records import Prompt
from eagle_eval.settings import ProfileOptions, Settings

FAMILIES = ("deepseek_v3", "glm4_moe", "qwen3_next", "qwen3_5", "mimo")
NEW = 16


def settings(folder, prompts, **kw):
    return Settings.of(target=str(folder), draft="mtp", prompts=str(prompts), dtype="fp32", max_new_tokens=NEW,
                       limit=5, **kw)


@pytest.mark.parametrize("family", FAMILIES)
def test_profile_equals_the_loop_for_every_num_steps(mtp_targets, family):
    folder, prompts = mtp_targets(family)
    run = settings(folder, prompts)
    prof = api.profile(run, ProfileOptions(max_steps=4), progress=False)
    rates = []
    for k in (1, 2, 3, 4):
        loop = api.evaluate(Settings.of(**{**run.flat(), "num_steps": k}), progress=False)
        for a, b in zip(loop.samples, prof.samples):
            assert a.id == b.id and a.output_ids == b.output_ids
            assert a.accepted_per_cycle == b.extra["accepted_per_cycle_by_num_steps"][str(k)], (k, a.id)
        assert prof.report["by_num_steps"][str(k)]["per_position"] == loop.report["per_position"]
        rates.append(loop.report["per_position"][0]["conditional_rate"])
    assert 0.05 < rates[0] < 0.98                       # not trivial


@pytest.mark.parametrize("family", FAMILIES)
def test_the_batched_loop_equals_the_reference_loop(mtp_targets, family):
    folder, prompts = mtp_targets(family)
    o = api.load_oracle(settings(folder, prompts, num_steps=3))
    ps = [Prompt(id=f"p{i}", category="c", input_ids=p) for i, p in enumerate(read_prompts(prompts))]
    batched = o.decode_many(ps, batch_size=3)
    assert o.loop_mode(3)["loop"] == "batched"
    for p, b in zip(ps, batched):
        ref = o.decode(p)
        assert (b.output_ids, b.accepted_per_cycle) == (ref.output_ids, ref.accepted_per_cycle), p.id


@pytest.mark.parametrize("family", ["glm4_moe", "qwen3_next"])
def test_trees_under_sglang_equal_greedy_and_the_tree_profile(mtp_targets, family):
    folder, prompts = mtp_targets(family)
    run = settings(folder, prompts, mtp_convention="sglang", topk=2, num_draft_tokens=5, num_steps=3)
    loop = api.evaluate(run, progress=False)
    prof = api.profile(run, ProfileOptions(max_steps=3), progress=False)
    for a, b in zip(loop.samples, prof.samples):
        assert a.output_ids == b.output_ids
        assert a.accepted_per_cycle == b.extra["accepted_per_cycle_by_num_steps"]["3"]
    o = api.load_oracle(run)
    p = read_prompts(prompts)[0]
    rec = o.decode(Prompt(id="x", category="c", input_ids=p), check_lossless=True)
    assert rec.lossless and max(rec.accepted_per_cycle) >= 2


def test_trees_are_refused_under_vllms_convention(mtp_targets):
    folder, prompts = mtp_targets("glm4_moe")
    with pytest.raises(Exception, match="vLLM 0.32 drafts MTP chains only"):
        api.load_oracle(settings(folder, prompts, topk=2, num_draft_tokens=5))


def test_the_report_echoes_every_engines_convention(mtp_targets):
    folder, prompts = mtp_targets("glm4_moe")
    o = api.load_oracle(settings(folder, prompts, num_steps=2))
    d = o.resolved.as_dict()
    mtp = d["head"]["mtp"]
    assert d["head"]["kind"] == "mtp" and mtp["family"] == "glm4_moe" and mtp["layers"] == 1
    assert mtp["convention"]["engine"] == "vllm" and mtp["convention"]["chain"] == "pre"
    assert mtp["engines"]["sglang"]["chain"] == "post" and mtp["engines"]["sglang"]["mask_position0"] is False
    assert mtp["engines"]["transformers"]["refuses"].startswith("--num-steps 2: transformers drafts exactly one")
    assert d["aux_layers"]["hf"] == [3] and d["aux_layers"]["final_postnorm"] is True      # N + 1: after the norm
    assert d["aux_layers"]["engines"]["vllm_v1"]["hf"] == [3]
    mimo = api.load_oracle(settings(*mtp_targets("mimo"), num_steps=2)).resolved.as_dict()
    assert mimo["aux_layers"]["hf"] == [2] and mimo["aux_layers"]["final_prenorm"] is True  # vLLM's MiMo: before it
    assert mimo["aux_layers"]["engines"]["sglang"]["hf"] == [3]


@pytest.mark.parametrize("rule", ["vllm", "vllm-probabilistic", "sglang", "sglang-rs", "eagle"])
def test_temperature_above_zero_under_every_rule(mtp_targets, rule):
    """The engines run MTP drafts through their EAGLE sampling code (vLLM llm_base_proposer.py, SGLang's EAGLE
    worker), so every accept rule applies unchanged: the loop's samples pass the distribution check, the batched loop
    draws what the reference loop draws, and the profile at temperature > 0 runs."""
    from eagle_eval.settings import LoopOptions

    folder, prompts = mtp_targets("glm4_moe")
    convention = "sglang" if rule.startswith("sglang") else "vllm"
    run = settings(folder, prompts, num_steps=2, temperature=0.8, accept_rule=rule, mtp_convention=convention)
    one = api.evaluate(run, LoopOptions(check_lossless=True), progress=False)
    check = one.report["summary"]["distribution_check"]
    assert check["verdict"] in ("consistent", "undecided") and check["samples_checked"] == 5, check
    batched = api.evaluate(run, LoopOptions(batch_size=3), progress=False)
    assert [s.output_ids for s in batched.samples] == [s.output_ids for s in one.samples]
    assert sum(sum(s.accepted_per_cycle) for s in one.samples) > 0
    prof = api.profile(run, ProfileOptions(max_steps=2), progress=False)
    assert prof.report["config"]["head"]["kind"] == "mtp" and len(prof.per_start) > 10


def test_ablate_sweeps_num_steps_and_the_convention(mtp_targets):
    """One profile per variant gives every num_steps: the per-position rates show what reusing the one MTP layer for
    the later steps costs, beside SGLang's convention as a variant."""
    from eagle_eval.settings import AblateOptions

    folder, prompts = mtp_targets("glm4_moe")
    result = api.ablate(settings(folder, prompts), AblateOptions(max_steps=4, vary=("mtp_convention=sglang",),
                                                                 cost_ratio=0.1), progress=False)
    names = [v["variant"] for v in result["variants"]]
    assert len(names) == 2 and "mtp_convention=sglang" in names[1]
    base = result["variants"][0]
    rates = [p["conditional_rate"] for p in base["by_num_steps"]["4"]["per_position"]]
    assert len(rates) == 4 and rates[0] > 0


def test_plan_counts_the_mtp_layers_bytes_and_kv(mtp_targets):
    from eagle_eval.plan.command import make_plan
    from eagle_eval.settings import PlanOptions
    from eagle_eval.heads.mtp.load import load_from_target
    from mtp_fixtures import load_target

    folder, _ = mtp_targets("deepseek_v3")
    plan = make_plan(PlanOptions(target=str(folder), draft="mtp", gpus=1, gpu_memory="10GiB", dtype="fp32"))
    stack = load_from_target(load_target(folder)).head
    assert plan.head["kind"] == "mtp"
    assert plan.head["bytes"] == sum(t.numel() * 4 for t in stack.state_dict().values())
    # MLA held per head: 2 heads x (nope 8 + rope 8 + v 8) x 4 bytes
    assert plan.head["kv_per_token"] == 2 * (8 + 8 + 8) * 4 == plan.kv["head_per_token"]


def test_the_cli_runs_draft_mtp_and_echoes_the_conventions(mtp_targets, tmp_path):
    import json

    from click.testing import CliRunner

    from eagle_eval.cli import main

    folder, prompts = mtp_targets("mimo")
    out = CliRunner().invoke(main, ["run", "--target", str(folder), "--draft", "mtp", "--prompts", str(prompts),
                                    "--num-steps", "1", "--max-new-tokens", "8", "--mtp-convention", "sglang",
                                    "--output-dir", str(tmp_path / "run")])
    assert out.exit_code == 0, out.output
    assert "runs sglang's convention: input after the final norm, position-0 mask on" in out.output
    assert "vllm          input before the final norm" in out.output
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["config"]["mtp_convention"] == "sglang" and report["config"]["head"]["kind"] == "mtp"
    bad = CliRunner().invoke(main, ["run", "--target", str(folder), "--draft", "mtp", "--prompts", str(prompts),
                                    "--num-steps", "2", "--mtp-convention", "transformers"])
    assert bad.exit_code == 2 and "transformers 5.25 has no MTP generation for mimo" in bad.output
