"""EAGLE-3 heads of several decoder layers (the public P-EAGLE heads and speculators' examples have 4): layer 0 over
[input_layernorm(embeds), hidden_norm(hidden)], layers 1.. ordinary decoder layers over H, then the final norm
(vLLM 0.32 llama_eagle3.py `LlamaModel`). Against references nobody here wrote: a naive reference written below from
vLLM's fused-residual forward (plain tensors read by key from the checkpoint, plain forwards over the whole context,
no cache, cycle by cycle), plain greedy decoding, the batched loop, the teacher-forced profile for every num_steps;
a 2-layer P-EAGLE head the same; strict loading of every layer's tensors; the refusals."""

import json
import math

import pytest
import torch
from fixtures import make_target, train_head, write_prompts
from peagle_fixtures import MASK, peagle_pair

from eagle_eval import api
from eagle_eval.heads.eagle3.config import CheckpointError
from eagle_eval.settings import ConfigError, ProfileOptions, Settings

AUX_HF = (2, 4, 5)                 # HF hidden_states indices the heads tap (SGLang ids 1, 3, 4)
LAYERS = 3
MAX_NEW = 20


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    root = tmp_path_factory.mktemp("deep")
    target = make_target(root / "target")
    prompts = write_prompts(root / "prompts.jsonl", n=6, length=6)
    head = train_head(target, root / "head", prompts, aux_hf=AUX_HF, steps=60, num_steps=3,
                      head_kw={"num_hidden_layers": LAYERS})
    return {"target": target, "prompts": prompts, "head": head,
            "prompt_ids": [json.loads(line)["input_ids"] for line in prompts.read_text().splitlines()]}


@pytest.fixture(scope="module")
def deep_peagle(tmp_path_factory):
    return peagle_pair(tmp_path_factory.mktemp("deep_peagle"), layers=2)


def _settings(target, draft, prompts, **kw):
    return Settings.of(target=str(target), draft=str(draft), prompts=str(prompts), dtype="fp32",
                       max_new_tokens=MAX_NEW, **{"num_steps": 3, **kw})


def _deep_settings(deep, **kw):
    return _settings(deep["target"], deep["head"], deep["prompts"], **kw)


# -- the naive reference: vLLM's LlamaModel.forward over plain tensors read by key ---------------------------------

