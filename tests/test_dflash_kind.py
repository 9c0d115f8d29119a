"""The `dflash` head kind (heads/dflash/kind.py): a DFlash / DFlash2 folder given as --draft is found by its own
record, loaded strictly, tapped at target_layer_ids + 1, wired with BlockDraftState, and run through the oracle
(`eagle-eval run`, the API) with every resolved setting echoed: the block it was trained with, the block this run
drafts, what each engine taps and must be told, and a block of another length as a finding naming both."""

import json

import pytest
import torch
from click.testing import CliRunner
from dflash_fixtures import dflash_config, dflash_pair, random_drafter

from eagle_eval import api
from eagle_eval.heads.io import load_head
from eagle_eval.heads.kind import kind_of
from eagle_eval.settings import ConfigError, Settings

MAX_NEW = 20


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return dflash_pair(tmp_path_factory.mktemp("dflash_kind"), kinds=("dflash", "dflash2"))


def _settings(pair, kind="dflash", **kw):
    return Settings.of(target=str(pair["target"]), draft=str(pair[kind]), prompts=str(pair["prompts"]), dtype="fp32",
                       max_new_tokens=MAX_NEW, **{"num_steps": 3, **kw})


def _reference(pair, kind, num_steps):
    """The reference loop over the pair, built by hand from the DFlash core (tests/dflash_fixtures.py), not by
    the kind's wiring."""
    from dflash_fixtures import block_speculator

    from eagle_eval.loop.reference import speculative_decode

    spec = block_speculator(pair["target"], pair[kind])
    return [speculative_decode(spec, p, num_steps, MAX_NEW, {2}) for p in pair["prompt_ids"]]


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_run_with_a_dflash_folder_is_the_block_drafters_loop(pair, kind):
    """`run --draft DFLASH_FOLDER`: the records are the hand-built reference loop's, the output is plain greedy's
    (--check-lossless), and the report echoes the kind, the block and the taps."""
    result = api.evaluate(_settings(pair, kind), api.LoopOptions(check_lossless=True), progress=False)
    ref = _reference(pair, kind, 3)
    assert [s.output_ids for s in result.samples] == [r.output_ids for r in ref]
    assert [s.accepted_per_cycle for s in result.samples] == [r.accepted_per_cycle for r in ref]
    assert all(s.lossless for s in result.samples)
    assert sum(sum(s.accepted_per_cycle) for s in result.samples) > 0          # the trained drafter is accepted
    config = result.report["config"]
    head = config["head"]
    assert head["kind"] == "dflash" and head["dialect"] == "z-lab" and head["variant"]["kind"] == kind
    block = head["block"]
    assert (block["block_size"], block["mask_token_id"]) == (4, 95)
    assert block["target_layer_ids"]["zlab_target_layer_ids"] == [1, 3]
    assert block["target_layer_ids"]["hf"] == [2, 4] == config["aux_layers"]["hf"]
    assert (block["vllm_num_speculative_tokens"], block["sglang_num_draft_tokens"]) == (3, 4)
    assert block["served"]["rows"] == 4 and block["served"]["matches_trained_block"]
    assert {e: t["hf"] for e, t in config["aux_layers"]["engines"].items()} == \
        {"sglang": [2, 4], "vllm_v1": [2, 4], "vllm_v2": [2, 4]}
    assert "target_layer_ids [1, 3]" in config["aux_layers"]["source"]
    assert config["vocab_map"]["draft_vocab_size"] == config["vocab_map"]["vocab_size"] == 96
    assert config["embedding"].startswith("target")
    codes = [f["code"] for f in config["sanity"]]
    assert "dflash-checkpoint" in codes and "dflash-block-size" not in codes


