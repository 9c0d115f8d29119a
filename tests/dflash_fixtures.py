"""Tiny DFlash / DFlash2 drafters and their Qwen3 target, built from configs for the block-drafter tests.

The target is a random Qwen3 (6 layers, hidden 64, 4 heads x head_dim 32: a head_dim the vLLM CPU build's
attention supports, so the same folders could be served by it), with the repository's tiny tokenizer. A
drafter is random, or TRAINED for a few seconds on the target's greedy continuations of the prompts (every
anchor of every sequence in one teacher-forced block forward per step), so that its drafts are accepted often
but not always and the cycle structure is not trivial. Drafters are saved through eagle-eval's own writer
(heads/dflash/io.py save_dflash).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from fixtures import VOCAB, save_with_tokenizer
from torch.nn import functional as F

MASK = VOCAB - 1                  # a word of the tiny tokenizer: a row of the target's embedding table
TARGET_LAYERS = 6
PROMPT_LEN, NUM_PROMPTS, NEW_TOKENS = 8, 6, 28
DFLASH2_SETTINGS = dict(conv_kernel_size=3, conv_group_size=16, selector_rank=8, selector_top_k=5)


def make_qwen3_target(path: Path, seed: int = 0, max_positions: int = 512) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("qwen3", vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                               num_hidden_layers=TARGET_LAYERS, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=32, max_position_embeddings=max_positions, initializer_range=0.3,
                               tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    return save_with_tokenizer(AutoModelForCausalLM.from_config(cfg, dtype=torch.float32), path)


def dflash_config(kind: str = "dflash", layout: str = "z-lab", **kw):
    from eagle_eval.heads.dflash.config import DFlashConfig

    settings = dict(kind=kind, layout=layout, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, intermediate_size=128, vocab_size=VOCAB, block_size=4,
                    mask_token_id=MASK, target_layer_ids=(1, 3), num_target_layers=TARGET_LAYERS,
                    max_position_embeddings=512, **(DFLASH2_SETTINGS if kind == "dflash2" else {}))
    return DFlashConfig(**{**settings, **kw})


def random_drafter(cfg, seed: int = 1, own_lm_head: bool = False, with_embedding: bool = False):
    """Weights drawn N(0, 0.3) (matrices) and 1 + N(0, 0.2) (norms), so that every tensor changes the drafts."""
    from eagle_eval.heads.dflash.model import DFlashDrafter

    torch.manual_seed(seed)
    drafter = DFlashDrafter(cfg, own_lm_head=own_lm_head, with_embedding=with_embedding)
    with torch.no_grad():
        for p in drafter.parameters():
            p.normal_(0, 0.3) if p.dim() > 1 else p.copy_(1 + 0.2 * torch.randn_like(p))
    return drafter.eval()


def write_prompts(path: Path, n: int = NUM_PROMPTS, seed: int = 5) -> Path:
    g = torch.Generator().manual_seed(seed)
    rows = [[1] + torch.randint(5, VOCAB - 1, (PROMPT_LEN - 1,), generator=g).tolist() for _ in range(n)]
    path.write_text("".join(json.dumps({"id": f"p{i}", "category": "c", "input_ids": r}) + "\n"
                            for i, r in enumerate(rows)))
    return path


def read_prompts(path: Path) -> list[list[int]]:
    return [json.loads(line)["input_ids"] for line in Path(path).read_text().splitlines()]


def train_drafter(drafter, target_path: Path, prompts: list[list[int]], steps: int = 60, lr: float = 3e-3):
    """Fit the drafter to the target's greedy continuations: every anchor s after the prompt, block
    [x_s, m, ..., m] -> x_{s+1..s+B-1}, the context the target's states at positions < s (the loop's context,
    teacher-forced)."""
    from transformers import AutoModelForCausalLM

    cfg = drafter.config
    model = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32).eval()
    block = cfg.block_size
    data = []
    with torch.no_grad():
        for ids in prompts:
            ids = torch.tensor([ids])
            seq = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0,
                                 max_new_tokens=NEW_TOKENS + block, min_new_tokens=NEW_TOKENS + block)
            out = model(seq, output_hidden_states=True)
            aux = torch.cat([out.hidden_states[i + 1] for i in cfg.target_layer_ids], dim=-1)   # [1, T, k*H]
            starts = torch.arange(ids.shape[1], seq.shape[1] - block + 1)                         # [P]
            block_ids = torch.full((len(starts), block), cfg.mask_token_id)
            block_ids[:, 0] = seq[0, starts]
            labels = seq[0, starts[:, None] + torch.arange(1, block)[None]]                      # [P, B-1]
            data.append((aux, starts, block_ids, labels))
    return fit(drafter, model, data, steps, lr)


def fit(drafter, model, data, steps: int, lr: float):
    """Adam on the cross-entropy of the block's drafts (DFlash2: with the selector's pair term, teacher-forced) over
    data = [(aux [1, T, k*H], starts [P], block ids [P, B], labels [P, B-1])], the target's embedding and lm_head."""
    lm_head, embed = model.lm_head, model.get_input_embeddings()
    drafter.train()
    opt = torch.optim.Adam(drafter.parameters(), lr=lr)
    for _ in range(steps):
        loss = 0.0
        for aux, starts, block_ids, labels in data:
            ctx = drafter.context_kv(aux, torch.arange(aux.shape[1]))
            y = drafter.block(embed(block_ids), starts, ctx)[:, 1:]                             # [P, B-1, H]
            logits = lm_head(y)
            if drafter.candidate_selector is not None:    # the selector's pair term too, teacher-forced
                sel = drafter.candidate_selector
                prev = torch.cat([block_ids[:, :1], labels[:, :-1]], dim=1)                      # [P, B-1]
                gate = sel.predecessor_codebook[prev] * sel.hidden_projection(y)                 # [P, B-1, r]
                logits = logits + gate @ sel.successor_codebook.T
            loss = loss + F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return drafter.eval()


