"""Tiny models built from configs for the tests: targets of several families, heads of each layout."""

from __future__ import annotations

import json
from pathlib import Path

import torch

VOCAB = 96


def make_tokenizer(vocab_size: int = VOCAB):
    """A word-level tokenizer over 'w0'..'wN' plus specials, with a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>"]
    words = specials + [f"w{i}" for i in range(vocab_size - len(specials))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|> {% endif %}")
    return fast


def make_target(path: Path, family: str = "llama", num_layers: int = 8, hidden: int = 48, seed: int = 0,
                eos_token_id: int | None = None, overrides: dict | None = None) -> Path:
    """Save a random tiny causal LM (fp32) and a tokenizer to `path`; `overrides` replace config fields."""
    from transformers import AutoConfig, AutoModelForCausalLM

    common = {**dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=num_layers,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                     initializer_range=0.3, tie_word_embeddings=False, bos_token_id=1,
                     eos_token_id=eos_token_id if eos_token_id is not None else 2, pad_token_id=0),
              **(overrides or {})}
    if family == "llama":
        cfg = AutoConfig.for_model("llama", **common)
    elif family == "qwen3":
        cfg = AutoConfig.for_model("qwen3", head_dim=12, **common)
    elif family == "qwen2":
        cfg = AutoConfig.for_model("qwen2", **common)
    elif family == "deepseek_v3":
        cfg = AutoConfig.for_model(
            "deepseek_v3", **{**dict(moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                                     n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None,
                                     qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12, n_group=1, topk_group=1,
                                     rope_scaling=None), **common, "num_key_value_heads": 4})
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    return save_with_tokenizer(AutoModelForCausalLM.from_config(cfg, dtype=torch.float32), path)


def save_with_tokenizer(model, path: Path) -> Path:
    """Save `model` and the tiny test tokenizer to `path` (a target folder)."""
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    make_tokenizer().save_pretrained(path)
    return path


def head_config(target_hidden: int = 48, hidden: int = 48, draft_vocab: int = VOCAB, **kw):
    from eagle_eval.heads.eagle3.layer import HeadConfig

    return HeadConfig(hidden_size=hidden, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                      intermediate_size=64, vocab_size=VOCAB, draft_vocab_size=draft_vocab,
                      target_hidden_size=target_hidden, **kw)


def make_head(path: Path, dialect: str = "specforge", seed: int = 1, aux_ids_sglang=None,
              draft_vocab: int = VOCAB, with_embedding: bool = False, **kw) -> Path:
    from eagle_eval.heads.io import save_head, vocab_map_from_used
    from eagle_eval.heads.eagle3.layer import Eagle3Head

    torch.manual_seed(seed)
    head = Eagle3Head(head_config(draft_vocab=draft_vocab, **kw), with_embedding=with_embedding)
    for p in head.parameters():        # visible weights so that drafts depend on the inputs
        torch.nn.init.normal_(p, std=0.3) if p.dim() > 1 else None
    if draft_vocab < VOCAB:
        used = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed))[:draft_vocab]
        d2t, t2d = vocab_map_from_used(used, VOCAB)
        head.d2t.copy_(d2t)
        head.t2d.copy_(t2d)
    save_head(head, path, aux_layer_ids_sglang=aux_ids_sglang, dialect=dialect)
    return path


def write_prompts(path: Path, n: int = 4, length: int = 6, seed: int = 0) -> Path:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        ids = [1] + (torch.randint(5, VOCAB, (length + i,), generator=g)).tolist()
        rows.append({"id": f"p{i}", "category": "cat" + str(i % 2), "input_ids": ids})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def train_head(target_path: Path, head_path: Path, prompts_file: Path, aux_hf=(2, 4, 5), steps: int = 150,
               num_steps: int = 3, new_tokens: int = 40, seed: int = 0, draft_vocab: int = VOCAB,
               head_kw: dict | None = None, dialect: str = "specforge", head_cfg=None) -> Path:
    """A small head trained (seconds, CPU) on the tiny target's own greedy continuations of the
    prompts, so that acceptance is far from 0 and from 1 and falls by position. `head_kw`: HeadConfig
    variant settings; an aux index N (boundary convention) is the final norm's input, HF[N] is not, and
    then no ids are written to the config (pass them with --aux-convention boundary). `head_cfg`: a whole
    HeadConfig instead (e.g. an MLA head, written with dialect 'mla')."""
    from transformers import AutoModelForCausalLM

    from eagle_eval.heads.io import save_head
    from eagle_eval.heads.eagle3.layer import Eagle3Head
    from eagle_eval.heads.mla.layer import build_head
    from eagle_eval.profile.unroll import unroll_chains

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32).eval()
    seqs = []
    for row in json.loads("[" + ",".join(Path(prompts_file).read_text().split("\n")[:-1]) + "]"):
        ids = torch.tensor([row["input_ids"]])
        with torch.no_grad():
            for _ in range(new_tokens):
                nxt = model(ids).logits[:, -1].argmax(-1, keepdim=True)
                ids = torch.cat([ids, nxt], dim=1)
        seqs.append(ids)
    head = (build_head(head_cfg) if head_cfg is not None
            else Eagle3Head(head_config(draft_vocab=draft_vocab, **(head_kw or {}))))
    n = model.config.num_hidden_layers
    prenorm = []
    model.model.norm.register_forward_pre_hook(lambda module, args: prenorm.append(args[0]))
    opt = torch.optim.Adam(head.parameters(), lr=3e-3)
    data = []
    with torch.no_grad():
        for ids in seqs:
            prenorm.clear()
            out = model(ids, output_hidden_states=True)
            states = list(out.hidden_states[:n]) + prenorm           # index n: before the final norm
            aux = torch.cat([states[i] for i in aux_hf], dim=-1)[:, :-1]
            labels = out.logits.argmax(-1)[:, 1:]                 # y[q] = argmax after x_{q+1} ~ x_{q+2}
            data.append((aux, model.get_input_embeddings()(ids[:, 1:]), labels))
    for _ in range(steps):
        loss = 0.0
        for aux, emb, labels in data:
            for j, logits in enumerate(unroll_chains(head, aux, emb, num_steps)):
                loss = loss + torch.nn.functional.cross_entropy(logits[0, j:], labels[0, j:]) * 0.8 ** j
        opt.zero_grad()
        loss.backward()
        opt.step()
    ids = None if n in aux_hf else [i - 1 for i in aux_hf]
    save_head(head, head_path, aux_layer_ids_sglang=ids, dialect=dialect)
    return head_path


def load_prompts(path, tokenizer) -> list:
    """The prompts of a prompt JSONL, rendered by the product's own path (`conversations.load_workload`)."""
    from eagle_eval.settings import Settings
    from eagle_eval.workload.conversations import load_workload

    return load_workload(Settings.of(prompts=str(path)).workload, tokenizer).first_prompts


