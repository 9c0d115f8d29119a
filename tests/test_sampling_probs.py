"""The target's distribution at temperature > 0, in each engine's filter order (rules/filters.py)."""

import pytest
import torch

from eagle_eval.settings import DecodingSettings
from eagle_eval.rules.filters import draft_probs, target_probs

P = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
Z = P.log()


def _d(rule, **kw):
    return DecodingSettings(temperature=1.0, accept_rule=rule, **kw)


def test_temperature_zero_is_the_argmax_under_every_rule():
    for rule in ("vllm", "vllm-probabilistic", "sglang", "sglang-rs", "eagle"):
        p = target_probs(Z, DecodingSettings(temperature=0.0, top_p=0.5, top_k=3, accept_rule=rule))
        assert p.tolist() == [1.0, 0, 0, 0, 0, 0]


def test_no_filter_is_the_tempered_softmax():
    for rule in ("vllm", "sglang", "eagle"):
        p = target_probs(Z, DecodingSettings(temperature=0.5, accept_rule=rule))
        assert torch.allclose(p, (Z / 0.5).softmax(-1), atol=1e-7)


def test_top_k_then_top_p_differs_from_top_p_then_top_k_by_hand():
    # top-k = 3 keeps 0.40, 0.25, 0.15 (renormalised 0.5, 0.3125, 0.1875); top-p 0.75 on that keeps 0.5 + 0.3125
    vllm = target_probs(Z, _d("vllm", top_k=3, top_p=0.75))
    assert torch.allclose(vllm, torch.tensor([0.40, 0.25, 0, 0, 0, 0]) / 0.65)
    # EAGLE: the nucleus of the FULL distribution at 0.75 is 0.40, 0.25, 0.15 (0.80 >= 0.75); top-k 3 keeps it
    eagle = target_probs(Z, _d("eagle", top_k=3, top_p=0.75))
    assert torch.allclose(eagle, torch.tensor([0.40, 0.25, 0.15, 0, 0, 0]) / 0.80)


def test_min_p_is_vllms_and_not_sglangs():
    vllm = target_probs(Z, _d("vllm", min_p=0.3))          # keeps p >= 0.3 * 0.40 = 0.12
    assert torch.allclose(vllm, torch.tensor([0.40, 0.25, 0.15, 0, 0, 0]) / 0.80)
    assert torch.allclose(target_probs(Z, _d("sglang", min_p=0.3)), P, atol=1e-7)


def test_top_p_boundary_is_each_engines():
    p = torch.tensor([0.5, 0.25, 0.25]).log()
    # ascending cumsum 0.25, 0.5, 1.0; 1 - p = 0.5: vLLM drops cumsum <= 0.5 (both 0.25s), SGLang keeps probs
    # >= the first whose CDF reaches 0.5 (0.25, tied: both kept)
    assert target_probs(p, _d("vllm", top_p=0.5)).tolist() == [1.0, 0.0, 0.0]
    assert torch.allclose(target_probs(p, _d("sglang", top_p=0.5)), torch.tensor([0.5, 0.25, 0.25]))


def test_eagles_order_equals_transformers_own_warpers():
    """EAGLE builds p with HF's TemperatureLogitsWarper, TopPLogitsWarper, TopKLogitsWarper: same p."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    g = torch.Generator().manual_seed(0)
    z = torch.randn(64, 50, generator=g) * 3
    for t, top_p, top_k in ((0.7, 0.9, 5), (1.0, 0.5, 0), (0.3, 1.0, 10), (1.3, 0.95, 40)):
        scores = TemperatureLogitsWarper(t)(None, z.clone())
        if top_p < 1:
            scores = TopPLogitsWarper(top_p)(None, scores)
        if top_k > 0:
            scores = TopKLogitsWarper(top_k)(None, scores)
        want = scores.softmax(-1)
        got = target_probs(z, DecodingSettings(temperature=t, top_p=top_p, top_k=top_k, accept_rule="eagle"))
        assert torch.allclose(got, want, atol=1e-6), (t, top_p, top_k)


@pytest.mark.parametrize("rule", ["vllm", "sglang", "eagle"])
def test_rows_are_distributions(rule):
    z = torch.randn(16, 30, generator=torch.Generator().manual_seed(1))
    p = target_probs(z, _d(rule, top_k=7, top_p=0.8, min_p=0.05))
    assert torch.allclose(p.sum(-1), torch.ones(16)) and (p >= 0).all() and ((p > 0).sum(-1) <= 7).all()


def test_sampled_drafts_are_unfiltered_tempered_softmax():
    z = torch.randn(4, 9, generator=torch.Generator().manual_seed(2))
    d = DecodingSettings(temperature=0.6, top_k=2, top_p=0.5, accept_rule="vllm-probabilistic")
    assert torch.allclose(draft_probs(z, d), (z / 0.6).softmax(-1))