def _rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, positions, d):
    """x [T, heads, d] at positions [T]: NeoX halves (i, i + d/2) rotated by positions * 10000^(-2i/d)."""
    angle = positions[:, None].double() * (10000.0 ** (-torch.arange(0, d, 2).double() / d))[None]
    cos, sin = angle.cos().float()[:, None], angle.sin().float()[:, None]
    a, b = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def _attention(w, p, x, pos, heads=4, kv=2, d=12):
    """Causal GQA self-attention of the rows x [T, width] at positions pos [T] with the weights under prefix p."""
    rows = len(x)
    q = _rope((x @ w[p + "q_proj.weight"].T).view(rows, heads, d), pos, d)
    key = _rope((x @ w[p + "k_proj.weight"].T).view(rows, kv, d), pos, d).repeat_interleave(heads // kv, 1)
    val = (x @ w[p + "v_proj.weight"].T).view(rows, kv, d).repeat_interleave(heads // kv, 1)
    scores = torch.einsum("qhd,khd->hqk", q, key) / math.sqrt(d)
    scores = scores.masked_fill(~torch.ones(rows, rows, dtype=torch.bool).tril(), float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), val).reshape(rows, -1) @ w[p + "o_proj.weight"].T


def _mlp(w, p, x):
    return (torch.nn.functional.silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) \
        @ w[p + "down_proj.weight"].T


def naive_forward(w, layers, embeds, hidden, pos, first="midlayer.", norm_before_residual=False, norm_output=False):
    """vLLM llama_eagle3.py LlamaModel.forward over every row at once (no cache): (logits input, next hidden input).
    Its fused add-RMSNorms, written out: norm(x, residual) returns (rms(x + residual), x + residual)."""
    h = _rms(hidden, w[first + "hidden_norm.weight"])
    x = torch.cat([_rms(embeds, w[first + "input_layernorm.weight"]), h], dim=-1)
    residual = h if norm_before_residual else hidden
    for i in range(layers):
        p = first if i == 0 else f"layers.{i}."
        if i > 0:                                  # input_layernorm(hidden_states, residual)
            residual = x + residual
            x = _rms(residual, w[p + "input_layernorm.weight"])
        x = _attention(w, p + "self_attn.", x, pos)
        residual = x + residual                    # post_attention_layernorm(hidden_states, residual)
        x = _mlp(w, p + "mlp.", _rms(residual, w[p + "post_attention_layernorm.weight"]))
    prenorm = x + residual
    normed = _rms(prenorm, w["norm.weight"])
    return normed, (normed if norm_output else prenorm)


def _aux(model, ids):
    with torch.no_grad():
        states = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    return torch.cat([states[i][0] for i in AUX_HF], dim=-1)


def naive_chain(w, layers, model, verified, k, **flags):
    """One EAGLE-3 cycle: rows (x_{t+1}, fc(features of x_t)) for every verified pair at positions 0..s-1, then
    each draft step appends (its draft, the last row's next-hidden output) at the next position and reruns the whole
    stack over every row."""
    with torch.no_grad():
        embed = model.get_input_embeddings().weight
        hidden = _aux(model, verified[:-1]) @ w["fc.weight"].T
        tokens = list(verified[1:])
        drafts = []
        while True:
            normed, nxt = naive_forward(w, layers, embed[torch.tensor(tokens)], hidden, torch.arange(len(tokens)),
                                        **flags)
            draft = int((normed[-1] @ w["lm_head.weight"].T).argmax())
            drafts.append(draft + int(w["d2t"][draft]))
            if len(drafts) == k:
                return drafts
            tokens.append(drafts[-1])
            hidden = torch.cat([hidden, nxt[-1:]])


def naive_parallel(w, layers, model, verified, k):
    """One P-EAGLE cycle (vLLM parallel drafting): the real rows, then K - 1 rows (mask token, fc(mask_hidden)) at
    the next positions, ONE causal pass of the whole stack; the drafts are the last K rows'."""
    with torch.no_grad():
        feats = torch.cat([_aux(model, verified[:-1]), w["mask_hidden"].reshape(1, -1).expand(k - 1, -1)]) \
            @ w["fc.weight"].T
        tokens = torch.tensor(verified[1:] + [MASK] * (k - 1))
        normed, _ = naive_forward(w, layers, model.get_input_embeddings().weight[tokens], feats,
                                  torch.arange(len(tokens)))
        ids = (normed[-k:] @ w["lm_head.weight"].T).argmax(-1)
        return (ids + w["d2t"][ids]).tolist()


def naive_decode(draft, model, prompt, k, max_new):
    """Cycle by cycle with plain forwards: (chains, accepted per cycle, output)."""
    with torch.no_grad():
        seq = prompt + [int(model(torch.tensor([prompt])).logits[0, -1].argmax())]
        chains, accepted = [], []
        while len(seq) - len(prompt) < max_new:
            drafts = draft(seq)
            argmax = model(torch.tensor([seq + drafts])).logits[0, len(seq) - 1:].argmax(-1).tolist()
            n = next((i for i, (a, b) in enumerate(zip(drafts, argmax)) if a != b), k)
            chains.append(drafts)
            accepted.append(n)
            seq += drafts[:n] + [argmax[n]]
    return chains, accepted, seq[len(prompt):][:max_new]


def _recording(settings):
    """The oracle's speculator with its drafting state recording every chain it proposes."""
    from dataclasses import replace

    oracle = api.load_oracle(settings)
    chains = []
    base = oracle.speculator.draft_state

    class Recording(base):
        def propose_chain(self, num_steps):
            drafts = super().propose_chain(num_steps)
            chains.append(drafts.tolist())
            return drafts

    return replace(oracle.speculator, draft_state=Recording), chains


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


# -- EAGLE-3 chains ------------------------------------------------------------------------------------------------

def test_the_head_has_its_layers_as_vllm_names_them(deep):
    from eagle_eval.heads.io import load_head

    loaded = load_head(deep["head"])
    assert loaded.head.depth == LAYERS
    names = set(_weights(deep["head"]))
    assert {"midlayer.self_attn.q_proj.weight", "layers.1.self_attn.q_proj.weight",
            "layers.2.mlp.down_proj.weight"} <= names
    assert not any(n.startswith(("layers.1.hidden_norm", "layers.0.")) for n in names)
    assert _weights(deep["head"])["layers.1.self_attn.q_proj.weight"].shape == (48, 48)          # over H, not 2H
    assert _weights(deep["head"])["midlayer.self_attn.q_proj.weight"].shape == (48, 96)


@pytest.mark.parametrize("k", [2, 4])
def test_the_loop_drafts_what_the_naive_reference_drafts_cycle_by_cycle(deep, k):
    from eagle_eval.loop.reference import speculative_decode

    spec, chains = _recording(_deep_settings(deep))
    w = _weights(deep["head"])
    seen = []
    for prompt in deep["prompt_ids"][:4]:
        chains.clear()
        out = speculative_decode(spec, prompt, k, MAX_NEW, set())
        ref = naive_decode(lambda seq: naive_chain(w, LAYERS, spec.target.model, seq, k), spec.target.model,
                           prompt, k, MAX_NEW)
        assert chains == ref[0]
        assert out.accepted_per_cycle == ref[1]
        assert out.output_ids == ref[2]
        seen += ref[1]
    assert len(set(seen)) >= 2, seen               # the cycles compared accept and reject alike


@pytest.mark.parametrize("flags", [{"norm_before_residual": True}, {"norm_output": True}])
def test_the_residual_variants_follow_vllms_forward_too(deep, tmp_path, flags):
    """A random 2-layer head with norm_before_residual (layer 0's residual is hidden_norm(hidden)) or norm_output
    (the recurrence carries norm(out) of the LAST layer), against the naive forward; written in speculators' layout
    (layer 0 named `layers.0.`, norm_before_residual at the top level, where vLLM reads it)."""
    from eagle_eval.heads.eagle3.layer import Eagle3Head
    from eagle_eval.heads.io import save_head
    from eagle_eval.loop.reference import speculative_decode
    from fixtures import head_config

    torch.manual_seed(3)
    head = Eagle3Head(head_config(num_hidden_layers=2, **flags))
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.3) if p.dim() > 1 else torch.nn.init.normal_(p, 1.0, 0.2)
    save_head(head, tmp_path / "h", aux_layer_ids_sglang=[i - 1 for i in AUX_HF], dialect="speculators")
    spec, chains = _recording(_settings(deep["target"], tmp_path / "h", deep["prompts"]))
    w = _weights(tmp_path / "h")
    prompt = deep["prompt_ids"][0]
    out = speculative_decode(spec, prompt, 4, 12, set())
    ref = naive_decode(lambda seq: naive_chain(w, 2, spec.target.model, seq, 4, first="layers.0.", **flags),
                       spec.target.model,
                       prompt, 4, 12)
    assert (chains, out.accepted_per_cycle, out.output_ids) == ref


