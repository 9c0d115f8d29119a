"""P-EAGLE (an EAGLE-3 head drafting K tokens in one causal forward; heads/peagle/) against references nobody here
wrote: a naive reference written below from vLLM 0.32's parallel-drafting layout (plain tensors read by key from
the checkpoint, plain forwards over the whole context, no cache, cycle by cycle), plain greedy decoding, the
teacher-forced profile for every K and the batched loop; strict loading of `mask_hidden` and the mask token id,
the report's echo, and the refusals."""

import json
import math

import pytest
import torch
from peagle_fixtures import AUX_HF, MASK, peagle_pair

from eagle_eval import api
from eagle_eval.heads.eagle3.config import CheckpointError
from eagle_eval.settings import ConfigError, ProfileOptions, Settings

MAX_NEW = 20


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return peagle_pair(tmp_path_factory.mktemp("peagle"))


def _settings(pair, draft=None, **kw):
    return Settings.of(target=str(pair["target"]), draft=str(draft or pair["specforge"]), prompts=str(pair["prompts"]),
                       dtype="fp32", max_new_tokens=MAX_NEW, **{"num_steps": 3, **kw})


# -- the naive reference: plain tensors, the weights read by key from the file ------------------------------------

def _rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, positions, d):
    """x [T, heads, d] at positions [T]: NeoX halves (i, i + d/2) rotated by positions * 10000^(-2i/d)."""
    angle = positions[:, None].double() * (10000.0 ** (-torch.arange(0, d, 2).double() / d))[None]
    cos, sin = angle.cos().float()[:, None], angle.sin().float()[:, None]
    a, b = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def naive_drafts(w, model, verified: list[int], k: int) -> list[int]:
    """One cycle, as vLLM lays out parallel drafting: the rows (x_{t+1}, fc(target states of x_t)) for every verified
    t < s = len(verified) - 1 at positions 0..s-1 (the last one, slot 0, pairs the newest token), then K - 1 rows
    (mask token, fc(mask_hidden)) at positions s..s+K-2; ONE causal pass of the draft layer over all of them; the
    drafts are the argmax (+ d2t) of the last K rows."""
    heads, kv, d = 4, 2, 12
    s = len(verified) - 1
    with torch.no_grad():
        states = model(torch.tensor([verified[:-1]]), output_hidden_states=True).hidden_states
        aux = torch.cat([states[i][0] for i in AUX_HF], dim=-1)                                    # [s, 3H]
        feats = torch.cat([aux, w["mask_hidden"].reshape(1, -1).expand(k - 1, -1)]) @ w["fc.weight"].T
        tokens = torch.tensor(verified[1:] + [MASK] * (k - 1))
        e = model.get_input_embeddings().weight[tokens]
        rows = len(tokens)
        pos = torch.arange(rows)
        u = torch.cat([_rms(e, w["midlayer.input_layernorm.weight"]), _rms(feats, w["midlayer.hidden_norm.weight"])], -1)
        p = "midlayer.self_attn."
        q = _rope((u @ w[p + "q_proj.weight"].T).view(rows, heads, d), pos, d)
        key = _rope((u @ w[p + "k_proj.weight"].T).view(rows, kv, d), pos, d).repeat_interleave(heads // kv, 1)
        val = (u @ w[p + "v_proj.weight"].T).view(rows, kv, d).repeat_interleave(heads // kv, 1)
        scores = torch.einsum("qhd,khd->hqk", q, key) / math.sqrt(d)
        scores = scores.masked_fill(~torch.ones(rows, rows, dtype=torch.bool).tril(), float("-inf"))
        attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), val).reshape(rows, -1) @ w[p + "o_proj.weight"].T
        x = feats + attn
        m = _rms(x, w["midlayer.post_attention_layernorm.weight"])
        x = x + (torch.nn.functional.silu(m @ w["midlayer.mlp.gate_proj.weight"].T)
                 * (m @ w["midlayer.mlp.up_proj.weight"].T)) @ w["midlayer.mlp.down_proj.weight"].T
        ids = (_rms(x[-k:], w["norm.weight"]) @ w["lm_head.weight"].T).argmax(-1)
        return (ids + w["d2t"][ids]).tolist()


def naive_decode(w, model, prompt, k, max_new):
    """Cycle by cycle with plain forwards: (chains, accepted per cycle, output)."""
    with torch.no_grad():
        seq = prompt + [int(model(torch.tensor([prompt])).logits[0, -1].argmax())]
        chains, accepted = [], []
        while len(seq) - len(prompt) < max_new:
            drafts = naive_drafts(w, model, seq, k)
            argmax = model(torch.tensor([seq + drafts])).logits[0, len(seq) - 1:].argmax(-1).tolist()
            n = next((i for i, (a, b) in enumerate(zip(drafts, argmax)) if a != b), k)
            chains.append(drafts)
            accepted.append(n)
            seq += drafts[:n] + [argmax[n]]
    return chains, accepted, seq[len(prompt):][:max_new]


