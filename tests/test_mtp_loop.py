"""MTP layers in the loop, against a naive reference written here: no cache, plain forwards, every draft step
recomputing every row (heads/mtp is not used by the reference).

The reference block is the target family's own decoder layer as transformers itself loads it: the checkpoint is read
by `from_pretrained` into a model one layer deeper, so the MTP block is that model's layer N (the hub's per-expert
tensors stacked by transformers' own conversion), run by its own forward with a full causal mask. The fusion and the
output norm are read from the safetensors file by name, and the norms computed here (zero-centred for Qwen). The
reference decode is greedy speculation as vLLM V1 / SGLang run it: step 1 over every verified pair (the target's last
hidden state at t, the token at t + 1, position t), each further step appending one row (the previous draft, the
previous step's output before or after the MTP output norm), accepted while the draft equals the target's greedy
token, drafts counted past the budget as vLLM counts them. Each test checks, prompt by prompt and cycle by cycle,
the oracle's accepted drafts and tokens against it, under each chaining, position-0 masking and input convention.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from mtp_fixtures import read_prompts

from eagle_eval import api
from eagle_eval.records import Prompt
from eagle_eval.settings import Settings

NEW_TOKENS = 14
LAYOUT = {   # family -> (MTP key prefix of layer 0, fusion keys (embedding norm, hidden norm, proj), output norm)
    "deepseek_v3": ("model.layers.2.", ("enorm", "hnorm", "eh_proj"), "shared_head.norm"),
    "glm4_moe": ("model.layers.2.", ("enorm", "hnorm", "eh_proj"), "shared_head.norm"),
    "qwen3_next": ("mtp.layers.0.", ("mtp.pre_fc_norm_embedding", "mtp.pre_fc_norm_hidden", "mtp.fc"), "mtp.norm"),
    "qwen3_5": ("mtp.layers.0.", ("mtp.pre_fc_norm_embedding", "mtp.pre_fc_norm_hidden", "mtp.fc"), "mtp.norm"),
    "mimo": ("model.mtp_layers.0.", ("token_layernorm", "hidden_layernorm", "input_proj"), "final_layernorm"),
}


class NaiveMTP:
    """One MTP layer with no cache: every call recomputes every row (see the module docstring)."""

    def __init__(self, folder):
        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoModelForCausalLM

        config = json.loads((folder / "config.json").read_text())
        family = "mimo" if config.get("architectures") == ["MiMoForCausalLM"] else config["model_type"]
        family = "qwen3_5" if family == "qwen3_5_text" else family
        n = config["num_hidden_layers"]
        prefix, fusion, out_norm = LAYOUT[family]
        prefix = prefix.replace(".2.", f".{n}.")
        tensors = load_file(folder / "model.safetensors")
        # the block as layer N of a model one layer deeper, loaded by transformers from the same tensors
        deeper = folder.parent / f"{folder.name}-deeper"
        if not deeper.exists():
            shutil.copytree(folder, deeper)
            renamed = {(f"model.layers.{n}." + k[len(prefix):] if k.startswith(prefix) else k): v
                       for k, v in tensors.items()}
            from safetensors.torch import save_file
            save_file(renamed, deeper / "model.safetensors", metadata={"format": "pt"})
            cfg = json.loads((deeper / "config.json").read_text())
            cfg["num_hidden_layers"] = n + 1
            if cfg.get("layer_types"):
                cfg["layer_types"] = cfg["layer_types"] + ["full_attention"]
            (deeper / "config.json").write_text(json.dumps(cfg))
        cfg = AutoConfig.from_pretrained(deeper)
        cfg._attn_implementation = "eager"
        self.model = AutoModelForCausalLM.from_pretrained(deeper, config=cfg, dtype=torch.float32).eval()
        self.block, self.n = self.model.model.layers[n], n
        where = "" if family.startswith("qwen3") else f"model.layers.{n}." if family != "mimo" else prefix
        self.w = {name: tensors[f"{where}{key}.weight"] for name, key in zip(("emb", "hid", "proj"), fusion)}
        self.w["out"] = tensors[f"{where}{out_norm}.weight"]
        self.zero_centred = family.startswith("qwen3")
        self.hidden_first = family == "mimo"
        self.eps = cfg.rms_norm_eps

    def norm(self, x, w):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * (1 + w) if self.zero_centred else x * w

    @torch.no_grad()
    def __call__(self, ids, hidden, mask0: bool):
        """Rows t: (hidden[t], token ids[t]) at position t -> (logits, output before its norm, after it)."""
        t = ids.shape[1]
        pos = torch.arange(t)[None]
        e = self.model.model.embed_tokens(ids)
        if mask0:
            e = torch.where((pos == 0)[..., None], torch.zeros_like(e), e)
        parts = [self.norm(e, self.w["emb"]), self.norm(hidden, self.w["hid"])]
        x = torch.nn.functional.linear(torch.cat(parts[::-1] if self.hidden_first else parts, -1), self.w["proj"])
        causal = torch.full((t, t), float("-inf")).triu(1)[None, None]
        o = self.block(x, attention_mask=causal, position_ids=pos,
                       position_embeddings=self.model.model.rotary_emb(x, pos))
        o = o[0] if isinstance(o, tuple) else o
        post = self.norm(o, self.w["out"])
        return self.model.lm_head(post), o, post

    @torch.no_grad()
    def target_states(self, seq):
        """The target's (N layers) last hidden state before and after its final norm over `seq`."""
        x = self.model.model.embed_tokens(seq)
        pos = torch.arange(seq.shape[1])[None]
        pe = self.model.model.rotary_emb(x, pos)
        causal = torch.full((seq.shape[1],) * 2, float("-inf")).triu(1)[None, None]
        for layer in self.model.model.layers[: self.n]:
            out = layer(x, attention_mask=causal, position_ids=pos, position_embeddings=pe)
            x = out[0] if isinstance(out, tuple) else out
        return x, self.model.model.norm(x)