@pytest.mark.parametrize("k", [1, 3])
def test_the_loop_equals_plain_greedy_decoding(deep, k):
    from eagle_eval.loop.plain import plain_greedy
    from eagle_eval.loop.reference import speculative_decode

    spec, _ = _recording(_deep_settings(deep))
    for prompt in deep["prompt_ids"]:
        out = speculative_decode(spec, prompt, k, MAX_NEW, set())
        assert out.output_ids == plain_greedy(spec.target, prompt, MAX_NEW, set())


def test_run_batched_equals_run_one_prompt_at_a_time(deep):
    from eagle_eval.loop.graphed import capture_blockers

    for k in (1, 4):
        one = api.evaluate(_deep_settings(deep, num_steps=k), progress=False)
        many = api.evaluate(_deep_settings(deep, num_steps=k), api.LoopOptions(batch_size=4), progress=False)
        assert [s.to_json() for s in many.samples] == [s.to_json() for s in one.samples]
        assert many.report["config"]["loop"]["loop"] == "batched"
    assert "3-layer draft head" in capture_blockers(api.load_oracle(_deep_settings(deep)).speculator, cuda=True)


def test_profile_equals_the_loop_for_every_num_steps(deep):
    prof = api.profile(_deep_settings(deep), ProfileOptions(max_steps=5), progress=False)
    by_id = {s.id: s for s in prof.samples}
    seen = set()
    for steps in range(1, 6):
        run = api.evaluate(_deep_settings(deep, num_steps=steps), progress=False)
        for rec in run.samples:
            assert by_id[rec.id].extra["accepted_per_cycle_by_num_steps"][str(steps)] == rec.accepted_per_cycle, \
                (steps, rec.id)
            seen |= set(rec.accepted_per_cycle)
        summary = prof.report["by_num_steps"][str(steps)]["summary"]
        assert summary["accept_length"] == pytest.approx(run.report["summary"]["accept_length"], abs=1e-12)
    assert {0, 1, 2} <= seen, seen


def test_the_report_names_the_layers_and_trees_are_refused(deep):
    run = api.evaluate(_deep_settings(deep, limit=1), progress=False)
    assert run.report["config"]["head"]["variant"]["num_hidden_layers"] == LAYERS
    with pytest.raises(ConfigError, match=r"--topk 2: a 3-layer draft head drafts chains only .* use --topk 1"):
        api.evaluate(_deep_settings(deep, topk=2, num_draft_tokens=4), progress=False)


# -- strict loading --------------------------------------------------------------------------------------------------

