"""The target wrapper: the one cache operation the loop uses, and placement options."""

import pytest
import torch

from eagle_eval.models.target import Target, TargetError, device_map_arg, parse_max_memory


def test_rollback_then_recompute_matches_a_fresh_forward(tiny):
    from transformers import AutoModelForCausalLM

    target = Target(AutoModelForCausalLM.from_pretrained(tiny["target"], dtype=torch.float32))
    ids = torch.randint(5, 90, (1, 10))
    full = target.forward(ids, target.new_cache())
    cache = target.new_cache()
    target.forward(ids[:, :7], cache)
    target.forward(torch.randint(5, 90, (1, 3)), cache)      # speculative tokens, rejected
    Target.rollback(cache, 7)
    assert Target.cache_len(cache) == 7
    again = target.forward(ids[:, 7:], cache)
    assert torch.allclose(again, full[:, 7:], atol=1e-4), (again - full[:, 7:]).abs().max()
    Target.rollback(cache, 10)                                # no-op
    with pytest.raises(ValueError, match="forward"):
        Target.rollback(cache, 11)


def test_placement_options():
    assert parse_max_memory("0=70GiB, 1=70GiB,cpu=100GiB") == {0: 70 * 2**30, 1: 70 * 2**30, "cpu": 100 * 2**30}
    assert parse_max_memory(None) is None
    with pytest.raises(TargetError, match="DEVICE=SIZE"):
        parse_max_memory("70GiB")
    assert device_map_arg("auto") == "auto" and device_map_arg("cuda:1") == {"": "cuda:1"}
    with pytest.raises(TargetError, match="--device-map"):
        device_map_arg("tpu")