@torch.no_grad()
def naive_greedy(model, prompt, count):
    seq = torch.tensor([prompt])
    for _ in range(count):
        seq = torch.cat([seq, model(seq).logits[:, -1:].argmax(-1)], dim=1)
    return seq


@torch.no_grad()
def naive_speculation(ref: NaiveMTP, target_model, prompt, new_tokens, k, *, input_post, mask0, chain_post):
    """(greedy tokens, accepted drafts per cycle, every cycle's drafts) of one MTP layer chained k steps (module
    docstring)."""
    seq = naive_greedy(target_model, prompt, new_tokens + k + 1)
    pre, post = ref.target_states(seq)
    hid = post if input_post else pre
    p, emitted, accepted, proposed = len(prompt), 1, [], []
    while emitted < new_tokens:
        m = p + emitted - 1                               # index of the newest verified token (the root)
        ids, hs, drafts = seq[:, 1:m + 1], hid[:, :m], []
        for _ in range(k):
            logits, o_pre, o_post = ref(ids, hs, mask0)
            drafts.append(int(logits[0, -1].argmax()))
            ids = torch.cat([ids, torch.tensor([[drafts[-1]]])], dim=1)
            hs = torch.cat([hs, (o_post if chain_post else o_pre)[:, -1:]], dim=1)
        n = 0
        while n < k and drafts[n] == int(seq[0, m + 1 + n]):
            n += 1
        accepted.append(n)
        proposed.append(drafts)
        emitted += n + 1
    return seq[0, p:p + new_tokens].tolist(), accepted, proposed


def oracle(folder, convention="vllm", planted=None, num_steps=3, **kw):
    return api.load_oracle(Settings.of(target=str(folder), draft="mtp", num_steps=num_steps, dtype="fp32",
                                       mtp_convention=convention, mtp_planted=planted, max_new_tokens=NEW_TOKENS,
                                       **kw))


CHAINS = [(f, chain) for f in LAYOUT for chain in ("pre", "post")]


@pytest.mark.parametrize("family,chain", CHAINS)
def test_the_loop_equals_the_naive_reference_cycle_by_cycle(mtp_targets, family, chain):
    folder, prompts = mtp_targets(family)
    o = oracle(folder, planted=(f"chain={chain}",))
    conv = o.resolved.head.extra["mtp"]["convention"]
    assert conv["chain"] == chain and conv["engine"] == "planted"
    ref = NaiveMTP(folder)
    hits, other_differs = 0, False
    for i, p in enumerate(read_prompts(prompts)[:3]):
        rec = o.decode(Prompt(id=f"p{i}", category="c", input_ids=p))
        run = {c: naive_speculation(ref, o.speculator.target.model, p, NEW_TOKENS, 3, input_post=conv["input"] == "post",
                                    mask0=conv["mask_position0"], chain_post=c == "post") for c in ("pre", "post")}
        tokens, accepted, _ = run[chain]
        assert rec.output_ids == tokens, f"prompt {i}: not plain greedy"
        assert rec.accepted_per_cycle == accepted, f"prompt {i}"
        hits += sum(accepted)
        other_differs |= run["pre"][2] != run["post"][2]
    assert 0 < hits < 3 * NEW_TOKENS                  # trained: drafts are accepted, not always
    assert other_differs                              # the other chaining drafts other tokens here


@pytest.mark.parametrize("family", list(LAYOUT))
def test_each_engines_convention_against_the_reference(mtp_targets, family):
    """vLLM's and SGLang's whole conventions (input, masking, chaining) as they are, each against the reference."""
    folder, prompts = mtp_targets(family)
    ref = NaiveMTP(folder)
    p = read_prompts(prompts)[1]
    for engine in ("vllm", "sglang"):
        o = oracle(folder, engine)
        conv = o.resolved.head.extra["mtp"]["convention"]
        rec = o.decode(Prompt(id="p1", category="c", input_ids=p))
        tokens, accepted, _ = naive_speculation(ref, o.speculator.target.model, p, NEW_TOKENS, 3,
                                             input_post=conv["input"] == "post", mask0=conv["mask_position0"],
                                             chain_post=conv["chain"] == "post")
        assert (rec.output_ids, rec.accepted_per_cycle) == (tokens, accepted), engine
