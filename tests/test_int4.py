"""compressed-tensors pack-quantized INT4 targets held packed.

The fixtures are written in the real format by compressed-tensors itself (tests/quant_fixtures.py): a
DeepSeek-V3 causal LM with INT4 routed experts (transformers' fused expert tensors) or INT4 everywhere
(packed Linear layers), and a Kimi-K2.5-style remote-code wrapper whose MoE holds fused experts or one
module per expert. Each is compared with compressed-tensors' own decompression of the same files, written
as a plain fp32 checkpoint: weights bit for bit, logits bit for bit (fp32), and the loop against the
packed model's own `generate`, the profile against the loop.
"""

import json

import pytest
import torch
from click.testing import CliRunner
from fixtures import make_head, write_prompts
from quant_fixtures import (
    EXPERT,
    make_int4_target,
    make_kimi_int4_target,
    write_int4_dequantized_copy,
)
from safetensors.torch import load_file, save_file

from eagle_eval import api
from eagle_eval.cli import main
from eagle_eval.settings import ProfileOptions, Settings
from eagle_eval.models.quant.int4 import (
    Int4Error,
    PackedInt4Experts,
    PackedInt4Linear,
    int4_scheme,
    pack_int4,
    unpack_int4,
)
from eagle_eval.models.quant.int4_load import checkpoint_tensors
from eagle_eval.models.target import load_target
from eagle_eval.results.report import render_table
from eagle_eval.workload.conversations import load_workload

pytest.importorskip("compressed_tensors")
pytestmark = pytest.mark.filterwarnings("ignore:.*past_key_values.*:FutureWarning")
KINDS = {"experts": lambda p: make_int4_target(p), "linear": lambda p: make_int4_target(p, scope="linear"),
         "kimi-fused": lambda p: make_kimi_int4_target(p, "fused"),
         "kimi-list": lambda p: make_kimi_int4_target(p, "list")}
