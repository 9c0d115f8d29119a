"""A quantized target's MTP layer held as the target's weights are (heads/mtp/quant.py), against the same checkpoint
dequantized by the format's own formula into a plain fp32 copy (tests/quant_fixtures.py: compressed-tensors'
decompression for INT4, W = fp8 * weight_scale_inv per block for FP8), which no code under test writes.

- INT4 (Kimi-K2 Thinking / K2.5 style, DeepSeek-V3 layout, the MTP layer at `model.layers.{N}`): the routed experts
  of every layer, the MTP layer's included, pack-quantized; what the `ignore` list leaves (attention, shared experts,
  the fusion projection) stays plain, in the target and in the MTP layer alike. Another checkpoint packs every
  projection, the MTP layer's attention and eh_proj included.
- FP8 held (transformers' GPU path, simulated on the CPU as in tests/test_quantized.py): every projection FP8, the MTP
  layer's eh_proj, attention and experts included, held as transformers' FP8Linear / FP8Experts and run by the
  target's --fp8-matmul (dequantize here: no kernel).
In fp32 the held forms compute the same weights as the plain copy (expanded per matmul vs on load), so the runs are
equal token for token and in accepted drafts per cycle.
`plan --draft mtp` counts the MTP layer as held: from the headers, and from config.json alone by the target's rule;
the expected bytes are written here from the plain stack's module shapes and each format's tensors.
"""

from __future__ import annotations

import shutil
from unittest import mock

import pytest
import torch
from mtp_fixtures import load_target, write_prompts
from quant_fixtures import (
    EXPERT,
    KIMI_IGNORE,
    PROJ_AND_EH,
    fp8_block_quantize,
    fp8_compress,
    int4_compress,
    write_dequantized_copy,
    write_int4_dequantized_copy,
)
from safetensors.torch import load_file, save_file

from eagle_eval import api
from eagle_eval.heads.eagle3.config import CheckpointError
from eagle_eval.heads.mtp.keys import checkpoint_tensors
from eagle_eval.heads.mtp.load import load_from_target
from eagle_eval.models.quant.int4 import PackedInt4Experts, PackedInt4Linear
from eagle_eval.plan.command import render_plan
from eagle_eval.results.report import render_table
from eagle_eval.settings import Settings

pytest.importorskip("compressed_tensors")
pytestmark = [pytest.mark.filterwarnings("ignore:.*past_key_values.*:FutureWarning"),
              pytest.mark.filterwarnings("ignore:vLLM 0.32 warns:UserWarning")]
MTP = "model.layers.2."
BLOCK = (8, 8)


def hopper():
    """transformers' view of a Hopper GPU (tests/test_quantized.py gpu_without_fp8_kernels): FP8 stays FP8 at load;
    the modules live on the CPU, where the dequantizing matmul runs them (the kernel cannot load here)."""
    from contextlib import ExitStack

    stack = ExitStack()
    for name, value in (("is_available", True), ("get_device_capability", (9, 0)),
                        ("get_device_name", "a simulated Hopper GPU (CPU test)")):
        stack.enter_context(mock.patch(f"torch.cuda.{name}", return_value=value))
    return stack


@pytest.fixture(scope="module")
def built(mtp_targets, tmp_path_factory):
    """The trained DeepSeek-V3 MTP target (tests/mtp_fixtures.py) quantized three ways, each with its plain copy: INT4
    routed experts (EXPERT: every layer's, the MTP layer's too), INT4 everywhere, FP8 everywhere (with eh_proj)."""
    trained, _ = mtp_targets("deepseek_v3")
    root = tmp_path_factory.mktemp("mtp-quant")

    def copy(name):
        shutil.copytree(trained, root / name)
        return root / name
    out = {"int4": int4_compress(copy("int4"), EXPERT, 16, KIMI_IGNORE),
           "int4-all": int4_compress(copy("int4-all"), PROJ_AND_EH, 16, ["lm_head"]),
           "fp8": fp8_compress(copy("fp8"), PROJ_AND_EH, BLOCK), "prompts": write_prompts(root / "prompts.jsonl", n=4)}
    for kind in ("int4", "int4-all"):
        out[kind + "/plain"] = write_int4_dequantized_copy(out[kind], root / f"{kind}-plain")
    out["fp8/plain"] = write_dequantized_copy(out["fp8"], root / "fp8-plain", BLOCK)
    return out


