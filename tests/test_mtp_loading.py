"""Reading MTP layers from the target's checkpoint: every tensor mapped, shapes checked, refusals naming the file,
the key and both shapes; what no engine reads is compared and noted; quantized MTP tensors refused with the reason."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from mtp_fixtures import load_target, make_mtp_target
from safetensors.torch import load_file, save_file

from eagle_eval.heads.eagle3.config import CheckpointError
from eagle_eval.heads.mtp.keys import checkpoint_tensors
from eagle_eval.heads.mtp.load import load_from_target


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp-load")
    return {f: make_mtp_target(root / f, f, n_mtp=2 if f == "glm4_moe" else 1)
            for f in ("deepseek_v3", "glm4_moe", "qwen3_next", "qwen3_5", "mimo")}


def edited(folder, tmp_path, change=None, config=None):
    """A copy of `folder` with its tensors (and config.json) changed."""
    copy = tmp_path / f"{folder.name}-edited"
    shutil.copytree(folder, copy)
    if change:
        sd = load_file(copy / "model.safetensors")
        change(sd)
        save_file(sd, copy / "model.safetensors", metadata={"format": "pt"})
    if config:
        conf = json.loads((copy / "config.json").read_text())
        config(conf)
        (copy / "config.json").write_text(json.dumps(conf))
    return copy


def load(folder):
    return load_from_target(load_target(folder))


@pytest.mark.parametrize("family", ["deepseek_v3", "glm4_moe", "qwen3_next", "qwen3_5", "mimo"])
def test_every_mtp_tensor_is_read_and_written_back_by_name(built, family):
    folder = built[family]
    loaded = load(folder)
    stack = loaded.head
    assert loaded.kind == "mtp" and loaded.dialect == family and stack.config.num_layers == (2 if family ==
                                                                                            "glm4_moe" else 1)
    stored = load_file(folder / "model.safetensors")
    written = checkpoint_tensors(stack)
    mtp_keys = {k for k in stored if k.startswith(("mtp.", "model.mtp_layers.", "model.layers.2.", "model.layers.3."))
                and not k.endswith(("embed_tokens.weight", "shared_head.head.weight"))}
    assert set(written) == mtp_keys                              # every tensor mapped, none invented
    assert all(torch.equal(written[k], stored[k]) for k in mtp_keys)
    assert type(stack.blocks[0]).__name__ == {"deepseek_v3": "DeepseekV3DecoderLayer", "glm4_moe": "Glm4MoeDecoderLayer",
                                              "qwen3_next": "Qwen3NextDecoderLayer", "qwen3_5": "Qwen3_5DecoderLayer",
                                              "mimo": "Qwen2DecoderLayer"}[family]
    if family in ("qwen3_next", "qwen3_5"):                      # zero-centred norms: x * (1 + w)
        norm = stack.out_norms[0]
        x = torch.randn(3, norm.weight.shape[0])
        expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + norm.weight)
        assert torch.allclose(norm(x), expected, atol=1e-5)


def test_a_missing_tensor_is_named_with_its_shape(built, tmp_path):
    folder = edited(built["glm4_moe"], tmp_path, lambda sd: sd.pop("model.layers.3.self_attn.k_proj.bias"))
    with pytest.raises(CheckpointError, match=r"missing MTP tensor 'model.layers.3.self_attn.k_proj.bias' \(expected "
                                              r"shape \(16,\); .*counts 2 MTP layer"):
        load(folder)


def test_a_missing_expert_is_named(built, tmp_path):
    folder = edited(built["glm4_moe"], tmp_path, lambda sd: sd.pop("model.layers.2.mlp.experts.3.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing MTP tensor 'model.layers.2.mlp.experts.3.up_proj.weight' "
                                              r"\(experts \[3\] of up_proj absent; the config has 4 routed experts\)"):
        load(folder)


def test_a_misshaped_tensor_names_file_key_and_both_shapes(built, tmp_path):
    def change(sd):
        sd["mtp.fc.weight"] = sd["mtp.fc.weight"][:, :-1].contiguous()
    folder = edited(built["qwen3_next"], tmp_path, change)
    with pytest.raises(CheckpointError, match=r"model.safetensors: MTP tensor 'mtp.fc.weight' has shape \[32, 63\], "
                                              r"expected \[32, 64\]"):
        load(folder)
    def expert(sd):
        sd["model.layers.2.mlp.experts.1.down_proj.weight"] = torch.zeros(32, 8)
    with pytest.raises(CheckpointError, match="disagree in shape"):
        load(edited(built["glm4_moe"], tmp_path / "x", expert))


def test_unexpected_mtp_tensors_are_refused(built, tmp_path):
    folder = edited(built["mimo"], tmp_path, lambda sd: sd.update({"model.mtp_layers.1.input_proj.weight":
                                                                    torch.zeros(32, 64)}))
    with pytest.raises(CheckpointError, match=r"unexpected MTP tensor 'model.mtp_layers.1.input_proj.weight': .* counts "
                                              r"1 MTP layer\(s\) \(num_nextn_predict_layers\)"):
        load(folder)
    folder = edited(built["deepseek_v3"], tmp_path / "b", lambda sd: sd.update(
        {"model.layers.2.self_attn.q_proj.bias": torch.zeros(32)}))
    with pytest.raises(CheckpointError, match=r"unexpected MTP tensor 'model.layers.2.self_attn.q_proj.bias': the "
                                              "DeepseekV3DecoderLayer block"):
        load(folder)


def test_a_target_without_mtp_layers_is_refused(built, tmp_path):
    folder = edited(built["glm4_moe"], tmp_path, config=lambda c: c.pop("num_nextn_predict_layers"))
    with pytest.raises(CheckpointError, match=r"config.json: key 'num_nextn_predict_layers' absent: a GLM-4.5"):
        load(folder)
    gone = edited(built["qwen3_5"], tmp_path / "b", lambda sd: [sd.pop(k) for k in list(sd) if k.startswith("mtp.")])
    with pytest.raises(CheckpointError, match="no MTP layer weights in the checkpoint .*exported or quantized without"):
        load(gone)
    from fixtures import make_target
    llama = make_target(tmp_path / "llama", num_layers=4)
    with pytest.raises(CheckpointError, match=r"model_type 'llama' .*--draft mtp reads the MTP layers of DeepSeek-V3"):
        load(llama)


def test_what_no_engine_reads_is_compared_and_noted(built, tmp_path):
    def change(sd):
        sd["model.layers.2.shared_head.head.weight"] = sd["model.layers.2.shared_head.head.weight"] + 1
    notes = load(edited(built["deepseek_v3"], tmp_path, change)).key_notes
    assert len(notes) == 1 and "'model.layers.2.shared_head.head.weight' differs from the target's lm_head: no " \
                               "engine reads it" in notes[0]
    assert load(built["deepseek_v3"]).key_notes == ()

    def bad(sd):
        sd["model.layers.2.embed_tokens.weight"] = torch.zeros(5, 32)
    with pytest.raises(CheckpointError, match=r"'model.layers.2.embed_tokens.weight' has shape \[5, 32\], the "
                                              r"target's embedding is \[96, 32\]"):
        load(edited(built["deepseek_v3"], tmp_path / "b", bad))


def test_quantized_mtp_tensors_the_target_does_not_share_are_refused_with_the_reason(built, tmp_path):
    def fp8(sd):
        w = sd["model.layers.2.eh_proj.weight"]
        sd["model.layers.2.eh_proj.weight"] = w.to(torch.float8_e4m3fn)
        sd["model.layers.2.eh_proj.weight_scale_inv"] = torch.ones(1, 1)
    with pytest.raises(CheckpointError, match=r"MTP tensor 'model.layers.2.eh_proj.weight' is stored F8_E4M3: the "
                                              r"target's checkpoint is not quantized in a way eagle-eval holds"):
        load(edited(built["deepseek_v3"], tmp_path, fp8))              # the target itself is not FP8

    def int4(sd):
        sd["model.layers.2.self_attn.o_proj.weight_packed"] = torch.zeros(32, 4, dtype=torch.int32)
    with pytest.raises(CheckpointError, match=r"'model.layers.2.self_attn.o_proj.weight_packed' is stored I32"):
        load(edited(built["deepseek_v3"], tmp_path / "int4", int4))


def test_experts_stored_fused_are_read_as_they_are(built, tmp_path):
    def fuse(sd):
        p = "model.layers.2.mlp.experts."
        sd[p + "gate_up_proj"] = torch.stack([torch.cat([sd.pop(f"{p}{e}.gate_proj.weight"),
                                                         sd.pop(f"{p}{e}.up_proj.weight")]) for e in range(4)])
        sd[p + "down_proj"] = torch.stack([sd.pop(f"{p}{e}.down_proj.weight") for e in range(4)])
    fused = load(edited(built["deepseek_v3"], tmp_path, fuse)).head
    per_expert = load(built["deepseek_v3"]).head
    assert all(torch.equal(a, b) for a, b in zip(fused.state_dict().values(), per_expert.state_dict().values()))
    def both(sd):
        p = "model.layers.2.mlp.experts."
        sd[p + "down_proj"] = torch.stack([sd[f"{p}{e}.down_proj.weight"] for e in range(4)])
    with pytest.raises(CheckpointError, match="stored both fused .* and one per key"):
        load(edited(built["deepseek_v3"], tmp_path / "both", both))


def test_an_mtp_layer_exported_alone_runs_as_the_targets_own(mtp_targets, tmp_path):
    """SGLang's NextN export (the target's config with num_hidden_layers 1, the layer as model.layers.0): detected
    by its architectures, read strictly, and run with its target it drafts what --draft mtp drafts."""
    from eagle_eval import api
    from eagle_eval.settings import Settings

    folder, prompts = mtp_targets("deepseek_v3")
    export = tmp_path / "nextn"
    export.mkdir()
    sd = load_file(folder / "model.safetensors")
    save_file({k.replace("model.layers.2.", "model.layers.0."): v for k, v in sd.items()
               if k.startswith("model.layers.2.")}, export / "model.safetensors", metadata={"format": "pt"})
    conf = json.loads((folder / "config.json").read_text())
    conf.update(num_hidden_layers=1, architectures=["DeepseekV3ForCausalLMNextN"])
    (export / "config.json").write_text(json.dumps(conf))
    runs = [api.evaluate(Settings.of(target=str(folder), draft=draft, prompts=str(prompts), dtype="fp32",
                                     num_steps=2, max_new_tokens=12, limit=3), progress=False)
            for draft in ("mtp", str(export))]
    assert runs[1].report["config"]["head"]["dialect"] == "deepseek_v3 (NextN export)"
    assert [(s.output_ids, s.accepted_per_cycle) for s in runs[0].samples] == \
        [(s.output_ids, s.accepted_per_cycle) for s in runs[1].samples]
    assert sum(sum(s.accepted_per_cycle) for s in runs[0].samples) > 0
    other, _ = mtp_targets("glm4_moe")
    with pytest.raises(Exception, match="DeepseekV3DecoderLayer block, the target's layers are Glm4MoeDecoderLayer"):
        api.load_oracle(Settings.of(target=str(other), draft=str(export), dtype="fp32"))


def test_a_block_fp8_mtp_layer_is_held_as_the_target_is(tmp_path):
    """A DeepSeek-V3 block-FP8 checkpoint (every projection, the MTP layer's too, FP8 with weight_scale_inv): on the
    CPU transformers dequantizes the target on load, and the MTP layer is dequantized the same way; the run equals
    the one of the checkpoint dequantized key by key (tests/quant_fixtures.py)."""
    from quant_fixtures import PROJ, _rewrite, fp8_block_quantize, write_dequantized_copy

    from eagle_eval import api
    from eagle_eval.settings import Settings
    from mtp_fixtures import write_prompts

    folder = make_mtp_target(tmp_path / "ds", "deepseek_v3", hidden=32)
    out = {}
    for key, w in load_file(folder / "model.safetensors").items():
        if PROJ.match(key) and w.shape[0] % 8 == 0 and w.shape[1] % 8 == 0:
            out[key], out[key.removesuffix("weight") + "weight_scale_inv"] = fp8_block_quantize(w, (8, 8))
        else:
            out[key] = w
    fp8 = _rewrite(folder, out, {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                 "weight_block_size": [8, 8]})
    assert any(k.startswith("model.layers.2.") and k.endswith("_scale_inv") for k in out)     # the MTP layer's too
    plain = write_dequantized_copy(fp8, tmp_path / "plain", (8, 8))
    prompts = write_prompts(tmp_path / "p.jsonl", n=3)
    runs = [api.evaluate(Settings.of(target=str(t), draft="mtp", prompts=str(prompts), dtype="fp32", num_steps=2,
                                     max_new_tokens=10), progress=False) for t in (fp8, plain)]
    assert [(s.output_ids, s.accepted_per_cycle) for s in runs[0].samples] == \
        [(s.output_ids, s.accepted_per_cycle) for s in runs[1].samples]
    a = load(fp8).head.state_dict()
    b = load(plain).head.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
