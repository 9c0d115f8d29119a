"""A block-FP8 DeepSeek-V3-architecture target held FP8 on a real GPU; skipped without CUDA.

On a GPU transformers keeps FP8 checkpoints FP8 (FP8Linear / FP8Experts). Where its FP8 kernel does not
load (offline: no `kernels` package, no Hub) `--fp8-matmul auto` runs eagle-eval's dequantizing matmul;
the checks are the CPU ones of test_quantized.py, on cuda:0: the loop equals the same model's
`generate`, the profile equals the loop, and partial last blocks use the configured block.
"""

import pytest
import torch
from fixtures import make_head, write_prompts
from quant_fixtures import make_fp8_target, write_dequantized_copy

from eagle_eval import api
from eagle_eval.settings import ProfileOptions, Settings
from eagle_eval.models.target import load_target
from eagle_eval.workload.conversations import load_workload

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-quant")
    return {"fp8": make_fp8_target(root / "fp8"), "head": make_head(root / "head"),
            "prompts": write_prompts(root / "prompts.jsonl", n=4),
            "fp8-64": make_fp8_target(root / "fp8-64", block=(64, 64)), "root": root}


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_held_fp8_on_the_gpu_loop_equals_generate_and_profile_equals_loop(built, dtype):
    cfg = Settings.of(target=str(built["fp8"]), draft=str(built["head"]), prompts=str(built["prompts"]),
                    max_new_tokens=24, num_steps=3, aux_layers=(0, 1, 2), aux_convention="hf", dtype=dtype,
                    device_map="cuda:0")
    oracle = api.load_oracle(cfg)
    quant = oracle.speculator.target.info.quantization
    assert quant["held_quantized_modules"] == 26, quant["summary"]
    model = oracle.speculator.target.model
    assert next(model.model.layers[0].self_attn.o_proj.parameters()).dtype == torch.float8_e4m3fn
    loop = api.evaluate(cfg, progress=False)
    for sample, row in zip(loop.samples, load_workload(cfg.workload, oracle.tokenizer).first_prompts):
        ids = torch.tensor([row.input_ids], device="cuda:0")
        expected = model.generate(ids, max_new_tokens=cfg.workload.max_new_tokens, do_sample=False,
                                  eos_token_id=sorted(oracle.eos_ids), pad_token_id=0)[0, ids.shape[1]:].tolist()
        assert sample.output_ids == expected, sample.id
    prof = api.profile(cfg, ProfileOptions(max_steps=3, batch_tokens=120), progress=False, oracle=oracle)
    assert prof.report["by_num_steps"]["3"]["per_position"] == loop.report["per_position"]


def test_held_fp8_partial_blocks_on_the_gpu_equal_the_formula(built):
    plain_dir = write_dequantized_copy(built["fp8-64"], built["root"] / "dequantized-64", (64, 64))
    held, _ = load_target(str(built["fp8-64"]), dtype="fp32", device_map="cuda:0")
    plain, _ = load_target(str(plain_dir), dtype="fp32", device_map="cuda:0")
    assert held.info.quantization["held_quantized_modules"] == 26
    ids = torch.randint(5, 90, (2, 9), generator=torch.Generator().manual_seed(0))
    assert torch.equal(held.forward(ids, None), plain.forward(ids, None))


def test_dequantization_on_the_gpu_equals_the_formula():
    from quant_fixtures import fp8_block_dequantize, fp8_block_quantize

    from eagle_eval.models.quant.fp8 import dequantize_blocks

    for shape in ((40, 24), (64, 48), (300, 130)):
        q, scale = fp8_block_quantize(torch.randn(*shape, generator=torch.Generator().manual_seed(4)), (16, 16))
        expected = fp8_block_dequantize(q, scale, (16, 16))
        got = dequantize_blocks(q.cuda(), scale.cuda(), (16, 16), torch.float32)
        assert torch.equal(got.cpu(), expected), shape
        assert torch.equal(dequantize_blocks(q.cuda(), scale.cuda(), (16, 16), torch.bfloat16).cpu(),
                           expected.to(torch.bfloat16)), shape


def test_an_mtp_layer_beside_a_held_fp8_target_is_held_the_same_on_the_gpu(built):
    """A DeepSeek-V3 FP8 target with an MTP layer (every projection FP8, eh_proj too) on cuda:0: the MTP layer is
    held FP8 as the target is; with the dequantizing matmul the run equals the dequantized copy's (fp32: the same
    weights), and under `auto` the MTP layer's matmul is the one the target's resolved to (the kernel where it
    loads: W8A8, so no equality with the copy is asserted there)."""
    from mtp_fixtures import make_mtp_target
    from mtp_fixtures import write_prompts as write_mtp_prompts
    from quant_fixtures import PROJ_AND_EH, fp8_compress

    root = built["root"]
    fp8 = fp8_compress(make_mtp_target(root / "mtp-fp8", "deepseek_v3"), PROJ_AND_EH, (8, 8))
    plain = write_dequantized_copy(fp8, root / "mtp-fp8-plain", (8, 8))
    prompts = write_mtp_prompts(root / "mtp-prompts.jsonl", n=4)

    def run(target, matmul):
        return api.evaluate(Settings.of(target=str(target), draft="mtp", prompts=str(prompts), dtype="fp32",
                                        num_steps=2, max_new_tokens=12, device_map="cuda:0", fp8_matmul=matmul),
                            progress=False)
    held, ref = run(fp8, "dequantize"), run(plain, "auto")
    assert held.report["config"]["head"]["mtp"]["weights"].startswith("held FP8 as the target's: 8 FP8Linear, 1 "
                                                                      "FP8Experts")
    assert [(s.output_ids, s.accepted_per_cycle) for s in held.samples] == \
        [(s.output_ids, s.accepted_per_cycle) for s in ref.samples]
    auto = run(fp8, "auto")
    matmul = auto.report["config"]["target"]["quantization"]["fp8_matmul"]["matmul"]
    assert auto.report["config"]["head"]["mtp"]["weights"].endswith(
        "transformers' FP8 kernel (W8A8)" if matmul == "kernel" else "eagle-eval's dequantizing matmul (W8A16)")
