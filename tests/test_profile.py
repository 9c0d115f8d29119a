"""The teacher-forced profile reproduces the reference loop exactly, for every num_steps."""

import json

import pytest
from fixtures import load_prompts, make_target, train_head, write_prompts

from eagle_eval import api
from eagle_eval.settings import ProfileOptions, Settings
from eagle_eval.loop.plain import plain_greedy
from eagle_eval.profile.teacher_forced import greedy_continuations
from eagle_eval.workload.data import DataError


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny target and a head trained on its greedy outputs: acceptance in between 0 and 1."""
    root = tmp_path_factory.mktemp("trained")
    target = make_target(root / "target", seed=3)
    prompts = write_prompts(root / "prompts.jsonl", n=6, seed=1)
    head = train_head(target, root / "head", prompts, steps=40, num_steps=3)
    return Settings.of(target=str(target), draft=str(head), prompts=str(prompts), max_new_tokens=32)


@pytest.fixture(scope="module")
def profiled(trained):
    return api.profile(trained, ProfileOptions(max_steps=8, batch_tokens=120), progress=False)


@pytest.mark.parametrize("num_steps", [1, 2, 3, 5, 8])
def test_profile_equals_loop(trained, profiled, num_steps):
    loop = api.evaluate(Settings.of(**{**trained.flat(), "num_steps": num_steps, "aux_layers": None}),
                        progress=False)
    section = profiled.report["by_num_steps"][str(num_steps)]
    for a, b in zip(loop.samples, profiled.samples):
        assert a.id == b.id and a.output_ids == b.output_ids
        assert a.accepted_per_cycle == b.extra["accepted_per_cycle_by_num_steps"][str(num_steps)]
    assert section["per_position"] == loop.report["per_position"]
    assert section["histogram"] == loop.report["histogram"]
    assert section["summary"] == loop.report["summary"]


def test_profile_is_not_trivial(profiled):
    """The equality above means something only if acceptance is neither 0 nor 1 everywhere."""
    rates = [p["conditional_rate"] for p in profiled.report["by_num_steps"]["3"]["per_position"]]
    assert 0.1 < rates[0] < 0.95 and rates[0] > 0


def test_batched_continuations_equal_batch_one_greedy(trained):
    oracle = api.load_oracle(trained)
    prompts = [p.input_ids for p in load_prompts(trained.workload.prompts, oracle.tokenizer)]
    batched = greedy_continuations(oracle.speculator, prompts, 20, pad_id=0, batch_tokens=90)
    for p, cont in zip(prompts, batched):
        assert cont == plain_greedy(oracle.speculator.target, p, 20, set())


def test_responses_file_round_trip_and_divergence(trained, profiled, tmp_path):
    rows = [{"id": s.id, "output_ids": s.output_ids} for s in profiled.samples]
    bad = next(i for i, r in enumerate(rows) if len(r["output_ids"]) > 10)
    rows[bad]["output_ids"][5] = (rows[bad]["output_ids"][5] + 1) % 96     # not the target's greedy token
    path = tmp_path / "responses.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = api.profile(trained, ProfileOptions(max_steps=8, responses=str(path)), progress=False)
    div = res.report["response_divergences"]
    assert len(div) == 1 and div[0]["id"] == rows[bad]["id"] and div[0]["position"] == 5
    assert div[0]["continuation_token"] == rows[bad]["output_ids"][5] and div[0]["margin"] > 0
    # the profile then follows the target's greedy sequence, so it equals the generated one
    assert res.report["by_num_steps"] == profiled.report["by_num_steps"]


def test_missing_response_is_an_error(trained, tmp_path):
    path = tmp_path / "responses.jsonl"
    path.write_text(json.dumps({"id": "nope", "output_ids": [5, 6]}) + "\n")
    with pytest.raises(DataError, match="no response for prompt id"):
        api.profile(trained, ProfileOptions(max_steps=2, responses=str(path)), progress=False)


def test_profile_outputs(trained, tmp_path):
    out = tmp_path / "prof"
    run = Settings.of(**{**trained.flat(), "output_dir": str(out), "aux_layers": None})
    api.profile(run, ProfileOptions(max_steps=4), progress=False)
    report = json.loads((out / "profile.json").read_text())
    assert sorted(report["by_num_steps"]) == ["1", "2", "3", "4"]
    for section in report["by_num_steps"].values():
        assert {"summary", "per_position", "histogram"} <= set(section)
    row = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    assert len(row["run_lengths"]) == 32 and sorted(row["accepted_per_cycle_by_num_steps"]) == ["1", "2", "3", "4"]


@pytest.mark.parametrize("topk, draft_tokens", [(2, 6), (3, 10), (4, 16)])
def test_tree_profile_equals_tree_loop(trained, topk, draft_tokens):
    run = Settings.of(**{**trained.flat(), "aux_layers": None, "topk": topk, "num_draft_tokens": draft_tokens})
    prof = api.profile(run, ProfileOptions(max_steps=5), progress=False)
    for s in (2, 3, 5):
        loop = api.evaluate(Settings.of(**{**run.flat(), "aux_layers": None, "num_steps": s}), progress=False)
        for a, b in zip(loop.samples, prof.samples):
            assert a.accepted_per_cycle == b.extra["accepted_per_cycle_by_num_steps"][str(s)]
        section = prof.report["by_num_steps"][str(s)]
        assert section["per_position"] == loop.report["per_position"]
        assert section["summary"]["off_top1_chain_cycles"] == loop.report["summary"]["off_top1_chain_cycles"]


def test_tree_run_lengths_by_hand():
    import torch

    from eagle_eval.profile.unroll import TreePools
    from eagle_eval.profile.teacher_forced import tree_run_lengths

    # one start, K = 2, S = 2: level 1 = [10, 11]; level 2 = children of 0 -> [20, 21], of 1 -> [22, 23]
    pools = TreePools(tokens=torch.tensor([[10, 11, 20, 21, 22, 23]]),
                      scores=torch.tensor([[0.6, 0.4, 0.3, 0.2, 0.25, 0.1]]),
                      parents=torch.tensor([[-1, -1, 0, 0, 1, 1]]), ranks=torch.tensor([[0, 1, 0, 1, 0, 1]]),
                      depths=torch.tensor([[1, 1, 2, 2, 2, 2]]))
    greedy = torch.tensor([[5, 11, 22]])                       # root, then the greedy tokens by depth
    r, off = tree_run_lengths(pools, greedy, 2, 2, num_draft_tokens=5)    # keeps nodes 0, 1, 2, 4
    assert r.tolist() == [2] and off.tolist() == [True]       # 11 (rank 1) -> 22: off the top-1 chain
    r, _ = tree_run_lengths(pools, greedy, 2, 2, num_draft_tokens=4)      # keeps 0, 1, 2: 22 dropped
    assert r.tolist() == [1]
    r, off = tree_run_lengths(pools, torch.tensor([[5, 10, 20]]), 2, 2, num_draft_tokens=4)
    assert r.tolist() == [2] and off.tolist() == [False]