def _speculator(pair):
    from dataclasses import replace

    from eagle_eval.heads.peagle.state import ParallelDraftState

    oracle = api.load_oracle(_settings(pair))
    chains = []

    class Recording(ParallelDraftState):
        def propose_chain(self, num_steps):
            drafts = super().propose_chain(num_steps)
            chains.append(drafts.tolist())
            return drafts

    assert oracle.speculator.draft_state is ParallelDraftState
    return replace(oracle.speculator, draft_state=Recording), chains


@pytest.mark.parametrize("k", [3, 5])
def test_the_loop_drafts_what_the_naive_reference_drafts_cycle_by_cycle(pair, k):
    from safetensors.torch import load_file

    from eagle_eval.loop.reference import speculative_decode

    spec, chains = _speculator(pair)
    w = load_file(str(pair["specforge"] / "model.safetensors"))
    seen = []
    for prompt in pair["prompt_ids"][:4]:
        chains.clear()
        out = speculative_decode(spec, prompt, k, MAX_NEW, set())
        ref_chains, ref_accepted, ref_out = naive_decode(w, spec.target.model, prompt, k, MAX_NEW)
        assert chains == ref_chains
        assert out.accepted_per_cycle == ref_accepted
        assert out.output_ids == ref_out
        seen += ref_accepted
    assert len(set(seen)) >= 3, seen               # the cycles compared accept and reject alike


@pytest.mark.parametrize("k", [1, 2, 4])
def test_the_loop_equals_plain_greedy_decoding(pair, k):
    from eagle_eval.loop.plain import plain_greedy
    from eagle_eval.loop.reference import speculative_decode

    spec, _ = _speculator(pair)
    for prompt in pair["prompt_ids"]:
        out = speculative_decode(spec, prompt, k, MAX_NEW, set())
        assert out.output_ids == plain_greedy(spec.target, prompt, MAX_NEW, set())
        assert all(0 <= n <= k for n in out.accepted_per_cycle)


def test_a_shorter_chain_is_the_prefix_of_a_longer_one(pair):
    """Why the profile may read every K from the slots' own drafts: attention is causal, so slot i does not see the
    later mask rows (unlike DFlash's non-causal block)."""
    from eagle_eval.heads.peagle.all_starts import parallel_drafts
    from eagle_eval.models.capture import FeatureCapture

    spec, _ = _speculator(pair)
    seq = pair["prompt_ids"][0] + list(range(10, 30))
    with FeatureCapture(spec.target.layers, spec.aux_hf, spec.draft_device) as cap:
        spec.target.forward(torch.tensor([seq]), None)
        aux = cap.pop()
    anchors = torch.arange(3, len(seq))
    two = parallel_drafts(spec.head, spec.embed, aux, torch.tensor(seq), anchors, 2)
    five = parallel_drafts(spec.head, spec.embed, aux, torch.tensor(seq), anchors, 5)
    assert torch.equal(two, five[:, :2])


def test_profile_equals_the_loop_for_every_k(pair):
    prof = api.profile(_settings(pair), ProfileOptions(max_steps=5), progress=False)
    by_id = {s.id: s for s in prof.samples}
    seen = set()
    for steps in range(1, 6):
        run = api.evaluate(_settings(pair, num_steps=steps), progress=False)
        for rec in run.samples:
            assert by_id[rec.id].extra["accepted_per_cycle_by_num_steps"][str(steps)] == rec.accepted_per_cycle, \
                (steps, rec.id)
            seen |= set(rec.accepted_per_cycle)
        summary = prof.report["by_num_steps"][str(steps)]["summary"]
        assert summary["accept_length"] == pytest.approx(run.report["summary"]["accept_length"], abs=1e-12)
    assert {0, 1, 2} <= seen, seen


def test_run_batched_equals_run_one_prompt_at_a_time(pair):
    from eagle_eval.loop.graphed import capture_blockers

    for k in (1, 4):
        one = api.evaluate(_settings(pair, num_steps=k), progress=False)
        many = api.evaluate(_settings(pair, num_steps=k), api.LoopOptions(batch_size=4), progress=False)
        assert [s.to_json() for s in many.samples] == [s.to_json() for s in one.samples]
        assert many.report["config"]["loop"]["loop"] == "batched"
    assert "P-EAGLE" in capture_blockers(api.load_oracle(_settings(pair)).speculator, cuda=True)


