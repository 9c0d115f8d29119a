"""Head variants: norm_before_fc, EAGLE-3.1 fc_norm / norm_output, interleaved and llama3-scaled
RoPE, boundary aux ids. Per variant: strict loading, the draft forward against a plain re-implementation
of the formulas written here, the loop lossless vs plain greedy, and the profile equal to the loop."""

import json
import math

import pytest
import torch
from fixtures import VOCAB, head_config, make_target, train_head, write_prompts
from safetensors.torch import load_file, save_file

from eagle_eval import api
from eagle_eval.settings import LoopOptions, ProfileOptions, Settings
from eagle_eval.heads.io import CheckpointError, load_head, save_head
from eagle_eval.heads.eagle3.layer import DraftCache, Eagle3Head

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
VARIANTS = {
    "norm_before_fc": dict(norm_before_fc=True),
    "fc_norm": dict(fc_norm=True),
    "norm_output": dict(norm_output=True),
    "interleaved": dict(rope_interleaved=True),
    "llama3": dict(rope_theta=500000.0, rope_scaling=LLAMA3),
    "eagle3.1": dict(fc_norm=True, norm_output=True),
}


def random_head(path, dialect="specforge", seed=0, **kw):
    """A head with every weight random, norm weights too (1 + noise), saved in `dialect`."""
    torch.manual_seed(seed)
    head = Eagle3Head(head_config(**kw))
    with torch.no_grad():
        for name, p in head.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if p.dim() == 1 else 0.3 * torch.randn_like(p))
    save_head(head, path, dialect=dialect)
    return path


# -- the formulas, written out (docs/eagle3.md section 2, the variants of heads/eagle3/config.py) -----------

def rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def inv_freq(d, theta, scaling):
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    if scaling is None:
        return inv
    old, factor = scaling["original_max_position_embeddings"], scaling["factor"]
    low_wl, high_wl = old / scaling["low_freq_factor"], old / scaling["high_freq_factor"]
    out = []
    for f in inv.tolist():                              # Meta's llama3 rule, one frequency at a time
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(f)
        elif wl > low_wl:
            out.append(f / factor)
        else:
            s = (old / wl - scaling["low_freq_factor"]) / (scaling["high_freq_factor"] - scaling["low_freq_factor"])
            out.append((1 - s) * f / factor + s * f)
    return torch.tensor(out, dtype=torch.float64)


def rotate(x, pos, inv, interleaved):
    """x [heads, T, d]: rotate pairs (2i, 2i+1) or (i, i+d/2) by angle pos * inv[i]."""
    ang = pos[:, None].double() * inv[None]                                    # [T, d/2]
    c, s = ang.cos(), ang.sin()
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * c - b * s, a * s + b * c), dim=-1)


def ref_fuse(w, aux, kw):
    if kw.get("norm_before_fc"):
        aux = rms(aux, w["input_norm.weight"])
    if kw.get("fc_norm"):
        aux = torch.cat([rms(a, w[f"fc_norm.{i}.weight"]) for i, a in enumerate(aux.chunk(3, dim=-1))], dim=-1)
    return aux @ w["fc.weight"].T


