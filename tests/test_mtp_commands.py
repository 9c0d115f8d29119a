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
    for k in (1, 2, 4):
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