def test_the_report_echoes_parallel_drafting_and_where_the_mask_token_came_from(pair, tmp_path):
    run = api.evaluate(_settings(pair, num_steps=5), progress=False)
    head = run.report["config"]["head"]
    echo = head["parallel_drafting"]
    assert echo["mask_token_id"] == MASK and echo["mask_token_from"] == "config.json key 'mask_token_id'"
    assert echo["k"] == 5 and echo["as_vllm"] == {"method": "eagle3", "num_speculative_tokens": 5,
                                                  "parallel_drafting": True}
    assert "mask_hidden" in echo["detected_by"] and head["variant"]["parallel_drafting"] is True
    # vLLM's other keys, in its order: pard_token read when mask_token_id is absent
    folder = _copy(pair["specforge"], tmp_path / "pard")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["pard_token"] = cfg.pop("mask_token_id")
    (folder / "config.json").write_text(json.dumps(cfg))
    echo = api.evaluate(_settings(pair, draft=folder, limit=1), progress=False).report["config"]["head"][
        "parallel_drafting"]
    assert echo["mask_token_from"] == "config.json key 'pard_token'" and echo["mask_token_id"] == MASK


def test_trees_are_refused_with_vllms_reason(pair):
    with pytest.raises(ConfigError, match=r"--topk 2: a P-EAGLE head drafts one chain .* no token tree"):
        api.evaluate(_settings(pair, topk=2, num_draft_tokens=4), progress=False)


def test_profile_above_temperature_zero_is_refused_by_name(pair):
    with pytest.raises(ConfigError, match=r"profile at --temperature 0.7 with a llama draft: .*P-EAGLE"):
        api.profile(_settings(pair, temperature=0.7), ProfileOptions(max_steps=3), progress=False)


# -- strict loading ----------------------------------------------------------------------------------------------

def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def _rewrite(folder, fn):
    from safetensors.torch import load_file, save_file

    file = folder / "model.safetensors"
    tensors = load_file(str(file))
    fn(tensors)
    save_file(tensors, str(file))


def test_a_misshaped_mask_hidden_is_refused_naming_file_and_key(pair, tmp_path):
    from eagle_eval.heads.io import load_head

    folder = _copy(pair["specforge"], tmp_path / "bad")
    _rewrite(folder, lambda t: t.update(mask_hidden=t["mask_hidden"][:, :100].contiguous()))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor 'mask_hidden' has shape \[1, 100\], "
                                              r"expected \[1, 144\]"):
        load_head(folder)


def test_mask_hidden_without_a_mask_token_id_is_refused_with_vllms_reason(pair, tmp_path):
    from eagle_eval.heads.io import load_head

    folder = _copy(pair["specforge"], tmp_path / "nomask")
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["mask_token_id"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: holds tensor 'mask_hidden' .* config\.json names "
                                              r"no mask token id: vLLM refuses parallel drafting .* pard_token"):
        load_head(folder)


def test_a_mask_token_outside_the_vocabulary_is_refused(pair, tmp_path):
    from eagle_eval.heads.io import load_head

    folder = _copy(pair["specforge"], tmp_path / "oov")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["mask_token_id"] = 96
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"key 'mask_token_id' = 96: .* 0\.\.95"):
        load_head(folder)


def test_the_speculators_peagle_layout_loads_and_drafts_alike(pair, tmp_path):
    """speculators saves mask_hidden as [1, 1, k*H_t] (models/peagle/core.py); vLLM reads it as view(1, -1). The same
    head in that layout gives the same run; without mask_hidden or mask_token_id it is refused with vLLM's reason."""
    from eagle_eval.heads.io import load_head, save_head

    folder = tmp_path / "spec"
    save_head(pair["head"], folder, aux_layer_ids_sglang=[i - 1 for i in AUX_HF], dialect="speculators")
    assert json.loads((folder / "config.json").read_text())["speculators_model_type"] == "peagle"
    _rewrite(folder, lambda t: t.update(mask_hidden=t["mask_hidden"][None].contiguous()))
    loaded = load_head(folder)
    assert loaded.dialect == "speculators" and loaded.head.config.parallel_drafting
    a = api.evaluate(_settings(pair, limit=3), progress=False)
    b = api.evaluate(_settings(pair, draft=folder, limit=3), progress=False)
    assert [s.output_ids for s in a.samples] == [s.output_ids for s in b.samples]
    assert [s.accepted_per_cycle for s in a.samples] == [s.accepted_per_cycle for s in b.samples]
    _rewrite(folder, lambda t: t.pop("mask_hidden"))
    with pytest.raises(CheckpointError, match=r"'peagle' but the weights hold no tensor 'mask_hidden' .* vLLM refuses"):
        load_head(folder)
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["mask_token_id"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"missing key 'mask_token_id': .*update_peagle"):
        load_head(folder)
