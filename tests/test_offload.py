"""A target bigger than the device: with --max-memory leaving too little room, accelerate puts the rest on
the CPU or the disk, and the loop's tokens equal the whole-on-one-device run's.

On this machine the device is the CPU itself, so the split is cpu + disk (the GPU half, GPU + cpu, is
benchmarks/bench_offload.py on the H200). The packed INT4 targets have the same test in test_int4.py.
"""

import pytest
from fixtures import make_head, make_target, write_prompts

from eagle_eval import api
from eagle_eval.settings import ProfileOptions, Settings
from eagle_eval.models.quant.int4_load import checkpoint_tensors


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("offload")
    return {family: make_target(root / family, family=family, num_layers=4) for family in ("llama", "deepseek_v3")} | {
        "head": make_head(root / "head"), "prompts": write_prompts(root / "prompts.jsonl", n=3)}


@pytest.mark.parametrize("family", ["llama", "deepseek_v3"])
def test_cpu_and_disk_placement_gives_the_same_tokens_and_profile(pair, family):
    base = dict(target=str(pair[family]), draft=str(pair["head"]), prompts=str(pair["prompts"]), max_new_tokens=16,
                num_steps=3, aux_layers=(0, 1, 2), aux_convention="hf", dtype="fp32")
    whole = api.evaluate(Settings.of(**base, device_map="cpu"), progress=False)
    size = sum(e.nbytes for e in checkpoint_tensors(pair[family]).values())
    split_cfg = Settings.of(**base, device_map="auto", max_memory=f"cpu={size // 2}B")
    split = api.evaluate(split_cfg, progress=False)
    assert split.report["config"]["target"]["devices"] == ["cpu", "disk"]
    assert whole.report["config"]["target"]["devices"] == ["cpu"]
    assert [s.output_ids for s in split.samples] == [s.output_ids for s in whole.samples]
    assert split.report["histogram"] == whole.report["histogram"]
    prof = api.profile(split_cfg, ProfileOptions(max_steps=3, batch_tokens=64), progress=False)
    assert prof.report["by_num_steps"]["3"]["per_position"] == whole.report["per_position"]