def run(built, target: str, **kw):
    return api.evaluate(Settings.of(target=str(target), draft="mtp", prompts=str(built["prompts"]), dtype="fp32",
                                    num_steps=2, max_new_tokens=12, device_map="cpu", **kw), progress=False)


def same_run(a, b) -> None:
    assert [(s.output_ids, s.accepted_per_cycle) for s in a.samples] == \
        [(s.output_ids, s.accepted_per_cycle) for s in b.samples]
    assert sum(sum(s.accepted_per_cycle) for s in a.samples) > 0          # drafts were accepted: a real comparison


def mtp_keys(folder) -> dict:
    return {k: v for k, v in load_file(folder / "model.safetensors").items()
            if k.startswith(MTP) and not k.endswith(("embed_tokens.weight", "shared_head.head.weight"))}


def test_an_int4_targets_mtp_experts_are_held_packed_and_what_it_ignores_stays_plain(built):
    stack = load_from_target(load_target(built["int4"])).head
    block = stack.blocks[0]
    assert type(block.mlp.experts) is PackedInt4Experts and len(block.mlp.experts) == 4
    for proj in ("gate_proj", "up_proj", "down_proj"):
        packed = getattr(block.mlp.experts[3], proj)
        assert type(packed) is PackedInt4Linear and packed.weight_packed.dtype == torch.int32
    # the checkpoint's ignore list (attention, shared experts) and the fusion it leaves alone: plain, as stored
    plain = [block.self_attn.q_proj, block.self_attn.kv_b_proj, block.mlp.shared_experts.up_proj, stack.fusions[0].proj]
    assert all(type(m) is torch.nn.Linear and m.weight.dtype == torch.float32 for m in plain)
    stored = mtp_keys(built["int4"])
    written = checkpoint_tensors(stack)
    assert any(k.endswith(".weight_packed") for k in stored) and written.keys() == stored.keys()
    assert all(torch.equal(written[k], stored[k]) and written[k].dtype == stored[k].dtype for k in stored)
    assert stack.config.weights.startswith("held packed INT4 as the target's: 0 PackedInt4Linear, 1 PackedInt4Experts "
                                           "(12 packed expert projections), group 16")

    every = load_from_target(load_target(built["int4-all"])).head
    assert all(type(m) is PackedInt4Linear for m in (every.fusions[0].proj, every.blocks[0].self_attn.q_proj,
                                                     every.blocks[0].self_attn.o_proj,
                                                     every.blocks[0].mlp.shared_experts.down_proj))
    assert every.config.weights.startswith("held packed INT4 as the target's: 8 PackedInt4Linear, 1 PackedInt4Experts")


@pytest.mark.parametrize("kind", ["int4", "int4-all"])
def test_an_int4_mtp_run_equals_the_run_of_its_dequantized_copy(built, kind):
    packed, plain = run(built, built[kind]), run(built, built[kind + "/plain"])
    same_run(packed, plain)
    mtp = packed.report["config"]["head"]["mtp"]
    assert mtp["weights"].startswith("held packed INT4 as the target's")
    assert plain.report["config"]["head"]["mtp"]["weights"] == "as stored (unquantized)"
    assert f"  weights       {mtp['weights']}" in render_table(packed.report).splitlines()


def test_the_head_keeps_its_packed_weights_and_scales_in_the_targets_dtype(built):
    """The oracle places the head in the target's dtype (fp16 here) without casting what is held quantized: the
    packed words stay int32 and the scales the checkpoint's bf16, as the target's own packed experts."""
    oracle = api.load_oracle(Settings.of(target=str(built["int4"]), draft="mtp", dtype="fp16", device_map="cpu"))
    stack = oracle.loaded.head.head
    expert = stack.blocks[0].mlp.experts[0].gate_proj
    mine = oracle.speculator.target.layers[1].mlp.experts[0].gate_proj
    assert (expert.weight_packed.dtype, expert.weight_scale.dtype) == (mine.weight_packed.dtype,
                                                                       mine.weight_scale.dtype) == (torch.int32,
                                                                                                    torch.bfloat16)
    assert stack.fusions[0].proj.weight.dtype == stack.blocks[0].self_attn.q_proj.weight.dtype == torch.float16