def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def _rewrite(folder, fn):
    from safetensors.torch import save_file

    tensors = _weights(folder)
    fn(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


def test_a_missing_layer_tensor_is_refused_naming_file_and_key(deep, tmp_path):
    from eagle_eval.heads.io import load_head

    folder = _copy(deep["head"], tmp_path / "missing")
    _rewrite(folder, lambda t: t.pop("layers.2.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing/model\.safetensors: missing tensor "
                                              r"'layers\.2\.mlp\.up_proj\.weight' \(expected shape \[64, 48\]\) "
                                              r"\(config\.json num_hidden_layers = 3"):
        load_head(folder)


def test_a_layer_beyond_num_hidden_layers_is_refused(deep, tmp_path):
    from eagle_eval.heads.io import load_head

    folder = _copy(deep["head"], tmp_path / "extra")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["num_hidden_layers"] = 2
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"extra/model\.safetensors: unexpected tensor\(s\) \['layers\.2\."):
        load_head(folder)


def test_layer_zero_may_be_named_layers_0_as_vllm_renames_it(deep, tmp_path):
    """vLLM's hf_to_vllm_mapper renames midlayer. to layers.0.: a multi-layer checkpoint may use either, not both."""
    from eagle_eval.heads.io import load_head

    folder = _copy(deep["head"], tmp_path / "layers0")
    _rewrite(folder, lambda t: t.update({k.replace("midlayer.", "layers.0."): t.pop(k) for k in list(t)
                                         if k.startswith("midlayer.")}))
    a = api.evaluate(_deep_settings(deep, limit=2), progress=False)
    b = api.evaluate(_settings(deep["target"], folder, deep["prompts"], limit=2), progress=False)
    assert [s.to_json() for s in a.samples] == [s.to_json() for s in b.samples]
    _rewrite(folder, lambda t: t.update({"midlayer.norm_extra": t["norm.weight"].clone()}))
    with pytest.raises(CheckpointError, match=r"both 'midlayer\.\*' and 'layers\.0\.\*'"):
        load_head(folder)


def test_the_speculators_layout_loads_the_same_layers(deep, tmp_path):
    from eagle_eval.heads.io import load_head, save_head

    folder = tmp_path / "spec"
    save_head(load_head(deep["head"]).head, folder, aux_layer_ids_sglang=[i - 1 for i in AUX_HF],
              dialect="speculators")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["transformer_layer_config"]["num_hidden_layers"] == LAYERS
    assert "layers.0.self_attn.q_proj.weight" in _weights(folder) and "layers.2.mlp.up_proj.weight" in _weights(folder)
    a = api.evaluate(_deep_settings(deep, limit=2), progress=False)
    b = api.evaluate(_settings(deep["target"], folder, deep["prompts"], limit=2), progress=False)
    assert [s.output_ids for s in a.samples] == [s.output_ids for s in b.samples]
    assert [s.accepted_per_cycle for s in a.samples] == [s.accepted_per_cycle for s in b.samples]


# -- P-EAGLE of two layers -------------------------------------------------------------------------------------------

def _peagle_settings(pair, **kw):
    return _settings(pair["target"], pair["specforge"], pair["prompts"], **kw)


@pytest.mark.parametrize("k", [3, 5])
def test_a_two_layer_peagle_head_drafts_what_the_naive_reference_drafts(deep_peagle, k):
    from eagle_eval.loop.reference import speculative_decode

    spec, chains = _recording(_peagle_settings(deep_peagle))
    assert spec.head.depth == 2 and spec.head.config.parallel_drafting
    w = _weights(deep_peagle["specforge"])
    seen = []
    for prompt in deep_peagle["prompt_ids"][:4]:
        chains.clear()
        out = speculative_decode(spec, prompt, k, MAX_NEW, set())
        ref = naive_decode(lambda seq: naive_parallel(w, 2, spec.target.model, seq, k), spec.target.model,
                           prompt, k, MAX_NEW)
        assert chains == ref[0]
        assert out.accepted_per_cycle == ref[1]
        assert out.output_ids == ref[2]
        seen += ref[1]
    assert len(set(seen)) >= 2, seen


def test_a_two_layer_peagle_head_batched_and_profiled_equals_its_loop(deep_peagle):
    from eagle_eval.loop.plain import plain_greedy
    from eagle_eval.loop.reference import speculative_decode

    prof = api.profile(_peagle_settings(deep_peagle), ProfileOptions(max_steps=4), progress=False)
    by_id = {s.id: s for s in prof.samples}
    seen = set()
    for steps in range(1, 5):
        one = api.evaluate(_peagle_settings(deep_peagle, num_steps=steps), progress=False)
        many = api.evaluate(_peagle_settings(deep_peagle, num_steps=steps), api.LoopOptions(batch_size=4),
                            progress=False)
        assert [s.to_json() for s in many.samples] == [s.to_json() for s in one.samples]
        for rec in one.samples:
            assert by_id[rec.id].extra["accepted_per_cycle_by_num_steps"][str(steps)] == rec.accepted_per_cycle
            seen |= set(rec.accepted_per_cycle)
    assert {0, 1} <= seen, seen
    spec, _ = _recording(_peagle_settings(deep_peagle))
    for prompt in deep_peagle["prompt_ids"][:3]:
        assert speculative_decode(spec, prompt, 4, MAX_NEW, set()).output_ids == \
            plain_greedy(spec.target, prompt, MAX_NEW, set())


@pytest.mark.parametrize("position_offset", [0, 1])
def test_the_all_starts_unroll_equals_the_sequential_chain_of_a_deep_head(position_offset):
    """profile/unroll.py `unroll_chains` (the profile's dense form, its rollouts at T > 0, the fixtures' training)
    runs every layer with the loop's attention pattern: step j from every start equals the loop's j-th step."""
    from eagle_eval.heads.eagle3.layer import Eagle3Head
    from eagle_eval.loop.draft import DraftState
    from eagle_eval.profile.unroll import unroll_chains
    from fixtures import head_config

    torch.manual_seed(0)
    head = Eagle3Head(head_config(num_hidden_layers=3, norm_output=True)).eval()
    for p in head.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.3)
    emb = torch.nn.Embedding(96, 48)
    t, k = 12, 4
    x = torch.randint(0, 96, (1, t + 1))
    aux = torch.randn(1, t, 144)
    with torch.no_grad():
        logits = unroll_chains(head, aux, emb(x[:, 1:]), k, position_offset=position_offset)
        for p in range(t - k):
            state = DraftState(head, emb, position_offset)
            state.extend(aux[:, : p + 1], x[:, 1: p + 2])
            out = state.last_out
            for j in range(k):
                diff = (head.logits(out)[0, -1] - logits[j][0, p + j]).abs().max()
                assert diff < 1e-4 * logits[j][0, p + j].abs().max(), (p, j, diff)      # fp32, another order of sums
                out = head.step(emb(x[:, p + 2 + j].view(1, 1)), out, torch.tensor([[p + 1 + j + position_offset]]),
                                state.cache)
            assert len(state.cache.layer(2)) == len(state.cache) == p + 1 + k      # every layer, every step


