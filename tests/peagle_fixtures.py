"""A tiny P-EAGLE head (an EAGLE-3 head with `mask_hidden` and a mask token id) and its Llama target, for the
parallel-drafting tests.

The head is TRAINED for a few seconds on the target's own predictions: every start s of every sequence, slot 0
(the last real pair's row) and K - 1 mask rows (mask token, fc(mask_hidden)) in one causal forward, each slot i
labelled with the target's argmax at s + i, so that its drafts are accepted often but not always. `mask_hidden`
is trained with the rest. Saved through eagle-eval's own writer (heads/io.py save_head).
"""

from __future__ import annotations

from pathlib import Path

import torch
from fixtures import VOCAB, head_config, make_target, write_prompts

MASK = VOCAB - 1                   # a word of the tiny tokenizer: a row of the target's embedding table
AUX_HF = (2, 4, 5)                 # HF hidden_states indices the head taps (SGLang ids 1, 3, 4)
K_TRAINED = 4


def _mask_logits(head, embed, outs, cache, starts, count):
    """Logits [P, count, V_d] of the mask rows of every start (differentiable; heads/peagle/all_starts.py's math),
    every layer of a multi-layer head over its own cache of the real pairs."""
    from eagle_eval.heads.protocol import above

    p, n1 = len(starts), cache.keys.shape[2]
    ids = torch.full((p, count), head.config.mask_token_id)
    hidden = head.fuse(head.mask_hidden[None]).expand(p, count, -1)
    positions = starts[:, None] + torch.arange(count)
    u, residual = head.attention_input(embed(ids), hidden, positions)
    cos, sin = head.rope(positions)
    q, k, v = head.attention.project(u, cos, sin)
    real = torch.arange(n1)[None, None, :] < starts[:, None, None]
    own = torch.ones(count, count, dtype=torch.bool).tril()[None]
    visible = torch.cat([real.expand(p, count, n1), own.expand(p, -1, -1)], dim=2)

    def attend(layer, attn, q, k, v, u):
        past = cache.layer(layer)
        keys = torch.cat([past.keys.expand(p, -1, -1, -1), k], dim=2)
        values = torch.cat([past.values.expand(p, -1, -1, -1), v], dim=2)
        return attn.attend(q, keys, values, visible[:, None], u)

    return head.logits(above(head, head.finish(residual, attend(0, head.attention, q, k, v, u)), cos, sin, attend))


def train_peagle(target_path: Path, prompts: list[list[int]], steps: int = 30, new_tokens: int = 24,
                 k: int = K_TRAINED, seed: int = 0, lr: float = 3e-3, layers: int = 1):
    from transformers import AutoModelForCausalLM

    from eagle_eval.heads.eagle3.layer import DraftCache, Eagle3Head

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32).eval()
    embed = model.get_input_embeddings()
    data = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            for _ in range(new_tokens):
                ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            out = model(ids, output_hidden_states=True)
            aux = torch.cat([out.hidden_states[i] for i in AUX_HF], dim=-1)
            data.append((aux, ids[0], out.logits[0].argmax(-1)))
    head = Eagle3Head(head_config(parallel_drafting=True, mask_token_id=MASK, num_hidden_layers=layers))
    head.mask_hidden.normal_(std=1.0)
    head.mask_hidden.requires_grad_(True)
    opt = torch.optim.Adam([*head.parameters(), head.mask_hidden], lr=lr)
    for _ in range(steps):
        loss = 0.0
        for aux, tokens, argmax in data:
            n = len(tokens)
            cache = DraftCache()
            outs = head.step(embed(tokens[None, 1:]), head.fuse(aux[:, :-1]), torch.arange(n - 1)[None], cache)
            loss = loss + torch.nn.functional.cross_entropy(head.logits(outs)[0], argmax[1:])      # slot 0
            starts = torch.arange(1, n - k + 1)
            logits = _mask_logits(head, embed, outs, cache, starts, k - 1)
            labels = argmax[starts[:, None] + 1 + torch.arange(k - 1)]
            loss = loss + torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    head.mask_hidden.requires_grad_(False)
    return head.eval()


def peagle_pair(root: Path, num_prompts: int = 6, layers: int = 1) -> dict:
    """{"target", "prompts" (the file), "prompt_ids", "head" (the trained head), "specforge" (its folder)}."""
    import json

    from eagle_eval.heads.io import save_head

    target = make_target(root / "target")
    prompts_file = write_prompts(root / "prompts.jsonl", n=num_prompts, length=6)
    prompt_ids = [json.loads(line)["input_ids"] for line in prompts_file.read_text().splitlines()]
    head = train_peagle(target, prompt_ids, layers=layers)
    folder = root / "specforge"
    save_head(head, folder, aux_layer_ids_sglang=[i - 1 for i in AUX_HF])
    return {"target": target, "prompts": prompts_file, "prompt_ids": prompt_ids, "head": head, "specforge": folder}