def test_an_fp8_held_targets_mtp_layer_is_held_in_fp8_and_runs_as_its_dequantized_copy(built):
    plain = run(built, built["fp8/plain"])
    with hopper():
        oracle = api.load_oracle(Settings.of(target=str(built["fp8"]), draft="mtp", dtype="fp32", device_map="cpu"))
        assert oracle.speculator.target.info.quantization["fp8_matmul"]["matmul"] == "dequantize"
        stack = oracle.loaded.head.head
        block = stack.blocks[0]
        modules = [stack.fusions[0].proj, block.self_attn.q_proj, block.self_attn.kv_a_proj_with_mqa,
                   block.self_attn.kv_b_proj, block.self_attn.o_proj, block.mlp.shared_experts.gate_proj]
        assert all(type(m).__name__ == "FP8Linear" and m.weight.dtype == torch.float8_e4m3fn
                   and m.weight_scale_inv.dtype == torch.float32 for m in modules)
        assert type(block.mlp.experts).__name__ == type(oracle.speculator.target.layers[1].mlp.experts).__name__
        assert block.mlp.experts.gate_up_proj.dtype == torch.float8_e4m3fn
        assert all(m.forward.__func__.__name__ == "_linear_forward" for m in modules)    # the target's matmul
        held = run(built, built["fp8"])
    same_run(held, plain)
    weights = held.report["config"]["head"]["mtp"]["weights"]
    assert weights == ("held FP8 as the target's: 8 FP8Linear, 1 FP8Experts (transformers' modules, block 8x8); the "
                       "target's --fp8-matmul: eagle-eval's dequantizing matmul (W8A16)")
    # the MTP tensors as stored: FP8 weights, their scales, the experts' one per key (gate's scale rows above up's)
    stored, written = mtp_keys(built["fp8"]), checkpoint_tensors(stack)
    assert written.keys() == stored.keys()
    assert all(torch.equal(written[k].view(torch.uint8) if written[k].dtype == torch.float8_e4m3fn else written[k],
                           stored[k].view(torch.uint8) if stored[k].dtype == torch.float8_e4m3fn else stored[k])
               for k in stored)


def test_an_fp8_target_dequantized_on_load_dequantizes_its_mtp_layer(built):
    """Without an FP8 GPU transformers dequantizes the target on load: the MTP layer is dequantized the same way."""
    stack = load_from_target(load_target(built["fp8"])).head
    assert type(stack.fusions[0].proj) is torch.nn.Linear and stack.fusions[0].proj.weight.dtype == torch.float32
    assert stack.config.weights.startswith("block FP8 8x8, 20 weights dequantized on load")
    plain = load_from_target(load_target(built["fp8/plain"])).head.state_dict()
    assert all(torch.equal(v, plain[k]) for k, v in stack.state_dict().items())


def edited(folder, tmp_path, change):
    copy = tmp_path / f"{folder.name}-edited"
    shutil.copytree(folder, copy)
    sd = load_file(copy / "model.safetensors")
    change(sd)
    save_file(sd, copy / "model.safetensors", metadata={"format": "pt"})
    return copy