def ref_step(w, kw, e, g, pos, past):
    """One call of the decoder layer: e, g [T, H], pos [T]; past = (keys, values) [kv, P, d] or None.
    Returns (logits [T, V_d], next hidden [T, H], (keys, values))."""
    heads, kv, d = 4, 2, 12
    u = torch.cat([rms(e, w["midlayer.input_layernorm.weight"]), rms(g, w["midlayer.hidden_norm.weight"])], -1)
    t = u.shape[0]
    q = (u @ w["midlayer.self_attn.q_proj.weight"].T).view(t, heads, d).transpose(0, 1)
    k = (u @ w["midlayer.self_attn.k_proj.weight"].T).view(t, kv, d).transpose(0, 1)
    v = (u @ w["midlayer.self_attn.v_proj.weight"].T).view(t, kv, d).transpose(0, 1)
    inv = inv_freq(d, kw.get("rope_theta", 10000.0), kw.get("rope_scaling"))
    q, k = rotate(q, pos, inv, kw.get("rope_interleaved")), rotate(k, pos, inv, kw.get("rope_interleaved"))
    if past is not None:
        k, v = torch.cat([past[0], k], dim=1), torch.cat([past[1], v], dim=1)
    p = k.shape[1] - t
    ctx = torch.zeros(heads, t, d, dtype=u.dtype)
    for h in range(heads):
        for i in range(t):
            kh, vh = k[h // (heads // kv), : p + i + 1], v[h // (heads // kv), : p + i + 1]
            ctx[h, i] = torch.softmax(kh @ q[h, i] / math.sqrt(d), dim=0) @ vh
    s = g + ctx.transpose(0, 1).reshape(t, -1) @ w["midlayer.self_attn.o_proj.weight"].T
    x = rms(s, w["midlayer.post_attention_layernorm.weight"])
    m = w["midlayer.mlp.gate_proj.weight"]
    mlp = (torch.nn.functional.silu(x @ m.T) * (x @ w["midlayer.mlp.up_proj.weight"].T)) @ w["midlayer.mlp.down_proj.weight"].T
    out = s + mlp
    normed = rms(out, w["norm.weight"])
    return normed @ w["lm_head.weight"].T, normed if kw.get("norm_output") else out, (k, v)


@pytest.mark.parametrize("name", VARIANTS)
def test_draft_forward_equals_the_formulas(tmp_path, name):
    kw = VARIANTS[name]
    path = random_head(tmp_path / "h", **kw)
    head = load_head(path).head.double()
    w = {k: t.double() for k, t in load_file(path / "model.safetensors").items()}
    torch.manual_seed(1)
    aux, e, e2 = torch.randn(7, 144).double() * 3, torch.randn(7, 48).double(), torch.randn(1, 48).double()
    cache = DraftCache()
    out = head.step(e[None], head.fuse(aux[None]), torch.arange(7)[None], cache)
    out2 = head.step(e2[None], out[:, -1:], torch.tensor([[7]]), cache)       # the recurrence: step 2 of a chain
    logits, nxt, past = ref_step(w, kw, e, ref_fuse(w, aux, kw), torch.arange(7), None)
    logits2, _, _ = ref_step(w, kw, e2, nxt[-1:], torch.tensor([7]), past)
    # float64 throughout except the head's RoPE angles (float32, as the engines compute them)
    torch.testing.assert_close(head.lm(out)[0], logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(head.lm(out2)[0], logits2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_changes_the_draft(tmp_path, name):
    """The flag is read and matters: the same weights without it draft differently."""
    kw = VARIANTS[name]
    head = load_head(random_head(tmp_path / "h", **kw)).head
    plain = Eagle3Head(head_config())
    plain.load_state_dict({k: v for k, v in head.state_dict().items() if not k.startswith(("input_norm", "fc_norm"))},
                          strict=False)
    torch.manual_seed(1)
    aux, e = torch.randn(1, 7, 144) * 3, torch.randn(1, 7, 48)
    a = head.step(e, head.fuse(aux), torch.arange(7)[None], DraftCache())
    a = head.step(e[:, :1], a[:, -1:], torch.tensor([[7]]), DraftCache())
    b = plain.step(e, plain.fuse(aux), torch.arange(7)[None], DraftCache())
    b = plain.step(e[:, :1], b[:, -1:], torch.tensor([[7]]), DraftCache())
    assert not torch.allclose(head.logits(a), plain.logits(b), atol=1e-3)


@pytest.mark.parametrize("dialect", ["specforge", "eagle", "speculators"])
@pytest.mark.parametrize("name", VARIANTS)
def test_variant_round_trips_each_layout(tmp_path, name, dialect):
    kw = VARIANTS[name]
    loaded = load_head(random_head(tmp_path / "h", dialect=dialect, **kw))
    for key, value in kw.items():
        assert getattr(loaded.head.config, key) == value
    assert loaded.key_audit.unknown == [] and loaded.key_audit.engine_math == {}


@pytest.mark.parametrize("dialect", ["specforge", "eagle", "speculators"])
def test_norm_before_residual_round_trips_each_layout(tmp_path, dialect):
    """vLLM reads `norm_before_residual` from the top of any EAGLE-3 config (llama_eagle3.py): every layout keeps it
    (the SpecForge and EAGLE writers dropped it)."""
    loaded = load_head(random_head(tmp_path / "h", dialect=dialect, norm_before_residual=True))
    assert loaded.head.config.norm_before_residual is True
    assert json.loads((tmp_path / "h" / "config.json").read_text())["norm_before_residual"] is True


def _rewrite(path, fn):
    tensors = load_file(path / "model.safetensors")
    fn(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def _set_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("flag, key, shape", [("norm_before_fc", "input_norm.weight", [144]),
                                              ("fc_norm", "fc_norm.1.weight", [48])])
def test_strict_loading_of_variant_tensors(tmp_path, flag, key, shape):
    path = random_head(tmp_path / "h", **{flag: True})
    weight = load_file(path / "model.safetensors")[key]
    assert list(weight.shape) == shape
    _rewrite(path, lambda t: t.pop(key))                                      # flag on, weight missing
    with pytest.raises(CheckpointError, match=rf"model\.safetensors: missing tensor '{key}' \(expected shape "
                                              rf"\[{shape[0]}\]\) \(config.json sets {flag}: true"):
        load_head(path)
    _rewrite(path, lambda t: t.update({key: torch.ones(shape[0] + 1)}))     # wrong shape
    with pytest.raises(CheckpointError, match=rf"'{key}' has shape \[{shape[0] + 1}\], expected \[{shape[0]}\]"):
        load_head(path)
    plain = random_head(tmp_path / "plain")                                   # weight present, flag off
    _rewrite(plain, lambda t: t.update({key: weight}))
    with pytest.raises(CheckpointError, match=rf"unexpected tensor\(s\) \['{key}'\].*no {flag}: true"):
        load_head(plain)


def test_exclusive_norms_and_disagreeing_flag_locations(tmp_path):
    path = random_head(tmp_path / "h", norm_before_fc=True)
    _set_config(path, fc_norm=True)
    with pytest.raises(CheckpointError, match="config.json: norm_before_fc and fc_norm exclude each other"):
        load_head(path)
    path = random_head(tmp_path / "h2", norm_before_fc=True)
    cfg = json.loads((path / "config.json").read_text())
    _set_config(path, eagle_config={**cfg["eagle_config"], "norm_before_fc": False})
    with pytest.raises(CheckpointError, match="'norm_before_fc' = True at the top level but eagle_config"):
        load_head(path)


def test_norm_before_fc_in_eagle_config_only(tmp_path):
    """NVIDIA's gpt-oss exports put the flag in eagle_config (vLLM PR #42143 reads it there)."""
    path = random_head(tmp_path / "h", norm_before_fc=True)
    cfg = json.loads((path / "config.json").read_text())
    cfg.pop("norm_before_fc")
    cfg["eagle_config"]["norm_before_fc"] = True
    (path / "config.json").write_text(json.dumps(cfg))
    assert load_head(path).head.config.norm_before_fc


# -- the loop with each variant: lossless, and the profile equal to it --------------------------------

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("variants")
    return root, make_target(root / "target", seed=3), write_prompts(root / "prompts.jsonl", n=4, seed=1)


LOOP_CASES = {**{k: (v, (2, 4, 5), "sglang") for k, v in VARIANTS.items()},
              "boundary": ({}, (2, 4, 8), "boundary")}


@pytest.mark.parametrize("name", LOOP_CASES)
def test_loop_lossless_and_profile_equal(world, name):
    root, target, prompts = world
    kw, aux_hf, convention = LOOP_CASES[name]
    head = train_head(target, root / f"head-{name}", prompts, aux_hf=aux_hf, steps=12, num_steps=3,
                      new_tokens=24, head_kw=kw, dialect="speculators" if "norm" in name else "specforge")
    ids = [i - 1 for i in aux_hf] if convention == "sglang" else list(aux_hf)
    cfg = Settings.of(target=str(target), draft=str(head), prompts=str(prompts), max_new_tokens=24, num_steps=3,
                    aux_layers=ids, aux_convention=convention)
    checked = api.evaluate(cfg, LoopOptions(check_lossless=True), progress=False)
    assert checked.report["summary"]["lossless"] is True and checked.report["summary"]["lossless_checked"] == 4
    loop = api.evaluate(cfg, progress=False)
    prof = api.profile(cfg, ProfileOptions(max_steps=3), progress=False).report["by_num_steps"]["3"]
    assert prof["per_position"] == loop.report["per_position"] and prof["histogram"] == loop.report["histogram"]
    assert prof["summary"] == loop.report["summary"]
    rates = [p["conditional_rate"] for p in loop.report["per_position"]]
    assert 0 < rates[0] < 1, rates                     # the equalities above are not about a trivial draft
    head_echo = loop.report["config"]["head"]["variant"]
    for key, value in kw.items():
        expected = {"rope_interleaved": ("rope", "interleaved (GPT-J)")}.get(key, (key, value))
        assert head_echo[expected[0]] == expected[1]
    aux = loop.report["config"]["aux_layers"]
    assert aux["boundary"] == list(aux_hf) and aux["final_prenorm"] == (8 in aux_hf)


def test_boundary_final_state_is_before_the_final_norm(world):
    """Boundary N taps the final norm's input; output_hidden_states[N] is after the norm."""
    from transformers import AutoModelForCausalLM

    from eagle_eval.models.capture import FeatureCapture, resolve_aux_layers
    from eagle_eval.models.target import Target

    model = AutoModelForCausalLM.from_pretrained(world[1], dtype=torch.float32).eval()
    aux = resolve_aux_layers(8, cli_ids=[2, 4, 8], cli_convention="boundary")
    seen = []
    model.model.norm.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    ids = torch.randint(5, 90, (1, 9))
    with torch.no_grad(), FeatureCapture(Target(model).layers, aux.hf, "cpu") as cap:
        out = model(ids, output_hidden_states=True)
        feats = cap.pop()
    h = model.config.hidden_size
    assert torch.equal(feats[..., :h], out.hidden_states[2]) and torch.equal(feats[..., h:2 * h], out.hidden_states[4])
    assert torch.equal(feats[..., 2 * h:], seen[0])
    assert not torch.allclose(feats[..., 2 * h:], out.hidden_states[8], atol=1e-3)


# -- no key goes unread --------------------------------------------------------------------------------

def test_audit_sorts_every_key(tmp_path):
    path = random_head(tmp_path / "h", norm_before_fc=True)
    _set_config(path, torch_dtype="bfloat16", transformers_version="5.24.0", logit_scale=1.0)
    audit = load_head(path).key_audit
    raw = json.loads((path / "config.json").read_text())
    nested = {f"eagle_config.{k}" for k in raw["eagle_config"]}
    assert set(audit.consumed) | set(audit.harmless) == set(raw) | nested
    assert "norm_before_fc" in audit.consumed and "eagle_config.use_aux_hidden_state" in audit.consumed
    assert "transformers_version" in audit.harmless and "neutral value 1.0" in audit.harmless["logit_scale"]


@pytest.mark.parametrize("dialect, section, key, value", [
    ("specforge", None, "logit_scale", 2.0),
    ("specforge", "eagle_config", "use_last_layernorm", False),
    ("speculators", "transformer_layer_config", "sliding_window", 128),
])
def test_planted_math_key_is_an_error_naming_it(tmp_path, dialect, section, key, value):
    path = random_head(tmp_path / "h", dialect=dialect)
    cfg = json.loads((path / "config.json").read_text())
    (cfg.setdefault(section, {}) if section else cfg)[key] = value
    (path / "config.json").write_text(json.dumps(cfg))
    name = f"{section}.{key}" if section else key
    with pytest.raises(CheckpointError, match=rf"config\.json: key\(s\) that change.*'{name}' = {value!r}.*"
                                              r"--allow-unknown-head-keys"):
        load_head(path)
    loaded = load_head(path, allow_unknown_keys=True)
    assert list(loaded.key_audit.engine_math) == [name]
    assert any(name in n and "proceeding" in n for n in loaded.key_notes)


@pytest.mark.parametrize("dialect, section", [("specforge", None), ("speculators", "transformer_layer_config")])
def test_a_partial_rotary_factor_inside_rope_parameters_is_an_error_naming_it(tmp_path, dialect, section):
    """transformers 5 keeps partial_rotary_factor inside rope_parameters; an engine honouring it rotates a part of
    head_dim (speculators#613), eagle-eval rotates all of it: refused like the top-level key, neutral at 1.0."""
    path = random_head(tmp_path / "h", dialect=dialect)
    cfg = json.loads((path / "config.json").read_text())
    layer = cfg[section] if section else cfg
    layer["rope_parameters"] = {"rope_type": "default", "rope_theta": float(layer.get("rope_theta", 10000.0)),
                                "partial_rotary_factor": 0.25}
    layer.pop("rope_theta", None)
    (path / "config.json").write_text(json.dumps(cfg))
    name = (f"{section}." if section else "") + "rope_parameters.partial_rotary_factor"
    with pytest.raises(CheckpointError, match=rf"'{name}' = 0.25.*--allow-unknown-head-keys"):
        load_head(path)
    layer["rope_parameters"]["partial_rotary_factor"] = 1.0
    (path / "config.json").write_text(json.dumps(cfg))
    assert "neutral value 1.0" in load_head(path).key_audit.harmless[name]


# The extra keys of the Llama-style heads SpecForge ships for DeepSeek-V3-family targets (sgl-project/SpecForge
# configs/: kimi-k2-eagle3.json @03ebe2c, kimi-k25-eagle3.json @3f9b5fc, deepseek-v3-671b-eagle3.json @c02a09a),
# the values theirs; the shapes stay the test head's.
SPECFORGE_SHIPPED = {
    "kimi-k2": dict(model_type="kimi_k2", attention_bias=False, attention_dropout=0.0, bos_token_id=163584,
                    eos_token_id=163585, initializer_range=0.02, max_window_layers=48, rope_scaling=None,
                    sliding_window=None, tie_word_embeddings=False, torch_dtype="bfloat16",
                    transformers_version="4.53.2", use_cache=True, use_sliding_window=False),
    "kimi-k25": dict(model_type="llama", attention_bias=False, attention_dropout=0.0, bos_token_id=163584,
                     dtype="bfloat16", eos_token_id=163585, initializer_range=0.02, max_window_layers=48,
                     mlp_bias=False, pretraining_tp=1, rope_scaling=None, sliding_window=None,
                     tie_word_embeddings=False, transformers_version="4.57.0", use_cache=True,
                     use_sliding_window=False),
    "deepseek-v3-671b": dict(model_type="llama", bos_token_id=128000, eos_token_id=128001, initializer_range=0.02,
                             pad_token_id=0, tie_word_embeddings=False, torch_dtype="float16",
                             transformers_version="4.28.1", use_cache=True),
}


@pytest.mark.parametrize("name", list(SPECFORGE_SHIPPED))
def test_specforge_shipped_head_configs_load_with_every_key_accounted_for(tmp_path, name):
    path = random_head(tmp_path / "h")
    reference = load_head(path)
    _set_config(path, **{k: v for k, v in SPECFORGE_SHIPPED[name].items() if v is not None})
    cfg = json.loads((path / "config.json").read_text())
    cfg.update({k: v for k, v in SPECFORGE_SHIPPED[name].items() if v is None})   # explicit nulls stay in
    (path / "config.json").write_text(json.dumps(cfg))
    loaded = load_head(path)
    assert loaded.key_audit.unknown == [] and loaded.key_audit.engine_math == {}
    assert loaded.dialect == "specforge" and loaded.head.config == reference.head.config
    for (k, a), (_, b) in zip(loaded.head.state_dict().items(), reference.head.state_dict().items()):
        assert torch.equal(a, b), k
    kimi_k2 = [n for n in loaded.key_notes if "'model_type' = 'kimi_k2'" in n]
    assert len(kimi_k2) == (name == "kimi-k2") and len(loaded.key_notes) == len(kimi_k2)
    if kimi_k2:
        assert "loaded as a Llama draft layer" in kimi_k2[0] and "DeepseekV3Config" in kimi_k2[0]


def test_deepseek_model_type_in_a_speculators_layer_is_refused(tmp_path):
    path = random_head(tmp_path / "h", dialect="speculators")
    cfg = json.loads((path / "config.json").read_text())
    cfg["transformer_layer_config"]["model_type"] = "kimi_k2"
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"'model_type' = 'kimi_k2'; only Llama-style draft layers"):
        load_head(path)


def test_harmless_unknown_key_warns(tmp_path):
    path = random_head(tmp_path / "h", dialect="speculators")
    cfg = json.loads((path / "config.json").read_text())
    cfg["training_note"] = "run 7"
    cfg["transformer_layer_config"]["my_flag"] = 1
    (path / "config.json").write_text(json.dumps(cfg))
    loaded = load_head(path)
    assert loaded.key_audit.unknown == ["training_note", "transformer_layer_config.my_flag"]
    assert len(loaded.key_notes) == 1 and "unknown key(s)" in loaded.key_notes[0]


def test_option_through_api_and_cli(world, tmp_path):
    from click.testing import CliRunner

    from eagle_eval.cli import main

    _, target, prompts = world
    path = random_head(tmp_path / "h")
    _set_config(path, logit_scale=2.0)
    args = ["run", "--target", str(target), "--draft", str(path), "--prompts", str(prompts),
            "--max-new-tokens", "4", "--limit", "1"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and "'logit_scale' = 2.0" in res.output and "config.json" in res.output
    res = CliRunner().invoke(main, args + ["--allow-unknown-head-keys"])
    assert res.exit_code == 0, res.output
    rep = api.evaluate(Settings.of(target=str(target), draft=str(path), prompts=str(prompts), max_new_tokens=4,
                                 limit=1, allow_unknown_head_keys=True), progress=False).report
    assert rep["config"]["head"]["keys"]["engine_math"] == {"logit_scale": rep["config"]["head"]["keys"]
                                                             ["engine_math"]["logit_scale"]}
    codes = {f["code"]: f["severity"] for f in rep["config"]["sanity"]}
    assert codes["head-key-engine-math"] == "warning" and any("logit_scale" in w for w in rep["warnings"])


def test_variant_sanity_findings(world, tmp_path):
    _, target, prompts = world
    path = random_head(tmp_path / "h", norm_before_fc=True, rope_interleaved=True)
    _rewrite(path, lambda t: t.update({"input_norm.weight": torch.ones(144)}))     # left at init
    oracle = api.load_oracle(Settings.of(target=str(target), draft=str(path), prompts=str(prompts)))
    codes = {f["code"]: f["severity"] for f in oracle.resolved.as_dict()["sanity"]}
    assert codes["input_norm-untrained"] == "warning" and codes["rope-interleaved"] == "warning"
    assert codes["norm-before-fc"] == "info" and codes["head-keys"] == "info"
    trained = random_head(tmp_path / "t", norm_before_fc=True)
    oracle = api.load_oracle(Settings.of(target=str(target), draft=str(trained), prompts=str(prompts),
                                       aux_layers=(2, 4, 8), aux_convention="boundary"))
    codes = {f["code"]: f["severity"] for f in oracle.resolved.as_dict()["sanity"]}
    assert "input_norm-untrained" not in codes and codes["aux-final-prenorm"] == "warning"
    assert VOCAB == oracle.speculator.head.config.vocab_size
