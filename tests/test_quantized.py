"""Quantized DeepSeek-V3-architecture targets (block-wise FP8, compressed-tensors INT4) through transformers.

On the CPU transformers dequantizes FP8 on load (its FP8 matmuls need a GPU); compressed-tensors keeps
compressed Linear modules packed until their first forward. The checks run against the SAME loaded
quantized model: the loop equals its `generate`, the profile equals the loop, and the draft's aux
features are its own hidden states.
"""

import pytest
import torch
from fixtures import make_head, write_prompts
from quant_fixtures import EXPERT, fp8_block_dequantize, make_fp8_target, make_int4_target

from eagle_eval import api
from eagle_eval.config import ProfileConfig, RunConfig
from eagle_eval.models.capture import FeatureCapture, resolve_aux_layers
from eagle_eval.models.quant import held_quantized
from eagle_eval.models.target import load_target
from eagle_eval.results.report import render_table
from eagle_eval.workload.conversations import load_workload

pytest.importorskip("compressed_tensors")
KINDS = {"fp8": make_fp8_target, "int4-experts": make_int4_target,
         "int4-linear": lambda p: make_int4_target(p, scope="linear")}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("quant")
    return {"head": make_head(root / "head"), "prompts": write_prompts(root / "prompts.jsonl", n=3),
            **{k: make(root / k) for k, make in KINDS.items()}}


def run_config(built, kind, **kw):
    return RunConfig(target=str(built[kind]), draft=str(built["head"]), prompts=str(built["prompts"]),
                     max_new_tokens=20, num_steps=3, aux_layers=(0, 1, 2), aux_convention="hf", dtype="fp32",
                     **kw)


def test_fp8_loads_the_weights_the_checkpoint_defines(built):
    from safetensors.torch import load_file

    target, _ = load_target(str(built["fp8"]), dtype="fp32", device_map="cpu")
    loaded = target.model.state_dict()
    stored = load_file(built["fp8"] / "model.safetensors")
    checked = 0
    for key, q in stored.items():
        if q.dtype != torch.float8_e4m3fn:
            continue
        expected = fp8_block_dequantize(q, stored[key.removesuffix("weight") + "weight_scale_inv"], (16, 16))
        if EXPERT.match(key):   # transformers fuses experts.E.{gate,up}_proj into experts.gate_up_proj[E]
            layer, e, proj = key.split(".mlp.experts.")[0], int(key.split(".")[5]), key.split(".")[6]
            fused = loaded[f"{layer}.mlp.experts.{'down_proj' if proj == 'down_proj' else 'gate_up_proj'}"][e]
            half = fused.shape[0] // 2
            got = {"gate_proj": fused[:half], "up_proj": fused[half:], "down_proj": fused}[proj]
        else:
            got = loaded[key]
        assert torch.equal(got, expected), key
        checked += 1
    assert checked == 48
    info = target.info.quantization
    assert (info["method"], info["bits"], info["weight_block_size"]) == ("fp8", 8, [16, 16])
    assert info["quantized_module_count"] == 48 and info["held_quantized_modules"] == 0
    assert info["unquantized_modules"] == ["lm_head", "model.embed_tokens", "model.layers.*.mlp.gate"]
    assert info["in_memory"] == "dequantized on load to float32"


def test_int4_info_names_what_stayed_quantized(built):
    experts, _ = load_target(str(built["int4-experts"]), dtype="fp32", device_map="cpu")
    info = experts.info.quantization
    assert (info["method"], info["bits"], info["format"]) == ("compressed-tensors", 4, "pack-quantized")
    assert info["groups"][0]["group_size"] == 16 and info["groups"][0]["strategy"] == "group"
    assert set(info["quantized_modules"]) == {f"model.layers.*.mlp.experts.*.{p}_proj" for p in ("gate", "up", "down")}
    assert "model.layers.*.self_attn.q_a_proj" in info["unquantized_modules"] and "lm_head" in info["unquantized_modules"]
    # transformers fuses the routed experts, so it decompresses them on load (in the scales' bf16)
    assert info["held_quantized_modules"] == 0 and info["in_memory"] == "dequantized on load to bfloat16, float32"

    linear, _ = load_target(str(built["int4-linear"]), dtype="fp32", device_map="cpu")
    info = linear.info.quantization
    assert info["quantized_module_count"] == 48 and info["held_quantized_modules"] == 24   # 48 - 24 routed experts
    assert type(linear.layers[1].self_attn.q_b_proj).__name__ == "Linear"
    assert linear.layers[1].self_attn.q_b_proj.weight_packed.dtype == torch.int32
    linear.forward(torch.tensor([[1, 7, 9]]), linear.new_cache())
    assert held_quantized(linear.model) == 0     # compressed-tensors decompressed them on the first forward


@pytest.mark.parametrize("kind", list(KINDS))
def test_aux_features_are_the_quantized_models_hidden_states(built, kind):
    target, _ = load_target(str(built[kind]), dtype="fp32", device_map="cpu")
    aux = resolve_aux_layers(target.num_layers, cli_ids=[0, 1, 2], cli_convention="hf")
    ids = torch.randint(5, 90, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), FeatureCapture(target.layers, aux.hf, "cpu") as cap:
        out = target.model(ids, output_hidden_states=True)       # the first forward: packed modules run here
        feats = cap.pop()
    assert torch.equal(feats, torch.cat([out.hidden_states[i] for i in aux.hf], dim=-1))


@pytest.mark.parametrize("kind", list(KINDS))
def test_loop_equals_generate_and_profile_equals_loop(built, kind):
    cfg = run_config(built, kind)
    oracle = api.load_oracle(cfg)
    loop = api.evaluate(cfg, progress=False)
    model = oracle.speculator.target.model
    for sample, row in zip(loop.samples, [r for r in load_workload(cfg, oracle.tokenizer).first_prompts]):
        ids = torch.tensor([row.input_ids])
        expected = model.generate(ids, max_new_tokens=cfg.max_new_tokens, do_sample=False, eos_token_id=sorted(oracle.eos_ids),
                                  pad_token_id=0)[0, ids.shape[1]:].tolist()
        assert sample.output_ids == expected, sample.id
    prof = api.profile(ProfileConfig(run=cfg, max_steps=3, batch_tokens=120), progress=False, oracle=oracle)
    section = prof.report["by_num_steps"]["3"]
    assert section["per_position"] == loop.report["per_position"]
    assert section["histogram"] == loop.report["histogram"]
    quant = loop.report["config"]["target"]["quantization"]
    assert quant["method"] == ("fp8" if kind == "fp8" else "compressed-tensors")
    assert f"quant   {quant['summary']}" in render_table(loop.report).splitlines()