def train_on_successors(drafter, model, successor: torch.Tensor, steps: int, lr: float = 1e-2, seed: int = 0):
    """Fit the drafter to a bigram target (its next token a function of the last one: `successor` [V]): every
    token a of the vocabulary as an anchor, labels successor^j(a) for j = 1..B-1 (what the target's greedy decoding
    emits after a), over the context of one random sequence. The model on the CPU."""
    cfg = drafter.config
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(3, VOCAB, (1, 8), generator=g)
    with torch.no_grad():
        states = model(seq, output_hidden_states=True).hidden_states
        aux = torch.cat([states[i + 1] for i in cfg.target_layer_ids], dim=-1)
    anchors = torch.arange(VOCAB)
    labels, x = [], anchors
    for _ in range(cfg.block_size - 1):
        x = successor[x]
        labels.append(x)
    block_ids = torch.full((VOCAB, cfg.block_size), cfg.mask_token_id)
    block_ids[:, 0] = anchors
    starts = torch.randint(1, 8, (VOCAB,), generator=g)
    return fit(drafter, model, [(aux, starts, block_ids, torch.stack(labels, dim=1))], steps, lr)


def block_speculator(target_path: Path, draft_path: Path, policy=None):
    """The reference loop's Speculator over a loaded target and a DFlash draft folder: the head bound to the
    target (its embedding and lm_head), the taps l + 1, and BlockDraftState as the draft's side."""
    from transformers import AutoModelForCausalLM

    from eagle_eval.heads.dflash.bind import bind
    from eagle_eval.heads.dflash.io import load_dflash
    from eagle_eval.heads.dflash.state import BlockDraftState
    from eagle_eval.models.target import Target
    from eagle_eval.loop.reference import Speculator
    from eagle_eval.loop.policy import GREEDY

    target = Target(AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32), str(target_path))
    head, _ = bind(load_dflash(draft_path), target)
    return Speculator(target=target, head=head, embed=head.embed, aux_hf=head.config.aux_hf,
                      policy=policy or GREEDY, draft_state=BlockDraftState)


def dflash_pair(root: Path, kinds=("dflash",), steps: dict | None = None, max_positions: int = 512,
                num_prompts: int = NUM_PROMPTS) -> dict:
    """A target folder, a prompts file and, per kind asked for, a drafter trained a few seconds and saved in the
    z-lab layout: {"target", "prompts" (the file), "prompt_ids", kind: folder}."""
    from eagle_eval.heads.dflash.io import save_dflash

    training = {"dflash": dict(steps=20, lr=6e-3), "dflash2": dict(steps=10, lr=1e-2), **(steps or {})}
    target = make_qwen3_target(root / "target", max_positions=max_positions)
    prompts = write_prompts(root / "prompts.jsonl", n=num_prompts)
    out = {"target": target, "prompts": prompts, "prompt_ids": read_prompts(prompts)}
    for kind in kinds:
        drafter = train_drafter(random_drafter(dflash_config(kind)), target, out["prompt_ids"], **training[kind])
        out[kind] = save_dflash(drafter, root / kind)
    return out
