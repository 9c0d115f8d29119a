"""A tiny target plus a head TRAINED on its greedy answers to the test prompts (a few seconds on CPU).

A random head accepts almost nothing, so every wiring fault looks alike. This head memorises the
target's continuations of these prompts through all its inputs (aux features, token embeddings,
positions), so the faithful wiring accepts nearly every draft and each usual fault (aux taps moved,
embedding output for the lowest tap, draft position offset) costs a visible, prompt-specific amount.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from fixtures import VOCAB, head_config, make_target
from torch.nn import functional as F

NUM_PROMPTS, PROMPT_LEN, NEW_TOKENS, NUM_STEPS = 8, 8, 24, 3
AUX_HF = (2, 4, 5)            # the default taps of an 8-layer target


def build_trained(root: Path, train_steps: int = 150) -> dict:
    from transformers import AutoModelForCausalLM

    from eagle_eval.heads.io import save_head
    from eagle_eval.heads.eagle3.layer import Eagle3Head
    from eagle_eval.profile.unroll import unroll_chains

    target_path = make_target(root / "target")
    model = AutoModelForCausalLM.from_pretrained(target_path).eval()
    g = torch.Generator().manual_seed(5)
    prompts = torch.cat([torch.ones(NUM_PROMPTS, 1, dtype=torch.long),
                         torch.randint(5, VOCAB, (NUM_PROMPTS, PROMPT_LEN - 1), generator=g)], dim=1)
    extra = NEW_TOKENS + NUM_STEPS + 2              # the chains near the end draft past max_new_tokens
    with torch.no_grad():
        seq = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                             max_new_tokens=extra, min_new_tokens=extra, pad_token_id=0)   # [B, P+extra]
        out = model(seq, output_hidden_states=True)
        aux = torch.cat([out.hidden_states[i] for i in AUX_HF], dim=-1)[:, :-1]            # x_0..x_{T-1}
        token_embeds = model.get_input_embeddings()(seq[:, 1:])                            # x_1..x_T
        labels = out.logits.argmax(-1)[:, 1:]       # at pair q: the target's argmax after x_{q+1}
    torch.manual_seed(11)
    head = Eagle3Head(head_config())
    with torch.no_grad():
        head.fc.weight.normal_(0, 0.05)
    opt = torch.optim.Adam(head.parameters(), lr=5e-3)
    start = PROMPT_LEN - 2                          # the first pair whose label is a generated token
    for _ in range(train_steps):
        loss = 0.0
        for j, logits in enumerate(unroll_chains(head, aux, token_embeds, NUM_STEPS)):
            loss = loss + 0.8 ** j * F.cross_entropy(logits[:, start + j:].reshape(-1, VOCAB),
                                                     labels[:, start + j:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_head(head, root / "head")
    prompts_file = root / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps({"id": f"p{i}", "category": "train", "input_ids": row.tolist()})
                                    + "\n" for i, row in enumerate(prompts)))
    return {"target": target_path, "head": root / "head", "prompts": prompts_file, "root": root}


_BUILT: dict = {}


def trained(tmp_path_factory) -> dict:
    """Build once per test session, whichever test module asks first."""
    if "paths" not in _BUILT:
        _BUILT["paths"] = build_trained(tmp_path_factory.mktemp("trained"))
    return _BUILT["paths"]