def test_what_cannot_be_held_as_the_target_is_refused_naming_the_file_and_key(built, tmp_path):
    def fp8_in_int4(sd):
        key = MTP + "self_attn.o_proj.weight"
        sd[key], sd[key + "_scale_inv"] = fp8_block_quantize(sd[key], BLOCK)
    with pytest.raises(CheckpointError, match=r"int4-edited/model.safetensors: MTP tensor 'model.layers.2.self_attn."
                                              r"o_proj.weight' is stored F8_E4M3: the target is compressed-tensors "
                                              r"pack-quantized INT4 held packed"):
        load_from_target(load_target(edited(built["int4"], tmp_path, fp8_in_int4)))

    def bad_shape(sd):
        sd[MTP + "mlp.experts.1.down_proj.weight_shape"] = torch.tensor([32, 32])
    with pytest.raises(CheckpointError, match=r"model.layers.2.mlp.experts.1.down_proj.weight_shape = \[32, 32\], but "
                                              r"the model built from config.json has \[32, 16\]"):
        load_from_target(load_target(edited(built["int4"], tmp_path / "b", bad_shape)))

    def one_expert_plain(sd):                  # FP8Experts holds every expert FP8: one stored bf16 cannot be held
        key = MTP + "mlp.experts.2.up_proj.weight"
        sd[key] = sd[key].float()
        del sd[key + "_scale_inv"]
    with hopper(), pytest.raises(CheckpointError, match=r"MTP tensor 'model.layers.2.mlp.experts.2.up_proj.weight' "
                                                        r"is float32, the other experts"):
        load_from_target(load_target(edited(built["fp8"], tmp_path / "c", one_expert_plain)))

    def static(sd):
        sd[MTP + "self_attn.o_proj.input_scale"] = torch.ones(())
    with hopper(), pytest.raises(CheckpointError, match=r"'model.layers.2.self_attn.o_proj.input_scale' is stored F32 "
                                                        r"\(a quantization scale or packed weight\): the target is "
                                                        r"block FP8 held in FP8"):
        load_from_target(load_target(edited(built["fp8"], tmp_path / "d", static)))


