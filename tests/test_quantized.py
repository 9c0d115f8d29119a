"""Quantized DeepSeek-V3-architecture targets (block-wise FP8, compressed-tensors INT4) through transformers.

On the CPU transformers dequantizes FP8 on load (its FP8 matmuls need a GPU); compressed-tensors INT4 is
held packed by eagle-eval's own loader (tests/test_int4.py covers it in depth). The checks run against the SAME loaded
quantized model: the loop equals its `generate`, the profile equals the loop, and the draft's aux
features are its own hidden states.
"""

import pytest
import torch
from fixtures import make_head, write_prompts
from quant_fixtures import EXPERT, fp8_block_dequantize, make_fp8_target, make_int4_target

from eagle_eval import api
from eagle_eval.settings import ProfileOptions, Settings
from eagle_eval.models.capture import FeatureCapture, resolve_aux_layers
from eagle_eval.models.quant.info import held_quantized
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
    return Settings.of(target=str(built[kind]), draft=str(built["head"]), prompts=str(built["prompts"]),
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
    # held packed by eagle-eval (models/quant/int4_load.py), not decompressed on load as transformers does
    assert info["held_quantized_modules"] == 24 and info["in_memory"].startswith("held packed INT4 (24 modules)")
    assert info["int4_matmul"]["expert_modules"] == 2 and info["int4_matmul"]["expert_linears"] == 24

    linear, _ = load_target(str(built["int4-linear"]), dtype="fp32", device_map="cpu")
    info = linear.info.quantization
    assert info["quantized_module_count"] == 48 and info["held_quantized_modules"] == 48
    assert type(linear.layers[1].self_attn.q_b_proj).__name__ == "PackedInt4Linear"
    assert linear.layers[1].self_attn.q_b_proj.weight_packed.dtype == torch.int32
    linear.forward(torch.tensor([[1, 7, 9]]), linear.new_cache())
    assert held_quantized(linear.model) == 48    # still packed after a forward: expanded per matmul, never kept


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
    for sample, row in zip(loop.samples, [r for r in load_workload(cfg.workload, oracle.tokenizer).first_prompts]):
        ids = torch.tensor([row.input_ids])
        expected = model.generate(ids, max_new_tokens=cfg.workload.max_new_tokens, do_sample=False, eos_token_id=sorted(oracle.eos_ids),
                                  pad_token_id=0)[0, ids.shape[1]:].tolist()
        assert sample.output_ids == expected, sample.id
    prof = api.profile(cfg, ProfileOptions(max_steps=3, batch_tokens=120), progress=False, oracle=oracle)
    section = prof.report["by_num_steps"]["3"]
    assert section["per_position"] == loop.report["per_position"]
    assert section["histogram"] == loop.report["histogram"]
    quant = loop.report["config"]["target"]["quantization"]
    assert quant["method"] == ("fp8" if kind == "fp8" else "compressed-tensors")
    assert f"quant   {quant['summary']}" in render_table(loop.report).splitlines()


# -- a block-FP8 target held in FP8 (what transformers does on a GPU) --------------------------------
@pytest.fixture
def gpu_without_fp8_kernels():
    """transformers' view of a Hopper machine: FP8 stays FP8 at load (FP8Linear / FP8Experts), and the
    first forward needs the `kernels` package and its Hub kernel, absent here as on the offline GPU
    machine. The modules live on the CPU, where eagle-eval's dequantizing matmul runs them."""
    from unittest import mock

    with mock.patch("torch.cuda.is_available", return_value=True), \
            mock.patch("torch.cuda.get_device_capability", return_value=(9, 0)), \
            mock.patch("torch.cuda.get_device_name", return_value="a simulated Hopper GPU (CPU test)"):
        yield


def test_held_fp8_without_the_kernel_fails_in_transformers_and_runs_dequantized(built, gpu_without_fp8_kernels):
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(str(built["fp8"]), dtype=torch.float32, device_map={"": "cpu"})
    assert {"FP8Linear", "float8_e4m3fn"} <= {type(m).__name__ for m in plain.modules()} | {
        str(p.dtype).removeprefix("torch.") for p in plain.parameters()}
    ids = torch.randint(5, 90, (2, 9), generator=torch.Generator().manual_seed(0))
    # the failure an offline machine sees: ImportError (the GPU machine, transformers 5.17), or
    # ValueError (kernels 0.19.1 here: its publisher-trust check needs the Hub)
    with pytest.raises((ImportError, ValueError), match="[Kk]ernel") as failed:
        plain(ids)
    held, _ = load_target(str(built["fp8"]), dtype="fp32", device_map="cpu")
    info = held.info.quantization
    assert info["fp8_matmul"]["matmul"] == "dequantize"
    assert info["fp8_matmul"]["kernel"].startswith(f"{failed.type.__name__}: ")      # the same failure, named
    assert info["held_quantized_modules"] == 26 and "kept fp8; eagle-eval's dequantizing matmul" in info["summary"]
    one_byte = sorted(n for n, p in held.model.named_parameters() if p.dtype == torch.float8_e4m3fn)
    assert len(one_byte) == 24 + 2 * 2 and "model.layers.1.mlp.experts.gate_up_proj" in one_byte   # still FP8
    # fp32: dequantize-per-forward and transformers' dequantize-on-load compute the same weights
    with mock_cuda_off():
        loaded, _ = load_target(str(built["fp8"]), dtype="fp32", device_map="cpu")
    assert loaded.info.quantization["held_quantized_modules"] == 0
    assert torch.equal(held.forward(ids, None), loaded.forward(ids, None))


def mock_cuda_off():
    from unittest import mock
    return mock.patch("torch.cuda.is_available", return_value=False)


def test_held_fp8_loop_equals_its_generate_and_profile_equals_loop(built, gpu_without_fp8_kernels):
    cfg = run_config(built, "fp8", device_map="cpu")
    oracle = api.load_oracle(cfg)
    assert oracle.speculator.target.info.quantization["fp8_matmul"]["matmul"] == "dequantize"
    loop = api.evaluate(cfg, progress=False)
    model = oracle.speculator.target.model
    for sample, row in zip(loop.samples, load_workload(cfg.workload, oracle.tokenizer).first_prompts):
        ids = torch.tensor([row.input_ids])
        expected = model.generate(ids, max_new_tokens=cfg.workload.max_new_tokens, do_sample=False,
                                  eos_token_id=sorted(oracle.eos_ids), pad_token_id=0)[0, ids.shape[1]:].tolist()
        assert sample.output_ids == expected, sample.id
    prof = api.profile(cfg, ProfileOptions(max_steps=3, batch_tokens=120), progress=False, oracle=oracle)
    assert prof.report["by_num_steps"]["3"]["per_position"] == loop.report["per_position"]
    assert loop.report["config"]["target"]["quantization"]["fp8_matmul"]["matmul"] == "dequantize"


def test_fp8_kernel_mode_refused_where_the_kernel_cannot_load(built, gpu_without_fp8_kernels):
    from eagle_eval.models.quant.fp8 import Fp8MatmulError

    with pytest.raises(Fp8MatmulError, match="--fp8-matmul kernel: transformers' FP8 kernel cannot run here: "
                       "(ImportError|ValueError): .*use --fp8-matmul dequantize"):
        load_target(str(built["fp8"]), dtype="fp32", device_map="cpu", fp8_matmul="kernel")


@pytest.mark.parametrize("shape", [(40, 24), (576, 7168 // 56), (16, 16), (3, 5)])
def test_dequantize_blocks_partial_last_blocks(shape):
    """Dims that are not a multiple of the block (DeepSeek-V3's kv_a_proj_with_mqa has 576 rows at
    block 128): the last block is partial; the test's formula is the checkpoint format's."""
    from quant_fixtures import fp8_block_quantize

    from eagle_eval.models.quant.fp8 import dequantize_blocks

    w = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    q, scale = fp8_block_quantize(w, (16, 16))
    assert torch.equal(dequantize_blocks(q, scale, (16, 16), torch.float32), fp8_block_dequantize(q, scale, (16, 16)))
    stacked = dequantize_blocks(torch.stack([q, q]), torch.stack([scale, 2 * scale]), (16, 16), torch.float32)
    assert torch.equal(stacked[1], 2 * fp8_block_dequantize(q, scale, (16, 16)))


def test_dequantize_blocks_refuses_a_grid_that_does_not_fit_the_block():
    from quant_fixtures import fp8_block_quantize

    from eagle_eval.models.quant.fp8 import Fp8MatmulError, dequantize_blocks

    q, scale = fp8_block_quantize(torch.randn(40, 24), (16, 16))        # grid 3 x 2
    with pytest.raises(Fp8MatmulError, match=r"layer\.w: weight \(40, 24\) with block 8x8 needs a scale grid 5x3"):
        dequantize_blocks(q, scale, (8, 8), torch.float32, "layer.w")


def test_fp8_matmul_choices_agree():
    from eagle_eval.settings import FP8_MATMUL_CHOICES as CONFIG_CHOICES
    from eagle_eval.models.quant.fp8 import FP8_MATMUL_CHOICES

    assert CONFIG_CHOICES == FP8_MATMUL_CHOICES


@pytest.fixture(scope="module", params=[32, 64])
def partial_blocks(tmp_path_factory, request):
    """Blocks 32x32 and 64x64 on the fixture's dims (48, 80, 96...): partial last blocks, as DeepSeek-V3's
    576-row kv_a_proj_with_mqa at block 128; at 64 the experts' intermediate size (32) is below the
    block, so the fused gate_up_proj carries a scale row per half. With the same weights dequantized by
    the test, key by key, into a plain fp32 checkpoint (the format's formula, W = fp8 * scale_inv)."""
    from quant_fixtures import write_dequantized_copy

    b = request.param
    root = tmp_path_factory.mktemp(f"partial{b}")
    fp8 = make_fp8_target(root / "fp8", block=(b, b))
    return fp8, write_dequantized_copy(fp8, root / "dequantized", (b, b))


def test_partial_fp8_blocks_refused_where_transformers_dequantizes_on_load(partial_blocks):
    from eagle_eval.models.target import TargetError

    grid = "2x3" if "partial32" in str(partial_blocks[0]) else "1x2"
    with pytest.raises(TargetError, match=r"fp8: 48 FP8 weight\(s\) are not a multiple of quantization_config"
                                          r".weight_block_size, first model.layers.0.mlp.down_proj.weight 48x96 "
                                          rf"\(grid {grid}\).*Load this target on a GPU"):
        load_target(str(partial_blocks[0]), dtype="fp32", device_map="cpu")


def test_partial_fp8_blocks_held_in_fp8_use_the_configured_block(partial_blocks, gpu_without_fp8_kernels):
    held, _ = load_target(str(partial_blocks[0]), dtype="fp32", device_map="cpu")
    assert held.info.quantization["fp8_matmul"]["matmul"] == "dequantize"
    with mock_cuda_off():
        plain, _ = load_target(str(partial_blocks[1]), dtype="fp32", device_map="cpu")
    ids = torch.randint(5, 90, (2, 9), generator=torch.Generator().manual_seed(0))
    assert torch.equal(held.forward(ids, None), plain.forward(ids, None))