REMOTE = {"kimi-fused", "kimi-list"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("int4")
    out = {"head": make_head(root / "head"), "prompts": write_prompts(root / "prompts.jsonl", n=3)}
    for kind, make in KINDS.items():
        out[kind] = make(root / kind)
        out[kind + "/plain"] = write_int4_dequantized_copy(out[kind], root / f"{kind}-plain")
    return out


def load(built, kind, **kw):
    return load_target(str(built[kind]), dtype="fp32", device_map="cpu", trust_remote_code=kind in REMOTE, **kw)[0]


def plain_model(built, kind):
    """compressed-tensors' decompression as transformers runs it: its eager expert loop, fp32."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(built[kind + "/plain"], dtype=torch.float32,
                                                trust_remote_code=kind in REMOTE, experts_implementation="eager",
                                                local_files_only=True).eval()


def test_bit_order_is_compressed_tensors_own():
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32

    g = torch.Generator().manual_seed(0)
    for columns in (64, 48, 40, 33, 7):
        values = torch.randint(-8, 8, (5, columns), generator=g, dtype=torch.int8)
        assert torch.equal(pack_int4(values), pack_to_int32(values, 4))
        words = torch.randint(-2**31, 2**31 - 1, (5, -(-columns // 8)), generator=g, dtype=torch.int64).to(torch.int32)
        assert torch.equal(unpack_int4(words, columns), unpack_from_int32(words, 4, torch.Size([5, columns])))
        assert torch.equal(unpack_int4(pack_int4(values), columns), values)
    # element 0 is the LOW nibble of word 0, stored + 8: 0x...21 holds -7 then -6
    assert unpack_int4(torch.tensor([[0x21]], dtype=torch.int32), 2).tolist() == [[1 - 8, 2 - 8]]


def test_the_fixtures_own_writer_is_compressed_tensors_bytes(built, tmp_path):
    """The writer used where compressed-tensors is not installed (the GPU image) writes the same files."""
    from quant_fixtures import int4_quantize

    own = make_int4_target(tmp_path / "own", writer="eagle-eval")
    theirs, mine = load_file(built["experts"] / "model.safetensors"), load_file(own / "model.safetensors")
    assert theirs.keys() == mine.keys() and all(torch.equal(theirs[k], mine[k]) for k in theirs)
    cfg = lambda f: json.loads((f / "config.json").read_text())["quantization_config"]           # noqa: E731
    assert int4_scheme(cfg(own), "x") == int4_scheme(cfg(built["experts"]), "x")
    w = torch.randn(8, 64, dtype=torch.bfloat16)                 # bf16 weights: the division in bf16, as theirs
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    ours = int4_quantize(w, 32)
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(num_bits=4, type="int", symmetric=True,
                                                                             strategy="group", group_size=32))
    ref = BaseCompressor.get_value_from_registry("pack-quantized").compress(
        {"weight": w, "weight_scale": ours["weight_scale"]}, scheme)
    assert torch.equal(ref["weight_packed"], ours["weight_packed"])


@pytest.mark.parametrize("kind", list(KINDS))
def test_dequantized_weights_are_compressed_tensors_decompression(built, kind):
    target = load(built, kind)
    plain = load_file(built[kind + "/plain"] / "model.safetensors")
    modules = {n: m for n, m in target.model.named_modules() if isinstance(m, PackedInt4Linear)}
    assert len(modules) == (48 if kind == "linear" else 24)
    for name, module in modules.items():
        assert torch.equal(module.dequantized(torch.float32), plain[name + ".weight"]), name
        assert module.weight_packed.dtype == torch.int32 and module.weight_scale.dtype == torch.bfloat16
    experts = [m for m in target.model.modules() if isinstance(m, PackedInt4Experts)]
    assert len(experts) == (0 if kind == "kimi-list" else 2)      # the list layout keeps its own MoE module


@pytest.mark.parametrize("kind", list(KINDS))
def test_held_bytes_are_the_packed_checkpoint_not_bf16(built, kind):
    target = load(built, kind)
    stored = checkpoint_tensors(built[kind])
    info = target.info.quantization
    assert info["held_bytes"] == sum(e.nbytes for e in stored.values())         # fp32 run of an fp32 + packed file
    shapes = {k: v.tolist() for k, v in load_file(built[kind] / "model.safetensors").items()
              if k.endswith("weight_shape")}
    # the format's size per [out, in] weight: 4 bits a value, one bf16 scale per 16 values, an int64 [2] shape
    packed_bytes = sum(out * inp // 2 + out * inp // 16 * 2 + 16 for out, inp in shapes.values())
    held_packed = sum(t.numel() * t.element_size() for m in target.model.modules() if isinstance(m, PackedInt4Linear)
                      for t in m.state_dict().values())
    assert held_packed == packed_bytes < 0.35 * sum(2 * out * inp for out, inp in shapes.values())   # bf16: 2 bytes
    assert info["int4_matmul"]["matmul"] == "dequantize"
    assert "held packed INT4" in info["summary"] and info["held_quantized_modules"] == len(shapes)


@pytest.mark.parametrize("kind", list(KINDS))
def test_logits_equal_compressed_tensors_decompression(built, kind):
    ids = torch.randint(5, 90, (2, 9), generator=torch.Generator().manual_seed(0))
    held = load(built, kind).forward(ids, None)
    with torch.no_grad():
        assert torch.equal(held, plain_model(built, kind)(ids).logits.float())


def run_config(built, kind, **kw):
    return Settings.of(target=str(built[kind]), draft=str(built["head"]), prompts=str(built["prompts"]),
                     max_new_tokens=20, num_steps=3, aux_layers=(0, 1, 2), aux_convention="hf", dtype="fp32",
                     trust_remote_code=kind in REMOTE, **kw)


@pytest.mark.parametrize("kind", list(KINDS))
def test_loop_equals_generate_and_profile_equals_loop(built, kind):
    cfg = run_config(built, kind)
    oracle = api.load_oracle(cfg)
    loop = api.evaluate(cfg, progress=False)
    model = oracle.speculator.target.model
    assert any(isinstance(m, PackedInt4Linear) for m in model.modules())
    for sample, row in zip(loop.samples, load_workload(cfg.workload, oracle.tokenizer).first_prompts):
        ids = torch.tensor([row.input_ids])
        expected = model.generate(ids, max_new_tokens=cfg.workload.max_new_tokens, do_sample=False,
                                  eos_token_id=sorted(oracle.eos_ids), pad_token_id=0)[0, ids.shape[1]:].tolist()
        assert sample.output_ids == expected, sample.id
    prof = api.profile(cfg, ProfileOptions(max_steps=3, batch_tokens=120), progress=False, oracle=oracle)
    assert prof.report["by_num_steps"]["3"]["per_position"] == loop.report["per_position"]
    assert prof.report["by_num_steps"]["3"]["histogram"] == loop.report["histogram"]
    quant = loop.report["config"]["target"]["quantization"]
    assert quant["int4_matmul"]["matmul"] == "dequantize" and "W4A16" in quant["int4_matmul"]["detail"]
    assert f"quant   {quant['summary']}" in render_table(loop.report).splitlines()


# -- CPU and disk offload: a placement over "cpu" and "disk" gives the all-on-CPU tokens ---------------
@pytest.mark.parametrize("kind", ["experts", "kimi-list"])
def test_cpu_and_disk_placement_gives_the_same_tokens(built, kind):
    cfg = run_config(built, kind, device_map="cpu")
    whole = api.evaluate(cfg, progress=False)
    held = sum(e.nbytes for e in checkpoint_tensors(built[kind]).values())
    split = run_config(built, kind, device_map="auto", max_memory=f"cpu={held // 2}B")   # half on disk
    offloaded = api.evaluate(split, progress=False)
    target = offloaded.report["config"]["target"]
    assert target["devices"] == ["cpu", "disk"], target["devices"]
    assert [s.output_ids for s in offloaded.samples] == [s.output_ids for s in whole.samples]
    assert offloaded.report["per_position"] == whole.report["per_position"]


# -- bad input: one line, exit 2 -------------------------------------------------------------------------
def _copy(built, tmp_path, kind="experts"):
    import shutil

    dest = tmp_path / kind
    shutil.copytree(built[kind], dest)
    return dest


def _run(built, target) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["run", "--target", str(target), "--draft", str(built["head"]), "--prompts",
                                    str(built["prompts"]), "--limit", "1", "--max-new-tokens", "2",
                                    "--aux-layers", "0,1,2", "--aux-convention", "hf", "--device-map", "cpu"])
    return res.exit_code, res.output


def _tensors(folder, fn):
    tensors = load_file(folder / "model.safetensors")
    fn(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _config(folder, fn):
    cfg = json.loads((folder / "config.json").read_text())
    fn(cfg["quantization_config"]["config_groups"]["group_0"]["weights"])
    (folder / "config.json").write_text(json.dumps(cfg))


KEY = "model.layers.1.mlp.experts.2.up_proj"
FIRST = "model.layers.1.mlp.experts.0.gate_proj"         # the first packed module, checked first
BAD = {
    "packed shape": (lambda f: _tensors(f, lambda t: t.update(
                         {KEY + ".weight_packed": t[KEY + ".weight_packed"][:, :4].contiguous()})),
                     rf"{KEY}.weight_packed is int32 \[32, 4\], which does not hold weight_shape \[32, 48\]: "
                     r"int32 \[32, 6\] expected"),
    "weight_shape": (lambda f: _tensors(f, lambda t: t.update({KEY + ".weight_shape": torch.tensor([32, 40])})),
                     rf"{KEY}.weight_shape = \[32, 40\], but the model built from config.json has \[32, 48\]"),
    "missing scale": (lambda f: _tensors(f, lambda t: t.pop(KEY + ".weight_scale")),
                      rf"{KEY}.weight_packed has no {KEY}.weight_scale \(a pack-quantized weight needs its "
                      r"group scales\)"),
    "group size 24": (lambda f: _config(f, lambda w: w.update(group_size=24)),
                      rf"{FIRST}.weight_scale is bfloat16 \[32, 3\]; a float \[32, 2\] is expected .*group_size = 24"),
    "group size 20": (lambda f: _config(f, lambda w: w.update(group_size=20)),
                      rf"{FIRST}: quantization_config.config_groups.group_0.weights.group_size = 20 does not "
                      r"divide in_features 48"),
    "group size 0": (lambda f: _config(f, lambda w: w.update(group_size=0)),
                     r"config_groups.group_0.weights.group_size = 0: the group size must be a positive integer"),
    "asymmetric": (lambda f: _config(f, lambda w: w.update(symmetric=False)),
                   r"config_groups.group_0.weights.symmetric = False: asymmetric INT4 \(a zero point per group\)"),
    "8 bits": (lambda f: _config(f, lambda w: w.update(num_bits=8)),
               r"config_groups.group_0.weights.num_bits = 8: only 4-bit weights are supported"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_int4_checkpoint_is_one_line_exit_2(built, tmp_path, case):
    import re

    folder = _copy(built, tmp_path)
    corrupt, message = BAD[case]
    corrupt(folder)
    code, output = _run(built, folder)
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("eagle-eval: error: ") and re.search(message, lines[0]), output
    assert str(folder) in lines[0]


def test_int4_scheme_reads_the_kimi_release_config():
    qc = {"config_groups": {"group_0": {"input_activations": None, "output_activations": None, "targets": ["Linear"],
                                        "weights": {"actorder": None, "block_structure": None, "dynamic": False,
                                                    "group_size": 32, "num_bits": 4, "observer": "minmax",
                                                    "observer_kwargs": {}, "strategy": "group", "symmetric": True,
                                                    "type": "int"}}},
          "format": "pack-quantized", "ignore": ["lm_head", "re:.*self_attn.*"], "kv_cache_scheme": None,
          "quant_method": "compressed-tensors", "quantization_status": "compressed"}
    scheme = int4_scheme(qc, "config.json")
    assert (scheme.group, scheme.group_size, scheme.targets) == ("group_0", 32, ("Linear",))
    assert int4_scheme({"quant_method": "fp8"}, "config.json") is None
    mixed = {**qc, "config_groups": {**qc["config_groups"], "group_1": {"format": "float-quantized", "weights": {}}}}
    with pytest.raises(Int4Error, match=r"config_groups.group_1.format = 'float-quantized': a checkpoint mixing"):
        int4_scheme(mixed, "config.json")


def test_expert_regex_still_names_the_fixture_layout(built):
    """The plain fixture's experts are what EXPERT names (the FP8 tests rely on the same key layout)."""
    keys = checkpoint_tensors(built["experts"])
    packed = [k.replace("weight_packed", "weight") for k in keys if k.endswith("weight_packed")]
    assert sum(bool(EXPERT.match(k)) for k in packed) == len(packed) == 24
