"""Head-training data: the target's greedy answers with their aux features, captured once while generating.

Contract: `generate_split` runs the fp32 target's greedy `generate` (left-padded batches, at most
`max_new_tokens`, cut after eos) with `output_hidden_states`, and keeps, per token, the aux features
HF[i] for the aux layers (the prompt's from the prefill forward, each answer token's from the decode
step that consumed it) and the target's argmax after it, which for greedy decoding is the next token.
Each batch is written to its own safetensors file as soon as it is done (an interrupted build resumes
at the next batch); `load_split` concatenates them into one `Split`:

| key | shape | what |
|---|---|---|
| `ids` | [N] int64 | all tokens, sequences back to back |
| `aux` | [N, k*H_t] float32 | HF[i], i in the aux layers, low -> high (pre-norm residual stream); a sequence's last token has none (zeros) |
| `argmax` | [N] int64 | the target's argmax after each token: the next token, from the last prompt token on; -1 before it (never a label) |
| `offsets` | [S+1] int64 | sequence s is `offsets[s]:offsets[s+1]` |
| `prompt_len` | [S] int64 | prompt tokens of sequence s |

`check_against_teacher_forced` compares a few sequences with one teacher-forced forward (the capture
that eagle-eval's profile does). `head_batches_from` turns a split into build_bundled `HeadBatch`es:
pair q = (feature of x_q, token x_{q+1}), label = the target's argmax after x_{q+1}, -1 where x_{q+2}
does not exist.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import build_bundled as bb

FILE_KEYS = ("ids", "aux", "argmax", "offsets", "prompt_len")


@dataclass(frozen=True)
class Split:
    ids: torch.Tensor
    aux: torch.Tensor
    argmax: torch.Tensor
    offsets: torch.Tensor
    prompt_len: torch.Tensor


@torch.no_grad()
def generate_batch(model, prompts: list[list[int]], aux_hf: tuple, max_new_tokens: int, pad_id: int,
                   eos_id: int) -> dict:
    """One left-padded greedy batch -> the flat tensors of FILE_KEYS for its sequences."""
    t = max(len(p) for p in prompts)
    x = torch.tensor([[pad_id] * (t - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (t - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(x, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                         output_hidden_states=True, return_dict_in_generate=True)
    new = out.sequences[:, t:]                                          # [B, steps]
    hs = out.hidden_states          # per step: HF[0..N] tuple; step 0 = prefill [B, t, H], then [B, 1, H]
    prefill = torch.cat([hs[0][i] for i in aux_hf], dim=-1)             # [B, t, k*H]
    decode = torch.cat([torch.cat([s[i] for i in aux_hf], dim=-1) for s in hs[1:]], dim=1) \
        if len(hs) > 1 else prefill[:, :0]                              # [B, steps - 1, k*H]
    rows = {k: [] for k in FILE_KEYS}
    lengths = []
    for b, p in enumerate(prompts):
        answer = new[b].tolist()
        answer = answer[:answer.index(eos_id) + 1] if eos_id in answer else answer
        n_p, n_a = len(p), len(answer)
        feats = torch.zeros(n_p + n_a, prefill.shape[-1])
        feats[:n_p] = prefill[b, t - n_p:]
        feats[n_p:n_p + n_a - 1] = decode[b, :n_a - 1]                  # the last token was never consumed
        argmax = torch.full((n_p + n_a,), -1, dtype=torch.long)
        argmax[n_p - 1:n_p + n_a - 1] = torch.tensor(answer)            # greedy: argmax after x_q = x_{q+1}
        rows["ids"].append(torch.tensor(p + answer))
        rows["aux"].append(feats)
        rows["argmax"].append(argmax)
        rows["prompt_len"].append(n_p)
        lengths.append(n_p + n_a)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), 0)
    return {"ids": torch.cat(rows["ids"]), "aux": torch.cat(rows["aux"]), "argmax": torch.cat(rows["argmax"]),
            "offsets": offsets, "prompt_len": torch.tensor(rows["prompt_len"])}


def generate_split(model, tokenizer, batches: list[list], encode, aux_hf: tuple, max_new_tokens: int,
                   folder: Path, log) -> None:
    """Every batch of instructions -> folder/batch-KKK.safetensors (+ its answers as text in a .jsonl)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    for k, items in enumerate(batches):
        path = folder / f"batch-{k:03d}.safetensors"
        if path.exists():
            continue
        prompts = [encode(tokenizer, i.text) for i in items]
        t = time.time()
        data = generate_batch(model, prompts, aux_hf, max_new_tokens, tokenizer.pad_token_id,
                              tokenizer.eos_token_id)
        tmp = path.with_suffix(".partial")
        save_file(data, str(tmp))
        os.replace(tmp, path)
        offsets = data["offsets"].tolist()
        with open(folder / f"batch-{k:03d}.jsonl", "w") as f:
            for s, item in enumerate(items):
                answer = data["ids"][offsets[s] + int(data["prompt_len"][s]):offsets[s + 1]]
                f.write(json.dumps({"id": item.id, "category": item.category, "prompt": item.text,
                                    "answer": tokenizer.decode(answer)}) + "\n")
        n_new, seconds = int(data["ids"].numel() - data["prompt_len"].sum()), time.time() - t
        (folder / f"batch-{k:03d}.json").write_text(json.dumps({"answers": len(items), "new_tokens": n_new,
                                                                "seconds": round(seconds, 1)}) + "\n")
        log(f"  {folder.name} batch {k + 1}/{len(batches)}: {len(items)} answers, {n_new} new tokens, "
            f"{n_new / seconds:.0f} tokens/s")


