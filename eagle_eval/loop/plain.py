"""Plain greedy decoding with `model.generate`, and where a speculative output departs from it.

Contract: `plain_greedy` is the ground truth the loop must reproduce token for token;
`first_divergence` explains a mismatch with the target's own logits (a near-tie is numerics,
a large margin is a logic bug).
"""

from __future__ import annotations

import torch

from eagle_eval.models.target import Target


@torch.no_grad()
def plain_greedy(target: Target, prompt_ids: list[int], max_new_tokens: int, eos_ids: set[int]) -> list[int]:
    from transformers import GenerationConfig

    eos = sorted(eos_ids)        # [] (not None, which falls back to the model's own EOS) = never stop
    gen = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos,
                           pad_token_id=eos[0] if eos else 0, num_beams=1)
    ids = torch.tensor([prompt_ids], device=target.input_device)
    out = target.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen)
    new = out[0, len(prompt_ids):].tolist()
    for i, tok in enumerate(new):       # generate pads after EOS: cut there
        if tok in eos_ids:
            return new[: i + 1]
    return new


@torch.no_grad()
def first_divergence(target: Target, prompt_ids: list[int], speculative: list[int],
                     greedy: list[int]) -> dict | None:
    """None when equal; else position, both tokens and the target's logit margin there."""
    n = min(len(speculative), len(greedy))
    pos = next((i for i in range(n) if speculative[i] != greedy[i]), None)
    if pos is None:
        if len(speculative) == len(greedy):
            return None
        return {"position": n, "reason": "length", "speculative_len": len(speculative),
                "greedy_len": len(greedy)}
    ids = torch.tensor([prompt_ids + greedy[:pos]])
    logits = target.forward(ids, None)[0, -1]
    top2 = logits.topk(2)
    return {"position": pos, "speculative_token": speculative[pos], "greedy_token": greedy[pos],
            "logit_greedy": float(logits[greedy[pos]]), "logit_speculative": float(logits[speculative[pos]]),
            "margin": float(logits[greedy[pos]] - logits[speculative[pos]]),
            "top2_gap": float(top2.values[0] - top2.values[1])}