def test_a_block_of_another_length_runs_as_asked_and_is_a_finding_naming_both(pair):
    """--num-steps 2 on a block_size 4 draft drafts blocks of 3 rows (as vLLM K = 2 and SGLang num_draft_tokens 3
    would, silently): the loop runs them (lossless), and a finding names 3 rows, the trained 4, K = 3 and D = 4."""
    result = api.evaluate(_settings(pair, num_steps=2), api.LoopOptions(check_lossless=True), progress=False)
    assert [s.output_ids for s in result.samples] == [r.output_ids for r in _reference(pair, "dflash", 2)]
    assert all(s.lossless for s in result.samples)
    (found,) = [f for f in result.report["config"]["sanity"] if f["code"] == "dflash-block-size"]
    assert found["severity"] == "warning"
    assert found["detail"] == {"num_steps": 2, "rows": 3, "trained_block_size": 4, "vllm_num_speculative_tokens": 3,
                               "sglang_num_draft_tokens": 4}
    assert "blocks of 3 rows" in found["message"] and "block_size 4" in found["message"]
    assert result.report["config"]["head"]["block"]["served"]["matches_trained_block"] is False


def test_the_cli_runs_a_dflash_folder_and_echoes_the_block(pair, tmp_path):
    from eagle_eval.cli import main

    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["run", "--target", str(pair["target"]), "--draft", str(pair["dflash"]),
                                    "--prompts", str(pair["prompts"]), "--dtype", "fp32", "--num-steps", "3",
                                    "--max-new-tokens", "12", "--output-dir", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["head"]["kind"] == "dflash"
    assert report["config"]["head"]["block"]["served"]["as_vllm"].startswith("num_speculative_tokens 3")
    assert report["config"]["num_steps"] == 3 and report["config"]["topk"] == 1


def test_settings_a_block_drafter_cannot_take_are_refused_by_name(pair):
    for kw, match in ((dict(topk=2, num_draft_tokens=4), "--topk 2: a block drafter"),
                      (dict(position_offset=1), "--position-offset 1"),
                      (dict(draft_embedding="own"), "--draft-embedding own: .* no 'embed_tokens.weight'")):
        with pytest.raises(ConfigError, match=match):
            api.load_oracle(_settings(pair, **kw))


def test_aux_layers_on_the_command_line_replace_the_configs_taps(pair):
    """What diagnose's sweeps change: --aux-layers (HF 3, 5 here) is tapped, and a finding says the config names
    others, which every engine taps."""
    oracle = api.load_oracle(_settings(pair, aux_layers=(3, 5), aux_convention="hf"))
    assert oracle.resolved.aux.hf == (3, 5) and oracle.speculator.aux_hf == (3, 5)
    (found,) = [f for f in oracle.resolved.sanity if f.code == "dflash-aux-override"]
    assert found.detail == {"tapped": [3, 5], "config_hf": [2, 4]}
    assert oracle.resolved.engines["vllm_v1"].hf == (2, 4)


def test_both_layouts_are_claimed_by_the_dflash_kind_alone(pair, tmp_path):
    from eagle_eval.heads.dflash.io import save_dflash

    spec = save_dflash(random_drafter(dflash_config(layout="speculators"), own_lm_head=True), tmp_path / "spec")
    for folder, layout in ((pair["dflash"], "z-lab"), (pair["dflash2"], "z-lab"), (spec, "speculators")):
        config = json.loads((folder / "config.json").read_text())
        found, dialect = kind_of(config, folder / "config.json")
        assert (found.name, dialect) == ("dflash", layout)
        loaded = load_head(folder)
        assert loaded.kind == "dflash" and loaded.dialect == layout
    with pytest.warns(UserWarning, match="vLLM 0.32 serves the draft layers as causal"):   # speculators' own default
        oracle = api.load_oracle(_settings(pair).with_(draft=str(spec)))
    assert oracle.resolved.head.dialect == "speculators"
    assert oracle.resolved.embedding.startswith("target")       # no own table in this checkpoint
    assert oracle.resolved.vocab_map.d2t == "none (full vocab)"


def test_plan_counts_the_context_kv_of_every_draft_layer(pair):
    """A DFlash draft keeps K and V of the context in every draft layer (the block's are dropped): 2 x L x kv x d
    elements per token; its weights hold no embedding or lm_head in the z-lab layout."""
    from eagle_eval.plan.command import make_plan
    from eagle_eval.settings import PlanOptions

    plan = make_plan(PlanOptions(target=str(pair["target"]), draft=str(pair["dflash"]), gpus=1, gpu_memory="10GiB",
                                 dtype="fp32"))
    assert plan.head["kind"] == "dflash"
    assert plan.head["kv_per_token"] == 2 * 2 * 2 * 32 * 4                  # L 2, kv heads 2, head_dim 32, fp32
    from safetensors import safe_open

    with safe_open(str(pair["dflash"] / "model.safetensors"), "pt") as f:
        stored = sum(f.get_tensor(k).numel() for k in f.keys())
    assert plan.head["bytes"] == 4 * stored


def test_the_trained_drafter_is_not_trivial(pair):
    """What the run tests rely on: the drafter's drafts are accepted often, not always."""
    ref = _reference(pair, "dflash", 3)
    accepted = [n for r in ref for n in r.accepted_per_cycle]
    assert 0 < sum(accepted) < 3 * len(accepted) and len(set(accepted)) >= 3
    assert torch.tensor(accepted).float().mean() > 0.5


def test_run_batched_equals_run_one_prompt_at_a_time_and_says_why_no_graph(pair):
    """`run --batch-size 4` drafts through the kind's batched form (heads/dflash/batched.py) and gives the records
    of --batch-size 1; CUDA graphs, asked for by default, are refused for a block drafter with the reason in
    config.loop (on a machine without CUDA the first reason is that)."""
    from eagle_eval.loop.graphed import capture_blockers

    one = api.evaluate(_settings(pair), progress=False)
    many = api.evaluate(_settings(pair), api.LoopOptions(batch_size=4), progress=False)
    assert [s.to_json() for s in many.samples] == [s.to_json() for s in one.samples]
    loop = many.report["config"]["loop"]
    assert loop["loop"] == "batched" and loop["cuda_graphs"] is False and loop["cuda_graphs_reason"]
    oracle = api.load_oracle(_settings(pair))
    assert "block drafter" in capture_blockers(oracle.speculator, cuda=True)


def test_the_vllm_cpu_convention_runs_in_every_loop_and_is_echoed(pair):
    """--dflash-convention vllm-cpu (heads/dflash/conventions.py; its math is checked against the naive reference in
    tests/test_dflash_loop.py, and against the real server in tests/test_real_vllm_dflash.py): the batched loop and
    the profile (L = 3) give the reference loop's records under it, the records differ from the published
    convention's somewhere, the report echoes the convention with a finding, and a DFlash2 drafter (which vLLM's CPU
    build does not serve) refuses it."""
    from eagle_eval.results.report import render_table
    from eagle_eval.settings import ProfileOptions

    cpu = _settings(pair, dflash_convention="vllm-cpu")
    one = api.evaluate(cpu, api.LoopOptions(check_lossless=True), progress=False)
    many = api.evaluate(cpu, api.LoopOptions(batch_size=4), progress=False)
    assert [s.accepted_per_cycle for s in many.samples] == [s.accepted_per_cycle for s in one.samples]
    assert all(s.lossless for s in one.samples)
    prof = api.profile(cpu, ProfileOptions(max_steps=3), progress=False)
    assert [s.extra["accepted_per_cycle_by_num_steps"]["3"] for s in prof.samples] == \
        [s.accepted_per_cycle for s in one.samples]
    published = api.evaluate(_settings(pair), progress=False)
    assert [s.accepted_per_cycle for s in published.samples] != [s.accepted_per_cycle for s in one.samples]
    config = one.report["config"]
    assert config["dflash_convention"] == "vllm-cpu"
    conv = config["head"]["block"]["convention"]
    assert conv["name"] == "vllm-cpu" and "layer 0" in conv["context_k_norm"]
    assert conv["each_engine"]["vLLM 0.32 dflash, CPU build"] == "vllm-cpu"
    assert conv["each_engine"]["vLLM dflash on CUDA"] == conv["each_engine"]["z-lab dflash"] == "published"
    (found,) = [f for f in config["sanity"] if f["code"] == "dflash-convention"]
    assert found["severity"] == "info" and "kernel defect" in found["message"]
    assert "context keys: draft layer 0's k_norm in every draft layer (--dflash-convention vllm-cpu)" in \
        render_table(one.report)
    assert "dflash-convention" not in [f["code"] for f in published.report["config"]["sanity"]]
    with pytest.raises(ConfigError, match="--dflash-convention vllm-cpu: vLLM's CPU build does not serve DFlash2"):
        api.load_oracle(_settings(pair, "dflash2", dflash_convention="vllm-cpu"))