def load_split(folder: Path) -> Split:
    from safetensors.torch import load_file

    parts = [load_file(str(p)) for p in sorted(folder.glob("batch-*.safetensors"))]
    base = torch.tensor([0] + [int(p["offsets"][-1]) for p in parts]).cumsum(0)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long)] + [p["offsets"][1:] + base[i] for i, p in enumerate(parts)])
    return Split(ids=torch.cat([p["ids"] for p in parts]), aux=torch.cat([p["aux"] for p in parts]),
                 argmax=torch.cat([p["argmax"] for p in parts]), offsets=offsets,
                 prompt_len=torch.cat([p["prompt_len"] for p in parts]))


@torch.no_grad()
def check_against_teacher_forced(model, split: Split, aux_hf: tuple, sequences: int) -> dict:
    """The first `sequences` sequences again through one teacher-forced forward each: the largest
    relative feature difference and the share of positions whose argmax equals the stored one."""
    worst, same, total = 0.0, 0, 0
    for s in range(min(sequences, split.prompt_len.numel())):
        a, b = int(split.offsets[s]), int(split.offsets[s + 1])
        res = model(input_ids=split.ids[a:b][None], output_hidden_states=True)
        tf = torch.cat([res.hidden_states[i][0] for i in aux_hf], dim=-1)[:-1]     # [n-1, k*H]
        stored = split.aux[a:b - 1]
        worst = max(worst, float(((tf - stored).norm(dim=-1) / tf.norm(dim=-1)).max()))
        want = split.argmax[a:b]
        known = want >= 0
        same += int((res.logits[0].argmax(-1)[known] == want[known]).sum())
        total += int(known.sum())
    return {"sequences": min(sequences, split.prompt_len.numel()), "max_relative_feature_diff": worst,
            "argmax_agreement": same / max(total, 1), "positions": total}


def head_batches_from(split: Split, aux_hf: tuple, batch_tokens: int, hidden_size: int) -> list:
    """Length-bucketed `bb.HeadBatch`es over the split (at most `batch_tokens` padded tokens each)."""
    examples, index = [], {}
    for s in range(split.prompt_len.numel()):
        a, b = int(split.offsets[s]), int(split.offsets[s + 1])
        e = bb.Example(split.ids[a:b], int(split.prompt_len[s]))
        index[id(e)] = (a, b)
        examples.append(e)
    batches = []
    for bucket in bb.length_batches(examples, batch_tokens):
        t1 = max(e.ids.numel() for e in bucket)                        # T + 1 tokens
        ids = torch.zeros(len(bucket), t1, dtype=torch.long)
        aux = torch.zeros(len(bucket), t1 - 1, split.aux.shape[1])
        labels = torch.full((len(bucket), t1 - 1), -1, dtype=torch.long)
        for row, e in enumerate(bucket):
            a, b = index[id(e)]
            n = b - a
            ids[row, :n] = split.ids[a:b]
            aux[row, :n - 1] = split.aux[a:b - 1]
            labels[row, :n - 2] = split.argmax[a + 1:b - 1]           # pair q: argmax after x_{q+1}, q + 2 < n
        hidden = {h: aux[..., k * hidden_size:(k + 1) * hidden_size] for k, h in enumerate(aux_hf)}
        batches.append(bb.HeadBatch(ids=ids, hidden=hidden, labels=labels,
                                    first_start=torch.tensor([e.prompt_len - 1 for e in bucket])))
    return batches