def test_the_profile_above_temperature_zero_recomputed_without_the_cache(deep, tmp_path):
    """profile at T > 0 (run_lengths.SparseChains past a wrong draft, every layer): each per_start row's
    P(accept >= i) equals the product of the target's probabilities of the drafts the loop's DraftState proposes
    after that prefix, from plain target forwards (no cache)."""
    from eagle_eval.loop.draft import DraftState
    from eagle_eval.models.capture import FeatureCapture
    from eagle_eval.rules.filters import target_probs
    from eagle_eval.settings import DecodingSettings

    dec = dict(temperature=2.0, top_k=60, top_p=0.95, accept_rule="vllm")
    k = 4
    settings = _deep_settings(deep, limit=3, output_dir=str(tmp_path / "run"), **dec)
    res = api.profile(settings, ProfileOptions(max_steps=k, expectation_floor=0.0), progress=False)
    rows = {(r["prompt_id"], r["start"], r["num_steps"]): r for r in res.per_start if r["sample"] == 0}
    spec, decoding = api.load_oracle(settings).speculator, DecodingSettings(**dec)
    checked = 0
    for p in res.profiled:
        for t in (1, 4, 9):
            ctx = p.prompt.input_ids + p.continuation[:t]
            with FeatureCapture(spec.target.layers, spec.aux_hf, spec.draft_device) as cap:
                spec.target.forward(torch.tensor([ctx]), None)
                aux = cap.pop()
            state = DraftState(spec.head, spec.embed, spec.position_offset)
            state.extend(aux[:, :-1], torch.tensor([ctx[1:]]))
            drafts = state.propose_chain(k).tolist()
            probs = target_probs(spec.target.forward(torch.tensor([ctx + drafts[:-1]]), None)[0, len(ctx) - 1:],
                                 decoding)
            acc = [float(probs[i, d]) for i, d in enumerate(drafts)]
            want = [math.prod(acc[:i]) for i in range(1, k + 1)]
            assert rows[(p.prompt.id, t, k)]["p_accept_at_least"] == pytest.approx(want, abs=2e-6), (p.prompt.id, t)
            checked += 1
    assert checked == 9