def add_decoder_layer(src: Path, dst: Path, std: float = 0.25, seed: int = 1) -> Path:
    """A copy of the head folder `src` (SpecForge layout, one layer) at `dst` with a second decoder layer, as vLLM's
    multi-layer EAGLE-3 LlamaModel loads it: `layers.1.*` (an ordinary Llama layer over H, unit norms, seeded
    weights of `std`) and num_hidden_layers 2; layer 0 stays `midlayer.`."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = load_file(str(dst / "model.safetensors"))
    cfg = json.loads((dst / "config.json").read_text())
    h, kv = cfg["hidden_size"], cfg["num_key_value_heads"] * cfg["head_dim"]
    q, i = cfg["num_attention_heads"] * cfg["head_dim"], cfg["intermediate_size"]
    g = torch.Generator().manual_seed(seed)
    weights.update({f"layers.1.{n}.weight": torch.ones(h) for n in ("input_layernorm", "post_attention_layernorm")})
    for name, shape in (("self_attn.q_proj", (q, h)), ("self_attn.k_proj", (kv, h)), ("self_attn.v_proj", (kv, h)),
                        ("self_attn.o_proj", (h, q)), ("mlp.gate_proj", (i, h)), ("mlp.up_proj", (i, h)),
                        ("mlp.down_proj", (h, i))):
        weights[f"layers.1.{name}.weight"] = torch.randn(*shape, generator=g) * std
    save_file(weights, str(dst / "model.safetensors"))
    (dst / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 2}, indent=2))
    return dst
