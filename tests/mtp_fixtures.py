"""Tiny targets with MTP layers in each family's hub layout, built from configs, for the MTP tests.

A target of family F is built with N + n decoder layers of F's own class; its last n layers become the n MTP blocks
under F's checkpoint names (heads/mtp/layouts.py), with the fusion (two norms, the 2H -> H projection) and the output
norm added, and config.json then counts N layers and n MTP layers. The final norm and every MTP norm have NON-constant
weights (RMSNorm is scale invariant: with constant weights the target's state before and after its final norm feed
an MTP layer the same numbers, and so do its output before and after its norm). `train_mtp` trains the MTP layers
for a few seconds on the target's greedy continuations, teacher-forced under one convention (the pairs of the
profile, two chained steps), so that drafts are accepted often but not always; they are written back with
eagle-eval's own writer (heads/mtp/load.py checkpoint_tensors).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fixtures import VOCAB, save_with_tokenizer

FAMILIES = ("deepseek_v3", "glm4_moe", "qwen3_next", "qwen3_5", "mimo")
ZERO_CENTRED = ("qwen3_next", "qwen3_5")
PROMPT_LEN, NUM_PROMPTS = 6, 8


def family_config(family: str, total: int, hidden: int = 32, head_dim: int = 16, linear_first: bool = False,
                  **over):
    """A transformers config of `family` with `total` decoder layers (the target's N and the n MTP blocks)."""
    from transformers import AutoConfig

    common = dict(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=total, max_position_embeddings=512,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                  initializer_range=0.2)
    moe = dict(moe_intermediate_size=hidden // 2, num_experts_per_tok=2)
    if family == "glm4_moe":
        cfg = AutoConfig.for_model("glm4_moe", intermediate_size=2 * hidden, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=head_dim, partial_rotary_factor=0.5,
                                   n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
                                   topk_group=1, use_qk_norm=False, attention_bias=True, norm_topk_prob=True,
                                   routed_scaling_factor=1.0, **moe, **common)
    elif family == "deepseek_v3":
        cfg = AutoConfig.for_model("deepseek_v3", intermediate_size=2 * hidden, num_attention_heads=2,
                                   num_key_value_heads=2, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
                                   qk_nope_head_dim=8, v_head_dim=8, n_routed_experts=4, n_shared_experts=1,
                                   first_k_dense_replace=1, n_group=1, topk_group=1, routed_scaling_factor=1.0,
                                   rope_scaling=None, **moe, **common)
    elif family in ("qwen3_next", "qwen3_5"):
        kinds = (["linear_attention"] if linear_first else []) + ["full_attention"] * total
        qwen = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=head_dim, linear_num_key_heads=2,
                    linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                    layer_types=kinds[:total], intermediate_size=2 * hidden, **common)
        if family == "qwen3_next":
            cfg = AutoConfig.for_model("qwen3_next", num_experts=4, shared_expert_intermediate_size=hidden // 2,
                                       decoder_sparse_step=1, **moe, **qwen)
        else:
            cfg = AutoConfig.for_model("qwen3_5_text", **qwen)
    elif family == "mimo":
        cfg = AutoConfig.for_model("qwen2", intermediate_size=2 * hidden, num_attention_heads=2, num_key_value_heads=1,
                                   head_dim=head_dim, **common)
    else:
        raise ValueError(family)
    for k, v in over.items():
        setattr(cfg, k, v)
    return cfg


def make_mtp_target(path: Path, family: str, num_layers: int = 2, n_mtp: int = 1, seed: int = 0, hidden: int = 32,
                    head_dim: int = 16, linear_first: bool = False) -> Path:
    """A random `family` target of `num_layers` layers with `n_mtp` MTP layers in its hub layout (module contract)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from eagle_eval.heads.mtp.layouts import LAYOUTS, family_of

    torch.manual_seed(seed)
    cfg = family_config(family, num_layers + n_mtp, hidden, head_dim, linear_first)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    zero = family in ZERO_CENTRED
    with torch.no_grad():
        model.model.norm.weight.copy_((0.0 if zero else 1.0) + 0.5 * torch.randn(hidden))
    save_with_tokenizer(model, path)
    sd = load_file(path / "model.safetensors")
    conf = json.loads((path / "config.json").read_text())
    if family == "mimo":
        conf["architectures"] = ["MiMoForCausalLM"]
    layout = LAYOUTS[family_of(conf)]
    base = 0.0 if zero else 1.0
    for i in range(n_mtp):
        src = f"model.layers.{num_layers + i}."
        dst = layout.block("model.layers", num_layers, i)
        for k in [k for k in sd if k.startswith(src)]:
            sd[dst + k[len(src):]] = sd.pop(k)
        where = layout.fusion_prefix or dst
        if layout.shared and i > 0:
            continue
        emb, hid, proj = layout.fusion
        sd[f"{where}{emb}.weight"] = base + 0.3 * torch.randn(hidden)
        sd[f"{where}{hid}.weight"] = base + 0.3 * torch.randn(hidden)
        sd[f"{where}{proj}.weight"] = torch.randn(hidden, 2 * hidden) / (2 * hidden) ** 0.5
        sd[f"{where}{layout.out_norm}.weight"] = base + 0.5 * torch.randn(hidden)
        for stem in layout.unused:         # DeepSeek / GLM layers carry copies of the target's tables
            table = "model.embed_tokens.weight" if stem == "embed_tokens" else "lm_head.weight"
            sd[f"{dst}{stem}.weight"] = sd[table].clone()
    save_file(sd, path / "model.safetensors", metadata={"format": "pt"})
    conf["num_hidden_layers"] = num_layers
    key = layout.count_key
    conf[key] = n_mtp
    if conf.get("layer_types"):
        conf["layer_types"] = conf["layer_types"][:num_layers]
    (path / "config.json").write_text(json.dumps(conf, indent=2))
    return path


def write_prompts(path: Path, n: int = NUM_PROMPTS, length: int = PROMPT_LEN, seed: int = 3) -> Path:
    g = torch.Generator().manual_seed(seed)
    rows = [{"id": f"p{i}", "category": f"c{i % 2}", "input_ids": [1] + torch.randint(5, VOCAB, (length,),
                                                                                        generator=g).tolist()}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_prompts(path: Path) -> list[list[int]]:
    return [json.loads(line)["input_ids"] for line in Path(path).read_text().splitlines() if line.strip()]


def load_target(path: Path):
    from eagle_eval.models.target import load_target as load

    return load(str(path), dtype="fp32", device_map="cpu")[0]


def greedy_sequences(model, prompts: list[list[int]], new_tokens: int) -> list[torch.Tensor]:
    """Plain greedy continuations, a full forward per token (no cache): [1, P + new_tokens] each."""
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            for _ in range(new_tokens):
                ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], dim=1)
            out.append(ids)
    return out


def train_mtp(path: Path, prompts: list[list[int]], convention: str = "vllm", steps: int = 40, new_tokens: int = 24,
              num_steps: int = 2, lr: float = 1e-2, planted: dict | None = None) -> Path:
    """Train the MTP layers of the target at `path` in place, teacher-forced under `convention` (module contract)."""
    from safetensors.torch import load_file, save_file

    from eagle_eval.heads.mtp.load import load_from_target
    from eagle_eval.heads.mtp.keys import checkpoint_tensors
    from eagle_eval.heads.mtp.wire import tap
    from eagle_eval.heads.mtp.conventions import CONVENTIONS, planted as plant
    from eagle_eval.heads.mtp.model import MTPDraft
    from eagle_eval.heads.mtp.wire import _rotary
    from eagle_eval.profile.unroll import unroll_chains

    torch.manual_seed(0)
    target = load_target(path)
    loaded = load_from_target(target)
    stack = loaded.head.train()
    conv = CONVENTIONS[stack.config.family][convention]
    conv = plant(conv, **planted) if planted else conv
    draft = MTPDraft(stack, conv, target.output_embeddings, _rotary(target))
    for p in target.model.parameters():
        p.requires_grad_(False)
    data = []
    with target.capture([tap(target.num_layers, conv)], "cpu") as cap:
        for seq in greedy_sequences(target.model, prompts, new_tokens):
            with torch.no_grad():
                target.model(seq)
            hidden = cap.pop()[:, :-1]                                        # [1, T-1, H]: x_0..x_{T-2}
            labels = seq[:, 2:]                                                # pair t predicts x_{t+2}
            data.append((hidden, target.input_embeddings(seq[:, 1:]).detach(), labels))
    opt = torch.optim.Adam(stack.parameters(), lr=lr)
    for _ in range(steps):
        loss = 0.0
        for hidden, emb, labels in data:
            for j, logits in enumerate(unroll_chains(draft, hidden, emb, num_steps)):
                loss = loss + torch.nn.functional.cross_entropy(logits[0, j:-1], labels[0, j:]) * 0.7 ** j
        opt.zero_grad()
        loss.backward()
        opt.step()
    stack.eval()
    sd = load_file(path / "model.safetensors")
    sd.update(checkpoint_tensors(stack, target.info.decoder.split('.', 1)[1]))
    save_file(sd, path / "model.safetensors", metadata={"format": "pt"})
    return path


@pytest.fixture(scope="session")
def mtp_targets(tmp_path_factory):
    """family -> (a tiny target with one MTP layer trained a little under vLLM's convention, the prompts file),
    each built once per session (tests/conftest.py shares it)."""
    root = tmp_path_factory.mktemp("mtp")
    prompts = write_prompts(root / "prompts.jsonl")
    made = {}

    def get(family: str):
        if family not in made:
            folder = make_mtp_target(root / family, family)
            train_mtp(folder, read_prompts(prompts)[:6], steps=12)
            made[family] = folder
        return made[family], prompts
    return get
