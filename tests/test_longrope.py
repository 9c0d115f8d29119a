"""A longrope target (Phi-3 style RoPE): transformers gives a whole forward the long factors once its largest
position passes original_max_position_embeddings, so runs stay below that switch (Oracle.limits)."""
import pytest
import torch
from fixtures import make_head, make_target, write_prompts

from eagle_eval import api
from eagle_eval.models.target import load_target
from eagle_eval.settings import LoopOptions, ProfileOptions, Settings
from eagle_eval.workload.data import DataError

SWITCH = 32
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 6,
            "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0], "original_max_position_embeddings": SWITCH}


@pytest.fixture(scope="module")
def longrope(tmp_path_factory):
    root = tmp_path_factory.mktemp("longrope")
    target = make_target(root / "target", num_layers=8, overrides={"rope_parameters": LONGROPE})
    return target, make_head(root / "head", draft_vocab=40), root


def test_a_row_past_the_switch_changes_another_rows_logits_in_transformers(longrope):
    """Why the bound exists: a short row batched with a row past the switch is rotated by the long
    factors; with the other row below the switch it is itself (up to fp32 padding noise)."""
    target, _, _ = longrope
    model = load_target(str(target), dtype="fp32")[0].model
    g = torch.Generator().manual_seed(0)
    short, other = torch.randint(5, 90, (1, 10), generator=g), torch.randint(5, 90, (1, SWITCH + 8), generator=g)
    alone = model(short).logits[0]

    def beside(length):
        ids = torch.zeros(2, length, dtype=torch.long)
        ids[0, :10], ids[1] = short[0], other[0, :length]
        mask = torch.ones_like(ids)
        mask[0, 10:] = 0
        return model(ids, attention_mask=mask).logits[0, :10]

    assert (beside(SWITCH) - alone).abs().max() < 1e-4
    assert (beside(SWITCH + 1) - alone).abs().max() > 0.1


def test_longrope_target_runs_batched_and_lossless_below_the_switch(longrope):
    target, head, root = longrope
    prompts = write_prompts(root / "short.jsonl", n=3, length=6)                  # 7..9 tokens + 8 + 4 + 1 <= 32
    cfg = Settings.of(target=str(target), draft=str(head), prompts=str(prompts), max_new_tokens=8, num_steps=3,
                      dtype="fp32")
    batched = api.evaluate(cfg, LoopOptions(batch_size=2, check_lossless=True), progress=False)
    reference = api.evaluate(cfg, LoopOptions(batch_size=1), progress=False)
    assert batched.report["config"]["loop"]["loop"] == "batched"
    assert all(s.lossless for s in batched.samples)
    assert [s.output_ids for s in batched.samples] == [s.output_ids for s in reference.samples]
    assert batched.report["config"]["target"]["rope_switch"] == SWITCH


def test_longrope_target_is_refused_past_the_switch_in_run_and_profile(longrope):
    target, head, root = longrope
    prompts = write_prompts(root / "long.jsonl", n=1, length=12)                  # 13 tokens + 16 + 4 + 1 > 32
    cfg = Settings.of(target=str(target), draft=str(head), prompts=str(prompts), max_new_tokens=16, num_steps=3,
                      dtype="fp32")
    expected = r"13 tokens; with 21 more .* past the target's 32 positions \(longrope's original_max_position_embeddings 32"
    with pytest.raises(DataError, match=expected):
        api.evaluate(cfg, progress=False)
    with pytest.raises(DataError, match=r"past the target's 32 positions \(longrope's"):
        api.profile(cfg, ProfileOptions(max_steps=3), progress=False)
