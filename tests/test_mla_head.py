"""The MLA EAGLE-3 head (Eagle3DeepseekV2ForCausalLM): strict loading, the draft forward against the MLA
formulas written out here (three draft steps over a cache), DeepSeek yarn against transformers' own,
the key audit, load-time checks, and the loop lossless vs plain greedy with a tiny DeepSeek-V3 target,
the profile equal to the loop."""

import json
import math

import pytest
import torch
from fixtures import VOCAB, make_target, train_head, write_prompts
from safetensors.torch import load_file, save_file

from eagle_eval import api
from eagle_eval.settings import LoopOptions, ProfileOptions, Settings
from eagle_eval.heads.eagle3.config import HeadConfig, MLASettings
from eagle_eval.heads.io import CheckpointError, load_head, save_head
from eagle_eval.heads.eagle3.layer import DraftCache
from eagle_eval.heads.mla.layer import MLAHead, deepseek_yarn, softmax_scale

H, HEADS, NOPE, ROPE, V_DIM, KV_RANK, Q_RANK = 48, 4, 8, 8, 12, 16, 16
YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1,
        "mscale": 1.0, "mscale_all_dim": 1.0}                       # DeepSeek-V3's shape, tiny context
VARIANTS = {
    "yarn": dict(rope_scaling=YARN),
    "yarn-mscale": dict(rope_scaling={**YARN, "mscale": 0.8, "mscale_all_dim": 0.5}),   # cos/sin scale != 1
    "no-scaling": dict(rope_scaling=None),
    "q_proj": dict(rope_scaling=YARN, q_lora_rank=None),
    "eagle3.1": dict(rope_scaling=YARN, fc_norm=True, norm_output=True),
}
P = "layers.0.self_attn."


def mla_config(q_lora_rank=Q_RANK, draft_vocab=VOCAB, rope_theta=10000.0, **kw) -> HeadConfig:
    return HeadConfig(hidden_size=H, num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=NOPE + ROPE,
                      intermediate_size=64, vocab_size=VOCAB, draft_vocab_size=draft_vocab, target_hidden_size=H,
                      rope_theta=rope_theta, max_position_embeddings=512, rope_interleaved=True,
                      mla=MLASettings(q_lora_rank, KV_RANK, NOPE, ROPE, V_DIM), **kw)


def random_mla_head(path, seed=0, **kw):
    """Every weight random, norm weights 1 + noise, saved in the mla layout."""
    torch.manual_seed(seed)
    head = MLAHead(mla_config(**kw))
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if p.dim() == 1 else 0.3 * torch.randn_like(p))
    save_head(head, path, dialect="mla")
    return path


# -- the formulas, written out (DeepSeek-V2 paper section 2.1; the engines' MLA, see heads/mla/layer.py) ----

def rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def mscale(factor, m):
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def yarn(d, theta, sc):
    """(inv_freq [d/2] float64, cos/sin factor, softmax factor): YaRN one frequency at a time."""
    base = [theta ** (-2 * i / d) for i in range(d // 2)]
    if sc is None:
        return torch.tensor(base, dtype=torch.float64), 1.0, 1.0
    factor, orig = sc["factor"], sc["original_max_position_embeddings"]

    def dim_of(rotations):            # the frequency index that turns `rotations` times over `orig` positions
        return d * math.log(orig / (2 * math.pi * rotations)) / (2 * math.log(theta))

    lo, hi = max(math.floor(dim_of(sc.get("beta_fast", 32))), 0), min(math.ceil(dim_of(sc.get("beta_slow", 1))), d - 1)
    out = []
    for i, f in enumerate(base):
        t = min(max((i - lo) / (hi - lo if hi != lo else 0.001), 0.0), 1.0)      # 0 keep, 1 interpolate
        out.append(f * (1 - t) + f / factor * t)
    all_dim = mscale(factor, sc.get("mscale_all_dim", 0))
    return torch.tensor(out, dtype=torch.float64), mscale(factor, sc.get("mscale", 1)) / all_dim, all_dim ** 2


def rotate_pairs(x, pos, inv):
    """x [..., T, d]: rotate dims (2i, 2i+1) by angle pos * inv[i]."""
    ang = pos[:, None].double() * inv[None]
    c, s = ang.cos(), ang.sin()
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)


def ref_fuse(w, aux, kw):
    if kw.get("fc_norm"):
        aux = torch.cat([rms(a, w[f"fc_norm.{i}.weight"]) for i, a in enumerate(aux.chunk(3, dim=-1))], dim=-1)
    return aux @ w["fc.weight"].T


def ref_step(w, kw, e, g, pos, past):
    """One decoder-layer call: e, g [T, H]; past = (keys [h, P, nope+rope], values [h, P, v]) or None."""
    u = torch.cat([rms(e, w["layers.0.input_layernorm.weight"]), rms(g, w["layers.0.hidden_norm.weight"])], -1)
    t = u.shape[0]
    if kw.get("q_lora_rank", Q_RANK) is None:
        q = u @ w[P + "q_proj.weight"].T
    else:
        q = rms(u @ w[P + "q_a_proj.weight"].T, w[P + "q_a_layernorm.weight"]) @ w[P + "q_b_proj.weight"].T
    q = q.view(t, HEADS, NOPE + ROPE).transpose(0, 1)                                     # [h, T, 16]
    latent = u @ w[P + "kv_a_proj_with_mqa.weight"].T                                     # [T, 16 + 8]
    kv = rms(latent[:, :KV_RANK], w[P + "kv_a_layernorm.weight"]) @ w[P + "kv_b_proj.weight"].T
    kv = kv.view(t, HEADS, NOPE + V_DIM).transpose(0, 1)                                  # [h, T, 8 + 12]
    inv, cs, sm = yarn(ROPE, kw.get("rope_theta", 10000.0), kw.get("rope_scaling"))
    q_pe = rotate_pairs(q[..., NOPE:], pos, inv) * cs
    k_pe = rotate_pairs(latent[:, KV_RANK:], pos, inv) * cs                               # [T, 8], every head
    k = torch.cat([kv[..., :NOPE], k_pe.expand(HEADS, t, ROPE)], dim=-1)
    v = kv[..., NOPE:]
    q = torch.cat([q[..., :NOPE], q_pe], dim=-1)
    if past is not None:
        k, v = torch.cat([past[0], k], dim=1), torch.cat([past[1], v], dim=1)
    p = k.shape[1] - t
    ctx = torch.zeros(HEADS, t, V_DIM, dtype=u.dtype)
    for h in range(HEADS):
        for i in range(t):
            scores = k[h, : p + i + 1] @ q[h, i] * (NOPE + ROPE) ** -0.5 * sm
            ctx[h, i] = torch.softmax(scores, dim=0) @ v[h, : p + i + 1]
    s = g + ctx.transpose(0, 1).reshape(t, -1) @ w[P + "o_proj.weight"].T
    x = rms(s, w["layers.0.post_attention_layernorm.weight"])
    mlp = (torch.nn.functional.silu(x @ w["layers.0.mlp.gate_proj.weight"].T) * (x @ w["layers.0.mlp.up_proj.weight"].T)) \
        @ w["layers.0.mlp.down_proj.weight"].T
    out = s + mlp
    normed = rms(out, w["norm.weight"])
    return normed @ w["lm_head.weight"].T, normed if kw.get("norm_output") else out, (k, v)


@pytest.mark.parametrize("name", VARIANTS)
def test_draft_forward_equals_the_formulas(tmp_path, name):
    kw = VARIANTS[name]
    path = random_mla_head(tmp_path / "h", **kw)
    head = load_head(path).head.double()
    w = {k: t.double() for k, t in load_file(path / "model.safetensors").items()}
    torch.manual_seed(1)
    aux, e = torch.randn(7, 3 * H).double() * 3, torch.randn(9, H).double()
    cache = DraftCache()
    out = head.step(e[None, :7], head.fuse(aux[None]), torch.arange(7)[None], cache)       # 7 real pairs
    out2 = head.step(e[None, 7:8], out[:, -1:], torch.tensor([[7]]), cache)                # draft step 2
    out3 = head.step(e[None, 8:9], out2, torch.tensor([[8]]), cache)                       # draft step 3
    assert len(cache) == 9
    logits, nxt, past = ref_step(w, kw, e[:7], ref_fuse(w, aux, kw), torch.arange(7), None)
    logits2, nxt2, past = ref_step(w, kw, e[7:8], nxt[-1:], torch.tensor([7]), past)
    logits3, _, _ = ref_step(w, kw, e[8:9], nxt2, torch.tensor([8]), past)
    # float64 throughout except the head's RoPE angles (float32, as the engines compute them)
    for mine, ref in ((out, logits), (out2, logits2), (out3, logits3)):
        torch.testing.assert_close(head.lm(mine)[0], ref, rtol=1e-5, atol=1e-5)


def test_yarn_and_softmax_scale_match_transformers_deepseek_v3():
    """Where transformers' DeepSeek-V3 and the engines agree (mscale == mscale_all_dim, as DeepSeek-V3 and Kimi
    ship), our yarn frequencies, cos/sin factor and softmax scale are transformers' own."""
    from transformers import DeepseekV3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    tcfg = DeepseekV3Config(hidden_size=H, num_attention_heads=HEADS, num_key_value_heads=HEADS, q_lora_rank=Q_RANK,
                            kv_lora_rank=KV_RANK, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=V_DIM,
                            rope_scaling=dict(YARN), rope_theta=10000.0, max_position_embeddings=512)
    inv, factor = ROPE_INIT_FUNCTIONS["yarn"](tcfg, "cpu")
    mine, my_factor = deepseek_yarn(ROPE, 10000.0, YARN)
    torch.testing.assert_close(mine, inv.float())
    assert my_factor == pytest.approx(factor)
    assert softmax_scale(mla_config(rope_scaling=YARN)) == pytest.approx(DeepseekV3Attention(tcfg, 0).scaling)
    assert softmax_scale(mla_config(rope_scaling=YARN)) > (NOPE + ROPE) ** -0.5 * 1.2     # mscale^2 ~ 1.296 is in


# -- strict loading ---------------------------------------------------------------------------------------

def _rewrite(path, fn):
    tensors = load_file(path / "model.safetensors")
    fn(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def _set_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    for k in [k for k, v in changes.items() if v is None]:
        cfg.pop(k)
    (path / "config.json").write_text(json.dumps(cfg))


def test_round_trip_and_both_layer_prefixes(tmp_path):
    path = random_mla_head(tmp_path / "h", rope_scaling=YARN)
    loaded = load_head(path)
    assert loaded.dialect == "mla" and isinstance(loaded.head, MLAHead) and loaded.head.config.kind == "mla"
    assert loaded.head.config.mla == MLASettings(Q_RANK, KV_RANK, NOPE, ROPE, V_DIM)
    assert loaded.key_audit.unknown == [] and loaded.key_audit.engine_math == {}
    tensors = load_file(path / "model.safetensors")
    assert list(tensors[P + "kv_a_proj_with_mqa.weight"].shape) == [KV_RANK + ROPE, 2 * H]    # the 2H input
    assert list(tensors[P + "q_a_proj.weight"].shape) == [Q_RANK, 2 * H]
    assert list(tensors[P + "kv_b_proj.weight"].shape) == [HEADS * (NOPE + V_DIM), KV_RANK]
    assert list(tensors[P + "o_proj.weight"].shape) == [H, HEADS * V_DIM]
    renamed = tmp_path / "midlayer"
    renamed.mkdir()
    (renamed / "config.json").write_text((path / "config.json").read_text())
    save_file({k.replace("layers.0.", "midlayer."): v for k, v in tensors.items()}, str(renamed / "model.safetensors"))
    other = load_head(renamed)
    for (k, a), (_, b) in zip(loaded.head.state_dict().items(), other.head.state_dict().items()):
        assert torch.equal(a, b), k
    _rewrite(renamed, lambda t: t.update({"layers.0.hidden_norm.weight": t["midlayer.hidden_norm.weight"].clone()}))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensors named both 'midlayer\.\*' and 'layers\.0"):
        load_head(renamed)


# The config keys NVIDIA ModelOpt writes for a Kimi-K2 MLA EAGLE-3 export (the key set of the kimik2 template in
# NVIDIA/Model-Optimizer modelopt/torch/export/plugins/hf_spec_export.py, export_spec_ckpt_config; ModelOpt fills
# each from the draft's or the base model's config): the base Kimi-K2 config's MoE layout and transformers 4.x
# generation defaults ride along with the MLA shape, under model_type "kimi_k2", with `midlayer.` tensors.
MODELOPT_KIMI_K2_EXTRA = {
    "aux_loss_alpha": 0.001, "bos_token_id": 163584, "eos_token_id": 163585, "ep_size": 1, "first_k_dense_replace": 1,
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 384, "n_shared_experts": 1,
    "norm_topk_prob": True, "num_experts_per_tok": 8, "num_nextn_predict_layers": 0, "routed_scaling_factor": 2.827,
    "scoring_func": "sigmoid", "seq_aux": True, "topk_group": 1, "topk_method": "noaux_tc", "attention_dropout": 0.0,
    "initializer_range": 0.02, "pad_token_id": None, "pretraining_tp": 1, "torch_dtype": "bfloat16",
    "transformers_version": "4.48.3", "use_bfloat16": False, "use_cache": True, "torchscript": False,
    "chunk_size_feed_forward": 0, "is_decoder": False, "is_encoder_decoder": False, "id2label": {"0": "LABEL_0"},
    "label2id": {"LABEL_0": 0}, "output_attentions": False, "output_hidden_states": False, "output_scores": False,
    "pruned_heads": {}, "return_dict": True, "return_dict_in_generate": False, "sep_token_id": None,
    "tf_legacy_loss": False, "tie_encoder_decoder": False, "do_sample": False, "temperature": 1.0, "top_k": 50,
    "top_p": 1.0, "typical_p": 1.0, "repetition_penalty": 1.0, "length_penalty": 1.0, "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0, "num_beams": 1, "num_beam_groups": 1, "diversity_penalty": 0.0,
    "early_stopping": False, "max_length": 20, "min_length": 0, "num_return_sequences": 1,
    "forced_bos_token_id": None, "forced_eos_token_id": None, "remove_invalid_values": False,
}
MODELOPT_EAGLE_CONFIG_EXTRA = {"use_input_layernorm_in_first_layer": True, "use_last_layernorm": True,
                               "use_mtp_layernorm": False, "next_layer_regular": True, "parallel_draft_step": 1,
                               "parallel_draft_heads_num_layers": 1}


def test_modelopt_kimi_k2_mla_export_loads_with_every_key_accounted_for(tmp_path):
    plain = random_mla_head(tmp_path / "plain", rope_scaling=YARN)
    export = tmp_path / "modelopt"
    export.mkdir()
    cfg = json.loads((plain / "config.json").read_text())
    cfg.update(MODELOPT_KIMI_K2_EXTRA, model_type="kimi_k2")
    cfg["eagle_config"] = {**cfg.get("eagle_config", {}), **MODELOPT_EAGLE_CONFIG_EXTRA}
    (export / "config.json").write_text(json.dumps(cfg))
    save_file({k.replace("layers.0.", "midlayer."): v for k, v in load_file(plain / "model.safetensors").items()},
              str(export / "model.safetensors"))
    loaded, reference = load_head(export), load_head(plain)
    assert loaded.key_audit.unknown == [] and loaded.key_audit.engine_math == {} and loaded.key_notes == ()
    assert "generation default" in loaded.key_audit.harmless["top_k"] and "MoE" in loaded.key_audit.harmless["ep_size"]
    assert loaded.head.config == reference.head.config
    for (k, a), (_, b) in zip(loaded.head.state_dict().items(), reference.head.state_dict().items()):
        assert torch.equal(a, b), k
    _set_config(export, model_type="llama")
    with pytest.raises(CheckpointError, match=r"'model_type' = 'llama'.*\['deepseek_v2', 'deepseek_v3', 'kimi_k2'\]"):
        load_head(export)


@pytest.mark.parametrize("change, message", [
    (lambda t: t.pop(P + "kv_b_proj.weight"),
     rf"missing tensor '{P}kv_b_proj.weight' \(expected shape \[{HEADS * (NOPE + V_DIM)}, {KV_RANK}\]\)"),
    (lambda t: t.update({P + "kv_a_proj_with_mqa.weight": torch.zeros(KV_RANK + ROPE, H)}),
     rf"tensor '{P}kv_a_proj_with_mqa.weight' has shape \[{KV_RANK + ROPE}, {H}\], expected \[{KV_RANK + ROPE}, "
     rf"{2 * H}\] \(from config.json\)"),
    (lambda t: t.update({P + "q_proj.weight": torch.zeros(HEADS * (NOPE + ROPE), 2 * H)}),
     rf"unexpected tensor\(s\) \['{P}q_proj.weight'\] for dialect 'mla'"),
    (lambda t: t.pop(P + "q_a_layernorm.weight"), rf"missing tensor '{P}q_a_layernorm.weight' \(expected shape \[16\]\)"),
])
def test_strict_loading_names_file_key_and_shapes(tmp_path, change, message):
    path = random_mla_head(tmp_path / "h", rope_scaling=YARN)
    _rewrite(path, change)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: " + message):
        load_head(path)


def test_q_lora_rank_null_needs_q_proj(tmp_path):
    path = random_mla_head(tmp_path / "h", q_lora_rank=None)
    assert P + "q_proj.weight" in load_file(path / "model.safetensors")
    _set_config(path, q_lora_rank=Q_RANK)
    with pytest.raises(CheckpointError, match=rf"missing tensor '{P}q_a_proj.weight'"):
        load_head(path)


@pytest.mark.parametrize("changes, message", [
    (dict(kv_lora_rank=None), r"missing key 'kv_lora_rank'"),
    (dict(rope_scaling={"type": "linear", "factor": 2.0}), r"'rope_scaling' has type 'linear'"),
    (dict(rope_scaling={"type": "yarn", "factor": 4.0}), r"'rope_scaling.original_max_position_embeddings' missing"),
    (dict(attention_bias=True), r"'attention_bias' = true"),
    (dict(norm_before_fc=True), r"'norm_before_fc' = true; neither engine's MLA head"),
    (dict(model_type="llama"), r"'model_type' = 'llama'"),
    (dict(qk_rope_head_dim=7), r"qk_rope_head_dim=7 is odd"),
    (dict(draft_vocab_size=40), r"tensor 'd2t' has shape \[96\], expected \[40\]"),
])
def test_bad_config_is_one_clear_error(tmp_path, changes, message):
    path = random_mla_head(tmp_path / "h", rope_scaling=YARN)
    _set_config(path, **changes)
    with pytest.raises(CheckpointError, match=r"config\.json: |model\.safetensors: "):
        load_head(path)
    with pytest.raises(CheckpointError, match=message):
        load_head(path)


def test_reduced_vocab_needs_d2t(tmp_path):
    path = random_mla_head(tmp_path / "h", rope_scaling=YARN, draft_vocab=40)
    assert list(load_head(path).head.lm_head.weight.shape) == [40, H]
    _rewrite(path, lambda t: (t.pop("d2t"), t.pop("t2d")))
    with pytest.raises(CheckpointError, match=r"missing tensor 'd2t' but draft_vocab_size=40 < vocab_size=96"):
        load_head(path)


def test_key_audit_for_mla_configs(tmp_path):
    path = random_mla_head(tmp_path / "h", rope_scaling=YARN)
    _set_config(path, n_routed_experts=256, moe_intermediate_size=2048, first_k_dense_replace=3, head_dim=ROPE,
                rope_interleave=True)
    audit = load_head(path).key_audit
    assert "MoE" in audit.harmless["n_routed_experts"] and "qk_rope_head_dim" in audit.harmless["head_dim"]
    assert {"q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "rope_interleave"} <= set(audit.consumed)
    assert audit.unknown == []
    for key, value in (("index_topk", 2048), ("use_aux_norm", True), ("apply_yarn_scaling", False)):
        bad = random_mla_head(tmp_path / key, rope_scaling=YARN)
        _set_config(bad, **{key: value})
        with pytest.raises(CheckpointError, match=rf"'{key}' = {value!r}.*--allow-unknown-head-keys"):
            load_head(bad)
        assert list(load_head(bad, allow_unknown_keys=True).key_audit.engine_math) == [key]


# -- the loop with a tiny DeepSeek-V3 target: lossless, the profile equal to it, the report and checks -------

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("mla")
    target = make_target(root / "target", family="deepseek_v3", seed=3,
                         overrides=dict(q_lora_rank=Q_RANK, rope_scaling=dict(YARN)))
    prompts = write_prompts(root / "prompts.jsonl", n=4, seed=1)
    head = train_head(target, root / "head", prompts, aux_hf=(2, 4, 5), steps=12, num_steps=3, new_tokens=24,
                      dialect="mla", head_cfg=mla_config(rope_scaling=dict(YARN)))
    return root, target, prompts, head


def test_loop_lossless_and_profile_equal(world):
    _, target, prompts, head = world
    cfg = Settings.of(target=str(target), draft=str(head), prompts=str(prompts), max_new_tokens=24, num_steps=3)
    checked = api.evaluate(cfg, LoopOptions(check_lossless=True), progress=False)
    assert checked.report["summary"]["lossless"] is True and checked.report["summary"]["lossless_checked"] == 4
    loop = api.evaluate(cfg, progress=False)
    prof = api.profile(cfg, ProfileOptions(max_steps=3), progress=False).report["by_num_steps"]["3"]
    assert prof["per_position"] == loop.report["per_position"] and prof["histogram"] == loop.report["histogram"]
    assert prof["summary"] == loop.report["summary"]
    rates = [p["conditional_rate"] for p in loop.report["per_position"]]
    assert 0 < rates[0] < 1, rates                     # the equalities above are not about a trivial draft
    echo = loop.report["config"]["head"]
    assert echo["kind"] == "mla" and echo["dialect"] == "mla"
    assert echo["mla"]["q_lora_rank"] == Q_RANK and echo["mla"]["kv_lora_rank"] == KV_RANK
    assert echo["mla"]["qk_rope_head_dim"] == ROPE and "GPT-J" in echo["mla"]["rope"]
    assert echo["rope_scaling"]["factor"] == YARN["factor"] and echo["variant"]["kind"] == "mla"
    codes = {f["code"]: f["severity"] for f in loop.report["config"]["sanity"]}
    assert codes["mla-head"] == "info" and codes["mla-rope"] == "info"
    assert "mla-rope-mismatch" not in codes and "rope-interleaved" not in codes


def test_tree_loop_lossless_and_profile_equal(world):
    """Trees drive the same attention interface (K frontier queries over the cache and their ancestors)."""
    _, target, prompts, head = world
    run = Settings.of(target=str(target), draft=str(head), prompts=str(prompts), max_new_tokens=24, num_steps=3,
                    topk=2, num_draft_tokens=6)
    loop = api.evaluate(run, LoopOptions(check_lossless=True), progress=False)
    assert loop.report["summary"]["lossless"] is True
    prof = api.profile(run, ProfileOptions(max_steps=3), progress=False)
    for a, b in zip(loop.samples, prof.samples):
        assert a.accepted_per_cycle == b.extra["accepted_per_cycle_by_num_steps"]["3"]
    assert prof.report["by_num_steps"]["3"]["per_position"] == loop.report["per_position"]


def test_rope_mismatch_with_the_target_is_a_warning(world, tmp_path):
    _, target, prompts, _ = world
    path = random_mla_head(tmp_path / "h", rope_scaling={**YARN, "factor": 8.0}, q_lora_rank=None)
    _set_config(path, rope_interleave=False)
    oracle = api.load_oracle(Settings.of(target=str(target), draft=str(path), prompts=str(prompts)))
    found = {f["code"]: f for f in oracle.resolved.as_dict()["sanity"]}
    assert found["mla-rope-mismatch"]["severity"] == "warning"
    assert "rope_scaling.factor 8.0 vs 4.0" in found["mla-rope-mismatch"]["message"]
    assert found["mla-q-proj"]["severity"] == "warning" and found["mla-rope-interleave"]["severity"] == "warning"


def test_sglang_reads_nested_ids_per_target_family(world, tmp_path):
    """SGLang's deepseek_v2.py adds 1 to the nested ids only when the first is 1 since PR #25454; its
    llama.py always adds 1. On the DeepSeek-V3 target a config whose nested ids start at 2 is tapped
    unchanged by current SGLang and +1 by older SGLang: both are reported, and the recommended lines
    say no nested list serves both versions."""
    from fixtures import make_target

    from eagle_eval.models.capture import TAP_ENGINES as ENGINES

    root, target, prompts, head = world
    starts_at_2 = tmp_path / "nested-2"
    starts_at_2.mkdir()
    (starts_at_2 / "model.safetensors").write_bytes((head / "model.safetensors").read_bytes())
    cfg = json.loads((head / "config.json").read_text())
    cfg.pop("eagle_aux_hidden_state_layer_ids", None)
    cfg["eagle_config"] = {**cfg.get("eagle_config", {}), "eagle_aux_hidden_state_layer_ids": [2, 4, 5]}
    (starts_at_2 / "config.json").write_text(json.dumps(cfg))
    oracle = api.load_oracle(Settings.of(target=str(target), draft=str(starts_at_2), prompts=str(prompts)))
    aux = oracle.resolved.as_dict()["aux_layers"]
    assert aux["hf"] == [3, 5, 6]                                   # eagle-eval reads nested ids SGLang-classic
    taps = {e: t["hf"] for e, t in aux["engines"].items()}
    assert list(aux["engines"]) == list(ENGINES)
    assert taps == {"sglang": [2, 4, 5], "sglang_before_25454": [3, 5, 6], "vllm_v1": [2, 4, 5], "vllm_v2": [2, 4, 5]}
    codes = {f["code"]: f for f in oracle.resolved.as_dict()["sanity"]}
    assert "sglang-taps-differ" in codes and "sglang-before-25454-taps-differ" not in codes
    assert "PR #25454" in codes["sglang-taps-differ"]["message"]
    assert "no nested list serves both versions" in codes["sglang-taps-differ"]["detail"]["recommended"]
    # the same config on a Llama target: llama.py adds 1, no version split
    llama = make_target(tmp_path / "llama", num_layers=8, seed=3)
    oracle = api.load_oracle(Settings.of(target=str(llama), draft=str(starts_at_2), prompts=str(prompts)))
    taps = {e: t["hf"] for e, t in oracle.resolved.as_dict()["aux_layers"]["engines"].items()}
    assert taps == {"sglang": [3, 5, 6], "vllm_v1": [2, 4, 5], "vllm_v2": [2, 4, 5]}