# `eagle-eval plan --draft mtp`: the MTP layer's bytes as held, against the sum written here from the plain stack's
# module shapes (the loader's, read from the unquantized trained checkpoint) and each format's tensors
def held_bytes(plain, quantized: set[str], fmt: str, group: int = 16, block: tuple[int, int] = BLOCK) -> int:
    """Bytes of the fp32 MTP stack `plain` with the modules in `quantized` (stack names; an experts module: all its
    experts) held as `fmt`: INT4 per Linear [out, in]: int32 words out x ceil(in / 8), bf16 scales out x in / group,
    an int64 shape of 2; FP8 per weight [.., out, in]: one byte a value, fp32 scale_inv per (block x block)."""
    import math

    def linear(out, inp, experts=1):
        if fmt == "int4":
            return experts * (out * math.ceil(inp / 8) * 4 + out * (inp // group) * 2 + 2 * 8)
        return experts * (out * inp + math.ceil(out / block[0]) * math.ceil(inp / block[1]) * 4)

    total = 0
    for name, t in plain.state_dict().items():
        module = name.rsplit(".", 1)[0]
        if module not in quantized:
            total += t.numel() * 4
        elif name.endswith(".experts.gate_up_proj"):                   # [E, 2I, H]: gate and up, each [I, H]
            e, two_i, h = t.shape
            total += linear(two_i // 2, h, 2 * e) if fmt == "int4" else linear(two_i, h, e)
        elif name.endswith(".experts.down_proj"):                      # [E, H, I]
            total += linear(t.shape[1], t.shape[2], t.shape[0])
        else:
            assert name.endswith(".weight") and t.dim() == 2, name     # a Linear without a bias
            total += linear(*t.shape)
    return total


def plan_mtp(folder, **kw):
    from eagle_eval.plan.command import make_plan
    from eagle_eval.settings import PlanOptions

    return make_plan(PlanOptions(target=str(folder), draft="mtp", gpus=1, gpu_memory="10GiB", dtype="fp32", **kw))


@pytest.fixture(scope="module")
def plain_stack(mtp_targets):
    return load_from_target(load_target(mtp_targets("deepseek_v3")[0])).head


def config_only(mtp_targets, tmp_path, quantization_config: dict):
    """The trained target's config.json alone (no weights, no index), with `quantization_config`."""
    import json

    config = json.loads((mtp_targets("deepseek_v3")[0] / "config.json").read_text())
    config["quantization_config"] = quantization_config
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def index_only(folder, tmp_path):
    """config.json and a safetensors index naming the checkpoint's tensors, no weights."""
    import json

    tmp_path.mkdir(parents=True, exist_ok=True)
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    names = dict.fromkeys(load_file(folder / "model.safetensors"), "model.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": names}))
    return tmp_path


ATTN = {f"blocks.0.self_attn.{p}" for p in ("q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")}
SHARED = {f"blocks.0.mlp.shared_experts.{p}" for p in ("gate_proj", "up_proj", "down_proj")}
EVERY = ATTN | SHARED | {"blocks.0.mlp.experts", "fusions.0.proj"}


def test_plan_counts_an_int4_targets_mtp_layer_as_held(built, plain_stack, mtp_targets, tmp_path):
    from quant_fixtures import _int4_quantization_config

    unquantized = sum(t.numel() * 4 for t in plain_stack.state_dict().values())
    # the safetensors headers decide: the routed experts packed, eh_proj / attention / shared experts as stored
    plan = plan_mtp(built["int4"])
    assert plan.head["bytes"] == held_bytes(plain_stack, {"blocks.0.mlp.experts"}, "int4") != unquantized
    held = load_from_target(load_target(built["int4"])).head                         # the loader's own holding
    assert plan.head["bytes"] == sum(t.numel() * t.element_size() for t in held.state_dict().values())
    assert plan.head["weights"] == ("held as the target's: 12 Linear weights packed (INT4 symmetric, group 16, "
                                    "pack-quantized (int32 words, 8 values each)), from the safetensors headers; the "
                                    "rest at float32")
    assert {p["part"]: p["format"] for p in plan.head["parts"]}["routed experts"] == "int4 packed + scales"
    assert plan_mtp(built["int4/plain"]).head["bytes"] == unquantized
    named = plan_mtp(index_only(built["int4"], tmp_path / "int4-index"))          # the index's weight_packed names
    assert named.head["bytes"] == plan.head["bytes"] and "from the safetensors index's" in named.head["weights"]
    assert named.target["bytes"] == plan.target["bytes"]      # the target's index rule leaves the MTP layer out
    every = plan_mtp(built["int4-all"])
    assert every.head["bytes"] == held_bytes(plain_stack, EVERY, "int4")
    # config.json alone (Kimi's quantization_config): its rule on the checkpoint's names, as for the target's layers:
    # the experts and eh_proj (a Linear no ignore pattern names) packed, attention and shared experts plain
    kimi = plan_mtp(config_only(mtp_targets, tmp_path / "kimi", _int4_quantization_config(16, KIMI_IGNORE)))
    assert kimi.head["bytes"] == held_bytes(plain_stack, {"blocks.0.mlp.experts", "fusions.0.proj"}, "int4")
    assert kimi.head["weights"].startswith("held as the target's: 13 Linear weights packed")
    assert "from config.json's quantization_config targets / ignore, on the checkpoint's names" in kimi.head["weights"]
    assert f"  weights {kimi.head['weights']}" in render_plan(kimi).splitlines()
    # --quantized dequantized: every weight in the dtype, as the target's
    assert plan_mtp(built["int4"], quantized="dequantized").head["bytes"] == unquantized


def test_plan_counts_an_fp8_targets_mtp_layer_as_held(built, plain_stack, mtp_targets, tmp_path):
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": list(BLOCK)}
    unquantized = sum(t.numel() * 4 for t in plain_stack.state_dict().values())
    plan = plan_mtp(built["fp8"])                         # the headers: every projection FP8, eh_proj included
    assert plan.head["bytes"] == held_bytes(plain_stack, EVERY, "fp8") != unquantized
    assert plan.head["weights"] == ("held as the target's: 9 modules in FP8 (block [8, 8], fp32 scales), from the "
                                    "safetensors headers; the rest at float32")
    named = plan_mtp(index_only(built["fp8"], tmp_path / "fp8-index"))        # the index's weight_scale_inv names
    assert named.head["bytes"] == plan.head["bytes"] and "from the safetensors index's" in named.head["weights"]
    # config.json alone: transformers' rule, every Linear and experts module but modules_to_not_convert, which names
    # the checkpoint's modules (the MTP layer is model.layers.2 here)
    alone = plan_mtp(config_only(mtp_targets, tmp_path / "fp8", fp8))
    assert alone.head["bytes"] == held_bytes(plain_stack, EVERY, "fp8")
    skip = plan_mtp(config_only(mtp_targets, tmp_path / "skip", {**fp8, "modules_to_not_convert": [
        "model.layers.2.self_attn", "eh_proj"]}))
    assert skip.head["bytes"] == held_bytes(plain_stack, SHARED | {"blocks.0.mlp.experts"}, "fp8")
    assert "from transformers' FP8 rule on config.json" in skip.head["weights"]
