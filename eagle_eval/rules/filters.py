"""The target's distribution when sampling: temperature and the filters, each engine's primitives, and the random
stream of each prompt.

Contract: `target_probs(logits, decoding)` is p_k of docs/eagle3.md section 8, the distribution a draft is verified
against and the bonus token is sampled from, built as the chosen accept rule's engine builds it (its record's
`probs`, rules/vllm.py, sglang.py, eagle.py; read in the engines' source; penalties, logit bias and grammars are not
modelled). Temperature 0 is greedy (one-hot at the argmax) under every rule. Rows are independent; everything is
float32 and deterministic (no sampling here: the decode policies and the expectations draw from these).
"""

from __future__ import annotations

import torch

from eagle_eval.registry import RULES


def keep_top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of the entries >= the k-th largest of each row (ties at the k-th kept); k <= 0: all."""
    if k <= 0 or k >= scores.shape[-1]:
        return torch.ones_like(scores, dtype=torch.bool)
    kth = scores.topk(k, dim=-1).values[..., -1:]
    return scores >= kth


def keep_top_p_cumsum(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """vLLM / HF: sort ascending, drop the entries whose ascending cumulative sum is <= 1 - p; the largest stays."""
    if top_p >= 1:
        return torch.ones_like(probs, dtype=torch.bool)
    sorted_p, order = probs.sort(dim=-1)
    drop = sorted_p.cumsum(dim=-1) <= 1 - top_p
    drop[..., -1] = False
    return ~drop.scatter(-1, order, drop)


def keep_top_p_pivot(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """SGLang / FlashInfer: the pivot is the first ascending probability whose CDF reaches 1 - p; keep
    probabilities >= the pivot (ties kept)."""
    if top_p >= 1:
        return torch.ones_like(probs, dtype=torch.bool)
    sorted_p, _ = probs.sort(dim=-1)
    first = (sorted_p.cumsum(dim=-1) >= 1 - top_p).float().argmax(dim=-1, keepdim=True)
    pivot = sorted_p.gather(-1, first)
    return probs >= pivot


def renorm(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    kept = probs * keep
    return kept / kept.sum(dim=-1, keepdim=True)


def target_probs(logits: torch.Tensor, decoding) -> torch.Tensor:
    """logits [..., V] -> p [..., V] float32 as `decoding.accept_rule`'s engine builds it (its record's `probs`, which
    takes the logits already divided by the temperature).

    decoding: settings.DecodingSettings (temperature, top_k, top_p, min_p, accept_rule).
    >>> from eagle_eval.settings import DecodingSettings
    >>> z = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    >>> target_probs(z, DecodingSettings(temperature=1.0, top_p=0.8)).tolist()      # vLLM: 0.5 + 0.3 reach 0.8
    [0.625, 0.375, 0.0, 0.0]
    >>> target_probs(z, DecodingSettings(temperature=0.0)).tolist()
    [1.0, 0.0, 0.0, 0.0]
    """
    logits = logits.float()
    if decoding.temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    if decoding.accept_rule not in RULES:
        raise ValueError(f"unknown accept rule {decoding.accept_rule!r}")
    return RULES.get(decoding.accept_rule).probs(logits / decoding.temperature, decoding)


def draft_probs(draft_logits: torch.Tensor, decoding) -> torch.Tensor:
    """q of the rules that sample drafts (vllm-probabilistic, sglang-rs): softmax(z / T) with no filter
    (vLLM `spec_decode` draft sampling; SGLang's rejection sampling path); greedy at temperature 0."""
    logits = draft_logits.float()
    if decoding.temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return (logits / decoding.temperature).softmax(-1)


def prompt_generator(seed: int, prompt_id: str, sample: int = 0, device="cpu") -> torch.Generator:
    """The random stream of one prompt's sample: seeded by (seed, prompt id, sample index) alone, so a run
    reproduces byte for byte whatever the order, batch or process its prompts run in.

    >>> a = torch.rand(2, generator=prompt_generator(0, "q1")); b = torch.rand(2, generator=prompt_generator(0, "q1"))
    >>> bool((a == b).all()), bool((a == torch.rand(2, generator=prompt_generator(0, "q1", 1))).all())
    (True, False)
    """
    import hashlib

    digest = hashlib.sha256(f"{seed}/{prompt_id}/{sample}".encode()).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
